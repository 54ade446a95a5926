"""Fork vs spawn: start-up time, total memory (PSS), per-rank private memory (USS) and
steady-state throughput of graphtrainer's launchers against a tutorial-style naive spawn.

    bash scripts/env.sh python benchmarks/fork_vs_spawn.py            # full matrix
    bash scripts/env.sh python benchmarks/fork_vs_spawn.py --tiny     # seconds

Launchers: ``gt-fork``, ``gt-forkserver``, ``gt-spawn`` (``Trainer(num_procs=N, launcher=...)``),
``naive-spawn`` (the hand-written loop: every child unpickles its own copy of the graph).
World size 1 is one in-process run, the baseline of every ratio. Each run is a fresh worker
process unless ``--no-isolate``. Start-up = the slowest rank's first-step delay after ``fit``;
at step ``--pause-at`` every rank waits while ``probe.MemoryWatcher`` reads the process
tree's PSS/USS; throughput = seeds of the next ``--measure-steps`` steps over their wall time.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List

import harness  # first: graphtrainer from this checkout, DGL on PyTorch
import handwritten
import probe
import workload

NAME = "fork_vs_spawn"
LAUNCHERS = ("gt-fork", "gt-forkserver", "gt-spawn", "naive-spawn")


def parse_args(argv: Any = None) -> Any:
    p = harness.base_parser(NAME, __doc__.split("\n\n")[0])
    p.add_argument("--datasets", nargs="+", choices=workload.DATASETS, default=list(workload.DATASETS))
    p.add_argument("--sizes", nargs="+", type=workload.parse_size, default=None,
                   help="synthetic sizes NODESxDEGREE (default: 250kx10 1Mx10 2Mx10 5Mx10)")
    p.add_argument("--feat-dim", type=int, default=64)
    p.add_argument("--launchers", nargs="+", choices=LAUNCHERS, default=list(LAUNCHERS))
    p.add_argument("--world-sizes", nargs="+", type=int, default=[1, 2, 4])
    p.add_argument("--fanouts", default="10,10")
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=1024, help="synthetic graphs (Tolokers: 256)")
    p.add_argument("--pause-at", type=int, default=3, help="step at which memory is measured")
    p.add_argument("--measure-steps", type=int, default=20, help="steps timed for throughput")
    p.add_argument("--repeats", type=int, default=1, help="passes over the whole (interleaved) matrix")
    p.add_argument("--no-isolate", action="store_true",
                   help="run every configuration in this process (faster; memory figures then carry what "
                        "earlier runs left behind; --tiny implies it)")
    p.add_argument("--memory-limit-gb", type=float, default=None,
                   help="leave out (or, when none fits, refuse) runs estimated above this much memory "
                        "(default: 90%% of the machine's)")
    p.add_argument("--skip-too-big", action="store_true",
                   help="run what fits and list the rest, instead of refusing the whole plan")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.tiny:
        args.sizes = args.sizes or [workload.parse_size("20kx5")]
        if "--datasets" not in (argv if argv is not None else sys.argv[1:]):
            args.datasets = ["synthetic"]
        if "--world-sizes" not in (argv if argv is not None else sys.argv[1:]):
            args.world_sizes = [1, 2]
        args.feat_dim, args.hidden, args.batch_size = 16, 32, 256
        args.pause_at, args.measure_steps = 1, 3
        args.no_isolate = True
    args.sizes = args.sizes or [workload.parse_size(s) for s in ("250kx10", "1Mx10", "2Mx10", "5Mx10")]
    if any(w < 1 for w in args.world_sizes):
        p.error("--world-sizes must be >= 1")
    return args


# ---------------------------------------------------------------------------------------
def plan(args: Any) -> List[Dict[str, Any]]:
    """Every run, interleaved: per graph and world size, the launchers one after another."""
    runs = []
    for rep in range(args.repeats):
        for spec in workload.graph_specs(args.datasets, args.sizes, args.feat_dim, args.batch_size):
            for world in sorted(set(args.world_sizes)):
                launchers = ["single"] if world == 1 else list(args.launchers)
                for launcher in launchers:
                    est = probe.estimate_mb(spec["num_nodes"], spec["num_edges"], spec["feat_dim"], launcher, world)
                    runs.append({"graph": spec, "launcher": launcher, "world": world, "repeat": rep,
                                 "estimate_mb": round(est), "label": f"{spec['label']} {launcher} x{world}",
                                 "fanouts": [int(f) for f in args.fanouts.split(",")], "hidden": args.hidden,
                                 "pause_at": args.pause_at, "measure_steps": args.measure_steps})
    if args.no_isolate:
        # All runs share this process: train in it (the 1-process runs) only after every fork
        # launch, since on a machine with GPUs graphtrainer refuses to fork after a backward pass.
        runs.sort(key=lambda r: (r["repeat"], r["launcher"] == "single"))
    return runs


# ---------------------------------------------------------------------------------------
def run_one(cfg: Dict[str, Any]) -> Dict[str, Any]:
    """One configuration, in this process (the launching process whose tree is measured)."""
    from graphtrainer import Trainer

    spec, launcher, world = cfg["graph"], cfg["launcher"], cfg["world"]
    graph = workload.build_graph(spec)
    probe_dir = tempfile.mkdtemp(prefix="gt-bench-")
    pr = probe.Probe(probe_dir, cfg["pause_at"], cfg["measure_steps"])
    watcher = probe.MemoryWatcher(probe_dir, world).start()
    threads = max(1, harness.available_cores() // world)
    try:
        t_fit = time.time()
        if launcher == "naive-spawn":
            hcfg = {"fanouts": cfg["fanouts"], "hidden": cfg["hidden"], "batch_size": spec["batch_size"],
                    "lr": 3e-3, "dropout": 0.5, "epochs": 10_000, "threads": threads, "seed": 0,
                    "probe_dir": probe_dir, "pause_at": cfg["pause_at"], "measure_steps": cfg["measure_steps"],
                    "max_steps": pr.total_steps}
            handwritten.naive_spawn(graph, world, hcfg)
        else:
            task = workload.BenchTask(graph, fanouts=cfg["fanouts"], hidden=cfg["hidden"],
                                    batch_size=spec["batch_size"], dropout=0.5)
            method = {"single": "auto", "gt-fork": "fork", "gt-spawn": "spawn",
                      "gt-forkserver": "forkserver"}[launcher]
            trainer = Trainer(num_procs=world, launcher=method, max_epochs=10_000, max_steps=pr.total_steps,
                              progress_bar=False, logger=False, default_root_dir=os.path.join(probe_dir, "runs"),
                              callbacks=[probe.ProbeCallback(pr)])
            trainer.fit(task)
    finally:
        watcher.stop()
    try:
        if watcher.steady is None:
            raise RuntimeError(f"{cfg['label']}: the ranks never paused for the memory measurement")
        res = probe.collect_probe(probe_dir, world, t_fit)
    finally:
        shutil.rmtree(probe_dir, ignore_errors=True)
    steady = watcher.steady
    rank_pids = res.pop("rank_pids")
    by_pid = {p["pid"]: p for p in steady["processes"]}
    for p in steady["processes"]:
        if p["role"] == "child":
            p["role"] = f"rank {rank_pids.index(p['pid'])}" if p["pid"] in rank_pids else "helper"
    ranks = [by_pid[pid] for pid in rank_pids if pid in by_pid and by_pid[pid]["role"] != "parent"]
    res.update({k: steady[k] for k in ("total_pss_mb", "parent_pss_mb", "processes")})
    res.update({"rank_uss_mb": [p["uss_mb"] for p in ranks], "rank_pss_mb": [p["pss_mb"] for p in ranks],
                "peak_total_pss_mb": round(max(watcher.peak_pss_mb, steady["total_pss_mb"]), 1)})
    return res


def run_isolated(cfg: Dict[str, Any]) -> Dict[str, Any]:
    """:func:`run_one` in a fresh worker process (``--worker``)."""
    with tempfile.TemporaryDirectory(prefix="gt-bench-worker-") as tmp:
        cfg = dict(cfg, result_file=str(Path(tmp) / "result.json"))
        harness.run_process([sys.executable, os.path.abspath(__file__), "--worker", json.dumps(cfg)], cfg["label"])
        return json.loads(Path(cfg["result_file"]).read_text())


# ---------------------------------------------------------------------------------------
def summarize(runs: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Mean over repeats per (graph, launcher, world), with ratios to the 1-process run."""
    groups: Dict[tuple, List[Dict[str, Any]]] = {}
    for r in runs:
        if "result" in r:
            groups.setdefault((r["graph"]["label"], r["launcher"], r["world"]), []).append(r["result"])
    rows = []
    for (g, launcher, world), results in groups.items():
        def mean(key: str) -> float:
            return sum(x[key] for x in results) / len(results)

        uss = [u for x in results for u in x["rank_uss_mb"]]
        rows.append({"graph": g, "launcher": launcher, "world": world, "n": len(results),
                     "startup_s": mean("startup_s"), "total_pss_mb": mean("total_pss_mb"),
                     "peak_total_pss_mb": mean("peak_total_pss_mb"), "rank_uss_mean_mb": sum(uss) / len(uss) if uss else None,
                     "throughput": mean("throughput_seeds_per_s"), "other_cores": mean("other_cores")})
    for row in rows:
        base = _row(rows, row["graph"], "single", 1)
        row["pss_ratio"] = row["total_pss_mb"] / base["total_pss_mb"] if base else None
        for launcher in ("gt-spawn", "gt-fork"):
            other = _row(rows, row["graph"], launcher, row["world"])
            row[f"startup_vs_{launcher.replace('-', '_')}"] = (row["startup_s"] / other["startup_s"]
                                                               if other and row["world"] > 1 else None)
    return rows


