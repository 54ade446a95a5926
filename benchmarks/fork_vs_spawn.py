"""Fork vs spawn: what graphtrainer's launchers cost in start-up time, memory and throughput.

Against ``naive-spawn`` (the tutorials' loop: each child unpickles its own graph), with the 1-process
run as baseline, each run in a fresh worker process unless ``--no-isolate``. Start-up: the slowest
rank's first step after ``fit``; memory: the tree's PSS/USS while the ranks pause after step
``--pause-at``; throughput: seeds of the next ``--measure-steps`` steps over their wall time, and
gt-fork's at 2 ranks over the 1-process run (the question of the former scaling.py; its workload:
``--datasets synthetic --sizes 1Mx20 --feat-dim 16 --fanouts 25,20 --hidden 32 --batch-size 512
--launchers gt-fork --world-sizes 1 2 --pause-at 4 --measure-steps 100 --rounds 3``)."""
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
SPEEDUP_TARGET = 1.7  # throughput of gt-fork x2 / the 1-process run, on 2 cores
TARGET_WORLD = 4
TINY = {"sizes": [workload.parse_size("20kx5")], "datasets": ["synthetic"], "world_sizes": [1, 2], "feat_dim": 16,
        "hidden": 32, "batch_size": 256, "pause_at": 1, "measure_steps": 3, "no_isolate": True}
SUMMARY = ("startup_s", "total_pss_mb", "peak_total_pss_mb", "throughput_seeds_per_s", "other_cores")


def parse_args(argv: Any = None) -> Any:
    p = harness.base_parser("fork_vs_spawn", __doc__, rounds=1, tiny=TINY)
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
    p.add_argument("--threads", type=int, help="threads per rank (default: the trainer's, cores / ranks)")
    p.add_argument("--no-isolate", action="store_true", help="every run in this process (faster; memory figures "
                   "then carry what earlier runs left behind; --tiny implies it)")
    p.add_argument("--memory-limit-gb", type=float, help="leave out (or, if none fits, refuse) runs estimated "
                   "above this much memory (default: 90%% of the machine's)")
    p.add_argument("--skip-too-big", action="store_true", help="run what fits and list the rest instead of refusing")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if min(args.world_sizes + [args.pause_at, args.measure_steps, args.rounds, args.threads or 1]) < 1:
        p.error("--world-sizes, --pause-at, --measure-steps, --rounds and --threads must be >= 1")
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
                             **{k: getattr(args, k) for k in ("fanouts", "hidden", "pause_at", "measure_steps",
                                                              "threads")}})
    # All in this process (--no-isolate): train in it (the 1-process runs) only after every fork
    # launch, since on a machine with GPUs graphtrainer refuses to fork after a backward pass.
    return sorted(runs, key=lambda r: bool(args.no_isolate and r["launcher"] == "single"))


