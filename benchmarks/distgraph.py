"""DistDGL against the in-memory graph: training seeds/s and memory per trainer; a remote
feature fetch; what a partitioned papers100M holds per machine.

    python benchmarks/distgraph.py                         # full run, 1M nodes
    python benchmarks/distgraph.py --paper                 # papers100M table only (no data)
    python benchmarks/distgraph.py --tiny --skip-remote    # seconds (smoke test)

Arms, interleaved, each a fresh process (``distgraph_worker.py``): ``workload.BenchTask`` on a
1-partition DistDGL graph (2 trainers + 1 graph server) and on the in-memory graph with fork.
Part 2: 2 METIS parts on 2 simulated machines. Part 3: :func:`paper_rows`, on paper.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import harness
import workload
from distgraph_worker import ARMS, SCRIPT as WORKER, child_env, private_shm_prefix, run_arm

NAME = "distgraph"
GB = 1e9
MEM_KEYS = ("server_rss_mb", "server_pss_mb", "server_uss_mb", "driver_rss_mb", "driver_pss_mb", "driver_uss_mb")

#: ogbn-papers100M as OGB ships it (directed citation edges).
PAPERS100M = {"name": "ogbn-papers100M", "nodes": 111_059_956, "edges": 1_615_685_872, "feat_dim": 128,
              "train": 1_207_179}
#: Halo nodes per inner node and edges a part stores per inner edge, measured on the synthetic
#: 1Mx10 graph in K METIS parts, 1 halo hop (results/distgraph/halo.json): pessimistic for papers100M.
HALO_MEASURED = {4: (1.229, 1.186), 8: (1.699, 1.218), 16: (4.404, 1.674)}


def paper_rows(graph: Dict[str, Any] = PAPERS100M) -> List[Dict[str, Any]]:
    """Bytes per machine of DGL 2.1's partitioned layout and of one machine holding it all. A
    graph server holds its inner nodes' data (float32 ``feat``, int64 ``label``, 3 bool masks)
    and the part graph over inner + halo nodes as CSC with edge ids and ``_ID``/``inner_*`` per
    node and edge; one machine (fork) every node's data, COO (as built) and CSC with edge ids."""
    n, e, f = graph["nodes"], graph["edges"], graph["feat_dim"]
    rows = [{"machines": 1, "layout": "one machine, in-memory DGLGraph", "inner_nodes": n, "halo_nodes": 0.0,
             "edges_held": e, "features_b": 4.0 * f * n, "csc_b": 8.0 * (n + 1 + e), "eid_b": 8.0 * e + 16.0 * e,
             "other_b": 11.0 * n}]
    for k, (halo, edge_factor) in HALO_MEASURED.items():
        inner = n / k
        nodes, edges = inner * (1 + halo), e / k * edge_factor
        rows.append({"machines": k, "layout": f"DistDGL, {k} parts", "inner_nodes": inner, "halo_nodes": inner * halo,
                     "edges_held": edges, "features_b": 4.0 * f * inner, "csc_b": 8.0 * (nodes + 1 + edges),
                     "eid_b": 16.0 * edges, "other_b": 11.0 * inner + 9.0 * nodes + edges})
    for row in rows:
        row["total_b"] = row["features_b"] + row["csc_b"] + row["eid_b"] + row["other_b"]
        row["vs_one_machine"] = row["total_b"] / rows[0]["total_b"]
        row["train_per_machine"] = graph["train"] / row["machines"]
    return rows


def paper_markdown(rows: List[Dict[str, Any]], graph: Dict[str, Any] = PAPERS100M) -> str:
    body = [[r["machines"], r["layout"], f"{r['inner_nodes']:,.0f}", f"{r['halo_nodes']:,.0f}",
             f"{r['edges_held']:,.0f}", f"{r['features_b'] / GB:.1f}", f"{r['csc_b'] / GB:.1f}",
             f"{r['eid_b'] / GB:.1f}", f"{r['total_b'] / GB:.1f}", f"{r['vs_one_machine']:.3f}",
             f"{r['train_per_machine']:,.0f}"] for r in rows]
    return (f"{graph['name']}: {graph['nodes']:,} nodes, {graph['edges']:,} edges, {graph['feat_dim']}-d float32 "
            "features. GB = 1e9 bytes; edge ids: CSC's and `_ID` (one machine: + COO).\n\n"
            + harness.markdown_table(["machines", "layout", "inner nodes", "halo nodes", "edges held", "features GB",
                                      "CSC indptr+indices GB", "edge ids GB (CSC + _ID)", "total GB", "x one machine",
                                      "train nodes"], body)
            + "\n\nHalo ratios from a random 8-class graph (`HALO_MEASURED`): pessimistic for a citation graph.")


