"""GPU runs for tests/integration/test_gpu.py, each in its own process so the test process never
initialises CUDA (a later fork launch in the same pytest session would be refused).

Plain torch only: it runs where DGL is not installed.

    python tests/helpers/gpu_script.py --gpus 0,0 --launcher fork --out DIR     # 2 ranks share GPU 0 (gloo)
    torchrun --standalone --nproc-per-node 1 tests/helpers/gpu_script.py --gpus 1 --out DIR   # nccl, 1 rank
    python tests/helpers/gpu_script.py --gpus 1 --out DIR --checkpoint          # in-process, checkpoint on GPU

Every rank writes ``rank<r>.json`` (devices it saw, backend, final parameters); with
``--checkpoint`` the run also saves a ``ModelCheckpoint`` and writes ``summary.json``.
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from gpu_tasks import DeviceTask  # noqa: E402

from graphtrainer import ModelCheckpoint, Trainer  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gpus", default=None, help="a count (e.g. 1) or device indices (e.g. 0,0)")
    parser.add_argument("--num-procs", type=int, default=None, help="CPU ranks (instead of --gpus)")
    parser.add_argument("--launcher", default="auto")
    parser.add_argument("--out", required=True)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--checkpoint", action="store_true")
    parser.add_argument("--touch-cuda", action="store_true", help="call torch.cuda.is_available() first")
    parser.add_argument("--backward-first", action="store_true", help="run a backward pass first")
    args = parser.parse_args()
    import torch

    if args.touch_cuda:
        assert torch.cuda.is_available()  # initialises the CUDA runtime: forks can no longer use it
    if args.backward_first:  # starts autograd's per-device threads: forks can no longer run autograd
        torch.ones(2, requires_grad=True).sum().backward()
    gpus = None if args.gpus is None else [int(g) for g in args.gpus.split(",")] if "," in args.gpus \
        else int(args.gpus)
    callbacks = [ModelCheckpoint(monitor="val_loss", mode="min", save_last=True)] if args.checkpoint else []
    trainer = Trainer(gpus=gpus, num_procs=args.num_procs, launcher=args.launcher, max_epochs=args.epochs,
                      seed=0, progress_bar=False,
                      default_root_dir=os.path.join(args.out, "runs"), callbacks=callbacks)
    task = DeviceTask(args.out)
    trainer.fit(task)
    if args.checkpoint:
        import json

        result = trainer.validate(task, ckpt_path="best")
        with open(os.path.join(args.out, "summary.json"), "w", encoding="utf-8") as fh:
            json.dump({"best_model_path": callbacks[0].best_model_path, "val_loss": result["val_loss"],
                       "param_device": str(next(task.module.parameters()).device),
                       "cuda_initialised": torch.cuda.is_initialized()}, fh)


if __name__ == "__main__":
    main()
