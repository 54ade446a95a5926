"""Shared pieces of the benchmarks: memory of a process tree, a cross-process step probe,
memory estimates (refusing sizes the machine cannot hold), graphs, a tutorial-style
hand-written DDP loop, and output (JSON + Markdown table + PNG).

Everything here is importable as ``common`` from the benchmark scripts, which put this
folder on ``sys.path``; spawned children inherit that path, so classes defined here can
be pickled to them.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import pickle
import platform
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence

os.environ.setdefault("DGLBACKEND", "pytorch")

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # so `import graphtrainer` works without an install
    sys.path.insert(0, str(ROOT))

MB = 1024 * 1024
DATASETS = ("synthetic", "tolokers")


# ---------------------------------------------------------------------------------------
# Memory of a process tree
# ---------------------------------------------------------------------------------------
def smaps_rollup(pid: int) -> Dict[str, float]:
    """``pss``, ``uss`` (private clean + dirty) and ``rss`` of one process, in MB."""
    fields: Dict[str, int] = {}
    with open(f"/proc/{pid}/smaps_rollup", encoding="ascii") as fh:
        for line in fh:
            parts = line.split()
            if len(parts) >= 3 and parts[-1] == "kB":
                fields[parts[0].rstrip(":")] = int(parts[1])
    uss = fields.get("Private_Clean", 0) + fields.get("Private_Dirty", 0)
    return {"pss_mb": fields.get("Pss", 0) / 1024, "uss_mb": uss / 1024, "rss_mb": fields.get("Rss", 0) / 1024}


def tree_memory(root_pid: Optional[int] = None) -> Dict[str, Any]:
    """PSS/USS of ``root_pid`` (default: this process) and all its live descendants.

    ``total_pss_mb`` is the sum of PSS over the tree: shared pages (copy-on-write pages of
    forked ranks, shared-memory segments) are counted once in total, split between the
    processes that map them.
    """
    import psutil

    root = psutil.Process(root_pid or os.getpid())
    procs = [root]
    try:
        procs += root.children(recursive=True)
    except psutil.NoSuchProcess:
        pass
    rows = []
    for proc in procs:
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            mem = smaps_rollup(proc.pid)
            cmd = " ".join(proc.cmdline())
        except (psutil.NoSuchProcess, FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        role = "parent" if proc.pid == root.pid else "child"
        rows.append({"pid": proc.pid, "role": role, "cmd": cmd[:120], **{k: round(v, 1) for k, v in mem.items()}})
    return {
        "total_pss_mb": round(sum(r["pss_mb"] for r in rows), 1),
        "parent_pss_mb": round(sum(r["pss_mb"] for r in rows if r["role"] == "parent"), 1),
        "processes": rows,
    }


# ---------------------------------------------------------------------------------------
# Probe: what every rank reports, through files in a shared directory
# ---------------------------------------------------------------------------------------
class Probe:
    """Per-rank instrumentation shared by graphtrainer runs (via :class:`ProbeCallback`) and
    hand-written loops (called directly). Files, not queues, so it works the same under
    fork, spawn and any launcher.

    - training about to start (process group up, model wrapped in DDP, loader built):
      :meth:`fit_start` writes ``started_<rank>`` with ``time.time()`` (wall clock,
      comparable across processes on one machine);
    - step 0 done: writes ``first_<rank>`` with ``time.time()``;
    - step ``pause_at`` done: writes ``ready_<rank>`` and waits for ``go`` (the parent's
      :class:`MemoryWatcher` measures the tree meanwhile; every rank is paused, so the
      memory is the steady state of training and no rank is mid-step);
    - steps ``pause_at+1 .. pause_at+measure_steps``: timed; the rank writes
      ``rank_<rank>.json`` with its steady-state window and seed count.
    """

    def __init__(self, directory: str, pause_at: int = 3, measure_steps: int = 10, wait_timeout_s: float = 300.0):
        self.directory = str(directory)
        self.pause_at = pause_at
        self.measure_steps = measure_steps
        self.wait_timeout_s = wait_timeout_s
        self._step = 0
        self._t0: Optional[float] = None
        self._seeds = 0
        self._done = False

    @property
    def total_steps(self) -> int:
        return self.pause_at + 1 + self.measure_steps

    def _write(self, name: str, payload: Any) -> None:
        path = os.path.join(self.directory, name)
        with open(path + ".tmp", "w", encoding="utf-8") as fh:
            json.dump(payload, fh)
        os.replace(path + ".tmp", path)

    def fit_start(self, rank: int) -> None:
        self._write(f"started_{rank}", time.time())

    def step_end(self, rank: int, num_seeds: int) -> None:
        step, self._step = self._step, self._step + 1
        now = time.time()
        if step == 0:
            self._write(f"first_{rank}", now)
        if step == self.pause_at:
            self._write(f"ready_{rank}", now)
            deadline = time.monotonic() + self.wait_timeout_s
            go = os.path.join(self.directory, "go")
            while not os.path.exists(go):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"rank {rank}: no 'go' from the memory watcher in {self.wait_timeout_s} s")
                time.sleep(0.02)
            self._t0 = time.time()
        elif self._t0 is not None and not self._done:
            self._seeds += int(num_seeds)
            if step >= self.pause_at + self.measure_steps:
                t1 = time.time()
                self._done = True
                self._write(f"rank_{rank}.json", {"rank": rank, "pid": os.getpid(), "t0": self._t0, "t1": t1,
                                                  "steps": step - self.pause_at, "seeds": self._seeds})


def _num_seeds(batch: Any) -> int:
    try:
        return int(batch[1].shape[0])  # DGL: (input_nodes, output_nodes, blocks)
    except Exception:  # noqa: BLE001
        return 0


from graphtrainer.callbacks import Callback  # noqa: E402


class ProbeCallback(Callback):
    """Calls :meth:`Probe.step_end` after every training step of a graphtrainer run."""

    def __init__(self, probe: Probe):
        self.probe = probe

    def on_fit_start(self, trainer: Any, task: Any) -> None:
        self.probe.fit_start(trainer.rank)

    def on_train_batch_end(self, trainer: Any, task: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.probe.step_end(trainer.rank, _num_seeds(batch))


def make_probe_callback(probe: Probe) -> Any:
    return ProbeCallback(probe)


class MemoryWatcher:
    """Background thread in the launching process: waits until ``world`` ranks have written
    ``ready_*`` (all paused at step ``pause_at``), settles briefly, measures the whole process
    tree, then writes ``go``. Until then it also samples the tree's total PSS every
    ``interval_s`` for a start-up peak (pickling, shared-memory copies); a sample that
    falls between two polls is missed, so the peak is a lower bound. After the steady-state
    measurement it reads nothing more, so the throughput window is not disturbed (reading
    ``smaps_rollup`` walks the target's page tables under its mmap lock)."""

    def __init__(self, directory: str, world: int, settle_s: float = 0.3, interval_s: float = 0.25):
        self.directory, self.world = str(directory), world
        self.settle_s, self.interval_s = settle_s, interval_s
        self.steady: Optional[Dict[str, Any]] = None
        self.peak_pss_mb = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="memory-watcher", daemon=True)

    def start(self) -> "MemoryWatcher":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        next_sample = 0.0
        while not self._stop.is_set() and self.steady is None:
            if time.monotonic() >= next_sample:
                next_sample = time.monotonic() + self.interval_s
                try:
                    self.peak_pss_mb = max(self.peak_pss_mb, tree_memory()["total_pss_mb"])
                except Exception:  # noqa: BLE001 - processes come and go
                    pass
            ready = [n for n in os.listdir(self.directory) if n.startswith("ready_")]
            if len(ready) >= self.world:
                time.sleep(self.settle_s)
                self.steady = tree_memory()
                self.peak_pss_mb = max(self.peak_pss_mb, self.steady["total_pss_mb"])
                with open(os.path.join(self.directory, "go"), "w", encoding="utf-8") as fh:
                    fh.write("go")
                return
            self._stop.wait(0.05)


