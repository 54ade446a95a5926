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
    """Dense global-to-local ids per node type (-1: not in the batch); entry ``num_nodes`` is a
    sink for masked slots, holding 0 for good so that a masked slot never reads as a new node."""

    def __init__(self, num_nodes: Dict[str, int], device: torch.device):
        self.size = dict(num_nodes)
        self.local = {nt: torch.full((n + 1,), -1, dtype=torch.int64, device=device).index_fill_(0, torch.tensor(
            [n], device=device), 0) for nt, n in num_nodes.items()}
        self.first = {nt: torch.full((n + 1,), _FAR, dtype=torch.int64, device=device) for nt, n in num_nodes.items()}

    def begin(self, seeds: Dict[str, torch.Tensor]) -> None:
        for nt, ids in seeds.items():
            self.local[nt][ids] = torch.arange(ids.numel(), device=ids.device)

    def end(self, nodes: Dict[str, torch.Tensor]) -> None:
        """Clear what a batch set (its input nodes hold every node it mapped)."""
        for nt, ids in nodes.items():
            self.local[nt][ids] = -1


def _squeeze(values: torch.Tensor, keep: torch.Tensor, size: int, kept: torch.Tensor) -> torch.Tensor:
    """``values[..., keep]`` of known ``size`` without a wait: a scatter into ``size + 1`` slots,
    the first taking what is not kept. ``kept``: ``cumsum(keep)``."""
    out = torch.empty((*values.shape[:-1], size + 1), dtype=values.dtype, device=values.device)
    out.scatter_(-1, torch.where(keep, kept, 0).expand_as(values), values)
    return out[..., 1:]


class _TypeCandidates:
    """One source type's sampled slots across the relations that start there."""

    def __init__(self, maps: NodeMaps, nt: str, parts: List[Sampled]):
        dev = maps.local[nt].device
        sink = maps.size[nt]
        if len(parts) == 1:
            src, valid = parts[0].src, parts[0].valid
        else:
            src = torch.cat([p.src for p in parts]) if parts else torch.empty(0, dtype=torch.int64, device=dev)
            valid = torch.cat([p.valid if p.valid is not None else torch.ones_like(p.src, dtype=torch.bool)
                               for p in parts]) if parts else None
        slots = src if valid is None else torch.where(valid, src, sink)
        local, first = maps.local[nt], maps.first[nt]
        new = local.index_select(0, slots) < 0  # the sink holds 0
        number = torch.arange(slots.numel(), device=dev)
        # Every slot's number goes in (a node seen before has no new slot to compare with).
        first.scatter_reduce_(0, slots, number, "amin")
        self.is_first = new & (first.index_select(0, slots) == number)
        first.index_fill_(0, slots, _FAR)
        self.kept = torch.cumsum(self.is_first, 0)
        self.slots, self.nt, self.maps = slots, nt, maps

    def count(self) -> torch.Tensor:
        """The number of new nodes, as a 0-d tensor (read in the layer's one wait)."""
        return self.kept[-1] if self.kept.numel() else torch.zeros((), dtype=torch.int64, device=self.kept.device)

    def assign(self, num_dst: int, new: torch.Tensor) -> torch.Tensor:
        """Local ids of every slot once the ``new`` nodes are numbered after the ``num_dst`` destinations."""
        local = self.maps.local[self.nt]
        local[new] = torch.arange(num_dst, num_dst + new.numel(), device=new.device)
        return local.index_select(0, self.slots)


def compact_layer(maps: NodeMaps, dst: Dict[str, torch.Tensor], sampled: Dict[EType, Sampled]
                  ) -> Tuple[Dict[str, torch.Tensor], Dict[EType, Tuple[torch.Tensor, torch.Tensor, torch.Tensor]]]:
    """The layer's source nodes per type (destinations first) and, per relation,
    ``(indptr, local source ids, graph edge ids)`` in CSC order."""
    by_type = {nt: [(et, s) for et, s in sampled.items() if et[0] == nt] for nt in dst}
    cands = {nt: _TypeCandidates(maps, nt, [s for _, s in parts]) for nt, parts in by_type.items()}
    indptrs = {}
    for et, s in sampled.items():
        indptrs[et] = torch.zeros(s.counts.numel() + 1, dtype=torch.int64, device=s.counts.device)
        torch.cumsum(s.counts, 0, out=indptrs[et][1:])
    # The one wait: new nodes per type, then edges per relation.
    sizes = torch.stack([c.count() for c in cands.values()] + [p[-1] for p in indptrs.values()]).tolist()
    new_counts = dict(zip(cands, sizes[:len(cands)]))
    num_edges = dict(zip(sampled, sizes[len(cands):]))

    src_nodes: Dict[str, torch.Tensor] = {}
    local_ids: Dict[str, torch.Tensor] = {}
    for nt, c in cands.items():
        new = _squeeze(c.slots, c.is_first, new_counts[nt], c.kept)
        src_nodes[nt] = torch.cat([dst[nt], new])
        local_ids[nt] = c.assign(dst[nt].numel(), new)

    edges = {}
    offsets = {nt: 0 for nt in dst}
    for et, s in sampled.items():
        nt = et[0]
        lo = offsets[nt]
        offsets[nt] = lo + s.src.numel()
        ids = local_ids[nt][lo:lo + s.src.numel()]
        if s.valid is None:
            edges[et] = (indptrs[et], ids, s.eid)
        else:
            both = _squeeze(torch.stack([ids, s.eid]), s.valid, num_edges[et], torch.cumsum(s.valid, 0))
            edges[et] = (indptrs[et], both[0], both[1])
    return src_nodes, edges
