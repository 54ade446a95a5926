"""One layer of weighted (``NeighborSampler(prob=...)``) or masked (``mask=...``) in-edge sampling.

DGL's meaning (2.1, checked against its CPU sampler): an edge of weight 0 (``False`` in a mask) is
never drawn. A destination with ``p`` positive in-edges and fanout ``k`` takes ``min(k, p)``
distinct ones by successive sampling, each draw proportional to weight among the edges not taken
yet; ``replace=True`` draws ``k`` independently, proportional to weight (none when ``p == 0``);
fanout ``-1`` takes the ``p`` positive edges. A relation without the key draws uniformly
(:mod:`.neighbors`). Weights are int8, uint8, bool, float32 or float64, finite and non-negative,
one per edge (:func:`check_weights`).

Without replacement each edge gets the key ``E / w`` (``E`` exponential): the ``k`` smallest per
destination are a successive sample (Efraimidis and Spirakis' ``u^(1/w)``, largest first, in
another form). With replacement each draw inverts the destination's cumulative weights, normalised
by its largest weight so that one batch's sum stays precise. Both lay out every in-edge of the
batch's destinations, so a layer waits once more per relation, to learn their number (as
``method="sort"`` and fanout ``-1`` do). Excluded edges weigh 0: taken out before the draw, as in
the uniform draw.
"""
from __future__ import annotations

from typing import Any, Optional

import torch

from .graph import Relation
from .neighbors import Excluded, Sampled

#: The weight types DGL's sampler reads (it refuses the others).
WEIGHT_DTYPES = (torch.float32, torch.float64, torch.bool, torch.uint8, torch.int8)
_LARGEST = torch.finfo(torch.float64).max


def check_weights(graph: Any, key: str, name: str) -> None:
    """A ``ValueError`` naming the problem unless some relation of ``graph`` has edge data ``key``
    with one finite, non-negative value of a type DGL reads per edge."""
    found = [et for et in graph.canonical_etypes if key in graph.edges[et].data]
    if not found:
        have = sorted({k for et in graph.canonical_etypes for k in graph.edges[et].data.keys()})
        raise ValueError(f"{name}(prob/mask={key!r}): no relation of the graph has edge data {key!r} (it has "
                         f"{have}); set g.edata[{key!r}] (a weight or a bool mask per edge) or fix the name")
    for et in found:
        w = graph.edges[et].data[key]
        where = f"the edge data {key!r}" + ("" if len(graph.canonical_etypes) == 1 else f" of {et}")
        if w.dtype not in WEIGHT_DTYPES:
            raise ValueError(f"{name}(prob/mask={key!r}): {where} is {w.dtype}; DGL's sampler reads float32, "
                             "float64, bool, uint8 or int8 weights: convert it (e.g. .float())")
        if w.numel() != graph.num_edges(et):  # (n,) or (n, 1), as DGL reads it
            raise ValueError(f"{name}(prob/mask={key!r}): {where} has shape {tuple(w.shape)}; give one value "
                             "per edge")
        if w.is_floating_point() and not bool(torch.isfinite(w).all()):
            raise ValueError(f"{name}(prob/mask={key!r}): {where} holds NaN or infinite weights (DGL's sampler "
                             "stops the process on them); give finite, non-negative weights")
        if w.dtype != torch.bool and bool((w < 0).any()):
            raise ValueError(f"{name}(prob/mask={key!r}): {where} holds negative weights (DGL leaves the draw "
                             "undefined); give non-negative weights, 0 for an edge never to draw")


def _excluded_at(excluded: Excluded, pos: torch.Tensor) -> torch.Tensor:
    """Whether each CSC position is excluded."""
    at = torch.searchsorted(excluded.pos, pos).clamp_(max=excluded.pos.numel() - 1)
    return excluded.pos.index_select(0, at) == pos


