"""DistDGL against the in-memory graph: 1. seeds/s and memory per trainer (2 trainers, a 1-partition
DistDGL graph / the in-memory graph with fork); 2. a feature fetch, local and remote (2 METIS parts
on 2 simulated machines); 3. what a partitioned papers100M holds per machine (on paper).

    python benchmarks/distgraph.py                         # full run, 1Mx10
    python benchmarks/distgraph.py --paper                 # papers100M table only (no data)
    python benchmarks/distgraph.py --tiny --skip-remote    # seconds (smoke test)"""
from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import harness
import probe
import torch
import workload
from graphtrainer import comm as gdist
from graphtrainer.distdgl.partition import partition_graph
from graphtrainer.testing import simulated_machines as sm

NAME, SCRIPT, GB = "distgraph", os.path.abspath(__file__), 1e9
TIMEOUT_S, FETCH_REPS = 900.0, 5  # per process; timed fetches of each kind in part 2
ARMS = {"distdgl": "DistDGL, 1 partition (2 trainers + 1 graph server)", "fork": "in-memory graph, fork (2 trainers)"}
MEM = ("rss_mb", "pss_mb", "uss_mb")
RANK_KEYS = tuple(f"rank_{k}" for k in MEM)
SCALARS = ("seeds_per_s", "batch_ms", "total_pss_mb", *(f"{who}_{k}" for who in ("server", "driver") for k in MEM))
PRIVATE_SHM = (["unshare", "--mount", "--propagation", "private", "sh", "-c",
                'mount -t tmpfs -o mode=1777 tmpfs /dev/shm && exec "$@"', "sh"]
               if os.geteuid() == 0 and shutil.which("unshare") else [])

#: ogbn-papers100M as OGB ships it (directed citation edges).
PAPERS100M = {"name": "ogbn-papers100M", "nodes": 111_059_956, "edges": 1_615_685_872, "feat_dim": 128,
              "train": 1_207_179}
#: Halo nodes per inner node, edges held per inner edge: 1Mx10 synthetic in K METIS parts (results/distgraph/halo.json).
HALO_MEASURED = {4: (1.229, 1.186), 8: (1.699, 1.218), 16: (4.404, 1.674)}


def paper_rows(graph: Dict[str, Any] = PAPERS100M) -> List[Dict[str, Any]]:
    """Bytes per machine (DGL 2.1): a server holds its inner nodes' data (``feat``, ``label``, 3 masks) and,
    over inner + halo nodes, CSC with edge ids, ``_ID``, ``inner_*``; one machine all, COO + CSC with ids."""
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
    totals = [r["features_b"] + r["csc_b"] + r["eid_b"] + r["other_b"] for r in rows]
    return [dict(r, total_b=t, vs_one_machine=t / totals[0], train_per_machine=graph["train"] / r["machines"])
            for r, t in zip(rows, totals)]


def paper_markdown(rows: List[Dict[str, Any]], graph: Dict[str, Any] = PAPERS100M) -> str:
    body = [[r["machines"], r["layout"], f"{r['inner_nodes']:,.0f}", f"{r['halo_nodes']:,.0f}",
             f"{r['edges_held']:,.0f}", *(f"{r[k] / GB:.1f}" for k in ("features_b", "csc_b", "eid_b", "total_b")),
             f"{r['vs_one_machine']:.3f}", f"{r['train_per_machine']:,.0f}"] for r in rows]
    return (f"{graph['name']}: {graph['nodes']:,} nodes, {graph['edges']:,} edges, {graph['feat_dim']}-d float32 "
            "features. GB = 1e9 bytes; edge ids: CSC's and `_ID` (one machine: + COO). Halo ratios from a random "
            "8-class graph (`HALO_MEASURED`): pessimistic for a citation graph.\n\n"
            + harness.markdown_table(["machines", "layout", "inner nodes", "halo nodes", "edges held", "features GB",
                                      "CSC indptr+indices GB", "edge ids GB (CSC + _ID)", "total GB",
                                      "x one machine", "train nodes"], body))


def med(vals: List[Any]) -> Optional[float]:
    vals = [v for v in vals if v is not None]
    return statistics.median(vals) if vals else None


