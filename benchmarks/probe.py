"""Process memory (PSS/USS from ``/proc/<pid>/smaps_rollup``, peak RSS), the memory estimate that refuses runs
the machine cannot hold, and a per-rank step clock reporting through files (so it works under any launcher)."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

import harness  # noqa: F401  (graphtrainer from this checkout, DGL on PyTorch)
import psutil
import torch
from graphtrainer.callbacks import Callback

MB = 1024 * 1024
PROCESS_BASE_MB = 450.0  # python + torch + dgl + gloo of one rank, measured ~350-450 MB RSS


def smaps_rollup(pid: int) -> Dict[str, float]:
    """PSS, USS (private clean + dirty) and RSS of one process, in MB."""
    with open(f"/proc/{pid}/smaps_rollup", encoding="ascii") as fh:
        kb = {p[0].rstrip(":"): int(p[1]) for p in map(str.split, fh) if len(p) >= 3 and p[-1] == "kB"}
    return {"pss_mb": round(kb.get("Pss", 0) / 1024, 1), "rss_mb": round(kb.get("Rss", 0) / 1024, 1),
            "uss_mb": round((kb.get("Private_Clean", 0) + kb.get("Private_Dirty", 0)) / 1024, 1)}


def peak_rss_mb(reset: bool = False) -> float:
    """This process's peak RSS (VmHWM, Linux); ``reset`` restarts it from the current RSS."""
    if reset:
        Path("/proc/self/clear_refs").write_text("5", encoding="ascii")
    with open("/proc/self/status", encoding="ascii") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("VmHWM")) / 1024


def tree_memory(root_pid: Optional[int] = None) -> Dict[str, Any]:
    """PSS/USS/RSS (MB) of ``root_pid`` (default: this process) and its live descendants. Summing PSS
    counts each shared page (copy-on-write, shared memory) once in ``total_pss_mb``."""
    root = psutil.Process(root_pid or os.getpid())
    rows = []
    for proc in [root] + root.children(recursive=True):
        try:  # processes come and go
            if proc.status() != psutil.STATUS_ZOMBIE:
                rows.append({"pid": proc.pid, "role": "parent" if proc is root else "child",
                             "cmd": " ".join(proc.cmdline())[:120], **smaps_rollup(proc.pid)})
        except (psutil.NoSuchProcess, FileNotFoundError, ProcessLookupError, PermissionError):
            pass
    return {"total_pss_mb": round(sum(r["pss_mb"] for r in rows), 1),
            "parent_pss_mb": round(sum(r["pss_mb"] for r in rows if r["role"] == "parent"), 1), "processes": rows}


def estimate_mb(num_nodes: int, num_edges: int, feat_dim: int, launcher: str, world: int) -> float:
    """Peak memory (MB) of one run, generous on purpose (10-80% above the peaks measured at 250k and 1M
    nodes): COO 16 B/edge, the CSC sampling reads 8 B/node + 16 B/edge, float32 features, int64 labels,
    three bool masks; building the graph holds about 3 COOs of temporaries."""
    coo, csc = 16.0 * num_edges / MB, (8.0 * num_nodes + 16.0 * num_edges) / MB
    graph, build = coo + csc + num_nodes * (4.0 * feat_dim + 11) / MB, 3 * coo
    if world == 1 or launcher == "single":
        return PROCESS_BASE_MB + graph + build
    # spawn, forkserver: the CSC moved to shared memory one array at a time; naive-spawn: the parent's graph
    # and its pickle, each rank's copy, one more unpickling
    held = {"gt-fork": graph, "gt-spawn": graph + csc, "gt-forkserver": graph + csc, "naive-spawn": (3 + world) * graph}
    return PROCESS_BASE_MB * (world + 1) + held[launcher] + build


def machine_memory_mb() -> float:
    return psutil.virtual_memory().total / MB


def refuse_if_too_big(plans: List[Dict[str, Any]], limit_mb: Optional[float] = None, skip: bool = False) -> List[Any]:
    """The planned runs (``label``, ``estimate_mb``) below 90% of the machine's memory and ``limit_mb``.
    With ``skip`` the others are listed and left out; else (or if none fits) exit."""
    total = machine_memory_mb()
    limit = min(0.9 * total, limit_mb or float("inf"))
    fits = [p for p in plans if p["estimate_mb"] <= limit]
    too_big = [f"{p['label']}: estimated {p['estimate_mb'] / 1024:.1f} GiB" for p in plans if p not in fits]
    if too_big and not (skip and fits):
        raise SystemExit(f"refusing: {len(too_big)} planned run(s) need more memory than this machine has "
                         f"({total / 1024:.1f} GiB, 90% usable):\n  " + "\n  ".join(too_big)
                         + "\nUse smaller --sizes, fewer ranks, or drop naive-spawn.")
    for line in too_big:
        print(f"skipping {line}, over the {limit / 1024:.1f} GiB limit", flush=True)
    return fits


class Probe(Callback):
    """Each rank's fit start, step ends (wall clock) and seeds per step. After step ``pause_at`` it writes
    ``ready_<rank>`` and waits for ``go`` (from the launching process); ``measure_steps`` timed steps later,
    ``<directory>/rank_<rank>.json``. Hand-written loops call :meth:`fit_start` and :meth:`step_end`."""

    def __init__(self, directory: str, pause_at: int = 3, measure_steps: int = 10, wait_timeout_s: float = 300.0):
        self.directory, self.pause_at, self.wait_timeout_s = str(directory), pause_at, wait_timeout_s
        self.total_steps, self.started = pause_at + 1 + measure_steps, 0.0
        self.ends: List[float] = []
        self.seeds: List[int] = []

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
            Path(self.directory, f"rank_{rank}.json").write_text(json.dumps({
                "started": self.started, "ends": self.ends, "seeds": self.seeds, "pid": os.getpid(),
                "torch_threads": torch.get_num_threads()}), encoding="utf-8")

    def on_fit_start(self, trainer: Any, task: Any) -> None:
        self.fit_start(trainer.rank)

    def on_train_batch_end(self, trainer: Any, task: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.step_end(trainer.rank, int(batch[1].shape[0]))  # DGL: (input_nodes, output_nodes, blocks)
