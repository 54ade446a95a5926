"""Measuring a benchmark's process tree: PSS/USS from ``/proc/<pid>/smaps_rollup``, the
estimate of a planned run's peak (sizes the machine cannot hold are refused before anything is
built), and the per-rank probe that pauses every rank while the launching process reads the
tree, then times the next steps (through files in a shared directory, any launcher)."""
from __future__ import annotations

import json
import os
import threading
import time
from typing import Any, Dict, List, Optional

import harness  # noqa: F401  (graphtrainer from this checkout, DGL on PyTorch)
from graphtrainer.callbacks import Callback

MB = 1024 * 1024


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


PROCESS_BASE_MB = 450.0  # python + torch + dgl + gloo of one rank, measured ~350-450 MB RSS


def graph_bytes(num_nodes: int, num_edges: int, feat_dim: int, formats: bool = True) -> Dict[str, float]:
    """Bytes of a DGL graph with float32 ``feat``, int64 ``label`` and three bool masks.

    COO is 16 B/edge; CSR and CSC each 8 B/node + 16 B/edge (indices and edge ids). With
    ``formats`` the CSC that sampling reads is counted (graphtrainer builds only that one).
    """
    coo = 16.0 * num_edges
    csx = 8.0 * num_nodes + 16.0 * num_edges
    ndata = num_nodes * (4.0 * feat_dim + 8 + 3)
    return {"coo": coo, "csx": csx, "ndata": ndata, "total": coo + ndata + (csx if formats else 0.0)}


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
    if launcher in ("gt-spawn", "gt-forkserver"):
        # moved to shared memory in place, one array at a time (its private copy lives until
        # the array is moved)
        return procs + graph + g["csx"] / MB + build
    if launcher == "naive-spawn":
        # parent: graph + pickled bytes; each rank its copy; while the parent sends to one
        # rank, about one more holds received bytes next to the copy it unpickles
        return procs + (3 + world) * graph + build
    raise ValueError(launcher)


def machine_memory_mb() -> float:
    import psutil

    return psutil.virtual_memory().total / MB


def refuse_if_too_big(plans: List[Dict[str, Any]], limit_fraction: float = 0.9,
                      limit_mb: Optional[float] = None, skip: bool = False) -> List[Dict[str, Any]]:
    """The planned runs that fit: below ``limit_fraction`` of the machine's memory (and
    ``limit_mb`` when given). With ``skip``, runs that do not fit are left out (and listed);
    otherwise, or when none fits, exit with the estimate of each."""
    total = machine_memory_mb()
    limit = min(limit_fraction * total, limit_mb or float("inf"))
    too_big = [p for p in plans if p["estimate_mb"] > limit]
    if too_big and skip and len(too_big) < len(plans):
        for p in too_big:
            print(f"skipping {p['label']}: estimated {p['estimate_mb'] / 1024:.1f} GiB, over the "
                  f"{limit / 1024:.1f} GiB limit", flush=True)
        return [p for p in plans if p["estimate_mb"] <= limit]
    if too_big:
        lines = [f"  {p['label']}: estimated {p['estimate_mb'] / 1024:.1f} GiB" for p in too_big]
        raise SystemExit(
            f"refusing: {len(too_big)} planned run(s) need more memory than this machine has "
            f"({total / 1024:.1f} GiB, {int(limit_fraction * 100)}% usable):\n" + "\n".join(lines)
            + "\nUse smaller --sizes, fewer ranks, or drop naive-spawn.")
    return plans


class Probe:
    """Per-rank files (any launcher): ``started_<rank>`` at fit start, ``first_<rank>`` after
    step 0, ``ready_<rank>`` after step ``pause_at`` (then it waits for ``go`` while the
    :class:`MemoryWatcher` measures the paused tree), and ``rank_<rank>.json`` with the seeds
    and wall window of the next ``measure_steps`` steps. Called by :class:`ProbeCallback` in
    graphtrainer runs and directly by the hand-written loop."""

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


class ProbeCallback(Callback):
    """Calls :meth:`Probe.step_end` after every training step of a graphtrainer run."""

    def __init__(self, probe: Probe):
        self.probe = probe

    def on_fit_start(self, trainer: Any, task: Any) -> None:
        self.probe.fit_start(trainer.rank)

    def on_train_batch_end(self, trainer: Any, task: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.probe.step_end(trainer.rank, _num_seeds(batch))


class MemoryWatcher:
    """A thread in the launching process: samples the tree's total PSS every ``interval_s``
    (the start-up peak, a lower bound) until ``world`` ranks wrote ``ready_*``, then measures
    the paused tree once and writes ``go``; nothing after, so the timed window is undisturbed."""

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


class StepClock(Callback):
    """Each rank's step ends (its own clock) and seeds per step, written to
    ``<directory>/rank_<rank>.json`` at the fit's end with the rank's thread counts."""

    def __init__(self, directory: str) -> None:
        self.directory = str(directory)
        self.ends: List[float] = []
        self.seeds: List[int] = []

    def on_train_batch_end(self, trainer: Any, task: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.ends.append(time.perf_counter())
        self.seeds.append(_num_seeds(batch))

    def on_fit_end(self, trainer: Any, task: Any) -> None:
        import torch

        Probe(self.directory)._write(f"rank_{trainer.rank}.json", {
            "ends": self.ends, "seeds": self.seeds, "torch_threads": torch.get_num_threads()})


def step_throughput(directory: str, world: int, warmup: int) -> Dict[str, Any]:
    """Seeds/s of all ranks after ``warmup`` steps (the slowest rank's window) and ms per step."""
    ranks = []
    for r in range(world):
        with open(os.path.join(directory, f"rank_{r}.json"), encoding="utf-8") as fh:
            ranks.append(json.load(fh))
    if any(len(x["ends"]) <= warmup for x in ranks):
        raise RuntimeError(f"a rank ran no more than the {warmup} warm-up steps")
    window = max(x["ends"][-1] - x["ends"][warmup - 1] for x in ranks)
    steps = len(ranks[0]["ends"]) - warmup
    return {"throughput_seeds_per_s": round(sum(sum(x["seeds"][warmup:]) for x in ranks) / window, 1),
            "step_ms": 1000 * window / steps, "torch_threads": ranks[0]["torch_threads"]}