class RankProbe(workload.EpochTimer):
    """Per epoch all ranks' seeds and batches (the epoch ends with the slower rank) and memory, and the driver's
    tree's; rank 0 writes medians over the steady epochs and the ranks' memory at the last's end to ``path``."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self.path, self.rows, self._seeds = path, [], 0

    def on_train_batch_end(self, trainer: Any, task: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        super().on_train_batch_end(trainer, task, outputs, batch, batch_idx)
        self._seeds += int(batch[1].numel())

    def on_train_epoch_end(self, trainer: Any, task: Any) -> None:
        counts = gdist.all_reduce(torch.tensor([self._seeds, len(self.step_ends[-1])], dtype=torch.float64))
        super().on_train_epoch_end(trainer, task)
        seconds, (seeds, batches), self._seeds = self.times[-1], counts.tolist(), 0
        ranks = gdist.all_gather_object(probe.smaps_rollup(os.getpid()))
        if task.rank != 0:
            return
        tree = probe.tree_memory(os.getppid())["processes"]  # the driver's, the driver first
        servers = [p for p in tree if "distdgl.servers" in p["cmd"]]
        self.rows.append({"seconds": seconds, "seeds": int(seeds), "seeds_per_s": seeds / seconds,
                          "batch_ms": 1000 * seconds * len(ranks) / batches,
                          **{f"rank_{k}": [r[k] for r in ranks] for k in MEM},
                          **{f"driver_{k}": tree[0][k] for k in MEM},
                          **{f"server_{k}": sum(p[k] for p in servers) if servers else None for k in MEM},
                          "total_pss_mb": sum(p["pss_mb"] for p in tree)})
        steady = self.rows[1:] or self.rows
        summary = {k: med([e[k] for e in steady]) for k in SCALARS}
        summary.update({k: self.rows[-1][k] for k in RANK_KEYS}, epoch_s=[e["seconds"] for e in self.rows])
        Path(self.path).write_text(json.dumps(dict(summary, seeds_per_epoch=steady[0]["seeds"])))


def run_arm(arm: str, cfg: Dict[str, Any], work: Path) -> Dict[str, Any]:
    """One arm in a fresh process, its summary; ``/dev/shm`` private where root can (names are not per graph)."""
    cfg = dict(cfg, arm=arm, result=str(work / f"{arm}-result.json"))
    harness.run_process(PRIVATE_SHM + [sys.executable, SCRIPT, "--worker", json.dumps(cfg)], f"{NAME} {arm}",
                        timeout=TIMEOUT_S)
    return json.loads(Path(cfg["result"]).read_text())


def analyse(runs: Dict[str, List[Dict[str, Any]]]) -> Dict[str, Any]:
    """Per arm: medians over rounds (trainer memory: mean over ranks); ratios DistDGL / fork."""
    arms = {arm: {"runs": len(items), "seeds_per_s_runs": [r["seeds_per_s"] for r in items],
                  **{k: med([r[k] for r in items]) for k in SCALARS},
                  **{k: med([statistics.fmean(r[k]) for r in items]) for k in RANK_KEYS},
                  "other_cores": statistics.fmean(r["other_cores"] for r in items)} for arm, items in runs.items()}
    d, f = arms["distdgl"], arms["fork"]
    return {"arms": arms, "ratios": {k: d[k] / f[k] for k in SCALARS[:3] + RANK_KEYS},
            "pair_ratios_seeds_per_s": [a / b for a, b in zip(d["seeds_per_s_runs"], f["seeds_per_s_runs"])]}


class RemoteFetchTask(workload.BenchTask):
    """The remote share of each batch's input nodes; at the epoch's end each rank in turn times
    fetching a batch's worth of features, all local and all remote, and writes ``rank<r>.json``."""

    def __init__(self, graph: Any, out_dir: str, **kwargs: Any) -> None:
        super().__init__(graph, **kwargs)
        self.out_dir, self.batches = out_dir, []

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        book = self.graph.get_partition_book()
        self.batches.append((batch[0].numel(), float((book.nid2partid(batch[0]) != book.partid).float().mean())))

    def on_train_epoch_end(self) -> None:
        book, feat = self.graph.get_partition_book(), self.graph.ndata["feat"]
        pools = {"local": book.partid2nids(book.partid), "remote": book.partid2nids(1 - book.partid)}  # 2 parts
        size, gen = int(statistics.median(n for n, _ in self.batches)), torch.Generator().manual_seed(7 + self.rank)
        times: Dict[str, List[float]] = {"local": [], "remote": []}
        for turn in range(self.world_size):  # one rank measures while the others wait
            gdist.barrier()
            for rep in range(FETCH_REPS + 1 if turn == self.rank else 0):  # the first round warms up
                for kind, pool in pools.items():  # local and remote interleaved
                    ids = pool[torch.randperm(len(pool), generator=gen)[:size]]
                    t = time.perf_counter()
                    rows = feat[ids]
                    if rep:
                        times[kind].append(1000 * (time.perf_counter() - t))
        gdist.barrier()
        Path(self.out_dir, f"rank{self.rank}.json").write_text(json.dumps({
            "rank": self.rank, "ids": size, "row_bytes": rows[0].numel() * rows.element_size(),
            "remote_fraction_mean": statistics.fmean(f for _, f in self.batches),
            **{f"{k}_ms": statistics.median(v) for k, v in times.items()}}))


