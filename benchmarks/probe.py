"""Process-tree memory (PSS/USS from ``/proc/<pid>/smaps_rollup``), the peak-memory estimate that
refuses sizes the machine cannot hold, and a per-rank step clock that reports to the launching process
through files in a shared directory (so it works under any launcher)."""
from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

import harness  # noqa: F401  (graphtrainer from this checkout, DGL on PyTorch)
from graphtrainer.callbacks import Callback

MB = 1024 * 1024
PROCESS_BASE_MB = 450.0  # python + torch + dgl + gloo of one rank, measured ~350-450 MB RSS


def smaps_rollup(pid: int) -> Dict[str, float]:
    """PSS, USS (private clean + dirty) and RSS of one process, in MB."""
    with open(f"/proc/{pid}/smaps_rollup", encoding="ascii") as fh:
        kb = {p[0].rstrip(":"): int(p[1]) for p in map(str.split, fh) if len(p) >= 3 and p[-1] == "kB"}
    return {"pss_mb": round(kb.get("Pss", 0) / 1024, 1), "rss_mb": round(kb.get("Rss", 0) / 1024, 1),
            "uss_mb": round((kb.get("Private_Clean", 0) + kb.get("Private_Dirty", 0)) / 1024, 1)}


def tree_memory(root_pid: Optional[int] = None) -> Dict[str, Any]:
    """PSS/USS/RSS (MB) of ``root_pid`` (default: this process) and its live descendants. Summing PSS
    counts each shared page (copy-on-write, shared memory) once in ``total_pss_mb``."""
    import psutil

    root = psutil.Process(root_pid or os.getpid())
    rows = []
    for proc in [root] + root.children(recursive=True):
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            rows.append({"pid": proc.pid, "role": "parent" if proc is root else "child",
                         "cmd": " ".join(proc.cmdline())[:120], **smaps_rollup(proc.pid)})
        except (psutil.NoSuchProcess, FileNotFoundError, ProcessLookupError, PermissionError):
            continue  # processes come and go
    return {"total_pss_mb": round(sum(r["pss_mb"] for r in rows), 1),
            "parent_pss_mb": round(sum(r["pss_mb"] for r in rows if r["role"] == "parent"), 1), "processes": rows}


def estimate_mb(num_nodes: int, num_edges: int, feat_dim: int, launcher: str, world: int) -> float:
    """Peak memory (MB) of one run, generous on purpose (10-80% above the peaks measured at 250k and 1M
    nodes): COO 16 B/edge, the CSC sampling reads 8 B/node + 16 B/edge, float32 features, int64 labels,
    three bool masks; building the graph holds about 3 COOs of temporaries."""
    coo, csc = 16.0 * num_edges / MB, (8.0 * num_nodes + 16.0 * num_edges) / MB
    graph, build, procs = coo + csc + num_nodes * (4.0 * feat_dim + 11) / MB, 3 * coo, PROCESS_BASE_MB * (world + 1)
    if world == 1 or launcher == "single":
        return PROCESS_BASE_MB + graph + build
    if launcher == "gt-fork":
        return procs + graph + build
    if launcher in ("gt-spawn", "gt-forkserver"):
        return procs + graph + csc + build  # moved to shared memory one array at a time
    if launcher == "naive-spawn":  # the parent's graph and pickle, each rank's copy, one more unpickling
        return procs + (3 + world) * graph + build
    raise ValueError(launcher)


def machine_memory_mb() -> float:
    import psutil

    return psutil.virtual_memory().total / MB


def refuse_if_too_big(plans: List[Dict[str, Any]], limit_fraction: float = 0.9,
                      limit_mb: Optional[float] = None, skip: bool = False) -> List[Dict[str, Any]]:
    """The planned runs (``label``, ``estimate_mb``) below ``limit_fraction`` of the machine's memory
    and ``limit_mb``. With ``skip`` the others are listed and left out; else (or if none fits) exit."""
    total = machine_memory_mb()
    limit = min(limit_fraction * total, limit_mb or float("inf"))
    too_big = [p for p in plans if p["estimate_mb"] > limit]
    if too_big and skip and len(too_big) < len(plans):
        for p in too_big:
            print(f"skipping {p['label']}: estimated {p['estimate_mb'] / 1024:.1f} GiB, over the "
                  f"{limit / 1024:.1f} GiB limit", flush=True)
        return [p for p in plans if p["estimate_mb"] <= limit]
    if too_big:
        lines = "".join(f"\n  {p['label']}: estimated {p['estimate_mb'] / 1024:.1f} GiB" for p in too_big)
        raise SystemExit(f"refusing: {len(too_big)} planned run(s) need more memory than this machine has "
                         f"({total / 1024:.1f} GiB, {int(limit_fraction * 100)}% usable):{lines}\n"
                         "Use smaller --sizes, fewer ranks, or drop naive-spawn.")
    return plans


