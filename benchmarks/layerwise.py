"""Layer-wise full-graph inference on a large graph: seconds and memory per rank.

    python benchmarks/layerwise.py --out benchmarks/results/full            # 1M nodes, 2 ranks
    python benchmarks/layerwise.py --nodes 20000 --out /tmp/lw              # seconds

On 2 forked ranks, ``graphtrainer.data.inference.layerwise`` on a 2-layer GraphSAGE per
``--batch-sizes`` value; each rank reports seconds, peak RSS growth (a 10 ms sampling thread)
and USS/PSS while the result is held.
"""
from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path
from typing import Any, Dict, List

import psutil
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from graphtrainer import GraphTask, Trainer
from graphtrainer.data.inference import layerwise  # noqa: E402
from graphtrainer.models import SAGE  # noqa: E402


class _PeakRSS:
    """Largest RSS of this process seen every 10 ms while active."""

    def __enter__(self) -> "_PeakRSS":
        self.proc, self.peak, self._stop = psutil.Process(), 0, threading.Event()
        self.start = self.proc.memory_info().rss
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()
        return self

    def _watch(self) -> None:
        while not self._stop.wait(0.01):
            self.peak = max(self.peak, self.proc.memory_info().rss)

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.proc.memory_info().rss)


class LayerwiseBench(GraphTask):
    def __init__(self, graph: Any, hidden: int, batch_sizes: List[int]):
        super().__init__()
        self.graph, self.hidden, self.batch_sizes = graph, hidden, batch_sizes

    def configure_model(self) -> Any:
        return SAGE(self.graph.ndata["feat"].shape[1], self.hidden, 8, num_layers=2)

    def val_dataloader(self) -> Any:
        return self.node_dataloader(torch.arange(2), [2, 2], 1)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        pass

    def on_validation_epoch_end(self) -> None:
        mb = 2 ** 20
        for i, bs in enumerate(self.batch_sizes):
            t0 = time.perf_counter()
            with _PeakRSS() as rss:
                out = layerwise(self.module, self.graph, batch_size=bs)
            seconds = time.perf_counter() - t0
            info = psutil.Process().memory_full_info()
            self.log(f"b{i}_seconds", seconds, reduce_fx="sum")
            self.log(f"b{i}_rss_growth_mb_r{self.rank}", (rss.peak - rss.start) / mb, reduce_fx="sum")
            self.log(f"b{i}_uss_mb_r{self.rank}", info.uss / mb, reduce_fx="sum")
            self.log(f"b{i}_pss_mb_r{self.rank}", info.pss / mb, reduce_fx="sum")
            self.log(f"b{i}_checksum", float(out.double().sum()), reduce_fx="sum")
            del out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=1_000_000)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--batch-sizes", default="1024,8192")
    parser.add_argument("--num-procs", type=int, default=2)
    parser.add_argument("--root-dir", default="/tmp/graphtrainer-bench-layerwise")
    parser.add_argument("--out", default="bench_out/layerwise")
    args = parser.parse_args()

    from graphtrainer import datasets

    graph = datasets.synthetic(args.nodes, 10, 64, 8)
    sizes = [int(b) for b in args.batch_sizes.split(",")]
    trainer = Trainer(num_procs=args.num_procs, progress_bar=False, logger=False, default_root_dir=args.root_dir,
                      hang_timeout=None)
    m = trainer.validate(LayerwiseBench(graph, args.hidden, sizes))
    shared_mb = 4 * args.nodes * (args.hidden + 8) / 2 ** 20
    lines = [f"{args.nodes:,} nodes, {graph.num_edges():,} edges, SAGE 64 -> {args.hidden} -> 8, "
             f"{args.num_procs} ranks; shared layer outputs {shared_mb:.0f} MB in all",
             "", "| batch size | seconds (rank mean) | per rank: peak RSS growth MB | USS MB after | PSS MB after |",
             "|---|---|---|---|---|"]
    rows: List[Dict[str, Any]] = []
    for i, bs in enumerate(sizes):
        ranks = range(args.num_procs)
        row = {"batch_size": bs, "seconds": m[f"b{i}_seconds"] / args.num_procs,
               "rss_growth_mb": [m[f"b{i}_rss_growth_mb_r{r}"] for r in ranks],
               "uss_mb": [m[f"b{i}_uss_mb_r{r}"] for r in ranks], "pss_mb": [m[f"b{i}_pss_mb_r{r}"] for r in ranks]}
        rows.append(row)
        fmt = lambda v: " / ".join(f"{x:,.0f}" for x in v)  # noqa: E731
        lines.append(f"| {bs} | {row['seconds']:.1f} | {fmt(row['rss_growth_mb'])} | {fmt(row['uss_mb'])} | "
                     f"{fmt(row['pss_mb'])} |")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "layerwise.json").write_text(json.dumps({"config": vars(args), "shared_mb": shared_mb, "runs": rows},
                                                   indent=2))
    (out / "layerwise.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
