"""Evaluation at scale, memory and time: one question per sub-command, its results named as it is.

    python benchmarks/evaluation.py layerwise [--nodes 1000000] [--batch-sizes 1024,8192]  # full-graph inference
    python benchmarks/evaluation.py binned_auroc  # exact ROC-AUC/AP against the streaming binned one
"""
from __future__ import annotations

import multiprocessing
import os
import time
from typing import Any, Dict, List

import harness  # first: graphtrainer from this checkout, DGL on PyTorch
import probe
import torch
from graphtrainer import GraphTask, Trainer, datasets
from graphtrainer.data.inference import layerwise
from graphtrainer.models import SAGE

MEMORY = ("rss_growth_mb", "uss_mb", "pss_mb")  # per rank, after each batch size's layer-wise run


class LayerwiseBench(GraphTask):
    """``layerwise`` on a 2-layer GraphSAGE per batch size, after a trivial validation on every (forked) rank;
    each rank logs its seconds, peak RSS growth and USS/PSS while the result is held, under its own name."""

    def configure_model(self) -> Any:
        return SAGE(self.graph.ndata["feat"].shape[1], self.hidden, 8, num_layers=2)

    def val_dataloader(self) -> Any:
        return self.node_dataloader(torch.arange(2), [2, 2], 1)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        pass  # Trainer.validate needs one; the work is in on_validation_epoch_end

    def on_validation_epoch_end(self) -> None:
        for i, batch_size in enumerate(self.batch_sizes):
            start_mb, start = probe.peak_rss_mb(reset=True), time.perf_counter()
            out = layerwise(self.module, self.graph, batch_size=batch_size)
            self.log(f"b{i}_seconds", time.perf_counter() - start, reduce_fx="sum")
            mem = probe.smaps_rollup(os.getpid())
            for key, mb in zip(MEMORY, (probe.peak_rss_mb() - start_mb, mem["uss_mb"], mem["pss_mb"])):
                self.log(f"b{i}_{key}_r{self.rank}", mb, reduce_fx="sum")  # summed: the other ranks add nothing
            del out  # before the next batch size


def layerwise_inference(argv: List[str]) -> Dict[str, Any]:
    """Layer-wise full-graph inference on a large graph: seconds and memory per rank."""
    parser = harness.base_parser("layerwise", str(layerwise_inference.__doc__), tiny={"nodes": 20_000})
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


def measure_auroc(method: str, edges: int, negatives: int, bins: int) -> Dict[str, Any]:
    """One method in a fresh (spawned) interpreter; "peak extra": its peak RSS above the RSS before it."""
    from graphtrainer.evaluation.binned_auroc import BinnedAUROC
    from graphtrainer.evaluation.ranking import roc_auc_ap

    gen = torch.Generator().manual_seed(0)
    pos, neg = torch.randn(edges, generator=gen) + 1.0, torch.randn(edges, negatives, generator=gen)
    start_mb, start = probe.peak_rss_mb(reset=True), time.perf_counter()
    if method == "exact":
        result = roc_auc_ap(pos, neg)
    else:
        metric = BinnedAUROC(bins=bins)
        for lo in range(0, edges, 65536):  # as an evaluation loop feeds it, batch by batch
            metric.update(pos[lo:lo + 65536], neg[lo:lo + 65536])
        result = dict(metric.compute(), auc_error_bound=metric.auc_error_bound)
    return {"method": method, "scored_edges": edges * (1 + negatives), "seconds": time.perf_counter() - start,
            "peak_extra_mb": probe.peak_rss_mb() - start_mb, "scores_mb": (pos.numel() + neg.numel()) * 4 / 2**20,
            **result}


def binned_auroc(argv: List[str]) -> Dict[str, Any]:
    """Exact ROC-AUC/AP (scikit-learn) against ``graphtrainer.evaluation.binned_auroc`` at 10M scored edges (1M
    positives x 9 negatives): peak memory, seconds, error."""
    parser = harness.base_parser("binned_auroc", str(binned_auroc.__doc__), tiny={"edges": 10_000, "bins": 1_000})
    for flag, default in (("--edges", 1_000_000), ("--negatives", 9), ("--bins", 100_000)):
        parser.add_argument(flag, type=int, default=default)
    args = parser.parse_args(argv)
    jobs = [(method, args.edges, args.negatives, args.bins) for method in ("exact", "binned")]
    with multiprocessing.get_context("spawn").Pool(1, maxtasksperchild=1) as pool:  # a fresh interpreter per method
        exact, binned = rows = pool.starmap_async(measure_auroc, jobs, chunksize=1).get(timeout=1800)
    md = harness.markdown_table(
        ["method", "scored edges", "peak extra RSS (MB)", "scores held (MB)", "seconds", "auc", "ap"],
        [[r["method"], f"{r['scored_edges']:,}", f"{r['peak_extra_mb']:.0f}", f"{r['scores_mb']:.0f}",
          f"{r['seconds']:.2f}", f"{r['auc']:.6f}", f"{r['ap']:.6f}"] for r in rows])
    md += (f"\n\nbinned: {args.bins:,} bins ({2 * args.bins * 8 / 2**20:.1f} MB of counts per rank), reported "
           f"AUC error bound {binned['auc_error_bound']:.2e}, |binned - exact| AUC "
           f"{abs(binned['auc'] - exact['auc']):.2e}, AP {abs(binned['ap'] - exact['ap']):.2e}")
    return harness.report(args, {"rows": rows}, md)


def main(argv: Any = None) -> Dict[str, Any]:
    return harness.subcommands(__doc__, {"layerwise": layerwise_inference, "binned_auroc": binned_auroc}, argv)


if __name__ == "__main__":
    main()