def worker(cfg: Dict[str, Any]) -> None:
    """A fresh process: one arm's fit with 2 trainers, or one simulated machine's with 1 (part 2)."""
    part = cfg["part_config"]  # DistDGL's ranks open the partition themselves
    if "ip_config" in cfg:
        workload.fit(None, RemoteFetchTask(part, cfg["out_dir"], **cfg["task"]), 1, evaluate_test=False, num_procs=1,
                     distributed_graph=part, ip_config=cfg["ip_config"], limit_train_batches=cfg["batches"])
        return
    fork = cfg["arm"] == "fork"
    graph = workload.build_graph(cfg["spec"]) if fork else part
    if fork:
        workload.cap_train(graph, cfg["max_train_nodes"])  # the training seeds the partition holds
    workload.fit(graph, workload.BenchTask(graph, **cfg["task"]), cfg["epochs"], RankProbe(cfg["result"]),
                 evaluate_test=False, limit_train_batches=cfg["batches"], distributed_graph=None if fork else part)


def remote_part(part_config: str, cfg: Dict[str, Any]) -> Dict[str, Any]:
    """Part 2: ``{"ranks": [...]}``, or ``{"skipped": why}``, or ``{"failed": what}`` (the log's tail)."""
    ok, why = sm.can_simulate()
    if not ok:
        return {"skipped": why}
    with tempfile.TemporaryDirectory(prefix="distgraph-remote-") as work, sm.SimulatedMachines(2) as machines:
        argv = [sys.executable, SCRIPT, "--worker", json.dumps(dict(
            cfg, part_config=part_config, out_dir=work, ip_config=machines.ip_config(f"{work}/ip_config.txt")))]
        with open(f"{work}/machines.log", "wb") as log:  # each machine writes through its own copy
            procs = [machines.popen(m, argv, stdout=log, stderr=subprocess.STDOUT,
                                    env=dict(os.environ, PYTHONUNBUFFERED="1")) for m in range(2)]
        bad = sm.wait_all(procs, TIMEOUT_S)  # TimeoutError: the machines' processes are ended on exit
        if bad is not None:
            return {"failed": f"{bad}\n" + Path(f"{work}/machines.log").read_text(errors="replace")[-6000:]}
        return {"ranks": [json.loads(Path(f"{work}/rank{r}.json").read_text()) for r in range(2)]}