def sample_weighted(rel: Relation, seeds: torch.Tensor, fanout: int, replace: bool, gen: torch.Generator,
                    weights: torch.Tensor, excluded: Optional[Excluded] = None) -> Sampled:
    """In-edges of ``seeds`` (destination ids, unique) drawn from ``rel`` by ``weights`` (one per
    edge, in CSC order), in :func:`~.neighbors.sample_layer`'s layout."""
    dev = seeds.device
    n = seeds.numel()
    if fanout == 0 or n == 0 or rel.num_edges == 0:
        empty = torch.empty(0, dtype=torch.int64, device=dev)
        return Sampled(empty, empty, None, torch.zeros(n, dtype=torch.int64, device=dev))
    start = rel.indptr.index_select(0, seeds)
    deg = rel.degrees.index_select(0, seeds)
    total = int(deg.sum())  # the wait: every in-edge of the batch's destinations is laid out
    if total == 0:
        empty = torch.empty(0, dtype=torch.int64, device=dev)
        return Sampled(empty, empty, None, torch.zeros(n, dtype=torch.int64, device=dev))
    seg = torch.repeat_interleave(torch.arange(n, device=dev), deg, output_size=total)
    first = torch.cumsum(deg, 0) - deg  # where each destination's edges begin in that layout
    offs = torch.arange(total, device=dev) - first.index_select(0, seg)
    pos = start.index_select(0, seg) + offs
    w = weights.index_select(0, pos).to(torch.float64)
    if excluded is not None:
        w = torch.where(_excluded_at(excluded, pos), 0.0, w)
    positive = w > 0
    nnz = torch.zeros(n, dtype=torch.int64, device=dev).index_add_(0, seg, positive.to(torch.int64))
    if fanout == -1:  # every positive edge, in CSC order
        return Sampled(rel.indices.index_select(0, pos), rel.eids.index_select(0, pos), positive, nnz)
    if replace:
        counts = torch.where(nnz > 0, fanout, 0)
        picked = _with_replacement(w, positive, seg, first, deg, n, fanout, gen)
    else:
        fanout = min(fanout, rel.max_degree)  # no destination has more edges to draw
        counts = nnz.clamp(max=fanout)
        # Zero weights sort last and are never kept (a destination keeps at most its positive edges).
        e = torch.empty(total, dtype=torch.float64, device=dev).exponential_(generator=gen)
        key = torch.where(positive, (e / w).clamp_(max=_LARGEST), torch.inf)
        order = torch.argsort(key)
        order = order.index_select(0, torch.argsort(seg.index_select(0, order), stable=True))
        # Sorted by destination then key: entry j is destination seg[j]'s offs[j]-th smallest key.
        slot = torch.where(offs < fanout, seg * fanout + offs, n * fanout)  # the rest into a sink slot
        picked = torch.zeros(n * fanout + 1, dtype=torch.int64, device=dev)
        picked.scatter_(0, slot, order)
        picked = picked[:-1]
    valid = (torch.arange(fanout, device=dev) < counts.unsqueeze(1)).reshape(-1)
    at = pos.index_select(0, torch.where(valid, picked.reshape(-1), 0))
    return Sampled(rel.indices.index_select(0, at), rel.eids.index_select(0, at), valid, counts)


def _with_replacement(w: torch.Tensor, positive: torch.Tensor, seg: torch.Tensor, first: torch.Tensor,
                      deg: torch.Tensor, n: int, k: int, gen: torch.Generator) -> torch.Tensor:
    """``[n, k]`` places in the layout, each drawn proportional to ``w`` within its destination."""
    dev = w.device
    peak = torch.zeros(n, dtype=torch.float64, device=dev).scatter_reduce_(0, seg, w, "amax")
    norm = torch.where(positive, w / peak.index_select(0, seg).clamp_(min=torch.finfo(torch.float64).tiny), 0.0)
    upto = _cumsum(norm)
    before = torch.cat([upto.new_zeros(1), upto[:-1]])  # exact neighbours' values: no rounding between them
    last = upto.numel() - 1
    lo = before.index_select(0, first.clamp(max=last))
    hi = upto.index_select(0, (first + deg - 1).clamp(min=0, max=last))
    u = torch.rand((n, k), generator=gen, device=dev, dtype=torch.float64)
    t = lo.unsqueeze(1) + u * (hi - lo).unsqueeze(1)
    # Below hi, so the first cumulative weight above t is the destination's, and its edge weighs > 0.
    t = torch.minimum(t, torch.nextafter(hi, hi.new_full((), -torch.inf)).unsqueeze(1))
    return torch.searchsorted(upto, t, right=True).clamp_(max=last)


def _cumsum(x: torch.Tensor) -> torch.Tensor:
    """``cumsum`` of float ``x``. torch 2.2 (the pinned stack) has no deterministic float cumsum on
    CUDA and raises under ``use_deterministic_algorithms(True)`` (``Trainer(deterministic=True)``);
    newer torch has one. Where it raises, the sum is taken on the host, in order (a copy each way)."""
    try:
        return torch.cumsum(x, 0)
    except RuntimeError as err:
        if not x.is_cuda or "deterministic" not in str(err):
            raise
        return torch.cumsum(x.cpu(), 0).to(x.device)
