"""Memory and time of exact ROC-AUC/AP (scikit-learn) against the streaming binned one
(``graphtrainer.evaluation.binned_auroc``) at 10M scored edges (1M positives x 9 negatives).

    python benchmarks/binned_auroc.py          # full run
    python benchmarks/binned_auroc.py --tiny   # seconds

Each method in a fresh interpreter; a thread samples RSS every 2 ms while the metric runs:
"peak extra" is the highest RSS above the level before it.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from typing import Any, Dict

import harness  # noqa: F401  (graphtrainer from this checkout)


def child(method: str, edges: int, negatives: int, bins: int) -> Dict[str, Any]:
    import psutil
    import torch

    from graphtrainer.evaluation.binned_auroc import BinnedAUROC
    from graphtrainer.evaluation.ranking import roc_auc_ap

    gen = torch.Generator().manual_seed(0)
    pos = torch.randn(edges, generator=gen) + 1.0
    neg = torch.randn(edges, negatives, generator=gen)
    proc, peak, done = psutil.Process(), [0], threading.Event()
    base = proc.memory_info().rss

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], proc.memory_info().rss)
            time.sleep(0.002)

    watcher = threading.Thread(target=sample, daemon=True)
    watcher.start()
    start = time.perf_counter()
    if method == "exact":
        result = roc_auc_ap(pos, neg)
    else:
        metric = BinnedAUROC(bins=bins)
        for lo in range(0, edges, 65536):  # as an evaluation loop feeds it, batch by batch
            metric.update(pos[lo:lo + 65536], neg[lo:lo + 65536])
        result = metric.compute()
        result["auc_error_bound"] = metric.auc_error_bound
    seconds = time.perf_counter() - start
    done.set()
    watcher.join()
    return {"method": method, "scored_edges": edges * (1 + negatives), "seconds": seconds,
            "peak_extra_mb": (max(peak[0], proc.memory_info().rss) - base) / 2**20,
            "scores_mb": (pos.numel() + neg.numel()) * 4 / 2**20, **result}


def main(argv: Any = None) -> None:
    parser = harness.base_parser("binned_auroc", __doc__)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--edges", type=int, default=1_000_000)
    parser.add_argument("--negatives", type=int, default=9)
    parser.add_argument("--bins", type=int, default=100_000)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.edges, args.negatives, args.bins)))
        return
    if args.tiny:
        args.edges, args.bins = 10_000, 1_000
    rows = []
    for method in ("exact", "binned"):
        proc = subprocess.run([sys.executable, __file__, "--child", method, "--edges", str(args.edges),
                               "--negatives", str(args.negatives), "--bins", str(args.bins)],
                              capture_output=True, text=True, timeout=900, check=True)
        rows.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    exact, binned = rows
    md = harness.markdown_table(
        ["method", "scored edges", "peak extra RSS (MB)", "scores held (MB)", "seconds", "auc", "ap"],
        [[r["method"], f"{r['scored_edges']:,}", f"{r['peak_extra_mb']:.0f}", f"{r['scores_mb']:.0f}",
          f"{r['seconds']:.2f}", f"{r['auc']:.6f}", f"{r['ap']:.6f}"] for r in rows])
    md += (f"\n\nbinned: {args.bins:,} bins ({2 * args.bins * 8 / 2**20:.1f} MB of counts per rank), reported AUC "
           f"error bound {binned['auc_error_bound']:.2e}, |binned - exact| AUC {abs(binned['auc'] - exact['auc']):.2e}, "
           f"AP {abs(binned['ap'] - exact['ap']):.2e}")
    harness.write_outputs(args.out, "binned_auroc", {"config": {k: str(v) for k, v in vars(args).items()},
                                                     "rows": rows}, md)
    print(md)


if __name__ == "__main__":
    main()