def collect_probe(directory: str, world: int, t_fit: float) -> Dict[str, Any]:
    """First-step delays and steady-state throughput from the ranks' files."""
    firsts, starts, ranks = [], [], []
    for r in range(world):
        try:
            with open(os.path.join(directory, f"started_{r}"), encoding="utf-8") as fh:
                starts.append(json.load(fh) - t_fit)
            with open(os.path.join(directory, f"first_{r}"), encoding="utf-8") as fh:
                firsts.append(json.load(fh) - t_fit)
            with open(os.path.join(directory, f"rank_{r}.json"), encoding="utf-8") as fh:
                ranks.append(json.load(fh))
        except FileNotFoundError as err:
            raise RuntimeError(f"rank {r} did not report ({err.filename})") from err
    t0 = min(x["t0"] for x in ranks)
    t1 = max(x["t1"] for x in ranks)
    seeds = sum(x["seeds"] for x in ranks)
    return {
        "ready_s": [round(x, 3) for x in starts],
        "first_step_s": [round(x, 3) for x in firsts],
        "startup_s": round(max(firsts), 3),
        "throughput_seeds_per_s": round(seeds / max(t1 - t0, 1e-9), 1),
        "steady_steps_per_rank": ranks[0]["steps"],
        "rank_pids": [x["pid"] for x in ranks],
    }


