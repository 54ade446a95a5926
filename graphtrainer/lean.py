"""Keeping a launched rank's private memory to its batch's own data.

Imports: a rank imported about 680 modules on its own after start (``torch._dynamo``,
which the optimizer and DDP import lazily, and what it pulls in): each rank paid the time
and held the objects privately. :func:`import_rank_modules` imports them once before the
ranks exist, so they share those pages.

A rank's private memory (USS, about 190 MB at 1M nodes) was, by mapping (``/proc/<pid>/smaps``,
forked rank, 1M nodes / 10M edges, batch 1024, fanouts 10,10): the main heap about 130 MB,
anonymous mappings about 56 MB (half of them pages inherited from the parent and written
by the rank: Python objects whose reference counts change; half new: thread arenas and
stacks). Most of the heap is not live data: glibc keeps freed blocks of the per-batch
tensors (sampled blocks, gathered features, tens of MB each) for reuse, and once a large
block has been freed its dynamic mmap threshold rises, so later large tensors come from
the heap and their pages stay with the process after ``free``.

:func:`limit_malloc_caches` fixes the mmap threshold (large tensors are mapped and
unmapped, their pages given back at ``free``), trims the heap top sooner and caps the
number of malloc arenas. Set ``GRAPHTRAINER_MALLOC_TUNING=0`` to leave glibc's defaults.
"""
from __future__ import annotations

import ctypes
import importlib
import os
import sys

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8

#: Allocations from this size on are mapped and unmapped (given back at free).
MMAP_THRESHOLD = 1 << 20
#: Free memory at the heap's top beyond this is returned to the system.
TRIM_THRESHOLD = 8 << 20
#: Malloc arenas per rank (glibc's default is 8 per core).
ARENA_MAX = 2


#: Modules every rank imports lazily on its first optimizer step or DDP wrap (torch._dynamo
#: alone brings about 680 modules: sympy, torch.onnx, ...). Imported before ranks start
#: (fork: in the launching process; forkserver: in the server), each rank shares them
#: instead of importing and holding its own copy.
RANK_MODULES = ("torch.distributed", "torch.nn.parallel", "torch.optim", "torch._dynamo")


def import_rank_modules() -> None:
    """Import :data:`RANK_MODULES` in this process (a no-op for those already imported)."""
    for name in RANK_MODULES:
        if name not in sys.modules:
            importlib.import_module(name)


def limit_malloc_caches() -> bool:
    """Apply the settings above in this process (glibc only); True when applied."""
    if os.environ.get("GRAPHTRAINER_MALLOC_TUNING", "1") == "0" or not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    ok = mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)
    ok &= mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    ok &= mallopt(_M_ARENA_MAX, ARENA_MAX)
    libc.malloc_trim(0)  # what the parent left free in the inherited heap
    return bool(ok)
