"""Layer-wise full-graph inference on a large graph: seconds and memory per rank.

    python benchmarks/layerwise.py [--tiny] [--nodes 1000000] [--batch-sizes 1024,8192]
"""
from __future__ import annotations

import time
from typing import Any, Dict

import harness  # first: graphtrainer from this checkout, DGL on PyTorch
import psutil
import torch
from binned_auroc import peak_rss_mb
from graphtrainer import GraphTask, Trainer, datasets
from graphtrainer.data.inference import layerwise
from graphtrainer.models import SAGE

MEMORY = ("rss_growth_mb", "uss_mb", "pss_mb")  # per rank, after each batch size's run


class LayerwiseBench(GraphTask):
    """``layerwise`` on a 2-layer GraphSAGE per batch size, after a trivial validation on every (forked) rank;
    each rank logs its seconds, peak RSS growth and USS/PSS while the result is held, under its own name."""

    def configure_model(self) -> Any:
        return SAGE(self.graph.ndata["feat"].shape[1], self.hidden, 8, num_layers=2)

    def val_dataloader(self) -> Any:
        return self.node_dataloader(torch.arange(2), [2, 2], 1)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        pass

    def on_validation_epoch_end(self) -> None:
        for i, batch_size in enumerate(self.batch_sizes):
            start_mb, start = peak_rss_mb(reset=True), time.perf_counter()
            out = layerwise(self.module, self.graph, batch_size=batch_size)
            self.log(f"b{i}_seconds", time.perf_counter() - start, reduce_fx="sum")
            mem = psutil.Process().memory_full_info()
            mbs = (peak_rss_mb() - start_mb, mem.uss / 2**20, mem.pss / 2**20)
            for key, mb in zip(MEMORY, mbs):
                self.log(f"b{i}_{key}_r{self.rank}", mb, reduce_fx="sum")  # summed: the other ranks add nothing
            del out  # before the next batch size


def main(argv: Any = None) -> Dict[str, Any]:
    parser = harness.base_parser("layerwise", __doc__, tiny={"nodes": 20_000})
    for flag, default in (("--nodes", 1_000_000), ("--hidden", 64), ("--num-procs", 2)):
        parser.add_argument(flag, type=int, default=default)
    parser.add_argument("--batch-sizes", default="1024,8192")
    parser.add_argument("--root-dir", default="/tmp/graphtrainer-bench-layerwise")
    args = parser.parse_args(argv)
    graph, sizes = datasets.synthetic(args.nodes, 10, 64, 8), [int(b) for b in args.batch_sizes.split(",")]
    trainer = Trainer(num_procs=args.num_procs, progress_bar=False, logger=False, default_root_dir=args.root_dir,
                      hang_timeout=None)
    task = LayerwiseBench()
    task.graph, task.hidden, task.batch_sizes = graph, args.hidden, sizes
    m = trainer.validate(task)
    rows = [{"batch_size": bs, "seconds": m[f"b{i}_seconds"] / args.num_procs,
             **{k: [m[f"b{i}_{k}_r{r}"] for r in range(args.num_procs)] for k in MEMORY}} for i, bs in enumerate(sizes)]
    shared_mb = 4 * args.nodes * (args.hidden + 8) / 2**20
    md = (f"{args.nodes:,} nodes, {graph.num_edges():,} edges, SAGE 64 -> {args.hidden} -> 8, {args.num_procs} "
          f"ranks; shared layer outputs {shared_mb:.0f} MB in all\n\n" + harness.markdown_table(
              ["batch size", "seconds (rank mean)", "per rank: peak RSS growth MB", "USS MB after", "PSS MB after"],
              [[r["batch_size"], f"{r['seconds']:.1f}"] + [" / ".join(f"{x:,.0f}" for x in r[k]) for k in MEMORY]
               for r in rows]))
    return harness.report(args, {"shared_mb": shared_mb, "runs": rows}, md)


if __name__ == "__main__":
    main()