# ---------------------------------------------------------------------------------------
# Memory estimate (refuse before building)
# ---------------------------------------------------------------------------------------
PROCESS_BASE_MB = 450.0  # python + torch + dgl + gloo of one rank, measured ~350-450 MB RSS


def graph_bytes(num_nodes: int, num_edges: int, feat_dim: int, formats: bool = True) -> Dict[str, float]:
    """Bytes of a DGL graph with float32 ``feat``, int64 ``label`` and three bool masks.

    COO is 16 B/edge; CSR and CSC each 8 B/node + 16 B/edge (indices and edge ids).
    """
    coo = 16.0 * num_edges
    csx = 8.0 * num_nodes + 16.0 * num_edges
    ndata = num_nodes * (4.0 * feat_dim + 8 + 3)
    return {"coo": coo, "csx": csx, "ndata": ndata, "total": coo + ndata + (2 * csx if formats else 0.0)}


def estimate_mb(num_nodes: int, num_edges: int, feat_dim: int, launcher: str, world: int) -> float:
    """Peak memory (MB) of one benchmark run; generous on purpose (at 250k and 1M nodes it
    was 10-80% above the measured peaks)."""
    g = graph_bytes(num_nodes, num_edges, feat_dim)
    graph = g["total"] / MB
    build = 3 * g["coo"] / MB  # random endpoints, dedup/sort temporaries while building
    if world == 1 or launcher in ("single",):
        return PROCESS_BASE_MB + graph + build
    procs = PROCESS_BASE_MB * (world + 1)
    if launcher == "gt-fork":
        return procs + graph + build
    if launcher == "fork-noformats":
        return procs + graph + build + world * g["csx"] / MB  # each rank builds its own CSC
    if launcher == "gt-spawn":
        return procs + 2 * graph + build  # private copy and shared-memory copy during the move
    if launcher == "naive-spawn":
        # parent: graph + pickled bytes; each rank its copy; while the parent sends to one
        # rank, about one more holds received bytes next to the copy it unpickles
        return procs + (3 + world) * graph + build
    raise ValueError(launcher)


