"""The base of graphtrainer's loaders: a share of the ids per rank and epoch, cut into batches."""
from __future__ import annotations

import math
from typing import Any, Dict, Iterator, List, Optional, Tuple

import torch

from .. import comm
from .hetero import typed_share
from .sharding import EVEN_MODES, shard_ids


class ShardedLoader:
    """Base of graphtrainer's loaders: one global permutation of ``ids`` per epoch, an
    even split between ranks, and an exact split for evaluation.

    ``ids``: node or edge ids, positions in a list of pairs, or graph indices; subclasses
    batch a share in :meth:`__iter__`. Rank and world size are read when the share is
    computed, so a loader built in the launching process can travel to the ranks.

    The trainer relies on: ``len`` being exact (to skip ``Join`` when ranks have as many
    batches), :meth:`for_evaluation` seeing every id once across ranks, and rank ``r`` then
    holding positions ``r, r + world, ...`` in order (how predictions are put back in order).
    """

    #: On a heterograph: ``{type: ids}`` and the types' spans in the flat id space of
    #: ``ids`` (see :mod:`graphtrainer.data.hetero`); None otherwise.
    typed: Optional[Dict[Any, torch.Tensor]] = None
    spans: Optional[list] = None

    def __init__(self, ids: torch.Tensor, batch_size: int, *, shuffle: bool = True,
                 drop_last: bool = False, even: Optional[str] = None, seed: int = 0):
        if int(batch_size) <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        self.ids = ids
        self.batch_size = int(batch_size)
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.even = even if even is not None else ("drop" if drop_last else "pad")
        if self.even not in EVEN_MODES:
            raise ValueError(f"even={self.even!r}: choose one of {EVEN_MODES}")
        self.seed = seed
        self.epoch = 0
        self._share: Optional[tuple] = None  # (key, ids, share) of the last local_ids()

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch whose permutation the next iteration uses."""
        self.epoch = int(epoch)

    def for_evaluation(self) -> "ShardedLoader":
        """Each id exactly once across ranks, in the given order, nothing dropped."""
        self.shuffle, self.drop_last, self.even = False, False, "none"
        return self

    def local_ids(self) -> torch.Tensor:
        """The ids this rank iterates this epoch, in order (computed once per epoch)."""
        rank, world = self.split_place()
        key = (rank, world, self.epoch, self.seed, self.shuffle, self.even)
        if self._share is not None and self._share[0] == key and self._share[1] is self.ids:
            return self._share[2]
        if self.typed is not None and self.shuffle and self.even != "none":
            # several types: each permuted and split evenly
            share = typed_share(self.typed, self.spans, self.seed, self.epoch, rank, world, self.even)
            self._share = (key, self.ids, share)
            return share
        # A copy: the strided view would keep the whole epoch's permutation alive in every rank.
        share = shard_ids(self.ids, rank, world, epoch=self.epoch, seed=self.seed,
                          shuffle=self.shuffle, even=self.even).clone()
        if share.numel() == 0 and self.even == "drop":
            raise ValueError(
                f"{self.ids.numel()} seed ids cannot be split between {world} ranks with "
                "drop_last=True: every rank would get none. Use drop_last=False (pads with "
                "repeats) or fewer ranks."
            )
        self._share = (key, self.ids, share)
        return share

    def split_place(self) -> Tuple[int, int]:
        """``(place, count)``: this rank's share among who splits the ids (default: the job)."""
        return comm.get_rank(), comm.get_world_size()

    def local_batches(self) -> List[torch.Tensor]:
        """This rank's share in batches of ``batch_size`` (the last shorter unless ``drop_last``)."""
        share = self.local_ids()
        batches = list(torch.split(share, self.batch_size))
        if self.drop_last and batches and batches[-1].numel() < self.batch_size:
            batches.pop()
        return batches

    def __len__(self) -> int:
        n = self.local_ids().numel()
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)

    def check_world(self, world_size: int) -> None:
        """Raise ``ValueError`` when the ids cannot be split between ``world_size`` ranks."""

    def check_training_batches(self) -> None:
        """Raise ``ValueError`` when this rank's share makes no training batch. Training shares
        are equal on every rank (``even``), so every rank raises the same, before any batch."""
        if self.even == "none" or len(self) > 0:
            return
        rank, world = self.split_place()
        share = self.local_ids().numel()
        raise ValueError(
            f"the training loader has no batch: {len(self.ids)} ids split between {world} ranks give each "
            f"{share}, fewer than batch_size={self.batch_size}, and drop_last={self.drop_last} drops the "
            f"short batch. Use drop_last=False, a batch_size of at most {share}, or fewer ranks")

    def __iter__(self) -> Iterator[Any]:
        raise NotImplementedError
