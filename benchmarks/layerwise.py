"""Layer-wise full-graph inference on a large graph: seconds and memory per rank.

    python benchmarks/layerwise.py --out benchmarks/results/full            # 1M nodes, 2 ranks
    python benchmarks/layerwise.py --nodes 20000 --out /tmp/lw              # seconds

On 2 forked ranks, ``graphtrainer.data.inference.layerwise`` on a 2-layer GraphSAGE per
``--batch-sizes`` value; each rank reports seconds, peak RSS growth (a 10 ms sampling thread)
and USS/PSS while the result is held.
"""
from __future__ import annotations

import threading
import time
from typing import Any, Dict, List

import harness  # first: graphtrainer from this checkout, DGL on PyTorch
import psutil
import torch
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


def main(argv: Any = None) -> Dict[str, Any]:
    parser = harness.base_parser("layerwise", __doc__)
    parser.add_argument("--nodes", type=int, default=1_000_000)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--batch-sizes", default="1024,8192")
    parser.add_argument("--num-procs", type=int, default=2)
    parser.add_argument("--root-dir", default="/tmp/graphtrainer-bench-layerwise")
    args = parser.parse_args(argv)
    from graphtrainer import datasets

    graph = datasets.synthetic(args.nodes, 10, 64, 8)
    sizes = [int(b) for b in args.batch_sizes.split(",")]
    trainer = Trainer(num_procs=args.num_procs, progress_bar=False, logger=False, default_root_dir=args.root_dir,
                      hang_timeout=None)
    m = trainer.validate(LayerwiseBench(graph, args.hidden, sizes))
    shared_mb = 4 * args.nodes * (args.hidden + 8) / 2 ** 20
    ranks = range(args.num_procs)
    rows = [{"batch_size": bs, "seconds": m[f"b{i}_seconds"] / args.num_procs,
             **{k: [m[f"b{i}_{k}_r{r}"] for r in ranks] for k in ("rss_growth_mb", "uss_mb", "pss_mb")}}
            for i, bs in enumerate(sizes)]
    fmt = lambda v: " / ".join(f"{x:,.0f}" for x in v)  # noqa: E731
    md = (f"{args.nodes:,} nodes, {graph.num_edges():,} edges, SAGE 64 -> {args.hidden} -> 8, {args.num_procs} "
          f"ranks; shared layer outputs {shared_mb:.0f} MB in all\n\n" + harness.markdown_table(
              ["batch size", "seconds (rank mean)", "per rank: peak RSS growth MB", "USS MB after", "PSS MB after"],
              [[r["batch_size"], f"{r['seconds']:.1f}", fmt(r["rss_growth_mb"]), fmt(r["uss_mb"]), fmt(r["pss_mb"])]
               for r in rows]))
    payload = {"config": {k: str(v) for k, v in vars(args).items()}, "shared_mb": shared_mb, "runs": rows}
    harness.write_outputs(args.out, "layerwise", payload, md)
    print(md)
    return payload


if __name__ == "__main__":
    main()
