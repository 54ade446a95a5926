"""Seeding every generator a rank uses: python, numpy, torch, DGL's samplers and GraphBolt's.

DGL's per-thread random streams need care in forked ranks; that workaround lives in
:mod:`graphtrainer._compat.dgl_2_1_streams`.
"""
from __future__ import annotations

import random
import sys

import numpy as np
import torch

from .._compat import graphbolt_available
from .._compat.dgl_2_1_streams import claim_dgl_stream


def seed_all(value: int) -> None:
    """Seed python, numpy, torch, DGL's samplers and GraphBolt's (each keeps its own generator)."""
    random.seed(value)
    np.random.seed(value % 2**32)
    torch.manual_seed(value)
    if "dgl" in sys.modules:
        claim_dgl_stream(value)
        sys.modules["dgl"].seed(value)  # and every OpenMP thread's engine
    if graphbolt_available():
        sys.modules["dgl.graphbolt"].seed(value)


def seed_epoch(seed: int, rank: int, epoch: int) -> None:
    """Seed every generator a rank uses from ``(seed, rank, epoch)``."""
    seed_all((int(seed) * 1_000_003 + 7919 * (rank + 1) + epoch) % 2**31)