def available_cores() -> int:
    """Cores this process may run on (its affinity mask), as the trainer counts them."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def machine_memory_mb() -> float:
    import psutil

    return psutil.virtual_memory().total / MB


def refuse_if_too_big(plans: Iterable[Dict[str, Any]], limit_fraction: float = 0.9) -> None:
    """Exit with the estimate when any planned run needs more than the machine has."""
    total = machine_memory_mb()
    too_big = [p for p in plans if p["estimate_mb"] > limit_fraction * total]
    if too_big:
        lines = [f"  {p['label']}: estimated {p['estimate_mb'] / 1024:.1f} GiB" for p in too_big]
        raise SystemExit(
            f"refusing: {len(too_big)} planned run(s) need more memory than this machine has "
            f"({total / 1024:.1f} GiB, {int(limit_fraction * 100)}% usable):\n" + "\n".join(lines)
            + "\nUse smaller --sizes, fewer ranks, or drop naive-spawn.")


def parse_size(text: str) -> Dict[str, int]:
    """``NODESxDEGREE`` with k/M suffixes, e.g. ``2Mx10`` (2,000,000 nodes, ~20M edges)."""
    def num(s: str) -> int:
        s = s.strip()
        mult = {"k": 1_000, "K": 1_000, "m": 1_000_000, "M": 1_000_000}.get(s[-1:], 1)
        return int(float(s[:-1] if mult > 1 else s) * mult)

    try:
        nodes, _, deg = text.partition("x")
        out = {"num_nodes": num(nodes), "avg_degree": int(deg) if deg else 10}
    except ValueError:
        raise argparse.ArgumentTypeError(f"size {text!r}: use NODESxDEGREE, e.g. 2Mx10") from None
    if out["num_nodes"] < 100 or out["avg_degree"] < 1:
        raise argparse.ArgumentTypeError(f"size {text!r}: need at least 100 nodes and degree 1")
    return out


def size_label(size: Dict[str, int]) -> str:
    n = size["num_nodes"]
    text = f"{n / 1e6:g}M" if n >= 1_000_000 else f"{n / 1e3:g}k"
    return f"{text}x{size['avg_degree']}"


# ---------------------------------------------------------------------------------------
# Graphs
# ---------------------------------------------------------------------------------------
def build_graph(spec: Dict[str, Any]) -> Any:
    """``spec``: ``{"dataset": "tolokers"}`` or ``{"dataset": "synthetic", num_nodes, avg_degree,
    feat_dim, num_classes, seed}``. Tolokers' features are standardized as the example does."""
    from graphtrainer import datasets

    if spec["dataset"] == "tolokers":
        graph = datasets.load("tolokers")
        from graphtrainer.examples.node_classification import standardize_features

        standardize_features(graph)
        return single_split(graph)
    if spec["dataset"] == "synthetic":
        return datasets.synthetic(spec["num_nodes"], spec["avg_degree"], spec["feat_dim"],
                                  spec.get("num_classes", 8), spec.get("seed", 0))
    raise ValueError(f"unknown dataset {spec['dataset']!r}: choose one of {DATASETS}")


def train_ids(graph: Any) -> Any:
    mask = graph.ndata["train_mask"]
    if mask.dim() > 1:  # Tolokers: [N, 10] fixed splits; use split 0
        mask = mask[:, 0]
    return mask.nonzero(as_tuple=True)[0]


def split_ids(graph: Any, split: str) -> Any:
    mask = graph.ndata[f"{split}_mask"]
    if mask.dim() > 1:
        mask = mask[:, 0]
    return mask.nonzero(as_tuple=True)[0]


# ---------------------------------------------------------------------------------------
# A GraphTask for the benchmarks (train only)
# ---------------------------------------------------------------------------------------
from graphtrainer.examples.node_classification import NodeClassification  # noqa: E402


def single_split(graph: Any) -> Any:
    """Make ``*_mask`` 1-D (split 0 of Tolokers' 10) so the example task can use the graph."""
    for s in ("train", "val", "test"):
        m = graph.ndata[f"{s}_mask"]
        if m.dim() > 1:
            graph.ndata[f"{s}_mask"] = m[:, 0].contiguous()
    return graph


class BenchTask(NodeClassification):
    """The example's GraphSAGE task (``graphtrainer.examples.node_classification``) without
    validation (the benchmarks time training only), and with a training step that does
    exactly what the hand-written loop's step does: forward, cross-entropy, and the loss
    recorded once (``self.log`` here, ``loss.item()`` there); the example also logs a
    training accuracy, which the hand-written loop does not compute."""

    def val_dataloader(self) -> Any:
        return None

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        import torch.nn.functional as F

        logits, labels = self._forward(batch)
        loss = F.cross_entropy(logits, labels)
        self.log("train_loss", loss)
        return loss


