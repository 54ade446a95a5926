"""Fork vs spawn: what graphtrainer's launchers cost in start-up time, memory and throughput.

Against ``naive-spawn`` (the tutorials' loop: each child unpickles its own graph), with the 1-process
run as baseline, each run in a fresh worker process unless ``--no-isolate``. Start-up: the slowest
rank's first step after ``fit``; memory: the tree's PSS/USS while the ranks pause after step
``--pause-at``; throughput: seeds of the next ``--measure-steps`` steps over their wall time."""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Tuple

import harness  # first: graphtrainer from this checkout, DGL on PyTorch
import handwritten
import probe
import workload

LAUNCHERS = ("gt-fork", "gt-forkserver", "gt-spawn", "naive-spawn")
#: Total PSS at TARGET_WORLD ranks / the 1-process run (issue 16); start-up A / B at each world size.
PSS_TARGETS = {"gt-fork": 1.30, "gt-forkserver": 1.45, "gt-spawn": 2.0}
STARTUP_TARGETS = (("gt-fork", "gt-spawn", 1 / 3), ("gt-forkserver", "gt-fork", 1.5))
TARGET_WORLD = 4
TINY = {"sizes": [workload.parse_size("20kx5")], "datasets": ["synthetic"], "world_sizes": [1, 2], "feat_dim": 16,
        "hidden": 32, "batch_size": 256, "pause_at": 1, "measure_steps": 3, "no_isolate": True}
SUMMARY = ("startup_s", "total_pss_mb", "peak_total_pss_mb", "throughput_seeds_per_s", "other_cores")


def parse_args(argv: Any = None) -> Any:
    p = harness.base_parser("fork_vs_spawn", __doc__, tiny=TINY)
    p.add_argument("--datasets", nargs="+", choices=workload.DATASETS, default=list(workload.DATASETS))
    p.add_argument("--sizes", nargs="+", type=workload.parse_size, help="NODESxDEGREE (default 250kx10 1Mx10 "
                   "2Mx10 5Mx10)", default=[workload.parse_size(s) for s in ("250kx10", "1Mx10", "2Mx10", "5Mx10")])
    p.add_argument("--feat-dim", type=int, default=64)
    p.add_argument("--launchers", nargs="+", choices=LAUNCHERS, default=list(LAUNCHERS))
    p.add_argument("--world-sizes", nargs="+", type=int, default=[1, 2, 4])
    p.add_argument("--fanouts", default="10,10")
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=1024, help="synthetic graphs (Tolokers: 256)")
    p.add_argument("--pause-at", type=int, default=3, help="step (>= 1) at which memory is measured")
    p.add_argument("--measure-steps", type=int, default=20, help="steps timed for throughput")
    p.add_argument("--no-isolate", action="store_true", help="every run in this process (faster; memory figures "
                   "then carry what earlier runs left behind; --tiny implies it)")
    p.add_argument("--memory-limit-gb", type=float, help="leave out (or, if none fits, refuse) runs estimated "
                   "above this much memory (default: 90%% of the machine's)")
    p.add_argument("--skip-too-big", action="store_true", help="run what fits and list the rest instead of refusing")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if min(args.world_sizes) < 1 or args.pause_at < 1:
        p.error("--world-sizes and --pause-at must be >= 1")
    return args


def plan(args: Any) -> List[Dict[str, Any]]:
    """Every configuration: per graph and world size, the launchers one after another."""
    runs = []
    for spec in workload.graph_specs(args.datasets, args.sizes, args.feat_dim, args.batch_size):
        for world in sorted(set(args.world_sizes)):
            for launcher in ["single"] if world == 1 else args.launchers:
                est = probe.estimate_mb(spec["num_nodes"], spec["num_edges"], spec["feat_dim"], launcher, world)
                runs.append({"graph": spec, "launcher": launcher, "world": world, "estimate_mb": round(est),
                             "label": f"{spec['label']} {launcher} x{world}",
                             **{k: getattr(args, k) for k in ("fanouts", "hidden", "pause_at", "measure_steps")}})
    # All in this process (--no-isolate): train in it (the 1-process runs) only after every fork
    # launch, since on a machine with GPUs graphtrainer refuses to fork after a backward pass.
    return sorted(runs, key=lambda r: bool(args.no_isolate and r["launcher"] == "single"))