def run_one(cfg: Dict[str, Any]) -> Dict[str, Any]:
    """One configuration in this process (the launching process, whose tree is measured)."""
    from graphtrainer import Trainer

    spec, world, launcher = cfg["graph"], cfg["world"], cfg["launcher"]
    hyper = workload.task_kwargs(argparse.Namespace(**cfg), spec["batch_size"])
    graph = workload.build_graph(spec)
    probe_dir = tempfile.mkdtemp(prefix="gt-bench-")
    clock = probe.Probe(probe_dir, cfg["pause_at"], cfg["measure_steps"])
    watcher = probe.MemoryWatcher(probe_dir, world)
    watcher.start()
    try:
        t_fit = time.time()
        if launcher == "naive-spawn":
            threads = cfg["threads"] or max(1, harness.available_cores() // world)  # as the trainer's default
            handwritten.naive_spawn(graph, world, dict(
                hyper, epochs=10_000, threads=threads, seed=0, probe_dir=probe_dir, pause_at=cfg["pause_at"],
                measure_steps=cfg["measure_steps"], max_steps=clock.total_steps))
        else:
            trainer = Trainer(num_procs=world, launcher=launcher.removeprefix("gt-") if world > 1 else "auto",
                              max_epochs=10_000, max_steps=clock.total_steps, threads_per_proc=cfg["threads"],
                              progress_bar=False, logger=False, default_root_dir=os.path.join(probe_dir, "runs"),
                              callbacks=[clock])
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
    """Per (graph, launcher, world): the medians over rounds and the total PSS over the 1-process run's."""
    done: Dict[Tuple[str, str, int], List[Dict[str, Any]]] = {}
    for run in runs:
        if "error" not in run["result"]:
            done.setdefault((run["graph"]["label"], run["launcher"], run["world"]), []).append(run["result"])
    rows = {}
    for (graph, launcher, world), res in done.items():
        uss = [statistics.fmean(r["rank_uss_mb"]) for r in res if r["rank_uss_mb"]]
        medians = {k: harness.median([r[k] for r in res]) for k in SUMMARY}
        rows[graph, launcher, world] = {"graph": graph, "launcher": launcher, "world": world, **medians,
                                        "threads": res[0]["torch_threads"],
                                        "rank_uss_mean_mb": harness.median(uss) if uss else None}
    for (graph, _, _), row in rows.items():
        base = rows.get((graph, "single", 1))
        row["pss_ratio"] = row["total_pss_mb"] / base["total_pss_mb"] if base else None
    return rows


def targets(rows: Dict[Tuple[str, str, int], Dict[str, Any]]) -> List[Dict[str, Any]]:
    """PSS ratios at TARGET_WORLD ranks (else at the largest world size, marked), the start-up ratios
    at every world size, then (last, so the README's first two stay) gt-fork's speed-up at 2 ranks;
    timings are valid only if other work used at most harness.NOISY_CORES."""
    out, speedups = [], []
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
        row, base = rows.get((graph, "gt-fork", 2)), rows.get((graph, "single", 1))
        if row and base:
            ratio = row["throughput_seeds_per_s"] / base["throughput_seeds_per_s"]
            other = max(row["other_cores"], base["other_cores"])
            speedups.append({"graph": graph, "measured": ratio, "target": f">= {SPEEDUP_TARGET}",
                             "what": f"throughput, gt-fork 2 ranks x {row['threads']} thread(s) / 1 process x "
                             f"{base['threads']} thread(s)", "met": ratio >= SPEEDUP_TARGET, "other_cores": other,
                             "valid": other <= harness.NOISY_CORES})
    return out + speedups


def render(rows: Dict[Tuple[str, str, int], Dict[str, Any]], tgts: List[Dict[str, Any]]) -> str:
    md = harness.markdown_table(
        ["graph", "launcher", "ranks", "threads / rank", "first step s", "total PSS MB", "PSS / 1 proc",
         "peak PSS MB", "rank USS MB (mean)", "seeds/s", "other load (cores)"],
        [[r["graph"], "1 process" if r["launcher"] == "single" else r["launcher"], r["world"], r["threads"],
          r["startup_s"], r["total_pss_mb"], harness.fmt_ratio(r["pss_ratio"]), r["peak_total_pss_mb"],
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
    arms = {c["label"]: (lambda rnd, c=c: run_one(c) if args.no_isolate else run_isolated(c)) for c in cfgs}
    results, _ = harness.interleave(arms, args.rounds, "fork_vs_spawn")
    runs = [dict(c, round=i, result=res) for c in cfgs for i, res in enumerate(results[c["label"]])]
    rows = summarize(runs)
    tgts = targets(rows)
    md = render(rows, tgts)
    if len(cfgs) < len(planned):
        md += (f"\n\n{len(planned) - len(cfgs)} planned run(s) left out by the memory estimate guard (over "
               f"{(limit_mb or 0.9 * probe.machine_memory_mb()) / 1024:.1f} GiB estimated).")
    failed = [f"{r['label']} (round {r['round'] + 1})" for r in runs if "error" in r["result"]]
    if failed:
        md += "\n\nFailed runs (details in the JSON): " + ", ".join(failed)
    plot = harness.bar_plot({f"{g}\n{launcher} x{w}": r["pss_ratio"] or 0.0 for (g, launcher, w), r in rows.items()},
                            "total PSS / 1-process run")
    payload = harness.report(args, {"runs": runs, "summary": list(rows.values()), "targets": tgts}, md, plot,
                             figsize=(12, 8))
    if failed:
        raise SystemExit(f"[fork_vs_spawn] {len(failed)} run(s) failed: {', '.join(failed)}")
    return payload


if __name__ == "__main__":
    main()
