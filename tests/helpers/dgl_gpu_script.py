"""One fit of a task shape with torch blocks, on CPU ranks or on GPU 0, in its own process, for
tests/integration/test_gpu.py (the test process never initialises CUDA). Needs DGL: the
loaders sample DGL blocks on the CPU and the trainer turns them into torch blocks.

    python tests/helpers/dgl_gpu_script.py --case node --where gpu1 --out DIR [--epochs 2] [--checkpoint]
    python tests/helpers/dgl_gpu_script.py --case node --where cpu1 --out DIR --resume CKPT --epochs 3

``--sampling``: where the loaders sample (default ``cpu``: DGL's samples on every device, so
CPU and GPU runs see the same batches). ``--where``: ``cpu1`` (one CPU rank), ``cpu2`` (two, fork), ``gpu1`` (``gpus=1``) or ``gpu2``
(``gpus=[0, 0]``: two ranks share GPU 0 over gloo). Writes ``DIR/fit.json``: the history, the
graph classes and devices each rank's training batches held, and the device of its parameters.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import graphtrainer  # noqa: E402,F401  (DGL's compatibility layer before anything imports dgl)
from graphtrainer import ModelCheckpoint, Trainer  # noqa: E402

from nn_fit_cases import CASES, GraphKinds, read_kinds  # noqa: E402

WHERE = {"cpu1": {}, "cpu2": {"num_procs": 2, "launcher": "fork"},
         "gpu1": {"gpus": 1}, "gpu2": {"gpus": [0, 0], "launcher": "fork"}}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--case", choices=sorted(CASES), required=True)
    parser.add_argument("--where", choices=sorted(WHERE), required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--checkpoint", action="store_true", help="keep last.ckpt in DIR/runs")
    parser.add_argument("--resume", default=None, help="a checkpoint to resume from")
    parser.add_argument("--sampling", default="cpu", choices=("auto", "device", "cpu"),
                        help="Trainer(sampling=...); 'cpu' (DGL's samples) makes CPU and GPU runs comparable")
    parser.add_argument("--seed", type=int, default=5)
    parser.add_argument("--deterministic", default="off", choices=("off", "on", "warn"),
                        help="Trainer(deterministic=False, True or 'warn')")
    args = parser.parse_args()
    make_task, kwargs, _ = CASES[args.case]
    callbacks = [GraphKinds(args.out)]
    if args.checkpoint:
        callbacks.append(ModelCheckpoint(save_last=True))
    trainer = Trainer(max_epochs=args.epochs, seed=args.seed, threads_per_proc=1, progress_bar=False, logger=False,
                      block_type="torch", sampling=args.sampling, default_root_dir=os.path.join(args.out, "runs"), callbacks=callbacks,
                      deterministic={"off": False, "on": True, "warn": "warn"}[args.deterministic],
                      **WHERE[args.where], **kwargs)
    trainer.fit(make_task(0.0), ckpt_path=args.resume)
    world = 2 if args.where.endswith("2") else 1
    result = {"history": trainer.history, "ranks": read_kinds(args.out, world)}
    if args.checkpoint:
        result["last"] = callbacks[1].last_model_path
    with open(os.path.join(args.out, "fit.json"), "w", encoding="utf-8") as fh:
        json.dump(result, fh)


if __name__ == "__main__":
    main()
