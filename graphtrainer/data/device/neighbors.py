"""One layer of uniform in-edge sampling for a batch of destinations, in torch ops.

DGL's meaning: a destination with in-degree ``d`` and fanout ``k`` takes every in-edge when
``d <= k``, otherwise ``k`` distinct in-edges, each edge equally likely; ``replace=True`` draws
``k`` with replacement (none when ``d == 0``); fanout ``-1`` takes every in-edge.

Without replacement, ``k`` of ``d`` is drawn with Robert Floyd's algorithm for every
destination at once: round ``j`` of ``k`` draws ``t`` uniform in ``[0, d - k + j]`` and keeps
``d - k + j`` instead when ``t`` was drawn already; all rounds in one pass (:func:`floyd`).
``O(k log k)`` per destination whatever its degree (random keys with a segmented sort over the
in-edges cost ``O(d log d)``; both were timed on an H100: ``benchmarks/results/gpu/h100-device-sampling``).
A batch's ops do not grow with its size and barely with ``k``: on a GPU the host launching
them, not the device, bounds the sampler.

Excluded edges (link prediction) are taken out first: a destination draws among its ``d'``
other edges, the ``r``-th found by two binary searches over the sorted excluded positions.

Slots are laid out destination-major (``[n, k]`` flattened for a fanout, segments for
``-1``); a slot whose offset is not below the destination's degree is invalid. Nothing here
waits for the device, except a fanout of ``-1``, whose number of edges must be known to lay
the slots out.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Tuple

import torch

from .graph import Relation


@dataclass
class Sampled:
    """One relation's sampled in-edges: per slot the source, edge id and ``valid`` (None when
    every slot holds an edge); ``counts``: edges per destination."""

    src: torch.Tensor
    eid: torch.Tensor
    valid: Optional[torch.Tensor]
    counts: torch.Tensor


class Excluded:
    """Edges a layer must not sample, as sorted unique CSC positions of one relation."""

    def __init__(self, rel: Relation, eids: torch.Tensor):
        pos = torch.unique(rel.position_of(eids))  # sorted
        dst = torch.searchsorted(rel.indptr, pos, right=True) - 1
        first_of_segment = torch.searchsorted(pos, rel.indptr[dst])
        self.pos = pos
        # For the r-th free edge of a segment starting at s: position s + r + #{excluded with key <= s + r}.
        self.key = pos - (torch.arange(pos.numel(), device=pos.device) - first_of_segment)

    def count(self, start: torch.Tensor, deg: torch.Tensor) -> torch.Tensor:
        """Excluded edges among each destination's in-edges."""
        return torch.searchsorted(self.pos, start + deg) - torch.searchsorted(self.pos, start)

    def select(self, start: torch.Tensor, rank: torch.Tensor) -> torch.Tensor:
        """CSC position of the ``rank``-th edge that is not excluded, in segments starting at ``start``."""
        q = start + rank
        return q + torch.searchsorted(self.key, q, right=True) - torch.searchsorted(self.key, start)


_CONSTANTS: Dict[Tuple[int, str], Tuple[torch.Tensor, torch.Tensor]] = {}


