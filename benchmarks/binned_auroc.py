"""Memory and time of exact ROC-AUC/AP (scikit-learn) against the streaming binned one
(``graphtrainer.evaluation.binned_auroc``) at 10M scored edges (1M positives x 9 negatives).

    python benchmarks/binned_auroc.py --out benchmarks/results/binned_auroc

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
from pathlib import Path
from typing import Any, Dict


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--child")
    parser.add_argument("--edges", type=int, default=1_000_000)
    parser.add_argument("--negatives", type=int, default=9)
    parser.add_argument("--bins", type=int, default=100_000)
    parser.add_argument("--out", default="bench_out/binned_auroc")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.edges, args.negatives, args.bins)))
        return
    rows = []
    for method in ("exact", "binned"):
        proc = subprocess.run([sys.executable, __file__, "--child", method, "--edges", str(args.edges),
                               "--negatives", str(args.negatives), "--bins", str(args.bins)],
                              capture_output=True, text=True, timeout=900, check=True)
        rows.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "binned_auroc.json").write_text(json.dumps({"config": vars(args), "rows": rows}, indent=2))
    lines = [f"| method | scored edges | peak extra RSS (MB) | scores held (MB) | seconds | auc | ap |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['method']} | {r['scored_edges']:,} | {r['peak_extra_mb']:.0f} | {r['scores_mb']:.0f} | "
                     f"{r['seconds']:.2f} | {r['auc']:.6f} | {r['ap']:.6f} |")
    binned = rows[1]
    lines.append(f"\nbinned: {args.bins:,} bins ({2 * args.bins * 8 / 2**20:.1f} MB of counts per rank), "
                 f"reported AUC error bound {binned['auc_error_bound']:.2e}, "
                 f"|binned - exact| AUC {abs(binned['auc'] - rows[0]['auc']):.2e}, AP {abs(binned['ap'] - rows[0]['ap']):.2e}")
    (out / "binned_auroc.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
