"""Scaling: what training throughput 2 (or more) CPU processes give over 1 (target: 2 processes
>= 1.7x one process on 2 cores). Arms, interleaved: ``Trainer(num_procs=N)`` on
``workload.BenchTask`` for each N, and 1 process x 1 thread, each fit in a fresh process; seeds/s
from each rank's step ends (``probe.StepClock``) after ``--warmup`` steps.

    bash scripts/env.sh python benchmarks/scaling.py                 # full run
    bash scripts/env.sh python benchmarks/scaling.py --procs 1 2 4 8 # a machine with more cores
    bash scripts/env.sh python benchmarks/scaling.py --tiny          # seconds (smoke test)
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
    p.add_argument("--repeats", dest="rounds", type=int, help=argparse.SUPPRESS)  # the old name of --rounds
    p.add_argument("--worker", help=argparse.SUPPRESS)  # one fit: its ranks, threads and output folder
    args = p.parse_args(argv)
    if min(args.procs + [args.warmup, args.steps, args.rounds]) < 1:
        p.error("--procs, --warmup, --steps and --rounds must be >= 1")
    args.argv, args.procs = list(sys.argv[1:] if argv is None else argv), sorted(set(args.procs))
    return args


def fit(args: Any, world: int, threads: Optional[int], out_dir: str) -> None:
    """The worker's fit: its own graph, every rank's step ends to ``out_dir``."""
    from graphtrainer import Trainer

    graph = workload.build_graph({"dataset": "synthetic", **args.size, "feat_dim": args.feat_dim})
    graph.create_formats_()
    Trainer(num_procs=world, launcher=args.launcher, max_epochs=10**6, threads_per_proc=threads,
            max_steps=args.warmup + args.steps, progress_bar=False, logger=False, enable_model_summary=False,
            default_root_dir=os.path.join(out_dir, "runs"), callbacks=[probe.StepClock(out_dir)],
            ).fit(workload.BenchTask(graph, **workload.task_kwargs(args)))


def run_one(args: Any, world: int, threads: Optional[int]) -> Dict[str, Any]:
    """One fit in a fresh process, launched from its main thread as a user's script is: not here (a
    backward pass here forbids later forks on a GPU machine), not in a forked child (a non-main
    thread, 20-50% slower for 1 process)."""
    with tempfile.TemporaryDirectory(prefix="gt-scaling-") as tmp:
        harness.run_process([sys.executable, os.path.abspath(__file__), *args.argv, "--worker", json.dumps(
            {"world": world, "threads": threads, "out_dir": tmp})], f"the {world}-process run", timeout=1800)
        return dict(probe.step_throughput(tmp, world, args.warmup), world=world, default_threads=threads is None)


def summarise(runs: Dict[str, List[Dict[str, Any]]]) -> Dict[str, Any]:
    rows = [{"label": label, "procs": rs[0]["world"], "threads": rs[0]["torch_threads"],
             "default_threads": rs[0]["default_threads"], "all_throughputs": [r["throughput_seeds_per_s"] for r in rs],
             "throughput": harness.median([r["throughput_seeds_per_s"] for r in rs]),
             "step_ms": harness.median([r["step_ms"] for r in rs]),
             "other_cores": harness.median([r["other_cores"] for r in rs])} for label, rs in runs.items()]
    plain = {r["procs"]: r for r in rows if r["default_threads"]}  # the trainer's default threads
    for r in rows:
        r["speedup"] = r["throughput"] / plain[1]["throughput"] if 1 in plain else None
    if not {1, 2} <= set(plain):
        return {"summary": rows, "targets": []}
    one, two = plain[1], plain[2]
    what = f"throughput, 2 processes x {two['threads']} thread(s) / 1 process x {one['threads']} thread(s)"
    return {"summary": rows, "targets": [{
        "what": f"{what} (trainer defaults, plain runs)", "measured": two["speedup"], "target": f">= {TARGET}",
        "met": two["speedup"] >= TARGET, "other_cores": max(one["other_cores"], two["other_cores"])}]}


def main(argv: Any = None) -> Dict[str, Any]:
    args = parse_args(argv)
    if args.worker:
        cfg = json.loads(args.worker)
        fit(args, cfg["world"], cfg["threads"], cfg["out_dir"])
        return {}
    graph = {"nodes": args.size["num_nodes"], "edges": args.size["num_nodes"] * args.size["avg_degree"]}
    probe.refuse_if_too_big([{"label": f"{workload.size_label(args.size)} {args.launcher} x{n}", "estimate_mb":
                              probe.estimate_mb(*graph.values(), args.feat_dim, f"gt-{args.launcher}", n)}
                             for n in args.procs])
    configs = [(1, 1)] if not args.no_one_thread and harness.available_cores() > 1 else []
    arms = {f"{n} process(es)" + (f" x {t} thread" if t else ""): (lambda rnd, n=n, t=t: run_one(args, n, t))
            for n, t in configs + [(n, None) for n in args.procs]}
    runs, order = harness.interleave(arms, args.rounds, "scaling", lambda r: f"{r['throughput_seeds_per_s']:,.0f} "
                                     f"seeds/s, {r['step_ms']:.1f} ms/step, {r['torch_threads']} thread(s)")
    result = summarise(runs)
    md = harness.markdown_table(
        ["processes", "threads per process", "seeds/s (median)", "each run", "vs 1 process", "ms / step", "other load"],
        [[r["label"], r["threads"], r["throughput"], " / ".join(f"{x:,.0f}" for x in r["all_throughputs"]),
          harness.fmt_ratio(r["speedup"]), r["step_ms"], f"{r['other_cores']:.2f} cores"] for r in result["summary"]])
    for t in result["targets"]:
        md += (f"\n\nTarget: {t['what']} {harness.fmt_ratio(t['measured'])} ({t['target']}: "
               f"{'met' if t['met'] else '**not met**'}{harness.noise_note(t['other_cores'])})")
    return harness.report(args, {"graph": graph, "order": order, "runs": runs, **result}, md, harness.bar_plot(
        {r["label"]: r["throughput"] for r in result["summary"]}, "seed nodes / s (steady state)"))


if __name__ == "__main__":
    main()
