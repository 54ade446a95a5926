"""Splitting seed ids between ranks, and DGL block-sampling loaders built on that split.

DGL 2.1's ``DataLoader(use_ddp=True)`` gives each rank the same slice every epoch (it
ignores ``ddp_seed``, has no ``set_epoch``). :func:`shard_ids` permutes once per epoch from
``(seed, epoch)``, identically on every rank, then splits strided.
"""
from __future__ import annotations

import math
from typing import Any

import torch

EVEN_MODES = ("pad", "drop", "none")


def shard_ids(
    ids: torch.Tensor,
    rank: int,
    world_size: int,
    *,
    epoch: int = 0,
    seed: int = 0,
    shuffle: bool = True,
    even: str = "pad",
) -> torch.Tensor:
    """This rank's share of ``ids`` for one epoch; ``even`` evens the shares' lengths:

    - ``"pad"``: repeat ids from the permutation's start up to ``ceil(n / world_size)`` each
      (no rank holds an id twice);
    - ``"drop"``: drop the permutation's last ``n % world_size`` ids;
    - ``"none"``: shares differ by at most one, every id on exactly one rank (evaluation).
    """
    if even not in EVEN_MODES:
        raise ValueError(f"even={even!r}: choose one of {EVEN_MODES}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside a world of {world_size}")
    n = ids.numel()
    if shuffle:
        gen = torch.Generator().manual_seed(int(seed) * 1_000_003 + int(epoch))
        order = ids[torch.randperm(n, generator=gen)]
    else:
        order = ids
    if even == "pad" and n > 0:
        total = math.ceil(n / world_size) * world_size
        reps = math.ceil(total / n)
        order = order.repeat(reps)[:total]
    elif even == "drop":
        order = order[: (n // world_size) * world_size]
    return order[rank::world_size]


def check_seed_ids(ids: Any, num_nodes: int, what: str = "seed ids", unit: str = "node") -> torch.Tensor:
    """``ids`` as a 1-D int64 tensor of ids in ``[0, num_nodes)``, or a ``ValueError`` saying
    what is wrong. ``unit`` names what they count ("node", or "edge" for edge ids).

    Boolean masks are turned into ids. DGL aborts the whole process from C++ on an
    out-of-range seed, so this check must run before any sampling.
    """
    if not isinstance(ids, torch.Tensor):
        try:
            ids = torch.as_tensor(ids)
        except Exception as err:  # noqa: BLE001
            raise ValueError(f"{what}: expected a tensor of {unit} ids, got {type(ids).__name__}") from err
    if ids.dtype == torch.bool:
        if ids.numel() != num_nodes:
            raise ValueError(f"{what}: a boolean mask must have one entry per {unit} "
                             f"({num_nodes}), got {ids.numel()}")
        ids = ids.nonzero(as_tuple=True)[0]
    if ids.dtype == torch.uint8 and ids.numel() == num_nodes and bool(((ids == 0) | (ids == 1)).all()):
        raise ValueError(f"{what}: a uint8 0/1 tensor with one entry per {unit} reads as a mask, but uint8 is "
                         "not an id type: pass mask.bool() (a boolean mask), or int64 ids")
    if ids.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"{what}: dtype {ids.dtype} is not an integer id type; pass int64 {unit} "
                         "ids (e.g. mask.nonzero().squeeze(1)) or a boolean mask")
    if ids.dim() != 1:
        raise ValueError(f"{what}: expected a 1-D tensor of {unit} ids, got shape {tuple(ids.shape)}")
    if ids.numel() == 0:
        raise ValueError(f"{what}: the id set is empty")
    lo, hi = int(ids.min()), int(ids.max())
    if lo < 0 or hi >= num_nodes:
        raise ValueError(f"{what}: ids must lie in [0, {num_nodes}) for this graph, found "
                         f"min {lo} and max {hi}")
    return ids.to(torch.int64)
