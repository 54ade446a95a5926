"""Sampling worker processes: training seeds per second with 0, 1 and 2 workers per rank:
GraphSAGE on 2 forked ranks (``--hetero``: papers and words), 3 epochs of ``--batches`` batches
per rank per worker count, rank 0's epochs timed; epoch 0 starts the workers.

    python benchmarks/workers.py --out benchmarks/results/full          # 1M nodes, 2 ranks
    python benchmarks/workers.py --tiny --out /tmp/w                     # seconds
"""
from __future__ import annotations

from typing import Any, Dict

import harness  # noqa: F401  (first: graphtrainer from this checkout, DGL on PyTorch)
import workload
from graphtrainer import Trainer, datasets
from graphtrainer.examples.hetero_classification import HeteroClassification
from graphtrainer.examples.node_classification import NodeClassification


class _Training:
    """Training only, its loader given ``loader_kwargs`` (the worker processes)."""

    loader_kwargs: Dict[str, Any] = {}

    def val_dataloader(self) -> Any:
        return None

    def train_dataloader(self) -> Any:
        ids = self.split_ids["train"]  # type: ignore[attr-defined]
        ids = {self.target: ids} if isinstance(self, HeteroClassification) else ids
        return self.node_dataloader(ids, self.fanouts, self.batch_size, **self.loader_kwargs)  # type: ignore


class HomoTask(_Training, NodeClassification):
    pass


class HeteroTask(_Training, HeteroClassification):
    pass


def run(graph: Any, workers: int, args: Any) -> Dict[str, Any]:
    common = dict(fanouts=[10, 10], hidden=64, batch_size=args.batch_size)
    task = HeteroTask(graph, embed_dim=16, layerwise_eval=False, **common) if args.hetero else HomoTask(graph, **common)
    task.loader_kwargs = {"num_workers": workers, "persistent_workers": True} if workers else {}
    timer = workload.EpochTimer()
    Trainer(num_procs=args.num_procs, max_epochs=3, limit_train_batches=args.batches, progress_bar=False, logger=False,
            default_root_dir=args.root_dir, find_unused_parameters=args.hetero, threads_per_proc=args.threads,
            enable_model_summary=False, callbacks=[timer]).fit(task)
    seeds = args.batches * args.batch_size * args.num_procs
    return {"workers": workers, "epoch_s": timer.times, "seeds_per_s": [seeds / s for s in timer.times]}


def main(argv: Any = None) -> Dict[str, Any]:
    parser = harness.base_parser("workers", __doc__, tiny={"nodes": 5000, "batches": 2, "batch_size": 256})
    parser.add_argument("--nodes", type=int, default=1_000_000)
    parser.add_argument("--hetero", action="store_true", help="synthetic_hetero: papers and words")
    parser.add_argument("--workers", default="0,1,2")
    parser.add_argument("--batches", type=int, default=40, help="training batches per rank and epoch")
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--num-procs", type=int, default=2)
    parser.add_argument("--threads", type=int, default=None, help="threads_per_proc (default: cores // ranks)")
    parser.add_argument("--root-dir", default="/tmp/graphtrainer-bench-workers")
    args = parser.parse_args(argv)
    graph = (datasets.synthetic_hetero(args.nodes, max(args.nodes // 10, 8), avg_degree=10, feat_dim=64)
             if args.hetero else datasets.synthetic(args.nodes, 10, 64, 8))
    arms = {w: (lambda rnd, w=w: run(graph, w, args)) for w in map(int, args.workers.split(","))}
    rows = [rs[0] for rs in harness.interleave(arms, 1, "workers")[0].values()]
    steady = [harness.median(r["seeds_per_s"][1:]) for r in rows]
    table = harness.markdown_table(
        ["workers per rank", "epoch 0 seeds/s (starts workers)", "epochs 1-2 seeds/s", "vs 0 workers"],
        [[r["workers"], f"{r['seeds_per_s'][0]:,.0f}", f"{s:,.0f}", f"{s / steady[0]:.2f}x"]
         for r, s in zip(rows, steady)])
    return harness.report(args, {"runs": rows}, table)


if __name__ == "__main__":
    main()
