"""Pinning each launched rank to its own cores (``Trainer(pin_cpus=True)``, the default).

Ranks left to float over the machine's cores are moved between them by the scheduler,
and more ranks than cores take turns on whichever core is free, each move leaving its
caches behind. Rank ``r`` with ``t`` threads is pinned to cores ``r*t .. r*t+t-1`` of
the launching process's own affinity mask (so ``taskset`` and Slurm limits stand),
wrapping around when ranks times threads exceed the cores. Measured in
``benchmarks/tutorial_vs_task.py`` (``benchmarks/README.md``).

Processes a pinned rank starts for its sampling (DGL's workers) get the launcher's whole
mask back: they are meant to run beside the rank, not to take turns with it on its cores.
A forked child gets it at the fork; a spawned one (the workers of a spawned rank) when
graphtrainer's loaders start it (:func:`release`), from ``GRAPHTRAINER_LAUNCHER_CPUS``.
A spawned worker of a user's own ``DataLoader`` keeps the rank's cores.
"""
from __future__ import annotations

import os
from typing import FrozenSet, Iterable, Sequence

#: The launching process's mask, as a pinned rank leaves it to the processes it starts.
ENV = "GRAPHTRAINER_LAUNCHER_CPUS"
_registered = False


def rank_cores(local_rank: int, threads: int, cores: Iterable[int]) -> FrozenSet[int]:
    """The cores of ``local_rank`` running ``threads`` threads, out of ``cores``."""
    ordered = sorted(cores)
    threads = max(1, min(threads, len(ordered)))
    return frozenset(ordered[(local_rank * threads + i) % len(ordered)] for i in range(threads))


def pin_rank(local_rank: int, threads: int) -> None:
    """Pin this process (every thread it has) to ``local_rank``'s cores; the processes it
    starts get back the mask it had before (:func:`release`). A no-op where Linux's affinity
    calls are missing or the mask has one core."""
    global _registered
    if not hasattr(os, "sched_setaffinity"):
        return
    mask = frozenset(os.sched_getaffinity(0))
    if len(mask) < 2:
        return
    mine = rank_cores(local_rank, threads, mask)
    for tid in _thread_ids():
        try:
            os.sched_setaffinity(tid, mine)
        except OSError:  # the thread ended meanwhile
            pass
    os.environ[ENV] = ",".join(str(core) for core in sorted(mask))
    if not _registered:
        os.register_at_fork(after_in_child=release)
        _registered = True


def release() -> None:
    """In a process a pinned rank started: the launcher's mask again (nothing elsewhere)."""
    cores = os.environ.get(ENV)
    if not cores or not hasattr(os, "sched_setaffinity"):
        return
    try:
        os.sched_setaffinity(0, {int(core) for core in cores.split(",")})
    except (OSError, ValueError):  # a core went offline: keep the rank's
        pass


def _thread_ids() -> Sequence[int]:
    try:
        return [int(tid) for tid in os.listdir("/proc/self/task")]
    except OSError:
        return [0]