def summarize_run(res: Dict[str, Any]) -> Dict[str, Any]:
    """Seeds/s over the steady epochs, rank memory at the last epoch's end, driver and server
    memory (the watcher's samples) over the steady window."""
    epochs = res["epochs"]
    steady = epochs[1:] or epochs
    lo, hi = (epochs[0]["end_wall"] if len(epochs) > 1 else 0.0), epochs[-1]["end_wall"]
    with_ranks = [s for s in res["samples"] if any(p["role"] == "rank" for p in s["procs"])]
    window = [s for s in with_ranks if lo <= s["t"] <= hi] or with_ranks or res["samples"]

    def mem(role: str, key: str) -> Optional[float]:
        vals = [sum(p[key] for p in s["procs"] if p["role"] == role) for s in window
                if any(p["role"] == role for p in s["procs"])]
        return statistics.median(vals) if vals else None

    ranks = len(epochs[-1]["ranks"])
    return {"seeds_per_s": statistics.median([e["seeds_all_ranks"] / e["seconds"] for e in steady]),
            "batch_ms": statistics.median([1000 * e["seconds"] * ranks / max(1, e["batches_all_ranks"]) for e in steady]),
            "epoch_s": [e["seconds"] for e in epochs], "seeds_per_epoch": steady[0]["seeds_all_ranks"],
            **{f"rank_{k}": [r[k] for r in epochs[-1]["ranks"]] for k in ("uss_mb", "pss_mb", "rss_mb")},
            **{k: mem(k.split("_")[0], k.split("_", 1)[1]) for k in MEM_KEYS},
            "total_pss_mb": statistics.median([sum(p["pss_mb"] for p in s["procs"]) for s in window]),
            "fit_s": res["fit_s"]}


def analyse(runs: Dict[str, List[Dict[str, Any]]]) -> Dict[str, Any]:
    """Per arm: medians over rounds (rank memory: mean over ranks); ratios DistDGL / fork."""
    def med(vals: List[Any]) -> Optional[float]:
        vals = [v for v in vals if v is not None]
        return statistics.median(vals) if vals else None

    arms = {arm: {"runs": len(items), "seeds_per_s_runs": [r["seeds_per_s"] for r in items],
                  **{k: med([r[k] for r in items]) for k in ("seeds_per_s", "batch_ms", "total_pss_mb") + MEM_KEYS},
                  **{f"rank_{k}": med([statistics.fmean(r[f"rank_{k}"]) for r in items])
                     for k in ("uss_mb", "pss_mb", "rss_mb")},
                  "other_cores": statistics.fmean(r["other_cores"] or 0.0 for r in items)}
            for arm, items in runs.items()}
    out: Dict[str, Any] = {"arms": arms}
    if "distdgl" in arms and "fork" in arms:
        d, f = arms["distdgl"], arms["fork"]
        out["ratios"] = {k: d[k] / f[k] for k in ("seeds_per_s", "batch_ms", "rank_uss_mb", "rank_pss_mb",
                                                   "rank_rss_mb", "total_pss_mb") if d.get(k) and f.get(k)}
        out["pair_ratios_seeds_per_s"] = [a / b for a, b in zip(d["seeds_per_s_runs"], f["seeds_per_s_runs"])]
    return out


