"""Seed ids of heterographs: ``{ntype: ids}`` checked, put in one id space, ordered and split.

Every rank needs as many seeds (DDP: as many batches), every id is seen once per epoch, and
every type is split evenly: each type is permuted per epoch, identically on every rank, and
split as a homogeneous graph's ids (padding or dropping per type); a rank merges its types
in proportion to their sizes, so a batch holds each type in about its global share.

Batches address all types in one flat id space (``offset[ntype] + id``, offsets by node
counts in the dict's order). Evaluation splits the flat ids unpermuted (rank ``r`` holds
positions ``r, r + world, ...``: each type even to one id, predictions in order).

Position ``j`` of a type's permutation gets the key ``(j + 0.5) / n``, so when each batch
window holds an even count of each type (64 papers and 32 words, batch 12 on one rank or 6
on two), 2 ranks with batch ``b`` train on exactly 1 rank's seeds with batch ``2b``;
otherwise they differ at batch edges only.
"""
from __future__ import annotations

from typing import Any, Dict, List, Sequence, Tuple

import torch

from .sharding import check_seed_ids, shard_ids

#: ``(ntype, offset, num_nodes)`` of each type of a dict of seeds, in the dict's order.
TypeSpans = List[Tuple[Any, int, int]]


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


def check_typed_eids(eids: Any, graph: Any, what: str = "edge ids") -> Dict[Tuple[str, str, str], torch.Tensor]:
    """``{canonical etype: int64 edge ids}`` (keys: relation names or triples), or a ``ValueError``."""
    etypes = list(graph.canonical_etypes)
    if not isinstance(eids, dict):
        raise ValueError(f"{what}: this graph has edge types {[e[1] for e in etypes]}; pass a dict "
                         f"{{etype: eids}}, e.g. {{{etypes[0][1]!r}: train_eids}}")
    if not eids:
        raise ValueError(f"{what}: the dict of edge ids is empty")
    out: Dict[Tuple[str, str, str], torch.Tensor] = {}
    for etype, value in eids.items():
        try:
            canonical = graph.to_canonical_etype(etype)
        except Exception:  # noqa: BLE001 - DGL raises its own error type
            raise ValueError(f"{what}: unknown edge type {etype!r}; this graph has edge types "
                             f"{etypes}") from None
        out[canonical] = check_seed_ids(value, graph.num_edges(canonical), f"{what}[{etype!r}]", unit="edge")
    return out


def type_spans(ids: Dict[Any, torch.Tensor], graph: Any, edges: bool = False) -> TypeSpans:
    """Where each type of ``ids`` lives in the flat id space (edge types with ``edges``)."""
    spans: TypeSpans = []
    offset = 0
    for ntype in ids:
        n = graph.num_edges(ntype) if edges else graph.num_nodes(ntype)
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


def typed_share(ids: Dict[str, torch.Tensor], spans: TypeSpans, seed: int, epoch: int, rank: int, world: int,
                even: str) -> torch.Tensor:
    """This rank's flat seeds for a shuffled epoch: each type permuted from ``(seed, epoch,
    type)``, split like :func:`shard_ids` (``even`` per type), merged in proportion (module doc)."""
    flats, keys = [], []
    for k, (ntype, offset, _) in enumerate(spans):
        n = ids[ntype].numel()
        gen = torch.Generator().manual_seed((int(seed) * 1_000_003 + int(epoch)) * 131 + k)
        positions = shard_ids(torch.arange(n), rank, world, shuffle=False, even=even)
        flats.append(ids[ntype][torch.randperm(n, generator=gen)][positions] + offset)
        keys.append((positions.to(torch.float64) + 0.5) / n)
    order = torch.argsort(torch.cat(keys), stable=True)
    return torch.cat(flats)[order]


def num_seeds(output_nodes: Any) -> int:
    """Seeds of a node batch: a tensor's length, or the sum over a dict's types."""
    if isinstance(output_nodes, dict):
        return int(sum(v.shape[0] for v in output_nodes.values()))
    return int(output_nodes.shape[0])
