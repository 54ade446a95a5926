"""Sampled edges into DGL's block layout, on the device.

A layer's source nodes of each type are its destination nodes first, then the new nodes in
order of first appearance, as in DGL. Global ids map to local ones through a dense array per
type (:class:`NodeMaps`, ``num_nodes + 1`` int64, reset after each batch): ``O(edges)``, no
sort; first occurrences come from one ``scatter_reduce(amin)`` over slot numbers. Output
sizes come back in one transfer per layer, so a layer waits for the device once.
"""
from __future__ import annotations

from typing import Dict, List, Tuple

import torch

from .graph import EType
from .neighbors import Sampled

_FAR = torch.iinfo(torch.int64).max


class NodeMaps:
    """Dense global-to-local ids per node type; entry ``num_nodes`` is a sink for masked slots."""

    def __init__(self, num_nodes: Dict[str, int], device: torch.device):
        self.size = dict(num_nodes)
        self.local = {nt: torch.full((n + 1,), -1, dtype=torch.int64, device=device) for nt, n in num_nodes.items()}
        self.first = {nt: torch.full((n + 1,), _FAR, dtype=torch.int64, device=device) for nt, n in num_nodes.items()}

    def begin(self, seeds: Dict[str, torch.Tensor]) -> None:
        for nt, ids in seeds.items():
            self.local[nt][ids] = torch.arange(ids.numel(), device=ids.device)

    def end(self, nodes: Dict[str, torch.Tensor]) -> None:
        """Clear what a batch set (its input nodes hold every node it mapped)."""
        for nt, ids in nodes.items():
            self.local[nt][ids] = -1
            self.local[nt][-1] = -1


def _squeeze(values: torch.Tensor, keep: torch.Tensor, size: int, target: torch.Tensor) -> torch.Tensor:
    """``values[keep]`` of known ``size`` without a wait: a scatter into ``size + 1`` slots,
    the last taking what is not kept. ``target``: ``cumsum(keep) - 1``."""
    out = torch.empty(size + 1, dtype=values.dtype, device=values.device)
    out.scatter_(0, torch.where(keep, target, size), values)
    return out[:size]


class _TypeCandidates:
    """One source type's sampled slots across the relations that start there."""

    def __init__(self, maps: NodeMaps, nt: str, parts: List[Sampled]):
        dev = maps.local[nt].device
        sink = maps.size[nt]
        src = torch.cat([p.src for p in parts]) if parts else torch.empty(0, dtype=torch.int64, device=dev)
        valid = torch.cat([p.valid if p.valid is not None else torch.ones_like(p.src, dtype=torch.bool)
                           for p in parts]) if parts else torch.empty(0, dtype=torch.bool, device=dev)
        slots = torch.where(valid, src, sink)
        local, first = maps.local[nt], maps.first[nt]
        new = valid & (local[slots] < 0)
        number = torch.arange(slots.numel(), device=dev)
        first.scatter_reduce_(0, torch.where(new, slots, sink), number, "amin")
        self.is_first = new & (first[slots] == number)
        first.index_fill_(0, slots, _FAR)
        self.order = torch.cumsum(self.is_first, 0) - 1
        self.slots, self.nt, self.maps = slots, nt, maps

    def assign(self, num_dst: int) -> torch.Tensor:
        """Local ids of every slot once the new nodes are numbered after the ``num_dst`` destinations."""
        local = self.maps.local[self.nt]
        local.index_put_((torch.where(self.is_first, self.slots, self.maps.size[self.nt]),), num_dst + self.order)
        local[-1] = -1
        return local[self.slots]


def compact_layer(maps: NodeMaps, dst: Dict[str, torch.Tensor], sampled: Dict[EType, Sampled]
                  ) -> Tuple[Dict[str, torch.Tensor], Dict[EType, Tuple[torch.Tensor, torch.Tensor, torch.Tensor]]]:
    """The layer's source nodes per type (destinations first) and, per relation,
    ``(indptr, local source ids, graph edge ids)`` in CSC order."""
    by_type = {nt: [(et, s) for et, s in sampled.items() if et[0] == nt] for nt in dst}
    cands = {nt: _TypeCandidates(maps, nt, [s for _, s in parts]) for nt, parts in by_type.items()}
    edge_counts = [s.counts.sum() if s.valid is not None else torch.tensor(s.src.numel(), device=s.src.device)
                   for s in sampled.values()]
    sizes = torch.stack([c.is_first.sum() for c in cands.values()] + edge_counts).tolist()  # the one wait
    new_counts = dict(zip(cands, sizes[:len(cands)]))
    num_edges = dict(zip(sampled, sizes[len(cands):]))

    src_nodes: Dict[str, torch.Tensor] = {}
    local_ids: Dict[str, torch.Tensor] = {}
    for nt, c in cands.items():
        new = _squeeze(c.slots, c.is_first, new_counts[nt], c.order)
        src_nodes[nt] = torch.cat([dst[nt], new])
        local_ids[nt] = c.assign(dst[nt].numel())

    edges = {}
    offsets = {nt: 0 for nt in dst}
    for et, s in sampled.items():
        nt = et[0]
        lo = offsets[nt]
        offsets[nt] = lo + s.src.numel()
        ids = local_ids[nt][lo:lo + s.src.numel()]
        indptr = torch.zeros(s.counts.numel() + 1, dtype=torch.int64, device=ids.device)
        torch.cumsum(s.counts, 0, out=indptr[1:])
        if s.valid is None:
            edges[et] = (indptr, ids, s.eid)
        else:
            target = torch.cumsum(s.valid, 0) - 1
            m = num_edges[et]
            edges[et] = (indptr, _squeeze(ids, s.valid, m, target), _squeeze(s.eid, s.valid, m, target))
    return src_nodes, edges