def remote_part(part_config: str, cfg: Dict[str, Any], timeout: float) -> Dict[str, Any]:
    """Part 2 on 2 simulated machines: ``{"ranks": [...]}``, ``{"skipped": why}`` where they
    cannot be made here, ``{"failed": what}`` with the machines' log tails."""
    from graphtrainer.testing import simulated_machines as sm

    ok, why = sm.can_simulate()
    if not ok:
        print(f"[{NAME}] remote fetches skipped: {why}", flush=True)
        return {"skipped": why}
    machines = sm.SimulatedMachines(2)
    with tempfile.TemporaryDirectory(prefix="distgraph-remote-") as work, machines:
        path = os.path.join(work, "config.json")
        Path(path).write_text(json.dumps(dict(cfg, part_config=part_config, out_dir=work,
                                              ip_config=machines.ip_config(os.path.join(work, "ip_config.txt")))))
        logs = [open(os.path.join(work, f"machine{m}.log"), "wb") for m in range(2)]
        try:
            procs = [machines.popen(m, [sys.executable, WORKER, "--machine", path], stdout=logs[m],
                                    stderr=subprocess.STDOUT, env=child_env()) for m in range(2)]
            try:
                bad = sm.wait_all(procs, timeout)
            except TimeoutError as err:
                bad = str(err)
        finally:
            for fh in logs:
                fh.close()
        if bad is not None:
            tails = "\n".join(Path(work, f"machine{m}.log").read_text(errors="replace")[-3000:] for m in range(2))
            print(f"[{NAME}] simulated machines failed ({bad}):\n{tails}", file=sys.stderr, flush=True)
            return {"failed": f"{bad}\n{tails}"}
        return {"ranks": [json.loads(Path(work, f"rank{r}.json").read_text()) for r in range(2)]}


def render(spec: Dict[str, Any], thr: Dict[str, Any], remote: Optional[Dict[str, Any]], args: Any) -> str:
    num = lambda x: "-" if x is None else f"{x:,.0f}"  # noqa: E731
    md = [f"## 1. Seeds/s and memory per trainer ({workload.size_label(spec)}, {spec['feat_dim']}-d features; "
          f"fanouts {args.fanouts}, batch {args.batch_size}, {args.epochs} epochs of {args.batches} batches per rank, "
          f"first warm-up; {args.rounds} interleaved round(s))\n"]
    rows = [[ARMS[k], f"{r['seeds_per_s']:,.0f} (" + ", ".join(f"{x:,.0f}" for x in r["seeds_per_s_runs"]) + ")",
             f"{r['batch_ms']:.1f}", num(r["rank_uss_mb"]), num(r["rank_pss_mb"]),
             " / ".join(num(r[k]) for k in MEM_KEYS[:3]), num(r["driver_pss_mb"]), num(r["total_pss_mb"]),
             f"{r['other_cores']:.2f}"] for k, r in thr["arms"].items()]
    md.append(harness.markdown_table(["arm", "seeds/s (median; per round)", "ms/batch per rank", "trainer USS MB",
                                      "trainer PSS MB", "graph server RSS / PSS / USS MB", "driver PSS MB",
                                      "total PSS MB", "other load (cores)"], rows))
    if "ratios" in thr:
        q = thr["ratios"]
        md.append(f"\n**DistDGL / fork**: seeds/s {q['seeds_per_s']:.2f}x (per round: "
                  + ", ".join(f"{x:.2f}" for x in thr["pair_ratios_seeds_per_s"]) + f"); trainer USS "
                  f"{q['rank_uss_mb']:.2f}x, PSS {q['rank_pss_mb']:.2f}x.")
    md.append("\n## 2. Remote feature fetches (2 simulated machines, 1 trainer each)\n")
    if remote is None or "ranks" not in remote:
        md.append("Not run (--skip-remote)." if remote is None else
                  f"Skipped: {remote['skipped']}." if "skipped" in remote else f"Failed:\n\n```\n{remote['failed']}\n```")
    else:
        md.append(harness.markdown_table(
            ["rank", "ids per fetch", "local ms", "remote ms", "remote / local", "remote input nodes"],
            [[r["rank"], f"{r['ids']:,}", f"{r['local_ms']:.2f}", f"{r['remote_ms']:.2f}",
              f"{r['remote_ms'] / r['local_ms']:.1f}x", f"{100 * r['remote_fraction_mean']:.1f}%"]
             for r in remote["ranks"]]))
        md.append(f"\nRow size {remote['ranks'][0]['row_bytes']} B; medians of {args.remote_reps} fetches, one rank "
                  "measuring at a time; the \"network\" is a veth pair (DGL's RPC and copy costs).")
    md += ["\n## 3. papers100M per machine, on paper\n", paper_markdown(paper_rows())]
    return "\n".join(md)