# ---------------------------------------------------------------------------------------
# Hand-written DDP, in the style of DGL's classic multi-GPU node-classification tutorial
# ---------------------------------------------------------------------------------------
def handwritten_rank(rank: int, world: int, port: int, graph_or_box: Any, cfg: Dict[str, Any]) -> None:
    """One rank of the tutorial-style script: its own process group, DDP, DGL's
    ``DataLoader(use_ddp=True)``, ``loss.item()`` every step.

    ``graph_or_box``: the graph, or a one-item list holding its pickled bytes (naive spawn;
    the bytes are dropped as soon as they are unpickled, as with ``mp.spawn`` arguments).
    ``cfg`` keys: fanouts, hidden, batch_size, lr, dropout, epochs, threads, seed;
    optional: probe_dir, pause_at, measure_steps (a :class:`Probe`), max_steps, out_file
    (rank 0 writes epoch times and test metrics), join (run each epoch inside
    ``Join([model])`` as graphtrainer does: an ablation arm of overhead.py), fresh_thread
    (read by ``_naive_child``: train in a new thread, as graphtrainer's ranks do).
    """
    import contextlib

    import dgl
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.algorithms.join import Join
    from torch.nn.parallel import DistributedDataParallel

    from graphtrainer.models import SAGE

    torch.set_num_threads(cfg["threads"])
    dgl.utils.set_num_threads(cfg["threads"])
    g = pickle.loads(graph_or_box.pop()) if isinstance(graph_or_box, list) else graph_or_box
    del graph_or_box
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", world_size=world, rank=rank)
    torch.manual_seed(cfg["seed"])
    num_classes = int(g.ndata["label"].max()) + 1
    model = SAGE(g.ndata["feat"].shape[1], cfg["hidden"], num_classes, num_layers=len(cfg["fanouts"]),
                 dropout=cfg["dropout"])
    model = DistributedDataParallel(model)
    sampler = dgl.dataloading.NeighborSampler(list(cfg["fanouts"]), prefetch_node_feats=["feat"],
                                              prefetch_labels=["label"])
    train_idx = split_ids(g, "train")
    loader = dgl.dataloading.DataLoader(g, train_idx, sampler, batch_size=cfg["batch_size"], shuffle=True,
                                        drop_last=False, num_workers=0, use_ddp=True)
    opt = torch.optim.Adam(model.parameters(), lr=cfg["lr"])
    probe = Probe(cfg["probe_dir"], cfg["pause_at"], cfg["measure_steps"]) if cfg.get("probe_dir") else None
    if probe is not None:
        probe.fit_start(rank)
    max_steps = cfg.get("max_steps")
    epoch_times: List[float] = []
    step_ends: List[List[float]] = []  # per epoch: seconds from the epoch's start to each step's end
    step = 0
    for epoch in range(cfg["epochs"]):
        model.train()
        t0 = time.perf_counter()
        total_loss = 0.0
        ends: List[float] = []
        step_ends.append(ends)
        with (Join([model]) if cfg.get("join") else contextlib.nullcontext()):
            for it, (input_nodes, output_nodes, blocks) in enumerate(loader):
                x = blocks[0].srcdata["feat"]
                y = blocks[-1].dstdata["label"]
                y_hat = model(blocks, x)
                loss = F.cross_entropy(y_hat, y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                total_loss += loss.item()
                step += 1
                ends.append(time.perf_counter() - t0)
                if probe is not None:
                    probe.step_end(rank, output_nodes.shape[0])
                if max_steps is not None and step >= max_steps:
                    break
        epoch_times.append(time.perf_counter() - t0)
        if max_steps is not None and step >= max_steps:
            break
    if rank == 0 and cfg.get("out_file"):
        metrics = evaluate(model.module, g, split_ids(g, "test"))
        with open(cfg["out_file"], "w", encoding="utf-8") as fh:
            json.dump({"epoch_times_s": epoch_times, "step_ends_s": step_ends, **metrics}, fh)
    dist.barrier()
    if cfg.get("join"):
        # torch 2.2 + gloo: under Join, DDP leaves un-awaited async all-reduces behind; freeing
        # the DDP reducer then deadlocks (the main thread holds the GIL while joining a gloo
        # worker that needs it to free a tensor). Leave without tearing down.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    dist.destroy_process_group()


def evaluate(model: Any, graph: Any, ids: Any, batch_size: int = 4096) -> Dict[str, float]:
    """Test metrics over ``ids`` with every neighbour (exact), in this process:
    ``test_acc``, and ``test_auc`` (ROC-AUC of class 1) for binary labels."""
    import dgl
    import torch

    model.eval()
    sampler = dgl.dataloading.MultiLayerFullNeighborSampler(len(model.layers), prefetch_node_feats=["feat"],
                                                            prefetch_labels=["label"])
    loader = dgl.dataloading.DataLoader(graph, ids, sampler, batch_size=batch_size, shuffle=False)
    logits, labels = [], []
    with torch.no_grad():
        for _, _, blocks in loader:
            logits.append(model(blocks, blocks[0].srcdata["feat"]))
            labels.append(blocks[-1].dstdata["label"])
    model.train()
    out, y = torch.cat(logits), torch.cat(labels)
    metrics = {"test_acc": float((out.argmax(1) == y).float().mean())}
    if out.shape[1] == 2:
        from graphtrainer.metrics import roc_auc

        metrics["test_auc"] = roc_auc(torch.softmax(out, 1)[:, 1], y)
    return metrics


def _naive_child(rank: int, world: int, port: int, conn: Any, cfg: Dict[str, Any]) -> None:
    if sys.platform.startswith("linux"):  # die with the launching process (not what tutorials do;
        try:                              # it keeps a killed benchmark from leaving ranks behind)
            import ctypes

            ctypes.CDLL("libc.so.6").prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL
        except OSError:
            pass
    box = [conn.recv_bytes()]  # this rank's own copy of the pickled graph
    conn.close()
    if not cfg.get("fresh_thread"):
        handwritten_rank(rank, world, port, box, cfg)
        return
    # Ablation (overhead.py --thread-arm): train in a new thread, as graphtrainer's launched
    # ranks do (its work-around for the OpenMP fork hang), instead of the main thread.
    failed: List[BaseException] = []

    def target() -> None:
        try:
            handwritten_rank(rank, world, port, box, cfg)
        except BaseException as err:  # noqa: BLE001 - re-raised in the main thread
            failed.append(err)

    worker = threading.Thread(target=target, name=f"naive-rank{rank}-train")
    worker.start()
    worker.join()
    if failed:
        raise failed[0]


def naive_spawn(graph: Any, world: int, cfg: Dict[str, Any], teardown_timeout_s: float = 60.0) -> None:
    """Launch ``handwritten_rank`` the way the classic tutorials do: spawn, with the graph
    pickled (plain ``pickle.dumps``, as ``mp.spawn`` does with its arguments) and sent to
    every child, which unpickles its own private copy. The bytes go through a pipe so the
    parent does not keep them alive, and each child drops its bytes once unpickled."""
    import multiprocessing as mp

    from graphtrainer.distributed import free_port

    ctx = mp.get_context("spawn")
    data = pickle.dumps(graph, protocol=pickle.HIGHEST_PROTOCOL)
    port = free_port()
    procs, conns = [], []
    try:
        for r in range(world):
            recv, send = ctx.Pipe(duplex=False)
            p = ctx.Process(target=_naive_child, args=(r, world, port, recv, cfg), name=f"naive-rank{r}")
            p.start()
            recv.close()
            procs.append(p)
            conns.append(send)
        for send in conns:
            send.send_bytes(data)
            send.close()
        del data
        # Like the tutorials there is no watchdog in the ranks; here, at least, one failed
        # rank ends the others instead of leaving them blocked in a collective.
        first_done = None
        while True:
            alive = [p for p in procs if p.exitcode is None]
            if not alive or any(p.exitcode not in (None, 0) for p in procs):
                break
            if first_done is None and len(alive) < len(procs):
                first_done = time.monotonic()
            if first_done is not None and time.monotonic() - first_done > teardown_timeout_s:
                print(f"[bench] naive spawn: {len(alive)} rank(s) still tearing down {teardown_timeout_s:.0f} s "
                      "after another finished; ending them", file=sys.stderr, flush=True)
                for p in alive:
                    p.kill()
                    p.join(5)
                    p.exitcode_override = 0  # their work was done: all ranks passed the final barrier
                break
            alive[0].join(0.2)
    finally:
        for p in procs:  # only after a failure here: end the ranks still running
            if p.exitcode is None:
                p.kill()
                p.join(5)
    bad = [(r, p.exitcode) for r, p in enumerate(procs) if p.exitcode != 0 and not hasattr(p, "exitcode_override")]
    if bad:
        raise RuntimeError(f"naive spawn ranks failed (rank, exit code): {bad}")


# ---------------------------------------------------------------------------------------
# How busy the rest of the machine was
# ---------------------------------------------------------------------------------------
def _busy_cpu_s() -> float:
    """CPU seconds spent by every process on the machine since boot (all cores)."""
    with open("/proc/stat", encoding="ascii") as fh:
        fields = [int(x) for x in fh.readline().split()[1:]]
    # user nice system idle iowait irq softirq steal guest guest_nice; guest is inside user
    busy = fields[0] + fields[1] + fields[2] + fields[5] + fields[6] + (fields[7] if len(fields) > 7 else 0)
    return busy / os.sysconf("SC_CLK_TCK")


def _own_cpu_s() -> float:
    """CPU seconds of this process, its live descendants, and its reaped children (which
    include their own reaped descendants)."""
    import psutil

    me = psutil.Process()
    t = me.cpu_times()
    total = t.user + t.system + t.children_user + t.children_system
    for child in me.children(recursive=True):
        try:
            c = child.cpu_times()
            total += c.user + c.system
        except psutil.NoSuchProcess:
            pass
    return total


#: Above this many cores of other work during a run, its timings are marked as noisy.
NOISY_CORES = 0.25


def noise_note(other_cores: float) -> str:
    """'' for a quiet run, else a short warning for tables."""
    return "" if other_cores <= NOISY_CORES else f" (noisy: {other_cores:.2f} cores busy elsewhere)"


class LoadMeter:
    """``other_cores``: CPU time that processes *outside* this benchmark's process tree used
    during a run, per second of wall time (0 = quiet machine, 1 = one core busy elsewhere).
    Timings taken with ``other_cores`` well above 0 are skewed by that other work."""

    def __enter__(self) -> "LoadMeter":
        self._wall, self._busy, self._own = time.monotonic(), _busy_cpu_s(), _own_cpu_s()
        return self

    def __exit__(self, *exc: Any) -> None:
        wall = max(time.monotonic() - self._wall, 1e-6)
        other = (_busy_cpu_s() - self._busy) - (_own_cpu_s() - self._own)
        self.other_cores = round(max(0.0, other) / wall, 2)


# ---------------------------------------------------------------------------------------
# Output
# ---------------------------------------------------------------------------------------
def machine_info() -> Dict[str, Any]:
    """Cores, memory, platform, and the load when the benchmark started. Warns (stderr) when
    the machine is busy: timings then say more about the other work than about this one."""
    import psutil

    load = os.getloadavg()[0]
    cpus = available_cores()
    if load > 0.25 * cpus:
        print(f"[bench] WARNING: 1-minute load average {load:.2f} on {cpus} cores before starting: timings "
              "will be noisy (multi-threaded runs suffer most); memory figures are unaffected", file=sys.stderr,
              flush=True)
    model = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            model = next((l.split(":", 1)[1].strip() for l in fh if l.startswith("model name")), "")
    except OSError:
        pass
    return {
        "cpus": os.cpu_count(),
        "cores_available": available_cores(),
        "cpu_model": model,
        "ram_gib": round(machine_memory_mb() / 1024, 1),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "loadavg_start": [round(x, 2) for x in os.getloadavg()],
        "available_gib_start": round(psutil.virtual_memory().available / 2**30, 1),
    }


def versions() -> Dict[str, str]:
    import torch

    out = {"torch": torch.__version__}
    try:
        import dgl

        out["dgl"] = dgl.__version__
    except Exception:  # noqa: BLE001
        pass
    return out


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    def fmt(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:,.2f}" if abs(v) < 100 else f"{v:,.0f}"
        return "" if v is None else str(v)

    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def write_outputs(out_dir: Path, name: str, payload: Dict[str, Any], markdown: str,
                  plot: Callable[[Any], None], figsize: Sequence[float] = (12, 4.5)) -> Dict[str, Path]:
    """``<name>.json`` (payload plus machine load at the end), ``<name>.md``, ``<name>.png``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    payload.setdefault("machine", {})["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    paths = {"json": out_dir / f"{name}.json", "md": out_dir / f"{name}.md", "png": out_dir / f"{name}.png"}
    paths["json"].write_text(json.dumps(payload, indent=2, default=str) + "\n", encoding="utf-8")
    m = payload["machine"]
    header = (f"<!-- {name}: {m.get('cpus')} CPUs ({m.get('cpu_model')}), {m.get('ram_gib')} GiB RAM, load average "
              f"{m.get('loadavg_start')} at start, {m.get('loadavg_end')} at end -->\n")
    paths["md"].write_text(header + markdown.rstrip() + "\n", encoding="utf-8")
    fig = plt.figure(figsize=tuple(figsize))
    try:
        plot(fig)
        fig.tight_layout()
        fig.savefig(paths["png"], dpi=110)
    finally:
        plt.close(fig)
    return paths


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values)) if values else float("nan")


def base_parser(name: str, description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--out", type=Path, default=Path("bench_out") / name, help="output folder (default: %(default)s)")
    parser.add_argument("--tiny", action="store_true", help="a seconds-long configuration (smoke test)")
    return parser


def fmt_ratio(x: Optional[float]) -> str:
    return "" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.2f}x"
