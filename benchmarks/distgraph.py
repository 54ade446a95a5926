"""DistDGL against the in-memory graph: training seeds/s and memory per trainer, the cost of
remote feature fetches, and what a partitioned papers100M holds per machine.

    python benchmarks/distgraph.py --out benchmarks/results/distgraph   # full run, 1M nodes
    python benchmarks/distgraph.py --rounds 3 --arms distdgl fork distdgl-glibc fork-glibc --out ...
    python benchmarks/distgraph.py --paper                                # papers100M table only (no data)
    python benchmarks/distgraph.py --quick --skip-remote --out /tmp/dg    # seconds (smoke test)
    python benchmarks/distgraph.py --measure-halo --out benchmarks/results/distgraph

1. **Seeds/s and memory per trainer** (``distgraph_arm.py``): the synthetic graph
   (``datasets.synthetic(N, 10, 64, 8)``) in one partition; ``workload.BenchTask`` with the
   same settings runs (a) on DistDGL, 2 trainer ranks + 1 graph server, (b) in memory with
   the fork launcher; interleaved, each run in a fresh process with a private ``/dev/shm``
   when root. Rank 0 times each epoch (the first is warm-up); every rank reads its USS/PSS/RSS
   at each epoch end; a watcher samples driver and server memory from outside; after the last
   epoch every rank times sampling, feature and label fetches, DGL's ``DistNodeDataLoader``,
   forward + backward and its own loader. ``--profile-rounds`` adds runs with
   ``profiler="simple"``; the ``-glibc`` arms keep glibc's malloc defaults in the ranks.
2. **Remote feature fetches** (``distgraph_remote.py``): 2 METIS parts on 2 simulated machines.
3. **On paper** (``distgraph_paper.py``): a partitioned papers100M per machine, 4/8/16 machines.
"""
from __future__ import annotations

import argparse
import gc
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import harness
import distgraph_paper
import distgraph_remote
import workload
from distgraph_arm import ARMS, GLIBC_SUFFIX, private_shm_prefix, run_arm

NAME = "distgraph"


def summarize_run(res: Dict[str, Any], batch_size: int) -> Dict[str, Any]:
    """Per-run figures: seeds/s and ms per batch over steady epochs, rank memory at the
    last epoch end, driver/server/total memory over the steady window."""
    epochs = res["epochs"]
    steady = epochs[1:] if len(epochs) > 1 else epochs
    sps = [e["seeds_all_ranks"] / e["seconds"] for e in steady]
    world = len(epochs[-1]["ranks"])
    batch_ms = [1000 * e["seconds"] / max(1, e["batches_all_ranks"] / world) for e in steady]
    last = epochs[-1]["ranks"]
    lo = epochs[0]["end_wall"] if len(epochs) > 1 else 0.0
    hi = epochs[-1]["end_wall"]
    window = [s for s in res["samples"] if lo <= s["t"] <= hi and any(p["role"] == "rank" for p in s["procs"])]
    if not window:  # a run too short for a sample inside its steady epochs
        window = [s for s in res["samples"] if any(p["role"] == "rank" for p in s["procs"])] or res["samples"]

    def med(role: str, key: str) -> Optional[float]:
        vals = [sum(p[key] for p in s["procs"] if p["role"] == role) for s in window
                if any(p["role"] == role for p in s["procs"])]
        return statistics.median(vals) if vals else None

    def cores(role: str) -> Optional[float]:
        """CPU cores the role's processes used over the window (their CPU seconds / wall)."""
        if len(window) < 2 or window[-1]["t"] <= window[0]["t"]:
            return None
        first = {p["pid"]: p["cpu_s"] for p in window[0]["procs"] if p["role"] == role}
        last = {p["pid"]: p["cpu_s"] for p in window[-1]["procs"] if p["role"] == role}
        both = set(first) & set(last)
        if not both:
            return None
        return sum(last[pid] - first[pid] for pid in both) / (window[-1]["t"] - window[0]["t"])

    totals = [sum(p["pss_mb"] for p in s["procs"]) for s in window]
    return {
        "rank_cpu_cores": cores("rank"), "server_cpu_cores": cores("server"), "driver_cpu_cores": cores("driver"),
        "seeds_per_s": statistics.median(sps), "seeds_per_s_epochs": sps, "batch_ms": statistics.median(batch_ms),
        "epoch_s": [e["seconds"] for e in epochs], "seeds_per_epoch": steady[0]["seeds_all_ranks"],
        "rank_uss_mb": [r["uss_mb"] for r in last], "rank_pss_mb": [r["pss_mb"] for r in last],
        "rank_rss_mb": [r["rss_mb"] for r in last],
        "server_rss_mb": med("server", "rss_mb"), "server_pss_mb": med("server", "pss_mb"),
        "server_uss_mb": med("server", "uss_mb"), "driver_rss_mb": med("driver", "rss_mb"),
        "driver_pss_mb": med("driver", "pss_mb"), "driver_uss_mb": med("driver", "uss_mb"),
        "total_pss_mb": statistics.median(totals) if totals else None,
        "peak_total_pss_mb": max((sum(p["pss_mb"] for p in s["procs"]) for s in res["samples"]), default=None),
        "watch_samples_in_window": len(window), "fit_s": res["fit_s"], "probe": res["probe"],
        "other_cores": res.get("other_cores"), "loadavg_1min_before": res.get("loadavg_1min_before"),
    }


