"""DistDGL against the in-memory graph: training seeds/s and memory per trainer, remote
feature fetches, and what a partitioned papers100M holds per machine.

    python benchmarks/distgraph.py --out benchmarks/results/distgraph   # full run, 1M nodes
    python benchmarks/distgraph.py --paper                                # papers100M table only (no data)
    python benchmarks/distgraph.py --quick --skip-remote --out /tmp/dg    # seconds (smoke test)
    python benchmarks/distgraph.py --measure-halo --out benchmarks/results/distgraph

Arms (``distgraph_arm.py``, each a fresh process): ``workload.BenchTask`` on a 1-partition
DistDGL graph (2 trainers + 1 graph server) and on the in-memory graph with fork, interleaved.
Part 2 (``distgraph_remote.py``): 2 METIS parts on 2 simulated machines. Part 3
(``distgraph_paper.py``): papers100M per machine at 4/8/16 machines, on paper.
"""
from __future__ import annotations

import argparse
import gc
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

import harness
import distgraph_paper
import distgraph_remote
import workload
from distgraph_arm import ARMS, private_shm_prefix, run_arm

NAME = "distgraph"
PROBE_KEYS = ("sample_ms", "feat_ms", "label_ms", "input_nodes", "feat_mb_per_s", "loader_ms", "fwd_bwd_ms")
MEM_KEYS = ("server_rss_mb", "server_pss_mb", "server_uss_mb", "driver_rss_mb", "driver_pss_mb", "driver_uss_mb")


def _med(vals: List[Any]) -> Optional[float]:
    vals = [v for v in vals if v is not None]
    return statistics.median(vals) if vals else None


def summarize_run(res: Dict[str, Any]) -> Dict[str, Any]:
    """Seeds/s and ms per batch over the steady epochs, rank memory at the last epoch end,
    driver and server memory (watcher samples) over the steady window."""
    epochs = res["epochs"]
    steady = epochs[1:] if len(epochs) > 1 else epochs
    world = len(epochs[-1]["ranks"])
    lo, hi = (epochs[0]["end_wall"] if len(epochs) > 1 else 0.0), epochs[-1]["end_wall"]
    with_ranks = [s for s in res["samples"] if any(p["role"] == "rank" for p in s["procs"])]
    window = [s for s in with_ranks if lo <= s["t"] <= hi] or with_ranks or res["samples"]

    def mem(role: str, key: str) -> Optional[float]:
        return _med([sum(p[key] for p in s["procs"] if p["role"] == role) for s in window
                     if any(p["role"] == role for p in s["procs"])])

    last = epochs[-1]["ranks"]
    return {"seeds_per_s": statistics.median([e["seeds_all_ranks"] / e["seconds"] for e in steady]),
            "batch_ms": statistics.median([1000 * e["seconds"] / max(1, e["batches_all_ranks"] / world) for e in steady]),
            "epoch_s": [e["seconds"] for e in epochs], "seeds_per_epoch": steady[0]["seeds_all_ranks"],
            **{f"rank_{k}": [r[k] for r in last] for k in ("uss_mb", "pss_mb", "rss_mb")},
            **{k: mem(k.split("_")[0], k.split("_", 1)[1]) for k in MEM_KEYS},
            "total_pss_mb": _med([sum(p["pss_mb"] for p in s["procs"]) for s in window]),
            "fit_s": res["fit_s"], "probe": res["probe"], "other_cores": res.get("other_cores")}


def analyse(runs: Dict[str, List[Dict[str, Any]]]) -> Dict[str, Any]:
    """Per arm: medians over runs; ratios DistDGL / fork."""
    arms: Dict[str, Any] = {}
    for arm, items in runs.items():
        probes = [p for r in items for p in r["probe"]]
        arms[arm] = {"runs": len(items), "seeds_per_s_runs": [r["seeds_per_s"] for r in items],
                     **{k: _med([r[k] for r in items]) for k in ("seeds_per_s", "batch_ms", "total_pss_mb") + MEM_KEYS},
                     **{f"rank_{k}": statistics.median([statistics.fmean(r[f"rank_{k}"]) for r in items])
                        for k in ("uss_mb", "pss_mb", "rss_mb")},
                     "probe": {k: _med([p.get(k) for p in probes]) for k in PROBE_KEYS
                               if any(p.get(k) is not None for p in probes)},
                     "other_cores": statistics.fmean(r["other_cores"] or 0.0 for r in items)}
    out: Dict[str, Any] = {"arms": arms}
    if "distdgl" in arms and "fork" in arms:
        d, f = arms["distdgl"], arms["fork"]
        out["ratios"] = {k: d[k] / f[k] for k in ("seeds_per_s", "batch_ms", "rank_uss_mb", "rank_pss_mb",
                                                   "rank_rss_mb", "total_pss_mb") if d.get(k) and f.get(k)}
        out["pair_ratios_seeds_per_s"] = [a / b for a, b in zip(d["seeds_per_s_runs"], f["seeds_per_s_runs"])]
    return out


