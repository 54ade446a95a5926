"""Scaling: training throughput with 1, 2, ... CPU processes, and where a step's time goes.

    bash scripts/env.sh python benchmarks/scaling.py                 # full run
    bash scripts/env.sh python benchmarks/scaling.py --procs 1 2 4 8 # a machine with more cores
    bash scripts/env.sh python benchmarks/scaling.py --tiny          # seconds (smoke test)

Arms, interleaved: ``Trainer(num_procs=N)`` on ``steptimer.BreakdownTask`` for each N (and 1
process x 1 thread), ``plain`` (step ends only: throughput) and ``instrumented`` (each part
of a step timed). Target: 2 processes >= 1.7x one process on 2 cores.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import harness  # noqa: F401  (first: graphtrainer from this checkout, DGL on PyTorch)
import probe
import workload
import steptimer

NAME = "scaling"
TARGET = 1.7
LAUNCHERS = ("fork", "spawn")
MODES = ("plain", "instrumented")


def parse_args(argv: Any = None) -> Any:
    p = harness.base_parser(NAME, __doc__.split("\n\n")[0])
    p.add_argument("--procs", nargs="+", type=int, default=[1, 2], help="process counts (default: 1 2)")
    p.add_argument("--no-one-thread", action="store_true", help="skip the 1 process x 1 thread run")
    p.add_argument("--launcher", choices=LAUNCHERS, default="fork")
    p.add_argument("--size", type=workload.parse_size, default=workload.parse_size("1Mx20"),
                   help="synthetic graph NODESxDEGREE (default 1Mx20: 1M nodes, 20M edges)")
    p.add_argument("--feat-dim", type=int, default=16)
    p.add_argument("--fanouts", default="25,20")
    p.add_argument("--hidden", type=int, default=32)
    p.add_argument("--batch-size", type=int, default=512)
    p.add_argument("--warmup", type=int, default=5, help="steps dropped before timing (default %(default)s)")
    p.add_argument("--steps", type=int, default=100, help="steps timed per run (default %(default)s)")
    p.add_argument("--repeats", type=int, default=3, help="interleaved passes (default %(default)s)")
    p.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
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


def configs(args: Any) -> List[Tuple[int, Optional[int]]]:
    """``(processes, threads)``; threads None = what the trainer (or torch, for 1) chooses."""
    out: List[Tuple[int, Optional[int]]] = []
    if not args.no_one_thread and harness.available_cores() > 1:
        out.append((1, 1))
    return out + [(n, None) for n in args.procs]


def label(procs: int, threads: int) -> str:
    return f"{procs} x {threads} thread{'s' if threads > 1 else ''}"


def _fit(graph: Any, args: Any, world: int, mode: str, threads: Optional[int], out_dir: str) -> None:
    from graphtrainer import Trainer

    task = steptimer.BreakdownTask(graph, out_dir, fanouts=[int(f) for f in args.fanouts.split(",")],
                                   hidden=args.hidden, batch_size=args.batch_size,
                                   instrument=(mode == "instrumented"))
    trainer = Trainer(num_procs=world, launcher=args.launcher, max_epochs=10**6, threads_per_proc=threads,
                      max_steps=args.warmup + args.steps, progress_bar=False, logger=False,
                      default_root_dir=os.path.join(out_dir, "runs"))
    trainer.fit(task)


def _single_in_fresh_process(args: Any, mode: str, threads: Optional[int], out_dir: str) -> None:
    """A 1-process fit in a fresh process's main thread, as a user's script runs: not here (a
    backward pass here forbids later forks on a GPU machine), not in a forked child (it would
    train in a non-main thread, 20-50% slower). The worker rebuilds the same graph."""
    import json
    import subprocess

    cfg = {"argv": args.argv, "mode": mode, "threads": threads, "out_dir": out_dir}
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", json.dumps(cfg)],
                          capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"the 1-process run ({mode}) failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")


def worker_main(text: str) -> None:
    import json

    cfg = json.loads(text)
    args = parse_args(cfg["argv"])
    _fit(build(args)[0], args, 1, cfg["mode"], cfg["threads"], cfg["out_dir"])


def build(args: Any) -> Tuple[Any, float]:
    s = args.size
    t = time.perf_counter()
    graph = workload.build_graph({"dataset": "synthetic", "num_nodes": s["num_nodes"], "avg_degree": s["avg_degree"],
                                "feat_dim": args.feat_dim, "num_classes": 8, "seed": 0})
    graph.create_formats_()
    return graph, time.perf_counter() - t


def run_one(graph: Any, args: Any, world: int, mode: str, threads: Optional[int] = None) -> Dict[str, Any]:
    import json

    with tempfile.TemporaryDirectory(prefix="gt-scaling-") as tmp:
        t = time.perf_counter()
        if world == 1:
            _single_in_fresh_process(args, mode, threads, tmp)
        else:
            _fit(graph, args, world, mode, threads, tmp)
        wall = time.perf_counter() - t
        ranks = []
        for r in range(world):
            path = Path(tmp) / f"rank_{r}.json"
            if not path.exists():
                raise RuntimeError(f"{world} procs, {mode}: rank {r} wrote no timings")
            ranks.append(steptimer.summarize_rank(json.loads(path.read_text()), args.warmup))
    window = max(r["window_s"] for r in ranks)
    seeds = sum(r["seeds"] for r in ranks)
    parts = {p: sum(r["ms_per_step"][p] for r in ranks) / len(ranks) for p in steptimer.PARTS}
    return {"world": world, "mode": mode, "fit_wall_s": round(wall, 2), "window_s": round(window, 4),
            "seeds": seeds, "throughput_seeds_per_s": round(seeds / window, 1),
            "step_ms": sum(r["step_ms"] for r in ranks) / len(ranks),
            "torch_threads": ranks[0]["torch_threads"], "dgl_threads": ranks[0]["dgl_threads"],
            "ms_per_step": parts, "ranks": ranks}


def summarize(runs: List[Dict[str, Any]]) -> Dict[str, Any]:
    rows = []
    for mode in MODES:
        groups: Dict[Tuple[int, int], List[Dict[str, Any]]] = {}
        for r in runs:
            if r["mode"] == mode and "result" in r:
                groups.setdefault((r["world"], r["result"]["torch_threads"]), []).append(r)
        for (n, t), group in groups.items():
            rs = [r["result"] for r in group]
            parts = {p: harness.median([r["ms_per_step"][p] for r in rs]) for p in steptimer.PARTS}
            step = harness.median([r["step_ms"] for r in rs])
            rows.append({"mode": mode, "procs": n, "threads": t, "label": label(n, t), "runs": len(rs),
                         "default_threads": any(r["default_threads"] for r in group),
                         "throughput": harness.median([r["throughput_seeds_per_s"] for r in rs]),
                         "all_throughputs": [r["throughput_seeds_per_s"] for r in rs],
                         "step_ms": step, "ms_per_step": parts,
                         "sample_share": parts["sample"] / step if step else None,
                         "data_share": (parts["sample"] + parts["gather"]) / step if step else None,
                         "other_cores": harness.median([r["other_cores"] for r in rs]),
                         "all_other_cores": [r["other_cores"] for r in rs]})
        mine = [r for r in rows if r["mode"] == mode]
        base = next((r for r in mine if r["procs"] == 1 and r["default_threads"]), None)
        one = next((r for r in mine if r["procs"] == 1 and r["threads"] == 1), None)
        for r in mine:
            r["speedup"] = r["throughput"] / base["throughput"] if base else None
            r["speedup_vs_1x1"] = r["throughput"] / one["throughput"] if one else None
    tgt = []
    plain = [r for r in rows if r["mode"] == "plain" and r["default_threads"]]
    one = next((r for r in plain if r["procs"] == 1), None)
    two = next((r for r in plain if r["procs"] == 2), None)
    if one and two:
        ratio = two["throughput"] / one["throughput"]
        other = max(one["other_cores"], two["other_cores"])
        tgt.append({"what": f"throughput, 2 processes x {two['threads']} thread(s) / 1 process x {one['threads']} "
                            "thread(s) (trainer defaults, plain runs)", "measured": ratio,
                    "target": f">= {TARGET}", "met": ratio >= TARGET, "other_cores": other,
                    "valid": other <= harness.NOISY_CORES})
    return {"rows": rows, "targets": tgt}


def render(summary: Dict[str, Any], args: Any, cores: int) -> str:
    rows = summary["rows"]
    md = harness.markdown_table(
        ["mode", "processes x threads", "runs", "seeds/s (median)", "each run (other load, cores)", "vs 1 process (default threads)",
         "vs 1 x 1 thread", "ms / step per rank (median)", "other load (cores, median)"],
        [[r["mode"], r["label"] + ("" if r["default_threads"] else " (threads_per_proc=1)"), r["runs"], r["throughput"],
          " / ".join(f"{x:,.0f} ({c:.2f})" for x, c in zip(r["all_throughputs"], r["all_other_cores"])),
          harness.fmt_ratio(r["speedup"]),
          harness.fmt_ratio(r["speedup_vs_1x1"]), r["step_ms"], f"{r['other_cores']:.2f}"]
         for r in rows])
    inst = [r for r in rows if r["mode"] == "instrumented"]
    if inst:
        md += ("\n\nWhere a step's time goes (instrumented runs; ms per step, mean over ranks, median over runs;"
               " `other` = the step's wall time not covered by the timed parts)\n\n")
        md += harness.markdown_table(
            ["processes x threads"] + list(steptimer.PARTS) + ["step", "sample share", "sample + gather share"],
            [[r["label"]] + [r["ms_per_step"][p] for p in steptimer.PARTS]
             + [r["step_ms"], f"{100 * r['sample_share']:.0f}%", f"{100 * r['data_share']:.0f}%"] for r in inst])
    if summary["targets"]:
        md += "\n\nTarget (" + f"{cores} cores on this machine)\n\n" + harness.markdown_table(
            ["ratio", "measured", "target", "met"],
            [[t["what"], harness.fmt_ratio(t["measured"]), t["target"],
              ("yes" if t["met"] else "**no**") + harness.noise_note(t["other_cores"])] for t in summary["targets"]])
    return md


def plot(summary: Dict[str, Any]) -> Any:
    return harness.bar_plot({f"{r['label']}\n{r['mode']}": r["throughput"] for r in summary["rows"]},
                            "seed nodes / s (steady state)")


def main(argv: Any = None) -> Dict[str, Any]:
    args = parse_args(argv)
    if args.worker:
        worker_main(args.worker)
        return {}
    s = args.size
    num_edges = s["num_nodes"] * s["avg_degree"]
    launcher = {"fork": "gt-fork", "spawn": "gt-spawn"}[args.launcher]
    probe.refuse_if_too_big([{"label": f"{workload.size_label(s)} {args.launcher} x{n}",
                               "estimate_mb": probe.estimate_mb(s["num_nodes"], num_edges, args.feat_dim, launcher, n)}
                              for n in args.procs])
    machine = harness.machine_info()
    if max(args.procs) > (machine["cpus"] or 1):
        print(f"[{NAME}] note: {max(args.procs)} processes on {machine['cpus']} cores", flush=True)
    t_start = time.time()
    graph, build_s = build(args)
    print(f"[{NAME}] graph {workload.size_label(s)}: {graph.num_nodes():,} nodes, {graph.num_edges():,} edges, "
          f"built in {build_s:.1f} s", flush=True)
    runs = [{"world": n, "threads": t, "default_threads": t is None, "mode": m, "repeat": rep}
            for rep in range(args.repeats) for n, t in configs(args) for m in args.modes]
    for i, run in enumerate(runs):
        run["loadavg_1min_before"] = round(os.getloadavg()[0], 2)
        what = f"{run['world']} proc(s)" + (f" x {run['threads']} thread(s)" if run["threads"] else "")
        print(f"[{NAME}] {i + 1}/{len(runs)} {what}, {run['mode']} (load {run['loadavg_1min_before']})", flush=True)
        with harness.LoadMeter() as meter:
            run["result"] = run_one(graph, args, run["world"], run["mode"], run["threads"])
        r = run["result"]
        r["other_cores"] = meter.other_cores
        print(f"    {r['throughput_seeds_per_s']:,.0f} seeds/s, {r['step_ms']:.1f} ms/step, "
              f"{r['torch_threads']} thread(s)/proc, fit {r['fit_wall_s']:.1f} s, other load {meter.other_cores} cores",
              flush=True)
    summary = summarize(runs)
    md = render(summary, args, machine["cpus"])
    payload = {"benchmark": NAME, "machine": machine, "versions": harness.versions(),
               "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
               "graph": {"nodes": graph.num_nodes(), "edges": graph.num_edges(), "build_s": round(build_s, 2)},
               "wall_s": round(time.time() - t_start, 1), "runs": runs, "summary": summary["rows"],
               "targets": summary["targets"]}
    harness.write_outputs(args.out, NAME, payload, md, plot(summary))
    print(md)
    return payload


if __name__ == "__main__":
    main()