#: Total PSS with 4 ranks over the 1-process run (issue 16).
TARGETS = {"gt-fork": 1.30, "gt-forkserver": 1.45, "gt-spawn": 2.0}
#: gt-forkserver start-up over gt-fork's, same world size.
FORKSERVER_STARTUP = 1.5
TARGET_WORLD = 4


def _row(rows: List[Dict[str, Any]], graph: str, launcher: str, world: int) -> Any:
    return next((r for r in rows if (r["graph"], r["launcher"], r["world"]) == (graph, launcher, world)), None)


def targets(rows: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """PSS ratios at 4 ranks (else at the largest world size, marked); start-up ratios
    gt-fork / gt-spawn and gt-forkserver / gt-fork at every world size."""
    out = []
    for g in dict.fromkeys(r["graph"] for r in rows):
        worlds = sorted({r["world"] for r in rows if r["graph"] == g and r["world"] > 1})
        if not worlds:
            continue
        w = TARGET_WORLD if TARGET_WORLD in worlds else worlds[-1]
        note = "" if w == TARGET_WORLD else f" (no {TARGET_WORLD}-rank run: shown at {w})"
        for launcher, limit in TARGETS.items():
            row = _row(rows, g, launcher, w)
            if row and row["pss_ratio"] is not None:  # memory does not depend on other load
                out.append({"graph": g, "what": f"{launcher} total PSS, {w} ranks / 1 process{note}",
                            "measured": row["pss_ratio"], "target": f"<= {limit}", "met": row["pss_ratio"] <= limit,
                            "valid": True})
        for w in worlds:
            for a, b, key, limit in (("gt-fork", "gt-spawn", "startup_vs_gt_spawn", 1 / 3),
                                     ("gt-forkserver", "gt-fork", "startup_vs_gt_fork", FORKSERVER_STARTUP)):
                row, base = _row(rows, g, a, w), _row(rows, g, b, w)
                if row and base and row[key] is not None:
                    other = max(row["other_cores"], base["other_cores"])
                    out.append({"graph": g, "what": f"{a} start-up / {b} start-up, {w} ranks", "measured": row[key],
                                "target": f"<= {limit:.2f}", "met": row[key] <= limit, "other_cores": other,
                                "valid": other <= harness.NOISY_CORES})
    return out


def render(rows: List[Dict[str, Any]], tgts: List[Dict[str, Any]]) -> str:
    md = harness.markdown_table(
        ["graph", "launcher", "ranks", "first step s", "total PSS MB", "PSS / 1 proc", "peak PSS MB",
         "rank USS MB (mean)", "seeds/s", "start-up / gt-spawn", "start-up / gt-fork", "other load (cores)"],
        [[r["graph"], "1 process" if r["launcher"] == "single" else r["launcher"], r["world"], r["startup_s"],
          r["total_pss_mb"], harness.fmt_ratio(r["pss_ratio"]), r["peak_total_pss_mb"],
          r["rank_uss_mean_mb"] if r["world"] > 1 else "", r["throughput"], harness.fmt_ratio(r["startup_vs_gt_spawn"]),
          harness.fmt_ratio(r.get("startup_vs_gt_fork")), f"{r['other_cores']:.2f}"] for r in rows])
    if tgts:
        md += "\n\nTargets\n\n" + harness.markdown_table(
            ["graph", "ratio", "measured", "target", "met"],
            [[t["graph"], t["what"], harness.fmt_ratio(t["measured"]), t["target"],
              ("yes" if t["met"] else "**no**") + harness.noise_note(t.get("other_cores", 0.0))] for t in tgts])
    return md


def main(argv: Any = None) -> Dict[str, Any]:
    args = parse_args(argv)
    if args.worker:
        cfg = json.loads(args.worker)
        Path(cfg["result_file"]).write_text(json.dumps(run_one(cfg)))
        return {}
    runs = plan(args)
    limit_mb = args.memory_limit_gb * 1024 if args.memory_limit_gb else None
    planned = len(runs)
    runs = probe.refuse_if_too_big(runs, limit_mb=limit_mb, skip=args.skip_too_big)
    skipped = planned - len(runs)
    machine = harness.machine_info()
    t_start = time.time()
    for i, run in enumerate(runs):
        print(f"[{NAME}] {i + 1}/{len(runs)} {run['label']} (estimate {run['estimate_mb']} MB)", flush=True)
        load = os.getloadavg()[0]
        run["loadavg_1min_before"] = round(load, 2)
        t_run = time.perf_counter()
        try:
            with harness.LoadMeter() as meter:
                run["result"] = run_one(run) if args.no_isolate else run_isolated(run)
        except RuntimeError as err:
            if args.no_isolate:
                raise
            # One failed configuration must not cost the others: record it, go on.
            run["error"] = str(err)[-4000:]
            print(f"    FAILED: {str(err)[-2000:]}", flush=True)
            continue
        run["run_wall_s"] = round(time.perf_counter() - t_run, 1)
        run["result"]["other_cores"] = meter.other_cores
        r = run["result"]
        print(f"    ranks ready {max(r['ready_s']):.2f} s, first step {r['startup_s']:.2f} s, total PSS "
              f"{r['total_pss_mb']:.0f} MB, rank USS {', '.join(f'{u:.0f}' for u in r['rank_uss_mb'])} MB, "
              f"{r['throughput_seeds_per_s']:,.0f} seeds/s ({run['run_wall_s']} s, other load "
              f"{meter.other_cores} cores)", flush=True)
    rows = summarize(runs)
    tgts = targets(rows)
    payload = {"benchmark": NAME, "machine": machine, "versions": harness.versions(),
               "config": {k: (v if not isinstance(v, Path) else str(v)) for k, v in vars(args).items()},
               "wall_s": round(time.time() - t_start, 1), "runs": runs, "summary": rows, "targets": tgts}
    failed = [r for r in runs if "error" in r]
    md = render(rows, tgts)
    if skipped:
        md += (f"\n\n{skipped} planned run(s) left out by the memory estimate guard (over "
               f"{(limit_mb or 0.9 * probe.machine_memory_mb()) / 1024:.1f} GiB estimated).")
    if failed:
        md += "\n\nFailed runs (details in the JSON): " + ", ".join(r["label"] for r in failed)
    harness.write_outputs(args.out, NAME, payload, md, harness.bar_plot(
        {f"{r['graph']}\n{r['launcher']} x{r['world']}": r["pss_ratio"] or 0.0 for r in rows},
        "total PSS / 1-process run"), figsize=(12, 8))
    print(md)
    if failed:
        raise SystemExit(f"[{NAME}] {len(failed)} run(s) failed: {', '.join(r['label'] for r in failed)}")
    return payload


if __name__ == "__main__":
    main()