def _constants(k: int, device: torch.device) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(0..k-1, 1..k)`` on ``device``, made once per ``(k, device)``: every kernel a batch does
    not launch counts where the host launches them."""
    key = (k, str(device))
    if key not in _CONSTANTS:
        steps = torch.arange(k, device=device)
        _CONSTANTS[key] = (steps, steps + 1)
    return _CONSTANTS[key]


def floyd(deg: torch.Tensor, k: int, gen: torch.Generator) -> torch.Tensor:
    """``[n, k]`` offsets: ``k`` distinct values in ``[0, deg)`` per row, uniform over the
    ``k``-subsets, for rows with ``deg > k``; ``0..k-1`` for the others (round ``j`` takes ``j``
    there), whose values below ``deg`` are the row's edges (:func:`sample_layer` keeps those).

    Round ``j`` of Floyd's loop keeps its draw ``t`` unless ``t`` was taken, then takes
    ``L_j = deg - k + j``. ``t`` was taken iff it equals an earlier draw (kept, or a repeat of
    a kept value) or it is an ``L_i`` (``i < j``) that round ``i`` took, so "round ``j``
    repeats" is the earlier-draw test OR-ed along the chain ``j -> t - (deg - k) -> ...``
    of smaller rounds: pointer doubling, ``ceil(log2 k)`` steps, not ``k - 1`` rounds of a
    few kernels each (the host launching those bounded the sampler on an H100). Round 0
    never repeats, so a draw below ``deg - k`` may point there.
    """
    steps, upto = _constants(k, deg.device)
    base = (deg.unsqueeze(1) - k).clamp_(min=0)  # L_j = base + j; rows with deg <= k: a k-of-k draw
    # Round j draws t uniform in [0, base + j]; all rounds' draws are made at once.
    u = torch.rand((deg.numel(), k), generator=gen, device=deg.device, dtype=torch.float64)
    draws = (u * (base + upto)).to(torch.int64)
    # A draw repeats an earlier one when it follows an equal value in its row, stably sorted.
    values, order = draws.sort(dim=1, stable=True)
    repeat = torch.zeros_like(draws, dtype=torch.bool)
    repeat.scatter_(1, order[:, 1:], values[:, 1:] == values[:, :-1])
    link = (draws - base).clamp_(min=0)
    rounds = (k - 1).bit_length()
    for r in range(rounds):
        repeat |= repeat.gather(1, link)
        if r < rounds - 1:
            link = link.gather(1, link)
    return torch.where(repeat, base + steps, draws)


def sort_keys(deg: torch.Tensor, k: int, gen: torch.Generator) -> torch.Tensor:
    """:func:`floyd`'s draw by random keys, the ``k`` smallest of a row kept (one sort over the
    batch's in-edges); ``DeviceSampler(method="sort")``."""
    n = deg.numel()
    dev = deg.device
    total = int(deg.sum())
    seg = torch.repeat_interleave(torch.arange(n, device=dev), deg, output_size=total)
    offs = torch.arange(total, device=dev) - (torch.cumsum(deg, 0) - deg)[seg]
    keys = torch.rand(total, generator=gen, device=dev, dtype=torch.float64) + seg.to(torch.float64)
    order = torch.argsort(keys)  # by row, then by key: each row keeps its slice of positions
    out = torch.arange(k, device=dev).repeat(n, 1)
    keep = offs < k
    out[seg[keep], offs[keep]] = offs[order][keep]
    return out


def sample_layer(rel: Relation, seeds: torch.Tensor, fanout: int, replace: bool, gen: torch.Generator,
                 excluded: Optional[Excluded] = None, method: str = "floyd") -> Sampled:
    """In-edges of ``seeds`` (destination ids, unique) drawn from ``rel``."""
    dev = seeds.device
    n = seeds.numel()
    start = rel.indptr.index_select(0, seeds)  # index_select: the fast gather on the CPU
    deg = rel.degrees.index_select(0, seeds)
    if excluded is not None:
        deg = deg - excluded.count(start, deg)
    if fanout == 0 or n == 0 or rel.num_edges == 0:
        empty = torch.empty(0, dtype=torch.int64, device=dev)
        return Sampled(empty, empty, None, torch.zeros(n, dtype=torch.int64, device=dev))
    if fanout == -1:
        counts = deg
        total = int(counts.sum())  # the one wait: slots are laid out by the edges there are
        seg = torch.repeat_interleave(torch.arange(n, device=dev), counts, output_size=total)
        rank = torch.arange(total, device=dev) - (torch.cumsum(counts, 0) - counts)[seg]
        begin = start[seg]
        valid = None
    else:  # [n, fanout] slots; those with rank >= deg hold no edge
        if replace:
            counts = torch.where(deg > 0, fanout, 0)
            u = torch.rand((n, fanout), generator=gen, device=dev, dtype=torch.float64)
            rank = (u * deg.unsqueeze(1)).to(torch.int64)
        else:  # no destination has more than max_degree edges to draw: slots beyond are empty
            fanout = min(fanout, rel.max_degree)
            counts = deg.clamp(max=fanout)
            rank = (floyd if method == "floyd" else sort_keys)(deg, fanout, gen)
        begin = start.unsqueeze(1)
        valid = (rank < deg.unsqueeze(1)).reshape(-1)
    pos = (excluded.select(begin, rank) if excluded is not None else begin + rank).reshape(-1)
    if valid is not None:
        pos = torch.where(valid, pos, 0)
    return Sampled(rel.indices.index_select(0, pos), rel.eids.index_select(0, pos), valid, counts)
