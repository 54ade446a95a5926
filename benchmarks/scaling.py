"""Scaling: what training throughput 2 (or more) CPU processes give over 1.

    bash scripts/env.sh python benchmarks/scaling.py                 # full run
    bash scripts/env.sh python benchmarks/scaling.py --procs 1 2 4 8 # a machine with more cores
    bash scripts/env.sh python benchmarks/scaling.py --tiny          # seconds (smoke test)

Arms, interleaved: ``Trainer(num_procs=N)`` on ``workload.BenchTask`` for each N, and 1 process
x 1 thread; throughput from each rank's step ends (``probe.StepClock``) after ``--warmup`` steps.
Target: 2 processes >= 1.7x one process on 2 cores.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from typing import Any, Dict, List, Optional

import harness  # noqa: F401  (first: graphtrainer from this checkout, DGL on PyTorch)
import probe
import workload

TARGET = 1.7
TINY = {"size": workload.parse_size("20kx10"), "feat_dim": 8, "hidden": 16, "batch_size": 256, "fanouts": "10,5",
        "warmup": 2, "steps": 5, "rounds": 1}


def parse_args(argv: Any = None) -> Any:
    p = harness.base_parser("scaling", __doc__, rounds=3, tiny=TINY)
    p.add_argument("--procs", nargs="+", type=int, default=[1, 2], help="process counts (default: 1 2)")
    p.add_argument("--no-one-thread", action="store_true", help="skip the 1 process x 1 thread run")
    p.add_argument("--launcher", choices=("fork", "spawn"), default="fork")
    p.add_argument("--size", type=workload.parse_size, default=workload.parse_size("1Mx20"),
                   help="synthetic graph NODESxDEGREE (default 1Mx20: 1M nodes, 20M edges)")
    p.add_argument("--feat-dim", type=int, default=16)
    p.add_argument("--fanouts", default="25,20")
    p.add_argument("--hidden", type=int, default=32)
    p.add_argument("--batch-size", type=int, default=512)
    p.add_argument("--warmup", type=int, default=5, help="steps dropped before timing (default %(default)s)")
    p.add_argument("--steps", type=int, default=100, help="steps timed per run (default %(default)s)")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if min(args.procs + [args.warmup, args.steps, args.rounds]) < 1:
        p.error("--procs, --warmup, --steps and --rounds must be >= 1")
    args.argv, args.procs = list(sys.argv[1:] if argv is None else argv), sorted(set(args.procs))
    return args


def build(args: Any) -> Any:
    graph = workload.build_graph({"dataset": "synthetic", **args.size, "feat_dim": args.feat_dim})
    graph.create_formats_()
    return graph


def fit(graph: Any, args: Any, world: int, threads: Optional[int], out_dir: str) -> None:
    from graphtrainer import Trainer

    Trainer(num_procs=world, launcher=args.launcher, max_epochs=10**6, threads_per_proc=threads,
            max_steps=args.warmup + args.steps, progress_bar=False, logger=False, enable_model_summary=False,
            default_root_dir=os.path.join(out_dir, "runs"), callbacks=[probe.StepClock(out_dir)],
            ).fit(workload.BenchTask(graph, **workload.task_kwargs(args)))


def run_one(graph: Any, args: Any, world: int, threads: Optional[int]) -> Dict[str, Any]:
    """One fit. A 1-process fit runs in a fresh process's main thread, as a user's script does:
    not here (a backward pass here forbids later forks on a GPU machine), not in a forked child
    (a non-main thread, 20-50% slower); the worker rebuilds the same graph."""
    with tempfile.TemporaryDirectory(prefix="gt-scaling-") as tmp:
        if world == 1:
            cfg = json.dumps({"argv": args.argv, "threads": threads, "out_dir": tmp})
            harness.run_process([sys.executable, os.path.abspath(__file__), "--worker", cfg], "the 1-process run",
                                timeout=1800)
        else:
            fit(graph, args, world, threads, tmp)
        return dict(probe.step_throughput(tmp, world, args.warmup), world=world, default_threads=threads is None)


def summarise(runs: Dict[str, List[Dict[str, Any]]]) -> Dict[str, Any]:
    rows = [{"label": label, "procs": rs[0]["world"], "threads": rs[0]["torch_threads"], "runs": len(rs),
             "default_threads": rs[0]["default_threads"], "all_throughputs": [r["throughput_seeds_per_s"] for r in rs],
             **{k: harness.median([r[src] for r in rs]) for k, src in (
                 ("throughput", "throughput_seeds_per_s"), ("step_ms", "step_ms"), ("other_cores", "other_cores"))}}
            for label, rs in runs.items()]
    one, two = ({r["procs"]: r for r in rows if r["default_threads"]}.get(n) for n in (1, 2))
    for r in rows:
        r["speedup"] = r["throughput"] / one["throughput"] if one else None
    if not (one and two):
        return {"rows": rows, "targets": []}
    ratio, other = two["throughput"] / one["throughput"], max(one["other_cores"], two["other_cores"])
    return {"rows": rows, "targets": [{
        "what": f"throughput, 2 processes x {two['threads']} thread(s) / 1 process x {one['threads']} thread(s) "
                "(trainer defaults, plain runs)", "measured": ratio, "target": f">= {TARGET}", "met": ratio >= TARGET,
        "other_cores": other, "valid": other <= harness.NOISY_CORES}]}


def main(argv: Any = None) -> Dict[str, Any]:
    args = parse_args(argv)
    if args.worker:
        cfg = json.loads(args.worker)
        args = parse_args(cfg["argv"])
        fit(build(args), args, 1, cfg["threads"], cfg["out_dir"])
        return {}
    s = args.size
    probe.refuse_if_too_big([{"label": f"{workload.size_label(s)} {args.launcher} x{n}", "estimate_mb": probe.estimate_mb(
        s["num_nodes"], s["num_nodes"] * s["avg_degree"], args.feat_dim, f"gt-{args.launcher}", n)} for n in args.procs])
    graph = build(args)
    configs = [(1, 1)] if not args.no_one_thread and harness.available_cores() > 1 else []
    arms = {f"{n} process(es)" + (f" x {t} thread" if t else ""): (lambda rnd, n=n, t=t: run_one(graph, args, n, t))
            for n, t in configs + [(n, None) for n in args.procs]}
    runs, order = harness.interleave(arms, args.rounds, "scaling", lambda r: f"{r['throughput_seeds_per_s']:,.0f} "
                                     f"seeds/s, {r['step_ms']:.1f} ms/step, {r['torch_threads']} thread(s)")
    summary = summarise(runs)
    md = harness.markdown_table(
        ["processes", "threads per process", "runs", "seeds/s (median)", "each run", "vs 1 process", "ms / step",
         "other load (cores)"],
        [[r["label"], r["threads"], r["runs"], r["throughput"], " / ".join(f"{x:,.0f}" for x in r["all_throughputs"]),
          harness.fmt_ratio(r["speedup"]), r["step_ms"], f"{r['other_cores']:.2f}"] for r in summary["rows"]])
    md += "".join(f"\n\nTarget: {t['what']} {harness.fmt_ratio(t['measured'])} ({t['target']}: "
                  + ("met" if t["met"] else "**not met**") + harness.noise_note(t["other_cores"]) + ")"
                  for t in summary["targets"])
    payload = {"graph": {"nodes": graph.num_nodes(), "edges": graph.num_edges()}, "order": order, "runs": runs,
               "summary": summary["rows"], "targets": summary["targets"]}
    return harness.report(args, payload, md, harness.bar_plot(
        {r["label"]: r["throughput"] for r in summary["rows"]}, "seed nodes / s (steady state)"))


if __name__ == "__main__":
    main()