def parse_args(argv: Any = None) -> Any:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=1_000_000, help="synthetic graph nodes, degree 10 (default %(default)s)")
    p.add_argument("--feat-dim", type=int, default=64)
    p.add_argument("--epochs", type=int, default=4, help="per run; the first is warm-up (default %(default)s)")
    p.add_argument("--batches", type=int, default=40, help="training batches per rank and epoch (default %(default)s)")
    p.add_argument("--rounds", type=int, default=2, help="DistDGL/fork pairs, interleaved (default %(default)s)")
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--fanouts", default="10,10")
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--arms", nargs="+", choices=list(ARMS), default=list(ARMS))
    p.add_argument("--probe-batches", type=int, default=10, help="batches timed for the per-batch breakdown")
    p.add_argument("--remote-batches", type=int, default=20, help="training batches per rank in part 2")
    p.add_argument("--remote-reps", type=int, default=5, help="timed fetches per kind and size in part 2")
    p.add_argument("--out", type=Path, default=Path("bench_out") / NAME, help="output folder (default: %(default)s)")
    p.add_argument("--paper", action="store_true", help="print the papers100M table (no data needed) and exit")
    p.add_argument("--skip-remote", action="store_true", help="leave out part 2 (simulated machines)")
    p.add_argument("--quick", action="store_true", help="tiny graph, 1 epoch: a seconds-long smoke run")
    p.add_argument("--no-private-shm", action="store_true", help="use this machine's /dev/shm (default: a private "
                                                                 "tmpfs when root)")
    p.add_argument("--measure-halo", action="store_true",
                   help="partition the synthetic graph into --halo-parts parts, write halo.json, exit")
    p.add_argument("--halo-parts", type=lambda s: [int(x) for x in s.split(",")], default=[2, 4, 8, 16])
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per run before it is killed")
    args = p.parse_args(argv)
    if args.quick:
        args.nodes, args.feat_dim, args.epochs, args.batches, args.rounds = 20_000, 16, 1, 3, 1
        args.batch_size, args.hidden, args.probe_batches = 256, 32, 2
        args.remote_batches, args.remote_reps, args.timeout = 3, 2, 300.0
    if args.epochs < 1 or args.batches < 1 or args.rounds < 1 or args.nodes < 100:
        p.error("--epochs, --batches and --rounds must be >= 1, --nodes >= 100")
    return args