def run_one(cfg: Dict[str, Any]) -> Dict[str, Any]:
    """One configuration in this process (the launching process, whose tree is measured)."""
    from graphtrainer import Trainer

    spec, world, launcher = cfg["graph"], cfg["world"], cfg["launcher"]
    hyper = {"fanouts": [int(f) for f in cfg["fanouts"].split(",")], "hidden": cfg["hidden"], "lr": 3e-3,
             "batch_size": spec["batch_size"], "dropout": 0.5}
    graph = workload.build_graph(spec)
    probe_dir = tempfile.mkdtemp(prefix="gt-bench-")
    clock = probe.Probe(probe_dir, cfg["pause_at"], cfg["measure_steps"])
    watcher = probe.MemoryWatcher(probe_dir, world)
    watcher.start()
    try:
        t_fit = time.time()
        if launcher == "naive-spawn":
            handwritten.naive_spawn(graph, world, dict(
                hyper, epochs=10_000, threads=max(1, harness.available_cores() // world), seed=0, probe_dir=probe_dir,
                pause_at=cfg["pause_at"], measure_steps=cfg["measure_steps"], max_steps=clock.total_steps))
        else:
            trainer = Trainer(num_procs=world, launcher=launcher.removeprefix("gt-") if world > 1 else "auto",
                              max_epochs=10_000, max_steps=clock.total_steps, progress_bar=False, logger=False,
                              default_root_dir=os.path.join(probe_dir, "runs"), callbacks=[clock])
            trainer.fit(workload.BenchTask(graph, **hyper))
        tree = watcher.steady
        if tree is None:
            raise RuntimeError(f"{cfg['label']}: the ranks never paused for the memory measurement")
        res = probe.collect_probe(probe_dir, world, t_fit, cfg["pause_at"])
    finally:
        watcher.stop()
        shutil.rmtree(probe_dir, ignore_errors=True)
    pids = res.pop("rank_pids")
    for p in tree["processes"]:
        if p["role"] == "child":
            p["role"] = f"rank {pids.index(p['pid'])}" if p["pid"] in pids else "helper"
    ranks = [p for pid in pids for p in tree["processes"] if p["pid"] == pid and p["role"] != "parent"]
    return dict(res, **tree, rank_uss_mb=[p["uss_mb"] for p in ranks], rank_pss_mb=[p["pss_mb"] for p in ranks],
                peak_total_pss_mb=watcher.peak_pss_mb)


def run_isolated(cfg: Dict[str, Any]) -> Dict[str, Any]:
    """:func:`run_one` in a fresh worker process (``--worker``); a failure is recorded (``error``)
    instead of costing the other configurations."""
    with tempfile.TemporaryDirectory(prefix="gt-bench-worker-") as tmp:
        cfg = dict(cfg, result_file=os.path.join(tmp, "result.json"))
        try:
            harness.run_process([sys.executable, os.path.abspath(__file__), "--worker", json.dumps(cfg)], cfg["label"])
            return json.loads(Path(cfg["result_file"]).read_text(encoding="utf-8"))
        except RuntimeError as err:
            print(f"    FAILED: {str(err)[-2000:]}", flush=True)
            return {"error": str(err)[-4000:]}


def summarize(runs: List[Dict[str, Any]]) -> Dict[Tuple[str, str, int], Dict[str, Any]]:
    """Per (graph, launcher, world): the figures and the total PSS over the 1-process run's."""
    rows = {}
    for run in runs:
        graph, launcher, world, res = run["graph"]["label"], run["launcher"], run["world"], run["result"]
        if "error" not in res:
            rows[graph, launcher, world] = {
                "graph": graph, "launcher": launcher, "world": world, **{k: res[k] for k in SUMMARY},
                "rank_uss_mean_mb": statistics.fmean(res["rank_uss_mb"]) if res["rank_uss_mb"] else None}
    for (graph, _, _), row in rows.items():
        base = rows.get((graph, "single", 1))
        row["pss_ratio"] = row["total_pss_mb"] / base["total_pss_mb"] if base else None
    return rows


def targets(rows: Dict[Tuple[str, str, int], Dict[str, Any]]) -> List[Dict[str, Any]]:
    """PSS ratios at TARGET_WORLD ranks (else at the largest world size, marked), then the start-up
    ratios at every world size (valid only if other work used at most harness.NOISY_CORES)."""
    out = []
    for graph in dict.fromkeys(g for g, _, _ in rows):
        worlds = sorted({w for g, _, w in rows if g == graph and w > 1})
        w = TARGET_WORLD if TARGET_WORLD in worlds else max(worlds, default=0)
        note = "" if w == TARGET_WORLD else f" (no {TARGET_WORLD}-rank run: shown at {w})"
        for launcher, limit in PSS_TARGETS.items():
            ratio = rows.get((graph, launcher, w), {}).get("pss_ratio")
            if ratio is not None:  # memory does not depend on other load
                out.append({"graph": graph, "what": f"{launcher} total PSS, {w} ranks / 1 process{note}",
                            "measured": ratio, "target": f"<= {limit}", "met": ratio <= limit, "valid": True})
        for w, (a, b, limit) in [(w, t) for w in worlds for t in STARTUP_TARGETS]:
            row, base = rows.get((graph, a, w)), rows.get((graph, b, w))
            if row and base:
                ratio, other = row["startup_s"] / base["startup_s"], max(row["other_cores"], base["other_cores"])
                out.append({"graph": graph, "what": f"{a} start-up / {b} start-up, {w} ranks", "measured": ratio,
                            "target": f"<= {limit:.2f}", "met": ratio <= limit, "other_cores": other,
                            "valid": other <= harness.NOISY_CORES})
    return out


def render(rows: Dict[Tuple[str, str, int], Dict[str, Any]], tgts: List[Dict[str, Any]]) -> str:
    md = harness.markdown_table(
        ["graph", "launcher", "ranks", "first step s", "total PSS MB", "PSS / 1 proc", "peak PSS MB",
         "rank USS MB (mean)", "seeds/s", "other load (cores)"],
        [[r["graph"], "1 process" if r["launcher"] == "single" else r["launcher"], r["world"], r["startup_s"],
          r["total_pss_mb"], harness.fmt_ratio(r["pss_ratio"]), r["peak_total_pss_mb"],
          r["rank_uss_mean_mb"] if r["world"] > 1 else "", r["throughput_seeds_per_s"], f"{r['other_cores']:.2f}"]
         for r in rows.values()])
    return md + "\n\nTargets\n\n" + harness.markdown_table(
        ["graph", "ratio", "measured", "target", "met"],
        [[t["graph"], t["what"], harness.fmt_ratio(t["measured"]), t["target"],
          ("yes" if t["met"] else "**no**") + harness.noise_note(t.get("other_cores", 0.0))] for t in tgts])


def main(argv: Any = None) -> Dict[str, Any]:
    args = parse_args(argv)
    if args.worker:
        cfg = json.loads(args.worker)
        Path(cfg["result_file"]).write_text(json.dumps(run_one(cfg)), encoding="utf-8")
        return {}
    planned = plan(args)
    limit_mb = args.memory_limit_gb * 1024 if args.memory_limit_gb else None
    cfgs = probe.refuse_if_too_big(planned, limit_mb=limit_mb, skip=args.skip_too_big)
    machine = harness.machine_info()  # the load before the runs
    arms = {c["label"]: (lambda rnd, c=c: run_one(c) if args.no_isolate else run_isolated(c)) for c in cfgs}
    results, _ = harness.interleave(arms, 1, "fork_vs_spawn")
    runs = [dict(c, result=results[c["label"]][0]) for c in cfgs]
    rows = summarize(runs)
    md = render(rows, targets(rows))
    if len(cfgs) < len(planned):
        md += (f"\n\n{len(planned) - len(cfgs)} planned run(s) left out by the memory estimate guard (over "
               f"{(limit_mb or 0.9 * probe.machine_memory_mb()) / 1024:.1f} GiB estimated).")
    failed = [r["label"] for r in runs if "error" in r["result"]]
    if failed:
        md += "\n\nFailed runs (details in the JSON): " + ", ".join(failed)
    plot = harness.bar_plot({f"{g}\n{launcher} x{w}": r["pss_ratio"] or 0.0 for (g, launcher, w), r in rows.items()},
                            "total PSS / 1-process run")
    payload = harness.report(args, {"machine": machine, "runs": runs, "summary": list(rows.values()),
                                    "targets": targets(rows)}, md, plot, figsize=(12, 8))
    if failed:
        raise SystemExit(f"[fork_vs_spawn] {len(failed)} run(s) failed: {', '.join(failed)}")
    return payload


if __name__ == "__main__":
    main()