class Probe(Callback):
    """Each rank's fit start, step ends (wall clock) and seeds per step. After step ``pause_at`` it
    writes ``ready_<rank>`` and waits for ``go`` (from :class:`MemoryWatcher`; the timed steps start
    then); ``measure_steps`` steps later it writes ``<directory>/rank_<rank>.json`` with its pid and
    thread count. Hand-written loops call :meth:`fit_start` and :meth:`step_end` themselves."""

    def __init__(self, directory: str, pause_at: int = 3, measure_steps: int = 10, wait_timeout_s: float = 300.0):
        self.directory, self.started = str(directory), 0.0
        self.pause_at, self.measure_steps, self.wait_timeout_s = pause_at, measure_steps, wait_timeout_s
        self.ends: List[float] = []
        self.seeds: List[int] = []

    @property
    def total_steps(self) -> int:
        return self.pause_at + 1 + self.measure_steps

    def fit_start(self, rank: int) -> None:
        self.started = time.time()

    def step_end(self, rank: int, num_seeds: int) -> None:
        self.ends.append(time.time())
        self.seeds.append(int(num_seeds))
        if len(self.ends) == self.pause_at + 1:
            Path(self.directory, f"ready_{rank}").touch()
            deadline = time.monotonic() + self.wait_timeout_s
            while not os.path.exists(os.path.join(self.directory, "go")):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"rank {rank}: no 'go' from the memory watcher in {self.wait_timeout_s} s")
                time.sleep(0.02)
            self.ends[-1] = time.time()  # the timed steps start after the pause
        if len(self.ends) == self.total_steps:
            import torch

            Path(self.directory, f"rank_{rank}.json").write_text(json.dumps({
                "started": self.started, "ends": self.ends, "seeds": self.seeds, "pid": os.getpid(),
                "torch_threads": torch.get_num_threads()}), encoding="utf-8")

    def on_fit_start(self, trainer: Any, task: Any) -> None:
        self.fit_start(trainer.rank)

    def on_train_batch_end(self, trainer: Any, task: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.step_end(trainer.rank, int(batch[1].shape[0]))  # DGL: (input_nodes, output_nodes, blocks)


class MemoryWatcher(threading.Thread):
    """In the launching process: samples the tree's total PSS (``peak_pss_mb``, a lower bound) until
    ``world`` ranks paused, then measures the paused tree (``steady``) once and writes ``go``;
    nothing after, so the timed steps are undisturbed."""

    def __init__(self, directory: str, world: int, settle_s: float = 0.3, interval_s: float = 0.25):
        super().__init__(name="memory-watcher", daemon=True)
        self.directory, self.world, self.settle_s, self.interval_s = str(directory), world, settle_s, interval_s
        self.steady: Optional[Dict[str, Any]] = None
        self.peak_pss_mb = 0.0
        self.stopped = threading.Event()

    def stop(self) -> None:
        self.stopped.set()
        self.join(timeout=10)

    def run(self) -> None:
        while not self.stopped.wait(self.interval_s):
            self.peak_pss_mb = max(self.peak_pss_mb, tree_memory()["total_pss_mb"])
            if sum(n.startswith("ready_") for n in os.listdir(self.directory)) >= self.world:
                time.sleep(self.settle_s)
                self.steady = tree_memory()
                self.peak_pss_mb = max(self.peak_pss_mb, self.steady["total_pss_mb"])
                Path(self.directory, "go").touch()
                return


def collect_probe(directory: str, world: int, t_fit: float, pause_at: int = 3) -> Dict[str, Any]:
    """The :class:`Probe` files: each rank's fit start and first step after ``t_fit``, the slowest
    one's (start-up), and the seeds/s of all ranks' steps after the pause (over the slowest rank's
    window) and ms per step."""
    try:
        ranks = [json.loads(Path(directory, f"rank_{r}.json").read_text(encoding="utf-8")) for r in range(world)]
    except FileNotFoundError as err:
        raise RuntimeError(f"a rank did not report ({err.filename})") from err
    firsts = [round(x["ends"][0] - t_fit, 3) for x in ranks]
    window = max(x["ends"][-1] - x["ends"][pause_at] for x in ranks)
    return {"ready_s": [round(x["started"] - t_fit, 3) for x in ranks], "first_step_s": firsts,
            "startup_s": max(firsts), "rank_pids": [x["pid"] for x in ranks],
            "throughput_seeds_per_s": round(sum(sum(x["seeds"][pause_at + 1:]) for x in ranks) / window, 1),
            "step_ms": 1000 * window / (len(ranks[0]["ends"]) - pause_at - 1),
            "torch_threads": ranks[0]["torch_threads"]}