#: Stages of graphtrainer's simple profiler reported per batch (see graphtrainer/profiler.py).
PROFILE_STAGES = ("sample", "to device", "forward", "backward", "optimizer", "on_train_batch_end")


def profile_per_batch(res: Dict[str, Any]) -> Optional[Dict[str, float]]:
    """ms per training batch of each profiler stage, mean over ranks (``None`` unprofiled).
    ``sample`` is the loader's ``next()``: sampling, features and labels."""
    if not res.get("profile"):
        return None
    batches = sum(e["batches_all_ranks"] for e in res["epochs"]) / max(1, len(res["epochs"][-1]["ranks"]))
    out = {}
    for stage in PROFILE_STAGES + ("epoch start", "epoch end", "all-reduce (inside backward)"):
        vals = [r.get(stage, 0.0) for r in res["profile"]]
        out[stage] = 1000 * _mean(vals) / max(1.0, batches)
    out["fit_per_batch"] = 1000 * _mean([r.get("fit", 0.0) for r in res["profile"]]) / max(1.0, batches)
    return out


def _num(x: Optional[float]) -> str:
    return "-" if x is None else f"{x:,.0f}"


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


def analyse_throughput(runs: Dict[str, List[Dict[str, Any]]]) -> Dict[str, Any]:
    """Per arm: medians over runs; ratios DistDGL / fork."""
    arms: Dict[str, Any] = {}
    for arm, items in runs.items():
        def med(key: str) -> Optional[float]:
            vals = [r[key] for r in items if r.get(key) is not None]
            return statistics.median(vals) if vals else None
        probe_keys = ("sample_ms", "feat_ms", "label_ms", "input_nodes", "feat_mb_per_s", "dgl_loader_ms",
                      "loader_ms", "fwd_bwd_ms")
        probes = [p for r in items for p in r["probe"]]
        arms[arm] = {
            "runs": len(items), "seeds_per_s": med("seeds_per_s"), "seeds_per_s_runs": [r["seeds_per_s"] for r in items],
            "batch_ms": med("batch_ms"),
            "rank_uss_mb": statistics.median([_mean(r["rank_uss_mb"]) for r in items]),
            "rank_pss_mb": statistics.median([_mean(r["rank_pss_mb"]) for r in items]),
            "rank_rss_mb": statistics.median([_mean(r["rank_rss_mb"]) for r in items]),
            "rank_uss_mb_max": max(max(r["rank_uss_mb"]) for r in items),
            "rank_pss_mb_max": max(max(r["rank_pss_mb"]) for r in items),
            **{k: med(k) for k in ("server_rss_mb", "server_pss_mb", "server_uss_mb", "driver_rss_mb",
                                   "driver_pss_mb", "driver_uss_mb", "total_pss_mb", "peak_total_pss_mb",
                                   "rank_cpu_cores", "server_cpu_cores", "driver_cpu_cores")},
            "probe": {k: statistics.median([p[k] for p in probes if p.get(k) is not None])
                      for k in probe_keys if any(p.get(k) is not None for p in probes)},
            "other_cores": _mean([r["other_cores"] for r in items if r.get("other_cores") is not None]),
            "loadavg_before": [r.get("loadavg_1min_before") for r in items],
        }
    out: Dict[str, Any] = {"arms": arms}
    keys = ("seeds_per_s", "batch_ms", "rank_uss_mb", "rank_pss_mb", "rank_rss_mb", "total_pss_mb")

    def ratios(a: Dict[str, Any], b: Dict[str, Any]) -> Dict[str, float]:
        return {k: a[k] / b[k] for k in keys if a.get(k) and b.get(k)}

    if "distdgl" in arms and "fork" in arms:
        d, f = arms["distdgl"], arms["fork"]
        out["ratios"] = ratios(d, f)
        out["pair_ratios_seeds_per_s"] = [a / b for a, b in zip(d["seeds_per_s_runs"], f["seeds_per_s_runs"])]
        out["extra_ms_per_batch"] = {k: d["probe"].get(k, 0) - f["probe"].get(k, 0)
                                     for k in ("sample_ms", "feat_ms", "label_ms", "loader_ms", "fwd_bwd_ms")}
        out["extra_batch_ms"] = d["batch_ms"] - f["batch_ms"]
    if "distdgl-glibc" in arms and "fork-glibc" in arms:
        out["ratios_glibc"] = ratios(arms["distdgl-glibc"], arms["fork-glibc"])
    out["glibc_over_tuned"] = {base: ratios(arms[base + GLIBC_SUFFIX], arms[base]) for base in ("distdgl", "fork")
                               if base in arms and base + GLIBC_SUFFIX in arms}
    return out


