"""Sampling worker processes: training seeds per second with 0, 1 and 2 workers per rank.

    python benchmarks/workers.py --out benchmarks/results/full          # 1M nodes, 2 ranks
    python benchmarks/workers.py --nodes 20000 --batches 5 --out /tmp/w  # seconds

GraphSAGE on 2 forked ranks (``--hetero``: papers and words), 3 epochs of ``--batches``
batches per rank per worker count, each epoch timed in the ranks; epoch 0 starts the workers.
"""
from __future__ import annotations

import argparse
import os
import time
from typing import Any, Dict, List

import harness  # noqa: F401  (first: graphtrainer from this checkout, DGL on PyTorch)
from graphtrainer import Trainer
from graphtrainer.examples.hetero_classification import HeteroClassification  # noqa: E402
from graphtrainer.examples.node_classification import NodeClassification  # noqa: E402


class _Timing:
    """Workers per rank from ``loader_kwargs``; logs each training epoch's seconds."""

    loader_kwargs: Dict[str, Any] = {}

    def val_dataloader(self) -> Any:
        return None  # training throughput only

    def on_train_epoch_start(self) -> None:
        self._t0 = time.perf_counter()

    def on_train_epoch_end(self) -> None:
        self.log("epoch_s", time.perf_counter() - self._t0, batch_size=1)


class HomoTask(_Timing, NodeClassification):
    def train_dataloader(self) -> Any:
        return self.node_dataloader(self.split_ids["train"], self.fanouts, self.batch_size, **self.loader_kwargs)


class HeteroTask(_Timing, HeteroClassification):
    def train_dataloader(self) -> Any:
        return self.node_dataloader({"paper": self.split_ids["train"]}, self.fanouts, self.batch_size,
                                    **self.loader_kwargs)


def run(graph: Any, hetero: bool, workers: int, args: argparse.Namespace) -> Dict[str, Any]:
    kwargs = {"num_workers": workers, "persistent_workers": True} if workers else {}
    if hetero:
        task: Any = HeteroTask(graph, fanouts=[10, 10], hidden=64, embed_dim=16, batch_size=args.batch_size,
                               layerwise_eval=False)
    else:
        task = HomoTask(graph, fanouts=[10, 10], hidden=64, batch_size=args.batch_size)
    task.loader_kwargs = kwargs
    trainer = Trainer(num_procs=args.num_procs, max_epochs=3, limit_train_batches=args.batches, progress_bar=False,
                      logger=False, default_root_dir=args.root_dir, find_unused_parameters=hetero,
                      threads_per_proc=args.threads)
    load0 = os.getloadavg()[0]
    trainer.fit(task)
    seeds = args.batches * args.batch_size * args.num_procs
    epochs = [row["epoch_s"] for row in trainer.history]
    return {"workers": workers, "epoch_s": epochs, "seeds_per_s": [seeds / s for s in epochs],
            "loadavg_before": load0, "loadavg_after": os.getloadavg()[0]}


def main(argv: Any = None) -> Dict[str, Any]:
    parser = harness.base_parser("workers", __doc__)
    parser.add_argument("--nodes", type=int, default=1_000_000)
    parser.add_argument("--hetero", action="store_true", help="synthetic_hetero: papers and words")
    parser.add_argument("--workers", default="0,1,2")
    parser.add_argument("--batches", type=int, default=40, help="training batches per rank and epoch")
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--num-procs", type=int, default=2)
    parser.add_argument("--threads", type=int, default=None, help="threads_per_proc (default: cores // ranks)")
    parser.add_argument("--root-dir", default="/tmp/graphtrainer-bench-workers")
    args = parser.parse_args(argv)
    from graphtrainer import datasets

    if args.hetero:
        graph = datasets.synthetic_hetero(args.nodes, max(args.nodes // 10, 8), avg_degree=10, feat_dim=64)
    else:
        graph = datasets.synthetic(args.nodes, 10, 64, 8)
    rows: List[Dict[str, Any]] = []
    for workers in [int(w) for w in args.workers.split(",")]:
        rows.append(run(graph, args.hetero, workers, args))
        print(f"workers {workers}: seeds/s per epoch " + ", ".join(f"{v:,.0f}" for v in rows[-1]["seeds_per_s"]))
    base = sum(rows[0]["seeds_per_s"][1:]) / 2
    table = harness.markdown_table(
        ["workers per rank", "epoch 0 seeds/s (starts workers)", "epochs 1-2 seeds/s", "vs 0 workers"],
        [[r["workers"], f"{r['seeds_per_s'][0]:,.0f}", f"{sum(r['seeds_per_s'][1:]) / 2:,.0f}",
          f"{sum(r['seeds_per_s'][1:]) / 2 / base:.2f}x"] for r in rows])
    payload = {"config": {k: str(v) for k, v in vars(args).items()}, "runs": rows}
    harness.write_outputs(args.out, "workers", payload, table)
    print(table)
    return payload


if __name__ == "__main__":
    main()
