"""Seed ids of heterographs: ``{ntype: ids}`` checked, put in one id space, ordered and split.

A rank's share must have as many seeds as every other rank's (DDP needs as many batches
everywhere), and every id of every type must be seen once per epoch. The ids of all types
are therefore moved into one flat space (``offset[ntype] + id``, offsets by the graph's
node counts in the dict's type order), ordered once per epoch, identically on every rank,
and that order is split exactly like a homogeneous graph's ids.

The order is stratified: each type is permuted with the epoch's generator, and the types
are interleaved in proportion to their sizes. Every stretch of the order (and so every
rank's share, and every batch) then holds each type in about its global proportion, each
type is split evenly between ranks (shares differ by at most a few ids), and a batch of a
rank is the same set of seeds as the matching slice of the order with one rank.
"""
from __future__ import annotations

from typing import Any, Dict, List, Sequence, Tuple

import torch

from .sampling import check_seed_ids

#: ``(ntype, offset, num_nodes)`` of each type of a dict of seeds, in the dict's order.
TypeSpans = List[Tuple[str, int, int]]


def check_typed_ids(ids: Any, graph: Any, what: str = "seed ids") -> Dict[str, torch.Tensor]:
    """``{ntype: int64 ids}`` for a heterograph, or a ``ValueError`` naming the problem:
    not a dict, an empty dict, an unknown node type, or a bad id tensor of one type."""
    ntypes = list(graph.ntypes)
    if not isinstance(ids, dict):
        raise ValueError(f"{what}: this graph has node types {ntypes}; pass a dict {{ntype: ids}}, "
                         f"e.g. {{{ntypes[0]!r}: train_ids}}")
    if not ids:
        raise ValueError(f"{what}: the dict of ids is empty; give ids of at least one of {ntypes}")
    out: Dict[str, torch.Tensor] = {}
    for ntype, value in ids.items():
        if ntype not in ntypes:
            raise ValueError(f"{what}: unknown node type {ntype!r}; this graph has node types {ntypes}")
        out[ntype] = check_seed_ids(value, graph.num_nodes(ntype), f"{what}[{ntype!r}]")
    return out


def type_spans(ids: Dict[str, torch.Tensor], graph: Any) -> TypeSpans:
    """Where each type of ``ids`` lives in the flat id space."""
    spans: TypeSpans = []
    offset = 0
    for ntype in ids:
        n = graph.num_nodes(ntype)
        spans.append((ntype, offset, n))
        offset += n
    return spans


def flatten(ids: Dict[str, torch.Tensor], spans: TypeSpans) -> torch.Tensor:
    """The ids of every type, moved into the flat space, concatenated in type order."""
    return torch.cat([ids[ntype] + offset for ntype, offset, _ in spans])


def split_flat(flat: torch.Tensor, spans: Sequence[Tuple[str, int, int]]) -> Dict[str, torch.Tensor]:
    """``{ntype: ids}`` of flat ids, keeping their order within each type (every type of
    ``spans`` is a key, with an empty tensor when the batch has none of it)."""
    out: Dict[str, torch.Tensor] = {}
    for ntype, offset, n in spans:
        mine = (flat >= offset) & (flat < offset + n)
        out[ntype] = flat[mine] - offset
    return out


def typed_order(ids: Dict[str, torch.Tensor], spans: TypeSpans, seed: int, epoch: int) -> torch.Tensor:
    """This epoch's order of all flat ids: each type permuted from ``(seed, epoch, type)``,
    types interleaved in proportion to their counts. The same on every rank."""
    flats, keys = [], []
    for k, (ntype, offset, _) in enumerate(spans):
        n = ids[ntype].numel()
        gen = torch.Generator().manual_seed((int(seed) * 1_000_003 + int(epoch)) * 131 + k)
        flats.append(ids[ntype][torch.randperm(n, generator=gen)] + offset)
        # Position i of a type of n ids sits at (i + 0.5) / n of the order.
        keys.append((torch.arange(n, dtype=torch.float64) + 0.5) / n)
    order = torch.argsort(torch.cat(keys), stable=True)
    return torch.cat(flats)[order]


def num_seeds(output_nodes: Any) -> int:
    """Seeds of a node batch: a tensor's length, or the sum over a dict's types."""
    if isinstance(output_nodes, dict):
        return int(sum(v.shape[0] for v in output_nodes.values()))
    return int(output_nodes.shape[0])
