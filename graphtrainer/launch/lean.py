"""Keeping a launched rank's private memory to its batch's own data.

What a forked rank held privately (USS, ``/proc/<pid>/smaps`` by mapping; 1M nodes / 10M
edges, batch 1024, fanouts 10,10, 2 ranks, at step 3): 188 MB, of which the main heap
130 MB and anonymous mappings 56 MB (28 MB in address ranges inherited from the parent:
pages of its Python objects and arenas the rank wrote to; 28 MB new: arenas, stacks).
Two causes, two cuts:

- **Imports.** After starting, a rank imported about 680 modules of its own
  (``torch._dynamo``, which the optimizer and DDP import lazily, with sympy, torch.onnx,
  ...): time, and objects held privately by every rank. :func:`import_rank_modules`
  imports them once before the ranks exist (in the launching process for fork, in the
  server for forkserver), so they share those pages. Alone: 188 -> 128 MB.
- **Allocator caches.** glibc keeps freed blocks of the per-batch tensors (sampled
  blocks, gathered features, tens of MB each) for reuse, and once a large block has been
  freed its dynamic mmap threshold rises, so later large tensors come from the heap and
  their pages stay with the process. :func:`limit_malloc_caches` fixes the mmap
  threshold (large tensors are mapped and unmapped, their pages given back at ``free``),
  trims the heap top sooner and caps malloc arenas. Alone: 188 -> 154 MB.

Both: 89 MB per forked rank, 78 MB per rank forked from the fork server. What is left is
the batch itself (blocks, features, activations: the anonymous mappings the rank makes),
the allocator's small-block heap and the parent's pages the rank writes to (reference
counts of the objects it uses; ``gc.freeze()`` keeps the collector off them). Set
``GRAPHTRAINER_MALLOC_TUNING=0`` to leave glibc's defaults.
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
