"""DistDGL against the in-memory graph: training seeds/s and memory per trainer, the cost of
remote feature fetches, and what a partitioned papers100M holds per machine.

    python benchmarks/distgraph.py --out benchmarks/results/distgraph   # full run, 1M nodes
    python benchmarks/distgraph.py --rounds 3 --arms distdgl fork distdgl-glibc fork-glibc --out ...
    python benchmarks/distgraph.py --paper                                # papers100M table only (no data)
    python benchmarks/distgraph.py --quick --skip-remote --out /tmp/dg    # seconds (smoke test)
    python benchmarks/distgraph.py --measure-halo --out benchmarks/results/distgraph
                                   # halo/inner on the synthetic graph in 2, 4, 8, 16 METIS parts

1. **Seeds/s and memory per trainer.** The synthetic graph of the other benchmarks
   (``datasets.synthetic(N, 10, 64, 8)``: 1M nodes, 10M edges, 64-d float32 features) is
   partitioned once into one part (``partition_graph(..., parts=1)``, a temp folder).
   The same ``workload.BenchTask`` (the example ``NodeClassification`` without
   validation), same fanouts, batch size, hidden size, epochs and batches per epoch, runs
   (a) on DistDGL: ``Trainer(num_procs=2, distributed_graph=<part config>)``, 2 trainer
   ranks and 1 graph server, loopback; (b) on the in-memory graph with the fork launcher,
   ``Trainer(num_procs=2)``; interleaved a b a b, each run in a fresh process (so no run
   inherits another's memory) with a private ``/dev/shm`` when root (DGL names its
   feature segments ``node~_N~feat-kvdata-`` whatever the graph: two DistDGL runs on one
   machine would share them). A callback in the ranks records each epoch's wall time
   (rank 0, ``on_train_epoch_start`` to ``on_train_epoch_end`` after an all-reduce of the
   seed counts, so it waits for the slower rank) and seeds of all ranks; the first epoch is
   warm-up. At each epoch end every rank reads its own USS/PSS/RSS (psutil
   ``memory_full_info()``). A watcher process samples, from outside, the driver (the
   process calling ``fit``) and the graph server (``graphtrainer.distdgl.servers``) every
   second (``/proc/<pid>/smaps_rollup``); figures are medians over the steady epochs.
   At the last epoch's end every rank also times, for 10 batches of its own training
   seeds: sampling (``NeighborSampler.sample`` on the ``DistGraph`` or the ``DGLGraph``),
   the feature fetch of the input nodes as its loader does it (a kvstore pull from the
   ``DistTensor``; ``index_select`` on the in-memory tensor, as DGL's ``DataLoader``),
   the labels, the same seeds through DGL's ``DistNodeDataLoader``, forward + backward
   of a copy of the model, and ``next()`` on the task's own training loader. One more
   run per arm (``--profile-rounds``) with ``profiler="simple"`` splits real training
   batches into stages; it is not in the seeds/s figures. ``--arms`` adds
   ``distdgl-glibc`` and ``fork-glibc``: the same with ``GRAPHTRAINER_MALLOC_TUNING=0``
   (glibc's allocator defaults in the ranks instead of ``graphtrainer/lean.py``'s).
2. **Remote feature fetches.** The same graph in 2 METIS parts, 2 simulated machines
   (``SimulatedMachines(2)``: network namespaces, own addresses and ``/dev/shm``), 1
   trainer each (``Trainer(num_procs=1, distributed_graph=..., ip_config=...)``, 1 epoch
   of ``--remote-batches`` batches). Each training batch's input nodes are classified with
   the partition book (``nid2partid``); at the epoch's end each rank in turn (the other
   waits at a barrier) times ``g.ndata["feat"][ids]`` for ids all local and all remote,
   interleaved, at a batch's seed count and a batch's input-node count, and for the input
   nodes of real training batches. The "network" is a veth pair on this box: the figures
   are DGL's RPC and copy costs, not a real network's.
3. **On paper**: what a partition of ogbn-papers100M holds per machine with 4, 8, 16
   machines (``--paper``; :func:`paper_rows` lists every array and its bytes), against one
   machine holding the whole graph.

No timing is asserted by the tests (``tests/integration/test_benchmark_distgraph.py`` runs ``--quick``).
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import gc
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def mem_watch(pid: int, out_path: str, stop_path: str, interval: float) -> None:
    """Sample PSS/USS/RSS of process ``pid`` and its descendants (not this one) until
    ``stop_path`` exists or ``pid`` is gone; one JSON line per sample."""
    import psutil

    from memory import smaps_rollup

    root = psutil.Process(pid)
    me = os.getpid()
    with open(out_path, "w", encoding="utf-8") as out:
        while not os.path.exists(stop_path) and root.is_running():
            t = time.time()
            procs = []
            try:
                family = [root] + root.children(recursive=True)
            except psutil.NoSuchProcess:
                break
            for p in family:
                if p.pid == me:
                    continue
                try:
                    cmd = " ".join(p.cmdline())
                    if p.status() == psutil.STATUS_ZOMBIE:
                        continue
                    role = ("driver" if p.pid == pid else "server" if "graphtrainer.distdgl.servers" in cmd
                            else "rank" if p.ppid() == pid else "other")
                    cpu = p.cpu_times()
                    procs.append({"pid": p.pid, "role": role, "cpu_s": cpu.user + cpu.system, **smaps_rollup(p.pid)})
                except (psutil.NoSuchProcess, FileNotFoundError, ProcessLookupError, PermissionError):
                    continue
            out.write(json.dumps({"t": t, "procs": procs}) + "\n")
            out.flush()
            time.sleep(max(0.0, interval - (time.time() - t)))


if __name__ == "__main__" and sys.argv[1:2] == ["--mem-watch"]:
    # The watcher starts before torch and DGL are imported (seconds): it needs neither.
    mem_watch(int(sys.argv[2]), sys.argv[3], sys.argv[4], float(sys.argv[5]))
    raise SystemExit(0)

import bench_env  # noqa: E402  (graphtrainer from this checkout, DGL on PyTorch)
import report  # noqa: E402
import workload  # noqa: E402
from graphtrainer.callbacks import Callback  # noqa: E402

NAME = "distgraph"
SCRIPT = os.path.abspath(__file__)
ARMS = {"distdgl": "DistDGL, 1 partition (2 trainers + 1 graph server)",
        "fork": "in-memory graph, fork (2 trainers)",
        "distdgl-glibc": "DistDGL, allocator='glibc' (GRAPHTRAINER_MALLOC_TUNING=0)",
        "fork-glibc": "fork, allocator='glibc' (GRAPHTRAINER_MALLOC_TUNING=0)"}
#: Arms whose ranks leave glibc's allocator alone (``allocator="glibc"``: no trim at all)
#: instead of graphtrainer's default (glibc's thresholds, the inherited heap trimmed once at a
#: rank's start). Until issue 24 the default was today's ``allocator="lean"``.
GLIBC_SUFFIX = "-glibc"


def _base(arm: str) -> str:
    return arm[:-len(GLIBC_SUFFIX)] if arm.endswith(GLIBC_SUFFIX) else arm
MB = 1024 * 1024
GB = 1e9


def child_env() -> Dict[str, str]:
    """The environment of the worker processes: graphtrainer from this checkout, unbuffered."""
    path = os.pathsep.join(p for p in (str(bench_env.ROOT), os.environ.get("PYTHONPATH")) if p)
    return dict(os.environ, PYTHONPATH=path, PYTHONUNBUFFERED="1", DGLBACKEND="pytorch")

# ---------------------------------------------------------------------------------------
# Part 3: papers100M on paper
# ---------------------------------------------------------------------------------------

#: ogbn-papers100M as OGB ships it (directed citation edges; DGL users often add the
#: reverses, which doubles every per-edge figure below). Split sizes from OGB's split.
PAPERS100M = {"name": "ogbn-papers100M", "nodes": 111_059_956, "edges": 1_615_685_872, "feat_dim": 128,
              "train": 1_207_179, "val": 125_265, "test": 214_338}

#: Halo nodes per inner node, and edges a part stores per inner edge (its inner nodes'
#: in-edges plus, with 1 halo hop, its inner nodes' out-edges to halo nodes: 1 + the cut
#: fraction), measured on the synthetic 1Mx10 graph (the benchmark's graph) in K METIS
#: parts balanced on the train mask, 1 halo hop: ``python benchmarks/distgraph.py
#: --measure-halo`` (2026-11-23, results/distgraph/halo.json). That graph is random
#: (Chung-Lu degrees) with 8 classes and 75% of edges inside a class, and no other
#: locality: METIS finds the classes up to 8 parts (about 20% of edges cut) and has to cut
#: through them beyond (67% cut at 16 parts). A citation graph such as papers100M
#: partitions far better, so these are a pessimistic stand-in, not a papers100M
#: measurement; the table also gives the no-cut lower bound. Halo nodes cost 17 B each
#: (indptr, id, flag); the extra edges 41 B each.
HALO_MEASURED = {
    2: {"halo_per_inner": 0.723, "edges_per_inner_edge": 1.204, "cut_fraction": 0.204},
    4: {"halo_per_inner": 1.229, "edges_per_inner_edge": 1.186, "cut_fraction": 0.186},
    8: {"halo_per_inner": 1.699, "edges_per_inner_edge": 1.218, "cut_fraction": 0.218},
    16: {"halo_per_inner": 4.404, "edges_per_inner_edge": 1.674, "cut_fraction": 0.674},
}


def _int64(n: float) -> float:
    return 8.0 * n


def paper_rows(graph: Dict[str, Any] = PAPERS100M, machines: Sequence[int] = (4, 8, 16),
               halo: Optional[Dict[int, Dict[str, Any]]] = None) -> List[Dict[str, Any]]:
    """Bytes per machine of DGL 2.1's partitioned layout, and of one machine with the whole graph.

    A DistDGL graph server of machine ``k`` holds, in shared memory (its trainers map it,
    no copy), from ``dgl/distributed/partition.py``, ``dist_graph.py`` (``DistGraphServer``,
    ``_copy_graph_to_shared_mem``) and ``dist_context.py`` (``initialize`` passes
    ``graph_format=$DGL_GRAPH_FORMAT``, default ``csc``: the COO the part file holds is dropped):

    - node data of its *inner* nodes in the kvstore: ``feat`` (float32), ``label`` (int64,
      one per node: OGB's labels are NaN for unlabelled papers, stored as -1 or 0 here),
      ``train/val/test_mask`` (bool, 1 B each);
    - the part graph over inner + halo nodes and the edges it keeps (the inner nodes'
      in-edges, plus with 1 halo hop their out-edges to halo nodes): CSC (indptr int64 per
      node + 1, indices int64 per edge), the CSC's edge-id array (int64 per edge: CSC is
      built from the file's COO and keeps the permutation), ``_ID`` (global edge id, int64)
      and ``inner_edge`` (uint8) per edge, ``_ID`` (int64) and ``inner_node`` (uint8) per
      node: 25 B per edge, 17 B per node. The file also has ``part_id`` per node (int64)
      and, with 1 part, ``_TYPE`` (int32) per node and edge; the server keeps the edges'.

    One machine (graphtrainer's fork launcher): the node data of every node, COO (the
    graph as built) and CSC with its edge ids (what sampling reads, built before the fork).
    """
    halo = halo if halo is not None else HALO_MEASURED
    n, e, f = graph["nodes"], graph["edges"], graph["feat_dim"]
    rows: List[Dict[str, Any]] = []
    single = {"machines": 1, "layout": "one machine, in-memory DGLGraph", "inner_nodes": n, "halo_nodes": 0,
              "edges_held": e, "features_b": 4.0 * f * n, "other_ndata_b": 11.0 * n,
              "csc_b": _int64(n + 1) + _int64(e), "eid_b": _int64(e), "coo_b": 2 * _int64(e), "ids_flags_b": 0.0}
    rows.append(single)
    for k in machines:
        h = halo.get(k) or {}
        ratio, edge_factor = h.get("halo_per_inner"), h.get("edges_per_inner_edge")
        if ratio is None or edge_factor is None:
            ratio, edge_factor = _extrapolate(halo, k)
            assumed = "extrapolated"
        else:
            assumed = "measured on the synthetic graph"
        inner = n / k
        halo_nodes = inner * ratio
        nodes = inner + halo_nodes
        edges = e / k * edge_factor
        rows.append({"machines": k, "layout": f"DistDGL, {k} parts", "inner_nodes": inner, "halo_nodes": halo_nodes,
                     "halo_source": assumed, "halo_per_inner": ratio, "edges_per_inner_edge": edge_factor,
                     "edges_held": edges, "features_b": 4.0 * f * inner, "other_ndata_b": 11.0 * inner,
                     "csc_b": _int64(nodes + 1) + _int64(edges), "eid_b": 2 * _int64(edges),
                     "coo_b": 0.0, "ids_flags_b": _int64(nodes) + nodes + edges})
    total0 = None
    for row in rows:
        if row["machines"] > 1 or row["layout"].startswith("DistDGL"):
            # Lower bound: no halo node, no cut edge (inner nodes and their in-edges only).
            inner, edges = row["inner_nodes"], e / row["machines"]
            row["total_no_cut_b"] = (_int64(inner + 1) + _int64(edges) + 2 * _int64(edges) + _int64(inner) + inner
                                     + edges + (4.0 * f + 11) * inner)
        row["structure_b"] = row["csc_b"] + row["eid_b"] + row["coo_b"] + row["ids_flags_b"]
        row["total_b"] = row["structure_b"] + row["features_b"] + row["other_ndata_b"]
        total0 = total0 or row["total_b"]
        row["vs_one_machine"] = row["total_b"] / total0
        row["train_per_machine"] = graph.get("train", 0) / row["machines"]
    return rows


def _extrapolate(halo: Dict[int, Dict[str, Any]], k: int) -> tuple:
    """Halo/inner and edge factor for ``k`` parts from the largest measured part counts:
    linear in log2(k) through the two largest measured points (halo), the largest one's
    edge factor (the cut fraction changes little with k on that graph)."""
    known = sorted(p for p, v in halo.items() if v.get("halo_per_inner") is not None)
    if not known:
        return 1.0, 1.2
    if len(known) == 1:
        return halo[known[0]]["halo_per_inner"], halo[known[0]]["edges_per_inner_edge"]
    import math

    a, b = known[-2], known[-1]
    ra, rb = halo[a]["halo_per_inner"], halo[b]["halo_per_inner"]
    slope = (rb - ra) / (math.log2(b) - math.log2(a))
    return rb + slope * (math.log2(k) - math.log2(b)), halo[b]["edges_per_inner_edge"]


def paper_markdown(rows: List[Dict[str, Any]], graph: Dict[str, Any] = PAPERS100M) -> str:
    headers = ["machines", "layout", "inner nodes", "halo nodes", "edges held", "features GB",
               "label+masks GB", "CSC indptr+indices GB", "edge ids GB (CSC + _ID)", "COO GB",
               "node _ID + flags GB", "structure GB", "total GB", "x one machine", "total GB, no cut (lower bound)",
               "train nodes"]
    body = []
    for r in rows:
        eid = r["eid_b"]
        body.append([r["machines"], r["layout"], f"{r['inner_nodes']:,.0f}",
                     f"{r['halo_nodes']:,.0f}" + (f" ({r['halo_per_inner']:.2f}x)" if r["machines"] > 1 else ""),
                     f"{r['edges_held']:,.0f}", f"{r['features_b'] / GB:.1f}", f"{r['other_ndata_b'] / GB:.2f}",
                     f"{r['csc_b'] / GB:.1f}", f"{eid / GB:.1f}", f"{r['coo_b'] / GB:.1f}",
                     f"{r['ids_flags_b'] / GB:.1f}", f"{r['structure_b'] / GB:.1f}", f"{r['total_b'] / GB:.1f}",
                     f"{r['vs_one_machine']:.3f}",
                     f"{r['total_no_cut_b'] / GB:.1f}" if "total_no_cut_b" in r else "",
                     f"{r['train_per_machine']:,.0f}"])
    md = (f"{graph['name']}: {graph['nodes']:,} nodes, {graph['edges']:,} edges (as OGB ships them; with reverse "
          f"edges every per-edge column doubles), {graph['feat_dim']}-d float32 features, "
          f"{graph.get('train', 0):,} train nodes. GB = 1e9 bytes.\n\n")
    md += report.markdown_table(headers, body)
    sources = sorted({r.get("halo_source") for r in rows if r.get("halo_source")})
    cuts = ", ".join(f"{k} parts {100 * v['cut_fraction']:.0f}%" for k, v in sorted(HALO_MEASURED.items())
                     if v.get("cut_fraction") is not None)
    md += ("\n\nHalo nodes and edges held (inner nodes' in-edges + their out-edges to halo nodes): ratios "
           + ", ".join(sources) + " (1Mx10 in K METIS parts, 1 halo hop; `HALO_MEASURED` in this script; edges "
           f"cut: {cuts}). That graph is random with 8 classes: METIS cuts along the classes up to 8 parts and "
           "through them beyond. papers100M, a citation graph, partitions better, so these columns are "
           "pessimistic; \"no cut\" is the lower bound (inner nodes and their in-edges only). Per machine the "
           "graph server holds all of this once, in shared memory its trainers map (no copy per trainer), CSC "
           "only (DGL's server default); one machine (fork launcher) holds COO (the graph as built) + CSC with "
           "edge ids and every node's data.")
    return md


# ---------------------------------------------------------------------------------------
# Part 1: in the ranks
# ---------------------------------------------------------------------------------------

class RankProbe(Callback):
    """Per epoch: rank 0's wall time, seeds and batches of all ranks, every rank's USS/PSS/RSS;
    after the last epoch, every rank's per-batch sampling / feature / label costs.
    Travels back to the driver as callback state (rank 0's)."""

    def __init__(self, epochs: int, probe_batches: int, fanouts: Sequence[int], batch_size: int) -> None:
        self.epochs, self.probe_batches = epochs, probe_batches
        self.fanouts, self.batch_size = list(fanouts), batch_size
        self.rows: List[Dict[str, Any]] = []
        self.probe: List[Dict[str, Any]] = []
        self._t0, self._seeds, self._batches = 0.0, 0, 0

    def state_dict(self) -> Dict[str, Any]:
        return {"rows": list(self.rows), "probe": list(self.probe)}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.rows, self.probe = list(state["rows"]), list(state["probe"])

    def on_train_epoch_start(self, trainer: Any, task: Any) -> None:
        self._seeds = self._batches = 0
        self._t0 = time.perf_counter()

    def on_train_batch_end(self, trainer: Any, task: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self._seeds += int(batch[1].numel())
        self._batches += 1

    def on_train_epoch_end(self, trainer: Any, task: Any) -> None:
        import psutil
        import torch

        from graphtrainer import comm as gdist

        totals = gdist.all_reduce(torch.tensor([float(self._seeds), float(self._batches)], dtype=torch.float64))
        seconds = time.perf_counter() - self._t0  # after the all-reduce: the slower rank's end
        end_wall = time.time()
        mem = psutil.Process().memory_full_info()
        mine = {"rank": task.rank, "seeds": self._seeds, "batches": self._batches, "uss_mb": mem.uss / MB,
                "pss_mb": mem.pss / MB, "rss_mb": mem.rss / MB}
        self.rows.append({"epoch": len(self.rows), "seconds": seconds, "end_wall": end_wall,
                          "seeds_all_ranks": int(totals[0]), "batches_all_ranks": int(totals[1]),
                          "ranks": gdist.all_gather_object(mine)})
        if len(self.rows) == self.epochs and self.probe_batches > 0:
            self.probe = gdist.all_gather_object(batch_costs(task, self.fanouts, self.batch_size,
                                                             self.probe_batches))


def train_pool(task: Any) -> Any:
    """This rank's candidate training seeds: the train ids (in-memory graph), or the train
    nodes of this machine's partition (DistGraph)."""
    from graphtrainer.distdgl.graph import is_dist_graph

    g = task.graph
    if is_dist_graph(g):
        book = g.get_partition_book()
        local = book.partid2nids(book.partid)
        return local[g.ndata["train_mask"][local].bool()]
    return task.split_ids["train"]


def batch_costs(task: Any, fanouts: Sequence[int], batch_size: int, batches: int) -> Dict[str, Any]:
    """Median ms per batch of sampling, feature fetch and label fetch for ``batches``
    batches of random training seeds of this rank (after one warm-up batch)."""
    import dgl
    import torch

    from graphtrainer.distdgl.graph import is_dist_graph

    g = task.graph
    pool = train_pool(task)
    sampler = dgl.dataloading.NeighborSampler(list(fanouts))
    gen = torch.Generator().manual_seed(1000 + int(task.rank))
    dist = is_dist_graph(g)
    model = copy.deepcopy(task.module)
    formats: Dict[str, Any] = {}
    cost: Dict[str, List[float]] = {"sample_ms": [], "feat_ms": [], "label_ms": [], "fwd_bwd_ms": []}
    if dist:
        cost["dgl_loader_ms"] = []
    inputs: List[int] = []
    row_bytes = 0
    for i in range(batches + 1):
        seeds = pool[torch.randperm(len(pool), generator=gen)[:batch_size]]
        t0 = time.perf_counter()
        input_nodes, output_nodes, blocks = sampler.sample(g, seeds)
        t1 = time.perf_counter()
        # As each loader gathers them: DistNodeLoader pulls from the DistTensor (kvstore);
        # DGL's DataLoader gathers rows of the in-memory tensor with index_select
        # (dgl.storages.TensorStorage.fetch), not with advanced indexing (8x slower here).
        x = g.ndata["feat"][input_nodes] if dist else torch.index_select(g.ndata["feat"], 0, input_nodes)
        t2 = time.perf_counter()
        if dist:
            y = g.ndata["label"][output_nodes]
        else:
            y = torch.index_select(g.ndata["label"], 0, output_nodes)
        t3 = time.perf_counter()
        # Forward and backward of a copy of the model (no DDP hooks, no optimizer) on these blocks.
        logits = model(blocks, x)
        torch.nn.functional.cross_entropy(logits, y).backward()
        model.zero_grad(set_to_none=True)
        t5 = time.perf_counter()
        if i == 0:
            formats = {k: v for k, v in blocks[0].formats().items()}
        if dist:
            # The same seeds through DGL's DistNodeDataLoader, as graphtrainer's DistNodeLoader
            # gets its batches (sampling included; no features).
            loader = dgl.dataloading.DistNodeDataLoader(g, seeds, sampler, batch_size=len(seeds), shuffle=False)
            t4 = time.perf_counter()
            next(iter(loader))
            if i:
                cost["dgl_loader_ms"].append(1000 * (time.perf_counter() - t4))
        if i == 0:
            continue
        row_bytes = x.element_size() * (x.numel() // max(1, x.shape[0]))
        cost["sample_ms"].append(1000 * (t1 - t0))
        cost["feat_ms"].append(1000 * (t2 - t1))
        cost["label_ms"].append(1000 * (t3 - t2))
        cost["fwd_bwd_ms"].append(1000 * (t5 - t3))
        inputs.append(int(input_nodes.numel()))
    # The task's own training loader (NodeLoader or DistNodeLoader), as the epochs used it:
    # a whole batch (seeds, sampling, features, labels) per next().
    from graphtrainer.loop.batches import set_epoch

    loader = task.train_dataloader()
    set_epoch(loader, 1000)
    batches_iter = iter(loader)
    next(batches_iter)  # the loader's start-up
    cost["loader_ms"] = []
    for _ in range(batches):
        t0 = time.perf_counter()
        try:
            next(batches_iter)
        except StopIteration:
            break
        cost["loader_ms"].append(1000 * (time.perf_counter() - t0))
    del batches_iter, loader
    out: Dict[str, Any] = {k: statistics.median(v) for k, v in cost.items() if v}
    out["input_nodes"] = statistics.median(inputs)
    out["block0_formats"] = formats
    out["feat_mb_per_s"] = out["input_nodes"] * row_bytes / MB / (out["feat_ms"] / 1000) if out["feat_ms"] else None
    out["rank"] = int(task.rank)
    return out


# ---------------------------------------------------------------------------------------
# Part 1: one arm in a fresh process
# ---------------------------------------------------------------------------------------

def private_shm_prefix() -> List[str]:
    """A command prefix giving the process a private ``/dev/shm`` (root only), else []."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return []
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c",
            'mount -t tmpfs -o mode=1777 tmpfs /dev/shm && exec "$@"', "sh"]


def run_arm(arm: str, cfg: Dict[str, Any], work: Path, private_shm: bool, timeout: float) -> Dict[str, Any]:
    """Run one arm in a fresh worker process; its result dict."""
    import sysinfo

    run_dir = Path(tempfile.mkdtemp(prefix=f"{arm}-", dir=work))
    cfg = dict(cfg, arm=arm, result=str(run_dir / "result.json"), work=str(run_dir))
    (run_dir / "config.json").write_text(json.dumps(cfg))
    argv = [sys.executable, SCRIPT, "--arm-worker", str(run_dir / "config.json")]
    if private_shm:
        argv = private_shm_prefix() + argv
    log = run_dir / "log.txt"
    load = round(os.getloadavg()[0], 2)
    env = child_env()
    if arm.endswith(GLIBC_SUFFIX):
        env["GRAPHTRAINER_MALLOC_TUNING"] = "0"
    with open(log, "wb") as fh, sysinfo.LoadMeter() as meter:
        proc = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True, env=env)
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            code = None
    if code != 0:
        tail = log.read_text(errors="replace")[-4000:]
        raise RuntimeError(f"{arm} run {'timed out' if code is None else f'exited with {code}'}:\n{tail}")
    res = json.loads((run_dir / "result.json").read_text())
    res["loadavg_1min_before"] = load
    res["other_cores"] = meter.other_cores
    if not os.environ.get("DISTGRAPH_KEEP"):
        shutil.rmtree(run_dir, ignore_errors=True)
    return res


def _kill_group(proc: subprocess.Popen) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)
            return


def arm_worker(cfg_path: str) -> None:
    """One arm: build the task, start the memory watcher, fit, write the result JSON."""
    cfg = json.loads(Path(cfg_path).read_text())
    from graphtrainer import Trainer

    work = Path(cfg["work"])
    samples, stop = work / "samples.jsonl", work / "stop"
    watcher = subprocess.Popen([sys.executable, SCRIPT, "--mem-watch", str(os.getpid()), str(samples), str(stop),
                                str(cfg["watch_interval_s"])], env=child_env())
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not (samples.exists() and samples.stat().st_size):
        time.sleep(0.05)  # a first sample (the driver alone) before anything starts
    t_start = time.time()
    try:
        if _base(cfg["arm"]) == "fork":
            graph: Any = workload.build_graph(cfg["spec"])
        else:
            graph = cfg["part_config"]  # the task holds a PartitionedGraph; ranks open the DistGraph
        task = workload.BenchTask(graph, fanouts=cfg["fanouts"], hidden=cfg["hidden"], batch_size=cfg["batch_size"],
                                  lr=3e-3, dropout=0.5)
        probe = RankProbe(cfg["epochs"], cfg["probe_batches"], cfg["fanouts"], cfg["batch_size"])
        kwargs = {"distributed_graph": cfg["part_config"]} if _base(cfg["arm"]) == "distdgl" else {}
        if cfg.get("profile"):
            kwargs["profiler"] = "simple"
        trainer = Trainer(num_procs=2, max_epochs=cfg["epochs"], limit_train_batches=cfg["batches"],
                          progress_bar=False, logger=False, enable_model_summary=False, callbacks=[probe], seed=0,
                          default_root_dir=str(work / "runs"), **kwargs)
        t_fit = time.time()
        trainer.fit(task)
        fit_s = time.time() - t_fit
    finally:
        stop.touch()
        try:
            watcher.wait(timeout=30)
        except subprocess.TimeoutExpired:
            watcher.kill()
            watcher.wait()
    rows = [json.loads(line) for line in samples.read_text().splitlines() if line.strip()]
    result = {"arm": cfg["arm"], "epochs": probe.rows, "probe": probe.probe, "fit_s": fit_s,
              "profile": getattr(trainer.state, "profile", None),
              "start_to_fit_s": t_fit - t_start, "samples": rows, "threads_per_proc": trainer.threads_per_proc}
    Path(cfg["result"]).write_text(json.dumps(result))


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


def model_bytes_one_part(spec: Dict[str, Any]) -> Dict[str, float]:
    """What :func:`paper_rows`'s model says a 1-part DistDGL server holds for the benchmark
    graph (plus the 1-part file's ``_TYPE`` int32 per edge, which the server keeps)."""
    g = {"name": "synthetic", "nodes": spec["num_nodes"], "edges": spec["num_nodes"] * spec["avg_degree"],
         "feat_dim": spec["feat_dim"]}
    rows = paper_rows(g, machines=(1,), halo={1: {"halo_per_inner": 0.0, "edges_per_inner_edge": 1.0}})
    one, part = rows[0], rows[1]
    return {"one_machine_mb": one["total_b"] / MB, "server_mb": (part["total_b"] + 4.0 * g["edges"]) / MB}


# ---------------------------------------------------------------------------------------
# Part 2: remote feature fetches on simulated machines
# ---------------------------------------------------------------------------------------

class RemoteFetchTask(workload.BenchTask):
    """The benchmark task on a 2-machine DistGraph, recording which input nodes of each
    training batch are remote, then timing local and remote feature fetches at the
    epoch's end (each rank in turn) and writing ``rank<r>.json`` to ``out_dir``."""

    def __init__(self, graph: Any, out_dir: str, reps: int, **kwargs: Any) -> None:
        super().__init__(graph, **kwargs)
        self.out_dir, self.reps = out_dir, reps
        self._remote_frac: List[float] = []
        self._seed_remote: List[float] = []
        self._sizes: List[int] = []
        self._kept: List[Any] = []

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        book = self.graph.get_partition_book()
        input_nodes, output_nodes = batch[0], batch[1]
        self._remote_frac.append(float((book.nid2partid(input_nodes) != book.partid).float().mean()))
        self._seed_remote.append(float((book.nid2partid(output_nodes) != book.partid).float().mean()))
        self._sizes.append(int(input_nodes.numel()))
        if len(self._kept) < 3:
            self._kept.append(input_nodes.clone())

    def on_train_epoch_end(self) -> None:
        from graphtrainer import comm as gdist

        result = None
        for turn in range(self.world_size):  # one rank measures while the others wait
            gdist.barrier()
            if turn == self.rank:
                result = self._time_fetches()
        gdist.barrier()
        Path(self.out_dir, f"rank{self.rank}.json").write_text(json.dumps(result))

    def _time_fetches(self) -> Dict[str, Any]:
        import torch

        g = self.graph
        book = g.get_partition_book()
        me = book.partid
        pools = {"local": book.partid2nids(me),
                 "remote": torch.cat([book.partid2nids(p) for p in range(book.num_partitions()) if p != me])}
        feat = g.ndata["feat"]
        row_bytes = torch.empty(0, dtype=feat.dtype).element_size() * int(torch.tensor(feat.shape[1:]).prod())
        n_input = int(statistics.median(self._sizes))
        sizes = sorted({min(self.batch_size, n_input), n_input})
        gen = torch.Generator().manual_seed(7 + self.rank)

        def fetch(ids: Any) -> float:
            t = time.perf_counter()
            feat[ids]
            return time.perf_counter() - t

        rows = []
        for size in sizes:
            picks = {k: [pool[torch.randperm(len(pool), generator=gen)[:size]] for _ in range(self.reps + 1)]
                     for k, pool in pools.items()}
            times: Dict[str, List[float]] = {"local": [], "remote": []}
            for rep in range(self.reps + 1):
                for kind in ("local", "remote"):
                    seconds = fetch(picks[kind][rep])
                    if rep:  # the first round warms up
                        times[kind].append(seconds)
            for kind, vals in times.items():
                s = statistics.median(vals)
                rows.append({"ids": size, "kind": kind, "ms": 1000 * s, "mb_per_s": size * row_bytes / MB / s,
                             "ms_all": [1000 * v for v in vals]})
        sampled = []
        for ids in self._kept:
            fetch(ids)
            s = statistics.median([fetch(ids) for _ in range(self.reps)])
            frac = float((book.nid2partid(ids) != me).float().mean())
            sampled.append({"ids": int(ids.numel()), "remote_fraction": frac, "ms": 1000 * s,
                            "mb_per_s": ids.numel() * row_bytes / MB / s})
        return {"rank": self.rank, "partition": int(me), "local_nodes": int(pools["local"].numel()),
                "row_bytes": row_bytes, "fetch": rows, "sampled_batches": sampled,
                "batches": len(self._remote_frac), "input_nodes_median": n_input,
                "remote_fraction_mean": _mean(self._remote_frac),
                "remote_fraction_min": min(self._remote_frac), "remote_fraction_max": max(self._remote_frac),
                "seed_remote_fraction_mean": _mean(self._seed_remote)}


def machine_worker(cfg_path: str) -> None:
    """One simulated machine: 1 trainer rank (+ this machine's graph server), 1 epoch."""
    cfg = json.loads(Path(cfg_path).read_text())
    from graphtrainer import Trainer

    task = RemoteFetchTask(cfg["part_config"], cfg["out_dir"], cfg["reps"], fanouts=cfg["fanouts"],
                           hidden=cfg["hidden"], batch_size=cfg["batch_size"], lr=3e-3, dropout=0.5)
    with tempfile.TemporaryDirectory(prefix="distgraph-machine-") as root:
        trainer = Trainer(num_procs=1, distributed_graph=cfg["part_config"], ip_config=cfg["ip_config"],
                          max_epochs=1, limit_train_batches=cfg["batches"], progress_bar=False, logger=False,
                          enable_model_summary=False, default_root_dir=root, seed=0)
        trainer.fit(task)


def remote_part(part_config: str, cfg: Dict[str, Any], timeout: float) -> Dict[str, Any]:
    """Part 2 on 2 simulated machines; ``{"skipped": why}`` when they cannot be made here,
    ``{"failed": what}`` (with the machines' log tails) when the run fails."""
    from graphtrainer.testing import simulated_machines as sm

    ok, why = sm.can_simulate()
    if not ok:
        print(f"[{NAME}] remote fetches skipped: {why}", flush=True)
        return {"skipped": why}
    import sysinfo

    load = round(os.getloadavg()[0], 2)
    machines = sm.SimulatedMachines(2)
    failed = None
    with tempfile.TemporaryDirectory(prefix="distgraph-remote-") as work, machines, sysinfo.LoadMeter() as meter:
        ip = machines.ip_config(os.path.join(work, "ip_config.txt"))
        path = os.path.join(work, "config.json")
        Path(path).write_text(json.dumps(dict(cfg, part_config=part_config, ip_config=ip, out_dir=work)))
        logs = [open(os.path.join(work, f"machine{m}.log"), "wb") for m in range(2)]
        try:
            procs = [machines.popen(m, [sys.executable, SCRIPT, "--machine-worker", path], stdout=logs[m],
                                    stderr=subprocess.STDOUT, env=child_env())
                     for m in range(2)]
            try:
                bad = sm.wait_all(procs, timeout)
            except TimeoutError as err:
                bad = str(err)
        finally:
            for fh in logs:
                fh.close()
        if bad is not None:
            tails = "\n".join(f"--- machine {m} ---\n" + Path(work, f"machine{m}.log").read_text(errors="replace")[-3000:]
                              for m in range(2))
            failed = f"simulated machines failed ({bad}):\n{tails}"
        else:
            ranks = [json.loads(Path(work, f"rank{r}.json").read_text()) for r in range(2)]
    left = machines.existing()  # after close(): the namespaces must be gone
    if failed is not None:
        print(f"[{NAME}] {failed}", file=sys.stderr, flush=True)
        return {"failed": failed, "namespaces_left": left}
    return {"ranks": ranks, "addresses": list(machines.addresses), "loadavg_1min_before": load,
            "other_cores": meter.other_cores, "namespaces_left": left, "summary": summarize_remote(ranks)}


def summarize_remote(ranks: List[Dict[str, Any]]) -> Dict[str, Any]:
    """Remote share of training batches' input nodes; local and remote fetch of a batch's
    input nodes (medians over ranks)."""
    out: Dict[str, Any] = {
        "remote_fraction_mean": _mean([r["remote_fraction_mean"] for r in ranks]),
        "remote_fraction_range": [min(r["remote_fraction_min"] for r in ranks),
                                  max(r["remote_fraction_max"] for r in ranks)],
        "seed_remote_fraction_mean": _mean([r["seed_remote_fraction_mean"] for r in ranks])}
    for kind in ("local", "remote"):
        cells = [f for r in ranks for f in r["fetch"] if f["kind"] == kind and f["ids"] == r["input_nodes_median"]]
        out[f"{kind}_ms_input_nodes"] = statistics.median([c["ms"] for c in cells])
        out[f"{kind}_mb_per_s_input_nodes"] = statistics.median([c["mb_per_s"] for c in cells])
    out["remote_over_local"] = out["remote_ms_input_nodes"] / out["local_ms_input_nodes"]
    return out


# ---------------------------------------------------------------------------------------
# Halo measurement on the synthetic graph
# ---------------------------------------------------------------------------------------

def halo_stats(summary: Any) -> Dict[str, Any]:
    """Halo nodes per inner node, edges a part stores per inner edge, cut fraction."""
    import dgl

    inner = sum(r.inner_nodes for r in summary.rows)
    halo = sum(r.halo_nodes for r in summary.rows)
    inner_edges = sum(r.inner_edges for r in summary.rows)
    held = 0
    for i in range(summary.parts):
        (pg,), _ = dgl.load_graphs(str(Path(summary.config).parent / f"part{i}" / "graph.dgl"))
        held += pg.num_edges()
        del pg
    return {"parts": summary.parts, "halo_per_inner": halo / inner, "edges_per_inner_edge": held / inner_edges,
            "cut_fraction": summary.cut_fraction, "inner_nodes": [r.inner_nodes for r in summary.rows],
            "halo_nodes": [r.halo_nodes for r in summary.rows], "inner_edges": [r.inner_edges for r in summary.rows],
            "seconds": summary.seconds}


def measure_halo(args: Any) -> Dict[str, Any]:
    from graphtrainer.distdgl.partition import partition_graph

    spec = graph_spec(args)
    graph = workload.build_graph(spec)
    out: Dict[str, Any] = {"graph": spec, "parts": {}}
    for k in args.halo_parts:
        with tempfile.TemporaryDirectory(prefix="distgraph-halo-") as tmp:
            summary = partition_graph(graph, "syn", k, tmp)
            out["parts"][k] = halo_stats(summary)
            print(f"[{NAME}] {k} parts: " + json.dumps({x: out["parts"][k][x] for x in
                  ("halo_per_inner", "edges_per_inner_edge", "cut_fraction", "seconds")}), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "halo.json").write_text(json.dumps(out, indent=2) + "\n")
    print(f"[{NAME}] wrote {args.out / 'halo.json'}")
    return out


# ---------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------

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
    hidden = argparse.SUPPRESS
    p.add_argument("--arm-worker", help=hidden)
    p.add_argument("--machine-worker", help=hidden)
    p.add_argument("--mem-watch", nargs=4, help=hidden)  # handled before the imports, at the top
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
    md.append(report.markdown_table(headers, rows))
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
    md.append(report.markdown_table(headers, rows))
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
        md.append(report.markdown_table(headers, rows))
        md.append("\n`sample` is the loader's `next()` (sampling, features, labels); `fit / batch` includes the "
                  "epochs' start-up and ends; `all-reduce` overlaps `backward`.")
    md.append("\n## 2. Remote feature fetches (2 simulated machines, 1 trainer each)\n")
    if remote is None:
        md.append("Not run (--skip-remote).")
    elif "skipped" in remote:
        md.append(f"Skipped: {remote['skipped']}.")
    elif "failed" in remote:
        md.append("Failed:\n\n```\n" + remote["failed"][-2000:] + "\n```")
    else:
        headers = ["rank", "ids per fetch", "local ms", "remote ms", "remote / local", "local MB/s", "remote MB/s"]
        rows = []
        for r in remote["ranks"]:
            by = {}
            for f in r["fetch"]:
                by.setdefault(f["ids"], {})[f["kind"]] = f
            for ids, kinds in sorted(by.items()):
                lo, re_ = kinds["local"], kinds["remote"]
                rows.append([r["rank"], f"{ids:,}", f"{lo['ms']:.2f}", f"{re_['ms']:.2f}", f"{re_['ms'] / lo['ms']:.1f}x",
                             f"{lo['mb_per_s']:,.0f}", f"{re_['mb_per_s']:,.0f}"])
        md.append(report.markdown_table(headers, rows))
        s = remote["summary"]
        md.append(f"\nRemote input nodes in a training batch (each machine's own seeds): mean "
                  f"{100 * s['remote_fraction_mean']:.1f}% (batches {100 * s['remote_fraction_range'][0]:.1f}-"
                  f"{100 * s['remote_fraction_range'][1]:.1f}%); remote seeds {100 * s['seed_remote_fraction_mean']:.1f}%.")
        rows = [[r["rank"], f"{b['ids']:,}", f"{100 * b['remote_fraction']:.1f}%", f"{b['ms']:.2f}",
                 f"{b['mb_per_s']:,.0f}"] for r in remote["ranks"] for b in r["sampled_batches"]]
        md.append("\nFetching the input nodes of real training batches, as sampled:\n")
        md.append(report.markdown_table(["rank", "input nodes", "remote", "ms", "MB/s"], rows))
        md.append(f"\nRow size {remote['ranks'][0]['row_bytes']} B; medians of {args.remote_reps} fetches per cell, "
                  f"local and remote interleaved, one rank measuring at a time; load before "
                  f"{remote['loadavg_1min_before']}, other load {remote['other_cores']:.2f} cores.")
    md.append("\n## 3. papers100M per machine, on paper\n")
    md.append(paper_markdown(paper))
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
    if args.arm_worker:
        arm_worker(args.arm_worker)
        return None
    if args.machine_worker:
        machine_worker(args.machine_worker)
        return None
    if args.paper:
        print(paper_markdown(paper_rows()))
        return None
    if args.measure_halo:
        return measure_halo(args)
    import sysinfo

    from graphtrainer.distdgl.partition import partition_graph

    machine = sysinfo.machine_info()
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
        halo2 = halo_stats(two) if two is not None else None
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
            remote = remote_part(str(two.config), {"fanouts": fanouts, "hidden": args.hidden,
                                                   "batch_size": args.batch_size, "batches": args.remote_batches,
                                                   "reps": args.remote_reps}, args.timeout)
    paper = paper_rows()
    model = model_bytes_one_part(spec)
    md = render(spec, thr, remote, paper, args, model)
    payload = {"benchmark": NAME, "machine": machine, "versions": sysinfo.versions(),
               "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()
                          if k not in ("arm_worker", "machine_worker", "mem_watch")},
               "graph": spec, "private_shm": private, "order": order, "wall_s": round(time.time() - t_start, 1),
               "throughput": thr, "runs": runs, "remote": remote, "halo_2_parts": halo2, "paper": paper,
               "model_one_part": model}
    paths = report.write_outputs(args.out, NAME, payload, md, draw_for(thr), figsize=(10, 4))
    print(md)
    print(f"[{NAME}] wrote {', '.join(str(p) for p in paths.values())}")
    if remote is not None and "failed" in remote:
        raise SystemExit(1)
    return payload


if __name__ == "__main__":
    main()