def render(spec: Dict[str, Any], thr: Dict[str, Any], remote: Optional[Dict[str, Any]], args: Any) -> str:
    cols = {"batch_ms": "ms/batch per rank", "rank_uss_mb": "trainer USS", "rank_pss_mb": "trainer PSS",
            "server_rss_mb": "graph server RSS", "server_pss_mb": "server PSS", "server_uss_mb": "server USS",
            "driver_pss_mb": "driver PSS", "total_pss_mb": "total PSS", "other_cores": "other load (cores)"}
    md = [f"## 1. Seeds/s and memory per trainer ({spec['label']}, {spec['feat_dim']}-d features; fanouts "
          f"{args.fanouts}, batch {args.batch_size}, {args.epochs} epochs of {args.batches} batches per rank, first "
          f"warm-up; {args.rounds} interleaved round(s); memory at epoch ends, MB)\n", harness.markdown_table(
              ["arm", "seeds/s (median; per round)", *cols.values()],
              [[ARMS[k], f"{r['seeds_per_s']:,.0f} (" + ", ".join(f"{x:,.0f}" for x in r["seeds_per_s_runs"]) + ")",
                *(r[c] for c in cols)] for k, r in thr["arms"].items()])]
    q, pairs = thr["ratios"], ", ".join(f"{x:.2f}" for x in thr["pair_ratios_seeds_per_s"])
    md.append(f"\n**DistDGL / fork**: seeds/s {q['seeds_per_s']:.2f}x (per round: {pairs}); trainer USS "
              f"{q['rank_uss_mb']:.2f}x, PSS {q['rank_pss_mb']:.2f}x.\n\n"
              "## 2. Remote feature fetches (2 simulated machines, 1 trainer each)\n")
    if remote is None or "ranks" not in remote:
        md.append("Not run (--skip-remote)." if remote is None else f"Skipped: {remote['skipped']}."
                  if "skipped" in remote else f"Failed:\n\n```\n{remote['failed']}\n```")
    else:
        md.append(harness.markdown_table(
            ["rank", "ids per fetch", "local ms", "remote ms", "remote / local", "remote input nodes"],
            [[r["rank"], r["ids"], r["local_ms"], r["remote_ms"], f"{r['remote_ms'] / r['local_ms']:.1f}x",
              f"{100 * r['remote_fraction_mean']:.1f}%"] for r in remote["ranks"]]))
        md.append(f"\nRow size {remote['ranks'][0]['row_bytes']} B; medians of {FETCH_REPS} fetches, one "
                  "rank measuring at a time; the \"network\" is a veth pair (DGL's RPC and copy costs).")
    return "\n".join(md + ["\n## 3. papers100M per machine, on paper\n", paper_markdown(paper_rows())])


def main(argv: Optional[Sequence[str]] = None) -> Optional[Dict[str, Any]]:
    p = harness.base_parser(NAME, __doc__, rounds=2, tiny={**workload.TINY, "epochs": 1, "batches": 3})
    workload.training_options(p, batch_size=1024, max_train_nodes=1_000_000)
    p.add_argument("--batches", type=int, default=40, help="training batches per rank and epoch (part 2: 1 epoch)")
    p.add_argument("--paper", action="store_true", help="print the papers100M table (no data needed) and exit")
    p.add_argument("--skip-remote", action="store_true", help="leave out part 2 (simulated machines)")
    args = p.parse_args(argv)
    if args.paper:
        print(paper_markdown(paper_rows()))
        return None
    spec, graph, _ = next(workload.prepared_graphs(args))  # training seeds capped as the fork arm's
    cfg = {"spec": spec, "task": workload.task_kwargs(args), "epochs": args.epochs, "batches": args.batches,
           "max_train_nodes": args.max_train_nodes}
    with tempfile.TemporaryDirectory(prefix="distgraph-") as tmp:
        cfg["part_config"] = str(partition_graph(graph, "syn", 1, Path(tmp) / "parts1").config)
        two = None if args.skip_remote else partition_graph(graph, "syn", 2, Path(tmp) / "parts2")
        del graph
        runs, order = harness.interleave({arm: (lambda rnd, arm=arm: run_arm(arm, cfg, Path(tmp))) for arm in ARMS},
                                         args.rounds, NAME, lambda r: f"{r['seeds_per_s']:,.0f} seeds/s")
        remote = None if two is None else remote_part(str(two.config), cfg)
    thr = analyse(runs)
    plot = harness.bar_plot({k: a["seeds_per_s"] for k, a in thr["arms"].items()}, "training seeds/s (2 trainers)")
    payload = harness.report(args, {"graph": spec, "private_shm": bool(PRIVATE_SHM), "order": order, "throughput": thr,
                                    "runs": runs, "remote": remote, "paper": paper_rows()},
                             render(spec, thr, remote, args), plot, figsize=(10, 4))
    if remote is not None and "failed" in remote:
        raise SystemExit(1)
    return payload


if __name__ == "__main__" and sys.argv[1:2] == ["--worker"]:
    worker(json.loads(sys.argv[2]))
elif __name__ == "__main__":
    main()
