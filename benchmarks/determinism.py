"""What ``Trainer(deterministic=True)`` costs DGL's CPU sampling: ms per sampled batch with DGL's
thread fixes (:mod:`graphtrainer._compat.dgl_2_1_threads`) off and on, fused and unfused
``NeighborSampler``, 1 and 2 threads, every arm in turn batch by batch on the same seeds.

    python benchmarks/determinism.py --out benchmarks/results/determinism   # 1 to 3 minutes on 2 cores"""
from __future__ import annotations

import time
from typing import Any, Dict, List

import torch

import harness  # first: graphtrainer from this checkout, DGL on PyTorch
import workload
import dgl
from graphtrainer.data.determinism import deterministic
from graphtrainer.launch.threads import set_threads

GRAPHS = {"50k": ("50kx10", [10, 10], 512), "tiny": ("3kx5", [5, 5], 128)}  # size, fanouts, batch


def arm_name(fused: bool, threads: int) -> str:
    return f"{'fused' if fused else 'unfused'}, {threads} thread{'s' if threads > 1 else ''}"


def per_batch(graph: Any, name: str, batches: int, threads: List[int]) -> Dict[str, Dict[str, Any]]:
    """Median ms per batch of each (fused, threads) sampler with the fixes off and on, every arm
    sampling the same seeds in turn before the next batch (the first two batches untimed)."""
    _, fanouts, batch = GRAPHS[name]
    samplers = {f: dgl.dataloading.NeighborSampler(fanouts, fused=f) for f in (True, False)}
    ids = workload.split_ids(graph, "train")
    ids = ids[torch.randperm(ids.numel(), generator=torch.Generator().manual_seed(0))]
    ms: Dict[str, Dict[str, List[float]]] = {arm_name(f, t): {"off": [], "on": []} for f in samplers for t in threads}
    for i in range(batches + 2):
        seeds = ids[(i * batch) % max(1, ids.numel() - batch):][:batch]
        for fused, sampler in samplers.items():
            for t in threads:
                set_threads(t)
                for mode in (("off", "on") if i % 2 else ("on", "off")):  # A B, then B A
                    with deterministic(mode == "on"):
                        dgl.seed(i)
                        started = time.perf_counter()
                        sampler.sample(graph, seeds)
                        if i >= 2:
                            ms[arm_name(fused, t)][mode].append(1000 * (time.perf_counter() - started))
    return {arm: {"ms_off": harness.median(v["off"]), "ms_on": harness.median(v["on"]),
                  "ratio_on_over_off": harness.median(v["on"]) / harness.median(v["off"])} for arm, v in ms.items()}


def render(rows: Dict[str, Dict[str, Any]], graph: str) -> str:
    table = harness.markdown_table(
        ["sampler", "ms per batch, off", "ms per batch, deterministic=True", "on / off"],
        [[arm, f"{r['ms_off']:.1f}", f"{r['ms_on']:.1f}", harness.fmt_ratio(r["ratio_on_over_off"])]
         for arm, r in rows.items()])
    return (f"## DGL CPU sampling: deterministic=True against the default ({graph}, "
            f"fanouts {GRAPHS[graph][1]}, batch {GRAPHS[graph][2]})\n\n{table}\n")


def main(argv: Any = None) -> Dict[str, Any]:
    p = harness.base_parser("determinism", __doc__, tiny={"graph": "tiny", "batches": 3})
    p.add_argument("--graph", choices=list(GRAPHS), default="50k")
    p.add_argument("--batches", type=int, default=40, help="timed batches per arm")
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="sampling threads tried")
    args = p.parse_args(argv)
    size = GRAPHS[args.graph][0]
    graph = workload.build_graph({"dataset": "synthetic", **workload.parse_size(size), "feat_dim": 16})
    before = torch.get_num_threads()
    try:
        with harness.LoadMeter() as load:
            rows = per_batch(graph, args.graph, args.batches, args.threads)
    finally:
        set_threads(before)
    plot = harness.bar_plot({f"{arm}\n{m}": r[f"ms_{m}"] for arm, r in rows.items() for m in ("off", "on")},
                            "ms per batch (median)")
    ratios = {arm: r["ratio_on_over_off"] for arm, r in rows.items()}
    return harness.report(args, {"graph": args.graph, "per_batch": rows, "ratios": ratios,
                                 "other_cores": load.other_cores},
                          render(rows, args.graph), plot, figsize=(9, 4))


if __name__ == "__main__":
    main()
