"""Keeping a launched rank's private memory small without slowing its batches down.

A forked rank held 188 MB privately (USS, ``/proc/<pid>/smaps``; 1M nodes / 10M edges, batch
1024, fanouts 10,10, 2 ranks, step 3): 130 MB main heap, 56 MB anonymous mappings. Always cut:

- **Imports.** A rank imported about 680 modules of its own (``torch._dynamo``, which the
  optimizer and DDP import lazily, with sympy, torch.onnx, ...). :func:`import_rank_modules`
  imports them before the ranks exist (launching process for fork, server for forkserver),
  so ranks share those pages: 188 -> 128 MB. The launcher also ``gc.freeze()``-s the
  parent's objects so a rank's collector passes do not copy their pages.
- **The heap the parent left**, trimmed once at a launched rank's start (``malloc_trim``).

Not by default: a trim after every training epoch. It gave back nothing at the peak (run
PSS 1,300 vs 1,295 MB at 2 fork ranks, 1,441 vs 1,447 MB at 4; 1M nodes, the retired
``tutorial_vs_task.py --glibc-arm``: benchmarks/results/HISTORY.md) and makes every epoch refill
the heap by page faults (epoch time without it 0.96x at 2 ranks, 0.90x at 4, within run-to-run spread
on a second run).

``Trainer(allocator="lean")`` (:data:`ALLOCATORS`) trades throughput for memory: glibc's
mmap threshold fixed at 1 MB, so each batch faults its features, blocks and activations in
afresh as zeroed pages, plus the per-epoch trim. It roughly halves a rank's USS (DistDGL
trainers 61-77 vs 116-125 MB); at 1M nodes 2 fork ranks took 1.37x the epoch time (2.17 vs
1.58 s) and DistDGL and fork trainers' seeds/s fell to 0.60x (``benchmarks/README.md``).
``GRAPHTRAINER_MALLOC_TUNING=0`` / ``=1`` is read as ``"glibc"`` / ``"lean"``, with a warning.
"""
from __future__ import annotations

import ctypes
import importlib
import os
import sys
import warnings
from typing import Any, Optional

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8

#: ``allocator="lean"``: allocations from this size on are mapped and unmapped (given back at free).
MMAP_THRESHOLD = 1 << 20
#: ``allocator="lean"``: free memory at the heap's top beyond this is returned to the system.
TRIM_THRESHOLD = 8 << 20
#: ``allocator="lean"``: malloc arenas per rank (glibc's default is 8 per core).
ARENA_MAX = 2

#: ``Trainer(allocator=...)`` values. "default": glibc's thresholds, the heap trimmed once when a
#: launched rank starts. "lean": also 1 MB mmap and 8 MB trim thresholds, 2 arenas and a trim per
#: training epoch (about half the private memory for a quarter to two fifths of the throughput).
#: "glibc": the allocator left alone (no trims).
ALLOCATORS = ("default", "lean", "glibc")

_ENV = "GRAPHTRAINER_MALLOC_TUNING"
_ENV_MEANING = {"0": "glibc", "1": "lean"}

#: Modules every rank imports lazily on its first optimizer step or DDP wrap, imported before
#: ranks start so that they share them (see the module docstring).
RANK_MODULES = ("torch.distributed", "torch.nn.parallel", "torch.optim", "torch._dynamo")


def import_rank_modules() -> None:
    """Import :data:`RANK_MODULES` in this process (a no-op for those already imported)."""
    for name in RANK_MODULES:
        if name not in sys.modules:
            importlib.import_module(name)


def allocator_option(value: str) -> str:
    """Check ``Trainer(allocator=...)``; a set ``GRAPHTRAINER_MALLOC_TUNING`` (older) overrides it."""
    env = os.environ.get(_ENV)
    if env is not None:
        if env not in _ENV_MEANING:
            raise ValueError(f"{_ENV}={env!r}: use 0 (allocator='glibc') or 1 (allocator='lean'), or unset it "
                             "and pass Trainer(allocator=...)")
        warnings.warn(f"{_ENV}={env} is read as Trainer(allocator={_ENV_MEANING[env]!r}); pass that option "
                      f"instead (choices {ALLOCATORS})", stacklevel=3)
        return _ENV_MEANING[env]
    if value not in ALLOCATORS:
        raise ValueError(f"allocator={value!r}: choose one of {ALLOCATORS} ('default' costs no throughput; "
                         "'lean' halves a rank's private memory for a quarter or more of its speed)")
    return value


def _libc() -> Optional[Any]:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt, libc.malloc_trim  # noqa: B018 - glibc only (musl has neither)
        return libc
    except (OSError, AttributeError):
        return None


def apply_allocator(mode: str, launched: bool) -> bool:
    """Set this rank's allocator for ``mode``; ``launched``: trim the inherited free heap. True
    when glibc settings were changed (``"lean"`` on glibc)."""
    libc = _libc()
    if libc is None or mode == "glibc":
        return False
    changed = False
    if mode == "lean":
        ok = libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)
        ok &= libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
        ok &= libc.mallopt(_M_ARENA_MAX, ARENA_MAX)
        changed = bool(ok)
    if launched:
        libc.malloc_trim(0)  # what the parent left free in the inherited heap
    return changed


def trim_after_epoch(mode: str) -> bool:
    """At a training epoch's end, give the heap's free pages back: ``"lean"`` only (see the
    module docstring). True when trimmed."""
    libc = _libc()
    if libc is None or mode != "lean":
        return False
    libc.malloc_trim(0)
    return True


def limit_malloc_caches() -> bool:
    """``allocator="lean"`` in this process (kept for callers of the earlier API); True when applied."""
    if os.environ.get(_ENV, "1") == "0":
        return False
    return apply_allocator("lean", launched=True)
