"""Intra-op threads per rank."""
from __future__ import annotations

import os
import sys

import torch


def set_threads(threads: int) -> None:
    """Intra-op threads for torch and DGL in the calling thread's process."""
    torch.set_num_threads(threads)
    if "dgl" in sys.modules:
        sys.modules["dgl"].utils.set_num_threads(threads)


def available_cores() -> int:
    """Cores this process may run on (its affinity mask, e.g. under taskset or Slurm)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1
