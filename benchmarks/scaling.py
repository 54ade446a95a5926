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
from typing import Any, Dict, List, Optional, Tuple

import harness  # noqa: F401  (first: graphtrainer from this checkout, DGL on PyTorch)
import probe
import workload

NAME = "scaling"
TARGET = 1.7


def parse_args(argv: Any = None) -> Any:
    p = harness.base_parser(NAME, __doc__)
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
    p.add_argument("--repeats", type=int, default=3, help="interleaved passes (default %(default)s)")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.argv = list(argv) if argv is not None else sys.argv[1:]
    if args.tiny:
        args.size = workload.parse_size("20kx10")
        args.feat_dim, args.hidden, args.batch_size = 8, 16, 256
        args.fanouts, args.warmup, args.steps, args.repeats = "10,5", 2, 5, 1
    if any(n < 1 for n in args.procs):
        p.error("--procs must be >= 1")
    if args.warmup < 1 or args.steps < 1 or args.repeats < 1:
        p.error("--warmup, --steps and --repeats must be >= 1")
    args.procs = sorted(set(args.procs))
    return args


def build(args: Any) -> Any:
    s = args.size
    graph = workload.build_graph({"dataset": "synthetic", "num_nodes": s["num_nodes"], "avg_degree": s["avg_degree"],
                                  "feat_dim": args.feat_dim, "num_classes": 8, "seed": 0})
    graph.create_formats_()
    return graph


def _fit(graph: Any, args: Any, world: int, threads: Optional[int], out_dir: str) -> None:
    from graphtrainer import Trainer

    task = workload.BenchTask(graph, fanouts=[int(f) for f in args.fanouts.split(",")], hidden=args.hidden,
                              batch_size=args.batch_size, lr=3e-3, dropout=0.5)
    Trainer(num_procs=world, launcher=args.launcher, max_epochs=10**6, threads_per_proc=threads,
            max_steps=args.warmup + args.steps, progress_bar=False, logger=False, enable_model_summary=False,
            default_root_dir=os.path.join(out_dir, "runs"), callbacks=[probe.StepClock(out_dir)]).fit(task)


def run_one(graph: Any, args: Any, world: int, threads: Optional[int]) -> Dict[str, Any]:
    """One fit. A 1-process fit runs in a fresh process's main thread, as a user's script does:
    not here (a backward pass here forbids later forks on a GPU machine), not in a forked child
    (a non-main thread, 20-50% slower); the worker rebuilds the same graph."""
    with tempfile.TemporaryDirectory(prefix="gt-scaling-") as tmp:
        if world == 1:
            cfg = {"argv": args.argv, "threads": threads, "out_dir": tmp}
            harness.run_process([sys.executable, os.path.abspath(__file__), "--worker", json.dumps(cfg)],
                                "the 1-process run", timeout=1800)
        else:
            _fit(graph, args, world, threads, tmp)
        return dict(probe.step_throughput(tmp, world, args.warmup), world=world, default_threads=threads is None)


def summarize(runs: Dict[str, List[Dict[str, Any]]]) -> Dict[str, Any]:
    rows = [{"procs": rs[0]["world"], "threads": rs[0]["torch_threads"], "default_threads": rs[0]["default_threads"],
             "label": label, "runs": len(rs), "all_throughputs": [r["throughput_seeds_per_s"] for r in rs],
             "throughput": harness.median([r["throughput_seeds_per_s"] for r in rs]),
             "step_ms": harness.median([r["step_ms"] for r in rs]),
             "other_cores": harness.median([r["other_cores"] for r in rs])} for label, rs in runs.items()]
    one = next((r for r in rows if r["procs"] == 1 and r["default_threads"]), None)
    two = next((r for r in rows if r["procs"] == 2 and r["default_threads"]), None)
    for r in rows:
        r["speedup"] = r["throughput"] / one["throughput"] if one else None
    tgt = []
    if one and two:
        ratio, other = two["throughput"] / one["throughput"], max(one["other_cores"], two["other_cores"])
        tgt.append({"what": f"throughput, 2 processes x {two['threads']} thread(s) / 1 process x {one['threads']} "
                            "thread(s) (trainer defaults, plain runs)", "measured": ratio, "target": f">= {TARGET}",
                    "met": ratio >= TARGET, "other_cores": other, "valid": other <= harness.NOISY_CORES})
    return {"rows": rows, "targets": tgt}


def main(argv: Any = None) -> Dict[str, Any]:
    args = parse_args(argv)
    if args.worker:
        cfg = json.loads(args.worker)
        args = parse_args(cfg["argv"])
        _fit(build(args), args, 1, cfg["threads"], cfg["out_dir"])
        return {}
    s = args.size
    launcher = {"fork": "gt-fork", "spawn": "gt-spawn"}[args.launcher]
    probe.refuse_if_too_big([{"label": f"{workload.size_label(s)} {args.launcher} x{n}", "estimate_mb": probe.estimate_mb(
        s["num_nodes"], s["num_nodes"] * s["avg_degree"], args.feat_dim, launcher, n)} for n in args.procs])
    graph = build(args)
    configs: List[Tuple[int, Optional[int]]] = [(1, 1)] if not args.no_one_thread and harness.available_cores() > 1 else []
    configs += [(n, None) for n in args.procs]
    runs, order = harness.interleave(
        {f"{n} process(es)" + (f" x {t} thread" if t else ""): (lambda rnd, n=n, t=t: run_one(graph, args, n, t))
         for n, t in configs}, args.repeats, NAME,
        lambda r: f"{r['throughput_seeds_per_s']:,.0f} seeds/s, {r['step_ms']:.1f} ms/step, {r['torch_threads']} thread(s)")
    summary = summarize(runs)
    md = harness.markdown_table(
        ["processes", "threads per process", "runs", "seeds/s (median)", "each run", "vs 1 process", "ms / step",
         "other load (cores)"],
        [[r["label"], r["threads"], r["runs"], r["throughput"], " / ".join(f"{x:,.0f}" for x in r["all_throughputs"]),
          harness.fmt_ratio(r["speedup"]), r["step_ms"], f"{r['other_cores']:.2f}"] for r in summary["rows"]])
    md += "\n\n" + "\n".join(f"Target: {t['what']} {harness.fmt_ratio(t['measured'])} ({t['target']}: "
                             + ("met" if t["met"] else "**not met**") + harness.noise_note(t["other_cores"]) + ")"
                             for t in summary["targets"])
    payload = {"config": {k: str(v) for k, v in vars(args).items()}, "graph": {"nodes": graph.num_nodes(),
               "edges": graph.num_edges()}, "order": order, "runs": runs, "summary": summary["rows"],
               "targets": summary["targets"]}
    harness.write_outputs(args.out, NAME, payload, md, harness.bar_plot(
        {r["label"]: r["throughput"] for r in summary["rows"]}, "seed nodes / s (steady state)"))
    print(md)
    return payload


if __name__ == "__main__":
    main()