def main(argv: Optional[Sequence[str]] = None) -> Optional[Dict[str, Any]]:
    p = harness.base_parser(NAME, __doc__, rounds=2)
    p.add_argument("--nodes", type=int, default=1_000_000, help="synthetic graph nodes, degree 10")
    p.add_argument("--feat-dim", type=int, default=64)
    p.add_argument("--epochs", type=int, default=4, help="per run; the first is warm-up (default %(default)s)")
    p.add_argument("--batches", type=int, default=40, help="training batches per rank and epoch")
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--fanouts", default="10,10")
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--arms", nargs="+", choices=list(ARMS), default=list(ARMS))
    p.add_argument("--remote-batches", type=int, default=20, help="training batches per rank in part 2")
    p.add_argument("--remote-reps", type=int, default=5, help="timed fetches per kind in part 2")
    p.add_argument("--paper", action="store_true", help="print the papers100M table (no data needed) and exit")
    p.add_argument("--skip-remote", action="store_true", help="leave out part 2 (simulated machines)")
    p.add_argument("--no-private-shm", action="store_true", help="use this machine's /dev/shm (default: a private "
                                                                 "tmpfs when root)")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per run before it is killed")
    args = p.parse_args(argv)
    if args.paper:
        print(paper_markdown(paper_rows()))
        return None
    if args.tiny:
        args.nodes, args.feat_dim, args.epochs, args.batches, args.rounds = 20_000, 16, 1, 3, 1
        args.batch_size, args.hidden, args.remote_batches, args.remote_reps, args.timeout = 256, 32, 3, 2, 300.0
    from graphtrainer.distdgl.partition import partition_graph

    spec = {"dataset": "synthetic", "num_nodes": args.nodes, "avg_degree": 10, "feat_dim": args.feat_dim,
            "num_classes": 8, "seed": 0}
    fanouts = [int(f) for f in args.fanouts.split(",")]
    private = not args.no_private_shm and bool(private_shm_prefix())
    if not private:
        print(f"[{NAME}] note: the arms share this machine's /dev/shm (DGL's segment names are not per graph)")
    cfg = {"spec": spec, "fanouts": fanouts, "hidden": args.hidden, "batch_size": args.batch_size,
           "epochs": args.epochs, "batches": args.batches, "watch_interval_s": 1.0}
    with tempfile.TemporaryDirectory(prefix="distgraph-") as tmp:
        graph = workload.build_graph(spec)
        cfg["part_config"] = str(partition_graph(graph, "syn", 1, Path(tmp) / "parts1").config)
        two = None if args.skip_remote else partition_graph(graph, "syn", 2, Path(tmp) / "parts2")
        del graph
        runs, order = harness.interleave(
            {arm: (lambda rnd, arm=arm: summarize_run(run_arm(arm, cfg, Path(tmp), private, args.timeout)))
             for arm in args.arms}, args.rounds, NAME,
            lambda s: f"seeds/s {s['seeds_per_s']:,.0f}  trainer USS {[round(x) for x in s['rank_uss_mb']]} MB")
        thr = analyse(runs)
        remote = None if two is None else remote_part(str(two.config), {
            "fanouts": fanouts, "hidden": args.hidden, "batch_size": args.batch_size, "batches": args.remote_batches,
            "reps": args.remote_reps}, args.timeout)
    md = render(spec, thr, remote, args)
    payload = {"config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}, "graph": spec,
               "private_shm": private, "order": order, "throughput": thr, "runs": runs, "remote": remote,
               "paper": paper_rows()}
    harness.write_outputs(args.out, NAME, payload, md, harness.bar_plot(
        {k: a["seeds_per_s"] for k, a in thr["arms"].items()}, "training seeds/s (2 trainers)"), figsize=(10, 4))
    print(md)
    if remote is not None and "failed" in remote:
        raise SystemExit(1)
    return payload


if __name__ == "__main__":
    main()