def graph_spec(args: Any) -> Dict[str, Any]:
    return {"dataset": "synthetic", "num_nodes": args.nodes, "avg_degree": 10, "feat_dim": args.feat_dim,
            "num_classes": 8, "seed": 0}


def parse_args(argv: Any = None) -> Any:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=1_000_000, help="synthetic graph nodes, average degree 10 "
                                                                 "(default %(default)s)")
    p.add_argument("--feat-dim", type=int, default=64)
    p.add_argument("--epochs", type=int, default=4, help="per run; the first is warm-up (default %(default)s)")
    p.add_argument("--batches", type=int, default=40, help="training batches per rank and epoch (default %(default)s)")
    p.add_argument("--rounds", type=int, default=2, help="DistDGL/fork pairs, interleaved (default %(default)s)")
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--fanouts", default="10,10")
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--arms", nargs="+", choices=list(ARMS), default=["distdgl", "fork"],
                   help="arms, run in this order every round (default: distdgl fork); the -glibc arms keep "
                        "glibc's malloc defaults in the ranks (GRAPHTRAINER_MALLOC_TUNING=0)")
    p.add_argument("--probe-batches", type=int, default=10, help="batches timed for the per-batch breakdown")
    p.add_argument("--profile-rounds", type=int, default=1,
                   help="extra DistDGL/fork pairs with profiler='simple', for where a batch's time goes "
                        "(not in the seeds/s figures; default %(default)s)")
    p.add_argument("--remote-batches", type=int, default=20, help="training batches per rank in part 2")
    p.add_argument("--remote-reps", type=int, default=5, help="timed fetches per kind and size in part 2")
    p.add_argument("--out", type=Path, default=Path("bench_out") / NAME, help="output folder (default: %(default)s)")
    p.add_argument("--paper", action="store_true", help="print the papers100M table (no data needed) and exit")
    p.add_argument("--skip-remote", action="store_true", help="leave out part 2 (simulated machines)")
    p.add_argument("--quick", action="store_true", help="tiny graph, 1 epoch: a seconds-long smoke run")
    p.add_argument("--no-private-shm", action="store_true",
                   help="run the arms with this machine's /dev/shm (default: a private tmpfs when root)")
    p.add_argument("--measure-halo", action="store_true",
                   help="partition the synthetic graph into --halo-parts parts, write halo.json, exit")
    p.add_argument("--halo-parts", type=lambda s: [int(x) for x in s.split(",")], default=[2, 4, 8, 16])
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per run before it is killed")
    args = p.parse_args(argv)
    if args.quick:
        args.nodes, args.feat_dim, args.epochs, args.batches, args.rounds = 20_000, 16, 1, 3, 1
        args.batch_size, args.hidden, args.probe_batches = 256, 32, 2
        args.remote_batches, args.remote_reps, args.timeout, args.profile_rounds = 3, 2, 300.0, 0
    if args.epochs < 1 or args.batches < 1 or args.rounds < 1 or args.nodes < 100:
        p.error("--epochs, --batches and --rounds must be >= 1, --nodes >= 100")
    return args


