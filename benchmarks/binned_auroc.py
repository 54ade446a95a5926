"""Memory and time of exact ROC-AUC/AP (scikit-learn) against the streaming binned one at 10M scored edges.
``graphtrainer.evaluation.binned_auroc``, 1M positives x 9 negatives.

    python benchmarks/binned_auroc.py [--tiny]
"""
from __future__ import annotations

import multiprocessing
import time
from typing import Any, Dict

import harness  # first: graphtrainer from this checkout


def peak_rss_mb(reset: bool = False) -> float:
    """This process's peak RSS (VmHWM, Linux); ``reset`` restarts it from the current RSS (used by layerwise.py)."""
    if reset:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as fh:
            fh.write("5")
    with open("/proc/self/status", encoding="ascii") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("VmHWM")) / 1024


def measure(method: str, edges: int, negatives: int, bins: int) -> Dict[str, Any]:
    """One method in a fresh (spawned) interpreter; "peak extra": its peak RSS above the RSS before it."""
    import torch
    from graphtrainer.evaluation.binned_auroc import BinnedAUROC
    from graphtrainer.evaluation.ranking import roc_auc_ap

    gen = torch.Generator().manual_seed(0)
    pos, neg = torch.randn(edges, generator=gen) + 1.0, torch.randn(edges, negatives, generator=gen)
    start_mb, start = peak_rss_mb(reset=True), time.perf_counter()
    if method == "exact":
        result = roc_auc_ap(pos, neg)
    else:
        metric = BinnedAUROC(bins=bins)
        for lo in range(0, edges, 65536):  # as an evaluation loop feeds it, batch by batch
            metric.update(pos[lo:lo + 65536], neg[lo:lo + 65536])
        result = dict(metric.compute(), auc_error_bound=metric.auc_error_bound)
    return {"method": method, "scored_edges": edges * (1 + negatives), "seconds": time.perf_counter() - start,
            "peak_extra_mb": peak_rss_mb() - start_mb, "scores_mb": (pos.numel() + neg.numel()) * 4 / 2**20, **result}


def main(argv: Any = None) -> Dict[str, Any]:
    parser = harness.base_parser("binned_auroc", __doc__, tiny={"edges": 10_000, "bins": 1_000})
    for flag, default in (("--edges", 1_000_000), ("--negatives", 9), ("--bins", 100_000)):
        parser.add_argument(flag, type=int, default=default)
    args = parser.parse_args(argv)
    jobs = [(method, args.edges, args.negatives, args.bins) for method in ("exact", "binned")]
    with multiprocessing.get_context("spawn").Pool(1, maxtasksperchild=1) as pool:  # a fresh interpreter per method
        exact, binned = rows = pool.starmap_async(measure, jobs, chunksize=1).get(timeout=1800)
    md = harness.markdown_table(
        ["method", "scored edges", "peak extra RSS (MB)", "scores held (MB)", "seconds", "auc", "ap"],
        [[r["method"], f"{r['scored_edges']:,}", f"{r['peak_extra_mb']:.0f}", f"{r['scores_mb']:.0f}",
          f"{r['seconds']:.2f}", f"{r['auc']:.6f}", f"{r['ap']:.6f}"] for r in rows])
    md += (f"\n\nbinned: {args.bins:,} bins ({2 * args.bins * 8 / 2**20:.1f} MB of counts per rank), reported "
           f"AUC error bound {binned['auc_error_bound']:.2e}, |binned - exact| AUC "
           f"{abs(binned['auc'] - exact['auc']):.2e}, AP {abs(binned['ap'] - exact['ap']):.2e}")
    return harness.report(args, {"rows": rows}, md)


if __name__ == "__main__":
    main()