def render(spec: Dict[str, Any], thr: Dict[str, Any], remote: Optional[Dict[str, Any]],
           paper: List[Dict[str, Any]], args: Any, model: Dict[str, float]) -> str:
    a = thr["arms"]
    num = lambda x: "-" if x is None else f"{x:,.0f}"  # noqa: E731
    label = workload.size_label({"num_nodes": spec["num_nodes"], "avg_degree": spec["avg_degree"]})
    md = [f"## 1. Seeds/s and memory per trainer ({label}, {spec['feat_dim']}-d features; fanouts {args.fanouts}, "
          f"batch {args.batch_size}, {args.epochs} epochs of {args.batches} batches per rank, first warm-up; "
          f"{args.rounds} interleaved round(s))\n"]
    rows = [[ARMS[k], f"{r['seeds_per_s']:,.0f} (" + ", ".join(f"{x:,.0f}" for x in r["seeds_per_s_runs"]) + ")",
             f"{r['batch_ms']:.1f}", num(r["rank_uss_mb"]), num(r["rank_pss_mb"]), num(r["rank_rss_mb"]),
             " / ".join(num(r[k]) for k in MEM_KEYS[:3]), f"{num(r['driver_rss_mb'])} / {num(r['driver_pss_mb'])}",
             num(r["total_pss_mb"]), f"{r['other_cores']:.2f}"] for k, r in a.items()]
    md.append(harness.markdown_table(["arm", "seeds/s (median; per run)", "ms/batch per rank", "trainer USS MB",
                                      "trainer PSS MB", "trainer RSS MB", "graph server RSS / PSS / USS MB",
                                      "driver RSS / PSS MB", "total PSS MB", "other load (cores)"], rows))
    if "ratios" in thr:
        q = thr["ratios"]
        md.append("\n**DistDGL / fork**: seeds/s " + f"{q['seeds_per_s']:.2f}x (per pair: "
                  + ", ".join(f"{x:.2f}" for x in thr["pair_ratios_seeds_per_s"]) + f"); ms per batch "
                  f"{q['batch_ms']:.2f}x; trainer USS {q['rank_uss_mb']:.2f}x, PSS {q['rank_pss_mb']:.2f}x, "
                  f"RSS {q['rank_rss_mb']:.2f}x. Model (`paper_rows` on this graph): a 1-part server holds "
                  f"{model['server_mb']:,.0f} MB, one in-memory graph {model['one_machine_mb']:,.0f} MB.")
    md.append(f"\n### Per-batch costs (each rank, medians over {args.probe_batches} batches after the last epoch)\n")
    rows = [[ARMS[k], f"{p['input_nodes']:,.0f}"] + [f"{p.get(c, float('nan')):.2f}" for c in PROBE_KEYS if c != "input_nodes"]
            for k, p in ((k, r["probe"]) for k, r in a.items()) if p]
    md.append(harness.markdown_table(["arm", "input nodes / batch", "sampling ms", "feature fetch ms", "labels ms",
                                      "feature MB/s", "training loader ms", "forward + backward ms"], rows))
    md.append(distgraph_remote.remote_markdown(remote, args.remote_reps))
    md.append("\n## 3. papers100M per machine, on paper\n")
    md.append(distgraph_paper.paper_markdown(paper))
    return "\n".join(md)


def draw_for(thr: Dict[str, Any]) -> Any:
    return harness.bar_plot({k: a["seeds_per_s"] for k, a in thr["arms"].items()}, "training seeds/s (2 trainers)")


def main(argv: Any = None) -> Optional[Dict[str, Any]]:
    args = parse_args(argv)
    if args.paper:
        print(distgraph_paper.paper_markdown(distgraph_paper.paper_rows()))
        return None
    spec = {"dataset": "synthetic", "num_nodes": args.nodes, "avg_degree": 10, "feat_dim": args.feat_dim,
            "num_classes": 8, "seed": 0}
    if args.measure_halo:
        return distgraph_paper.measure_halo(spec, args.halo_parts, args.out)
    from graphtrainer.distdgl.partition import partition_graph

    machine, t_start = harness.machine_info(), time.time()
    fanouts = [int(f) for f in args.fanouts.split(",")]
    private = not args.no_private_shm and bool(private_shm_prefix())
    if not private:
        print(f"[{NAME}] note: the arms share this machine's /dev/shm (DGL's segment names are not per graph)")
    cfg = {"spec": spec, "fanouts": fanouts, "hidden": args.hidden, "batch_size": args.batch_size,
           "epochs": args.epochs, "batches": args.batches, "probe_batches": args.probe_batches, "watch_interval_s": 1.0}
    with tempfile.TemporaryDirectory(prefix="distgraph-") as tmp:
        work = Path(tmp)
        graph = workload.build_graph(spec)
        cfg["part_config"] = str(partition_graph(graph, "syn", 1, work / "parts1").config)
        two = None if args.skip_remote else partition_graph(graph, "syn", 2, work / "parts2")
        halo2 = distgraph_paper.halo_stats(two) if two is not None else None
        del graph
        gc.collect()
        runs, order = harness.interleave(
            {arm: (lambda rnd, arm=arm: summarize_run(run_arm(arm, cfg, work, private, args.timeout)))
             for arm in args.arms}, args.rounds, NAME,
            lambda s: f"seeds/s {s['seeds_per_s']:,.0f}  epochs s {[round(x, 2) for x in s['epoch_s']]}  "
                      f"trainer USS {[round(x) for x in s['rank_uss_mb']]} MB")
        thr = analyse(runs)
        remote = None
        if two is not None:
            remote = distgraph_remote.remote_part(str(two.config), {"fanouts": fanouts, "hidden": args.hidden,
                                                   "batch_size": args.batch_size, "batches": args.remote_batches,
                                                   "reps": args.remote_reps}, args.timeout)
    paper, model = distgraph_paper.paper_rows(), distgraph_paper.model_bytes_one_part(spec)
    md = render(spec, thr, remote, paper, args, model)
    payload = {"machine": machine, "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
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