def render(spec: Dict[str, Any], thr: Dict[str, Any], remote: Optional[Dict[str, Any]],
           paper: List[Dict[str, Any]], args: Any, model: Dict[str, float]) -> str:
    a = thr["arms"]
    label = workload.size_label({"num_nodes": spec["num_nodes"], "avg_degree": spec["avg_degree"]})
    md = [f"## 1. Seeds/s and memory per trainer ({label}, {spec['feat_dim']}-d features; fanouts {args.fanouts}, "
          f"batch {args.batch_size}, hidden {args.hidden}, {args.epochs} epochs of {args.batches} batches per rank, "
          f"first epoch warm-up; {args.rounds} interleaved round(s))\n"]
    headers = ["arm", "seeds/s (median; per run)", "ms/batch per rank", "trainer USS MB mean / max",
               "trainer PSS MB mean / max", "trainer RSS MB", "graph server RSS / PSS / USS MB",
               "driver RSS / PSS MB", "total PSS MB (peak)", "CPU cores used: trainers / server / driver",
               "other load (cores)", "1-min load before"]
    rows = []
    for arm in [k for k in ARMS if k in a]:
        r = a[arm]
        server = " / ".join(_num(r[k]) for k in ("server_rss_mb", "server_pss_mb", "server_uss_mb"))
        rows.append([ARMS[arm], f"{r['seeds_per_s']:,.0f} (" + ", ".join(f"{x:,.0f}" for x in r["seeds_per_s_runs"])
                     + ")", f"{r['batch_ms']:.1f}", f"{r['rank_uss_mb']:,.0f} / {r['rank_uss_mb_max']:,.0f}",
                     f"{r['rank_pss_mb']:,.0f} / {r['rank_pss_mb_max']:,.0f}", f"{r['rank_rss_mb']:,.0f}", server,
                     f"{_num(r['driver_rss_mb'])} / {_num(r['driver_pss_mb'])}",
                     f"{_num(r['total_pss_mb'])} ({_num(r['peak_total_pss_mb'])})",
                     " / ".join("-" if r[k] is None else f"{r[k]:.2f}"
                                for k in ("rank_cpu_cores", "server_cpu_cores", "driver_cpu_cores")),
                     f"{r['other_cores']:.2f}",
                     ", ".join(str(x) for x in r["loadavg_before"])])
    md.append(harness.markdown_table(headers, rows))
    if "ratios" in thr:
        q = thr["ratios"]
        md.append("\n**DistDGL / fork**: seeds/s " + f"{q['seeds_per_s']:.2f}x (per pair: "
                  + ", ".join(f"{x:.2f}" for x in thr["pair_ratios_seeds_per_s"]) + f"); ms per batch "
                  f"{q['batch_ms']:.2f}x; trainer USS {q['rank_uss_mb']:.2f}x, PSS {q['rank_pss_mb']:.2f}x, "
                  f"RSS {q['rank_rss_mb']:.2f}x; total PSS of the run {q.get('total_pss_mb', float('nan')):.2f}x.")
    if thr.get("ratios_glibc"):
        q = thr["ratios_glibc"]
        md.append(f"\n**With glibc's malloc defaults, DistDGL / fork**: seeds/s {q['seeds_per_s']:.2f}x; trainer USS "
                  f"{q['rank_uss_mb']:.2f}x, PSS {q['rank_pss_mb']:.2f}x.")
    for base, q in (thr.get("glibc_over_tuned") or {}).items():
        md.append(f"\n**{base}, glibc defaults / graphtrainer's malloc tuning**: seeds/s {q['seeds_per_s']:.2f}x; "
                  f"trainer USS {q['rank_uss_mb']:.2f}x, PSS {q['rank_pss_mb']:.2f}x.")
    if "ratios" in thr:
        md.append(f"\nModel of the layouts (`paper_rows` on this graph): a 1-part DistDGL server holds "
                  f"{model['server_mb']:,.0f} MB, one in-memory graph {model['one_machine_mb']:,.0f} MB.")
    md.append("\n### Per-batch costs before the model runs (each rank, medians over "
              f"{args.probe_batches} batches of its own training seeds, after the last epoch)\n")
    headers = ["arm", "input nodes / batch", "sampling ms", "feature fetch ms", "feature MB/s", "labels ms",
               "sum ms", "sampling via DGL's DistNodeDataLoader ms", "model forward + backward ms",
               "training loader ms / batch", "whole batch ms (training)", "rest: step and loop ms"]
    rows = []
    for arm in [k for k in ARMS if k in a]:
        if not a[arm]["probe"]:
            continue
        p = a[arm]["probe"]
        total = p["sample_ms"] + p["feat_ms"] + p["label_ms"]
        rows.append([ARMS[arm], f"{p['input_nodes']:,.0f}", f"{p['sample_ms']:.1f}", f"{p['feat_ms']:.1f}",
                     f"{p.get('feat_mb_per_s') or 0:,.0f}", f"{p['label_ms']:.2f}", f"{total:.1f}",
                     f"{p['dgl_loader_ms']:.1f}" if "dgl_loader_ms" in p else "", f"{p['fwd_bwd_ms']:.1f}",
                     f"{p['loader_ms']:.1f}" if "loader_ms" in p else "", f"{a[arm]['batch_ms']:.1f}",
                     f"{a[arm]['batch_ms'] - p['loader_ms']:.1f}" if "loader_ms" in p else ""])
    md.append(harness.markdown_table(headers, rows))
    if "extra_ms_per_batch" in thr:
        x = thr["extra_ms_per_batch"]
        md.append(f"\nDistDGL's batch took {thr['extra_batch_ms']:+.1f} ms more in training; its training loader "
                  f"{x['loader_ms']:+.1f} ms per batch; of the probed parts, sampling {x['sample_ms']:+.1f} ms, "
                  f"feature fetch {x['feat_ms']:+.1f} ms, labels {x['label_ms']:+.2f} ms; model forward + backward "
                  f"{x['fwd_bwd_ms']:+.1f} ms. The probes run after the epochs, both ranks at once, as in training.")
    profiles = thr.get("profiles") or {}
    if profiles:
        md.append("\n### Where a training batch's time goes (graphtrainer's `profiler=\"simple\"`, separate "
                  "profiled run per arm; ms per batch, mean of the 2 ranks, all epochs)\n")
        stages = PROFILE_STAGES + ("all-reduce (inside backward)", "fit_per_batch")
        headers = ["arm", "seeds/s (profiled run)"] + [("fit / batch" if k == "fit_per_batch" else k) for k in stages]
        rows = []
        for arm in [k for k in ARMS if k in profiles]:
            for item in profiles[arm]:
                pb = item["per_batch_ms"] or {}
                rows.append([ARMS[arm], f"{item['seeds_per_s']:,.0f}"] + [f"{pb.get(k, 0):.1f}" for k in stages])
        md.append(harness.markdown_table(headers, rows))
        md.append("\n`sample` is the loader's `next()` (sampling, features, labels); `fit / batch` includes the "
                  "epochs' start-up and ends; `all-reduce` overlaps `backward`.")
    md.append(distgraph_remote.remote_markdown(remote, args.remote_reps))
    md.append("\n## 3. papers100M per machine, on paper\n")
    md.append(distgraph_paper.paper_markdown(paper))
    return "\n".join(md)


