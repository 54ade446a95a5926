"""DGL 2.1's per-thread random streams, kept fixed in forked ranks (a workaround for how DGL
numbers them; imported by :mod:`graphtrainer` at start-up, which installs the claim).

DGL keeps one pcg32 engine per thread and, when seeded, gives each thread its own
*stream*: the order in which that thread first asked DGL for its thread number, counted
over the whole process. A forked rank inherits the parent's numbering, so a driver that
called ``dgl.seed()`` with several OpenMP threads (they race for number 0) or ran a
sampler before ``fit`` would change what every forked rank samples, whatever seed it is
given. Two measures keep the numbering fixed: the thread that seeds claims its number
alone before any OpenMP team does (``graphtrainer.loop.seeding.seed_all``), and the main
thread claims number 0 as soon as both graphtrainer and DGL are imported
(:func:`claim_dgl_stream`). What is left (DGL seeded from several threads before graphtrainer was
imported) is detected in
each rank by :func:`dgl_stream` and reported.

The other threads of an OpenMP team get their numbers the same way, first come first served,
so with three threads or more which thread holds which stream changes from run to run. Under
``Trainer(deterministic=True)``, :func:`~graphtrainer._compat.dgl_2_1_threads.seed_team` numbers
them in team order, and every ``dgl.seed`` goes through it.
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
import threading
import warnings
from typing import Any, Optional

from .dgl_2_1_fused import install_fused_int32_fix
from .dgl_2_1_threads import install_thread_fixes

#: The DGL stream every rank's sampling thread should have (a fresh process's main thread).
EXPECTED_DGL_STREAM = 0
_M64 = (1 << 64) - 1
_PCG_MULT = 6364136223846793005


def claim_dgl_stream(value: Optional[int] = None) -> None:
    """Give the calling thread its DGL stream number before any OpenMP worker can take it.

    Seeding with one OpenMP thread runs in the caller alone; the caller's thread count
    is restored afterwards. ``value`` defaults to a random seed, so an unseeded program
    stays unseeded.
    """
    dgl = sys.modules["dgl"]
    threads = dgl.utils.get_num_threads()
    dgl.utils.set_num_threads(1)
    try:
        dgl.seed(int.from_bytes(os.urandom(4), "little") >> 1 if value is None else value)
    finally:
        dgl.utils.set_num_threads(threads)


def dgl_stream() -> Optional[int]:
    """The DGL stream of the calling thread (None if it cannot be told). Reseeds DGL."""
    dgl = sys.modules.get("dgl")
    if dgl is None:
        return None
    claim_dgl_stream(7)
    # With a population of 2**32 DGL's uniform choice returns the engine's raw outputs.
    drawn = dgl.random.choice(1 << 32, 3).tolist()
    return next((s for s in range(4096) if _pcg32(7, s, 3) == drawn), None)


#: Set in a rank that runs in a fresh thread (launcher="fork" with several threads per rank):
#: DGL numbers that thread's stream after every thread the launching process gave one.
_in_fresh_thread = False


def note_fresh_rank_thread() -> None:
    """Called in a forked rank that runs in a fresh thread, before it trains."""
    global _in_fresh_thread
    _in_fresh_thread = True


def warn_if_dgl_stream_moved(rank: int, deterministic: bool = False) -> None:
    """Warn when this rank's DGL stream is not a fresh process's: its sampling would then
    differ from a run started from a clean driver with the same seed. ``deterministic``: the
    run's DGL sampling should repeat (a rank in a fresh thread is only warned about then)."""
    if _in_fresh_thread and not deterministic:
        return  # several threads, not deterministic: the loader's own warning says it does not repeat
    stream = dgl_stream()
    if stream is None or stream == EXPECTED_DGL_STREAM:
        return
    if _in_fresh_thread:
        if rank != 0:
            return  # one warning for the run: every rank's thread is numbered alike
        # Not the driver's import order: the stream a fresh thread gets is whatever number is next.
        warnings.warn(
            f"rank {rank}: launcher='fork' with several threads per rank runs each rank in a fresh thread (a "
            "forked main thread cannot use the launching process's OpenMP threads), and DGL numbers that "
            f"thread's random stream (here {stream}) and its OpenMP threads' after every thread the launching "
            "process gave one before fit. Sampling stays seeded and deterministic=True still repeats a rerun "
            "of the same script, but batches depend on what the script did before fit (a loader iterated, "
            "a fit in this process) and differ from launcher='spawn'. For batches that depend on the seed "
            "alone: launcher='forkserver' or 'spawn', threads_per_proc=1, or sampling='device'.",
            RuntimeWarning, stacklevel=2)
        return
    warnings.warn(
        f"rank {rank}: DGL's random stream in this rank is {stream}, not {EXPECTED_DGL_STREAM}, because "
        "the launching process seeded or used DGL's generator from several threads before graphtrainer "
        "was imported (e.g. dgl.seed() with OpenMP threads). Sampling stays seeded but will not match a "
        "run started from a clean process. Import graphtrainer before that call, leave seeding to "
        "Trainer(seed=...), or use launcher='spawn'.", RuntimeWarning, stacklevel=2)


def _pcg32(seed: int, stream: int, n: int) -> list:
    """First ``n`` outputs of pcg32 (XSH-RR 64/32) seeded like DGL's engine."""
    inc = ((stream << 1) | 1) & _M64
    state = ((seed + inc) * _PCG_MULT + inc) & _M64
    out = []
    for _ in range(n):
        old, state = state, (state * _PCG_MULT + inc) & _M64
        x = (((old >> 18) ^ old) >> 27) & 0xFFFFFFFF
        rot = old >> 59
        out.append(((x >> rot) | (x << ((-rot) & 31))) & 0xFFFFFFFF)
    return out


class _ClaimAfterDGLImport(importlib.abc.MetaPathFinder):
    """Claims the main thread's DGL stream right after ``import dgl`` finishes."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != "dgl":
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_claim(module: Any) -> None:
            exec_module(module)
            _after_dgl_import()

        spec.loader.exec_module = exec_then_claim  # type: ignore[method-assign]
        return spec


def _after_dgl_import() -> None:
    """DGL's thread-timing fixes (switched off until a deterministic run), the fused sampler's
    int32 fix, then the main thread's claim."""
    install_thread_fixes()
    install_fused_int32_fix()
    _claim_in_main_thread()


def _claim_in_main_thread() -> None:
    if threading.current_thread() is threading.main_thread():
        try:
            claim_dgl_stream()
        except Exception:  # noqa: BLE001 - a DGL without these calls: nothing to protect
            pass


def install_dgl_stream_claim() -> None:
    """Claim now if DGL is loaded, else right after it is (called once, at import); DGL's
    thread-timing fixes (off until switched on) go in at the same time."""
    if "dgl" in sys.modules:
        _after_dgl_import()
    elif not any(isinstance(f, _ClaimAfterDGLImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _ClaimAfterDGLImport())
