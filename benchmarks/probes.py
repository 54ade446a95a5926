"""What every rank reports during a benchmark run, through files in a shared directory: a
per-step probe (graphtrainer callback or direct calls), the launching process's memory
watcher, and the collection of the ranks' reports."""
from __future__ import annotations

import json
import os
import threading
import time
from typing import Any, Dict, Optional

import harness  # noqa: F401  (graphtrainer from this checkout, DGL on PyTorch)
from graphtrainer.callbacks import Callback
from memory import tree_memory


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