def draw_for(thr: Dict[str, Any]) -> Any:
    def draw(fig: Any) -> None:
        arms = [k for k in ARMS if k in thr["arms"]]
        ax = fig.add_subplot(1, 2, 1)
        ax.bar(range(len(arms)), [thr["arms"][k]["seeds_per_s"] for k in arms])
        ax.set_xticks(range(len(arms)), arms)
        ax.set_ylabel("training seeds/s (2 trainers)")
        ax = fig.add_subplot(1, 2, 2)
        width = 0.35
        for i, key in enumerate(("rank_uss_mb", "rank_pss_mb")):
            ax.bar([x + i * width for x in range(len(arms))], [thr["arms"][k][key] for k in arms], width,
                   label=key.replace("rank_", "trainer ").replace("_mb", ""))
        ax.set_xticks([x + width / 2 for x in range(len(arms))], arms)
        ax.set_ylabel("MB per trainer rank")
        ax.legend()
    return draw


def main(argv: Any = None) -> Optional[Dict[str, Any]]:
    args = parse_args(argv)
    if args.paper:
        print(distgraph_paper.paper_markdown(distgraph_paper.paper_rows()))
        return None
    if args.measure_halo:
        return distgraph_paper.measure_halo(graph_spec(args), args.halo_parts, args.out)
    from graphtrainer.distdgl.partition import partition_graph

    machine = harness.machine_info()
    t_start = time.time()
    spec = graph_spec(args)
    fanouts = [int(f) for f in args.fanouts.split(",")]
    private = not args.no_private_shm and bool(private_shm_prefix())
    if not private:
        print(f"[{NAME}] note: the arms share this machine's /dev/shm; a concurrent DistDGL run here would "
              "collide with them (DGL's feature segment names are not per graph)", flush=True)
    cfg = {"spec": spec, "fanouts": fanouts, "hidden": args.hidden, "batch_size": args.batch_size,
           "epochs": args.epochs, "batches": args.batches, "probe_batches": args.probe_batches,
           "watch_interval_s": 1.0}
    with tempfile.TemporaryDirectory(prefix="distgraph-") as tmp:
        work = Path(tmp)
        graph = workload.build_graph(spec)
        one = partition_graph(graph, "syn", 1, work / "parts1")
        two = None if args.skip_remote else partition_graph(graph, "syn", 2, work / "parts2")
        halo2 = distgraph_paper.halo_stats(two) if two is not None else None
        del graph
        gc.collect()
        cfg["part_config"] = str(one.config)
        runs: Dict[str, List[Dict[str, Any]]] = {arm: [] for arm in args.arms}
        order = []
        for rnd in range(args.rounds):
            for arm in args.arms:
                print(f"[{NAME}] round {rnd + 1}/{args.rounds}: {arm} (load {os.getloadavg()[0]:.2f})", flush=True)
                res = run_arm(arm, cfg, work, private, args.timeout)
                summ = summarize_run(res, args.batch_size)
                runs[arm].append(summ)
                order.append(arm)
                print(f"    seeds/s {summ['seeds_per_s']:,.0f}  epochs s {[round(s, 2) for s in summ['epoch_s']]}  "
                      f"trainer USS {[round(x) for x in summ['rank_uss_mb']]} MB  other load "
                      f"{summ['other_cores']} cores", flush=True)
        thr = analyse_throughput(runs)
        profiles: Dict[str, Any] = {}
        for rnd in range(args.profile_rounds):
            for arm in args.arms:
                print(f"[{NAME}] profiled run {rnd + 1}/{args.profile_rounds}: {arm} (load "
                      f"{os.getloadavg()[0]:.2f})", flush=True)
                res = run_arm(arm, dict(cfg, profile=True, probe_batches=0), work, private, args.timeout)
                profiles.setdefault(arm, []).append(
                    {"per_batch_ms": profile_per_batch(res), "seeds_per_s": summarize_run(res, args.batch_size)
                     ["seeds_per_s"], "other_cores": res["other_cores"], "profile": res["profile"]})
        thr["profiles"] = profiles
        remote = None
        if two is not None:
            print(f"[{NAME}] remote fetches on 2 simulated machines (load {os.getloadavg()[0]:.2f})", flush=True)
            remote = distgraph_remote.remote_part(str(two.config), {"fanouts": fanouts, "hidden": args.hidden,
                                                   "batch_size": args.batch_size, "batches": args.remote_batches,
                                                   "reps": args.remote_reps}, args.timeout)
    paper = distgraph_paper.paper_rows()
    model = distgraph_paper.model_bytes_one_part(spec)
    md = render(spec, thr, remote, paper, args, model)
    payload = {"benchmark": NAME, "machine": machine, "versions": harness.versions(),
               "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()
                          if k not in ("arm_worker", "machine_worker", "mem_watch")},
               "graph": spec, "private_shm": private, "order": order, "wall_s": round(time.time() - t_start, 1),
               "throughput": thr, "runs": runs, "remote": remote, "halo_2_parts": halo2, "paper": paper,
               "model_one_part": model}
    harness.write_outputs(args.out, NAME, payload, md, draw_for(thr), figsize=(10, 4))
    print(md)
    if remote is not None and "failed" in remote:
        raise SystemExit(1)
    return payload


if __name__ == "__main__":
    main()
