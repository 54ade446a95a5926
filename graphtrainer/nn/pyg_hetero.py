"""PyG ``HeteroData`` batches from a heterograph's sampled blocks: what PyG's ``NeighborLoader``
yields for a ``HeteroData`` (``input_nodes=(ntype, ids)``), so a PyG heterogeneous model
(``to_hetero(model, metadata)``, ``HeteroConv``) runs its step unchanged on
``batch.x_dict``/``batch.edge_index_dict``.

The blocks are in DGL's layout from any source (DGL's CPU sampling, torch blocks, the device
sampler): per node type, a block's destination nodes are the first of its source nodes and the
next block's source nodes, so every block numbers a type's nodes as ``blocks[0]``'s sources do.

PyG's rules, per type (:mod:`graphtrainer.nn.pyg` has them for one type): **each node's
in-edges are sampled once**, at the hop where it first appears; hop ``h`` takes, relation by
relation in the graph's ``canonical_etypes`` order (PyG walks its ``edge_types``), the in-edges
(from ``blocks[-h]``) of the destination type's nodes new at hop ``h - 1``; a source node not met
before is new at hop ``h``. **Each type's nodes are numbered** seeds first, then hop by hop in
the order first met (relations in order, each walking the previous hop's nodes in order). Nodes
only DGL's re-sampling of older nodes reached are left out. A relation's edges come hop by hop.

A batch holds, per node type, ``x`` (where the type has the feature key), ``y`` (where it has the
label key: every node, as PyG's), its other node data under their own names, ``n_id`` and
``num_sampled_nodes`` (one count per hop, the seeds first: 0 for other types); the seed type also
``batch_size`` and, where given, ``input_id``; per relation ``(src, rel, dst)`` (DGL's canonical
edge types are PyG's edge types), ``edge_index`` (row: the source type's local index, col: the
destination's), ``e_id``, ``edge_attr`` (where the relation has the edge key), its other edge data
under their own names and ``num_sampled_edges`` (per hop). PyG's ``num_neighbors={et: [25, 10]}``
(hop 1 first) is ``fanouts=[{et: 10}, {et: 25}]`` (the input layer first).

torch-geometric is optional: nothing here imports it until a batch is made.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

from .blocks import TorchBlock, TorchHeteroBlock
from .convert import csc_tensors, is_dgl_graph
from .pyg import EID, NID, pyg_data_class
from .pyg_attrs import carried

EType = Tuple[str, str, str]
#: One relation of one block: ``(indptr, indices, edge positions)`` in CSC, local ids.
Csc = Tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def hetero_data_class() -> Any:
    """``torch_geometric.data.HeteroData``, or an ``ImportError`` that names the install command."""
    return pyg_data_class("HeteroData")


def _etypes(block: Any) -> List[EType]:
    if isinstance(block, TorchBlock):
        return [block.canonical_etypes[0]]
    return list(block.canonical_etypes)


def _csc(block: Any, et: EType) -> Csc:
    """One relation's in-edges: ``indices`` number its source type's nodes, ``eids`` are rows of
    the relation's edge data in the block."""
    if isinstance(block, TorchHeteroBlock):
        rel = block.relations[et]
        return rel.indptr.long(), rel.indices.long(), rel.edge_ids.long()
    if isinstance(block, TorchBlock):
        return block.indptr.long(), block.indices.long(), block.edge_ids.long()
    if not is_dgl_graph(block) or not block.is_block:
        raise ValueError(f"batch_format='pyg' takes sampled blocks, got {type(block).__name__}")
    several = len(block.canonical_etypes) > 1
    indptr, indices, eids = csc_tensors(block, et if several else None, layer="batch_format='pyg'")
    return indptr.long(), indices.long(), eids.long()


def _counts(block: Any, src: bool) -> Dict[str, int]:
    if isinstance(block, TorchHeteroBlock):
        return dict(block.num_src_per_type if src else block.num_dst_per_type)
    if isinstance(block, TorchBlock):
        et = block.canonical_etypes[0]
        return {et[0]: block.num_src} if src else {et[2]: block.num_dst}
    types = block.srctypes if src else block.dsttypes
    return {nt: (block.num_src_nodes(nt) if src else block.num_dst_nodes(nt)) for nt in types}


def seed_type_of(blocks: Sequence[Any]) -> str:
    """The one node type with seeds (destinations of the last block), or a ``ValueError``."""
    typed = [nt for nt, n in _counts(blocks[-1], src=False).items() if n]
    if len(typed) != 1:
        raise ValueError(f"batch_format='pyg': PyG's NeighborLoader takes seeds of one node type "
                         f"(input_nodes=(ntype, ids)), this batch has seeds of {typed}. Fix: one loader per "
                         "type, {ntype: ids}, or DGL's batches (batch_format='dgl') for several types")
    return typed[0]


class TypedHops:
    """PyG's subgraph within a heterograph's blocks (module doc): per type ``order`` (kept nodes as
    positions among ``blocks[0]``'s sources of that type, in PyG's order) and ``counts`` (new per
    hop, seeds first); per relation, per hop, ``src``/``dst`` (PyG's local ids) and ``eid`` (rows of
    that block's edge data). ``seed_type``: whose destinations of the last block are the seeds."""

    def __init__(self, blocks: Sequence[Any], seed_type: str):
        depth = len(blocks)
        num = _counts(blocks[0], src=True)
        seeds = _counts(blocks[-1], src=False).get(seed_type, 0)
        device = _csc(blocks[0], _etypes(blocks[0])[0])[0].device if _etypes(blocks[0]) else torch.device("cpu")
        self.etypes = _etypes(blocks[0])
        self.new_id = {nt: torch.full((n,), -1, dtype=torch.int64, device=device) for nt, n in num.items()}
        frontier = {nt: torch.empty(0, dtype=torch.int64, device=device) for nt in num}
        frontier[seed_type] = torch.arange(seeds, device=device)
        self.new_id[seed_type][:seeds] = frontier[seed_type]
        self.total = {nt: int(f.numel()) for nt, f in frontier.items()}
        parts = {nt: [f] for nt, f in frontier.items()}
        self.counts: Dict[str, List[int]] = {nt: [int(f.numel())] for nt, f in frontier.items()}
        self.edges: Dict[EType, List[Dict[str, torch.Tensor]]] = {et: [] for et in self.etypes}
        for h in range(1, depth + 1):
            block = blocks[depth - h]
            fresh: Dict[str, List[torch.Tensor]] = {nt: [] for nt in num}
            for et in self.etypes:  # a node new at this hop is not walked until the next one
                hop, new = self._relation(_csc(block, et), et, frontier[et[2]])
                self.edges[et].append(hop)
                fresh[et[0]].append(new)
            frontier = {nt: torch.cat(f) if f else torch.empty(0, dtype=torch.int64, device=device)
                        for nt, f in fresh.items()}
            for nt, f in frontier.items():
                parts[nt].append(f)
                self.counts[nt].append(int(f.numel()))
        self.order = {nt: torch.cat(p) for nt, p in parts.items()}

    def _relation(self, csc: Csc, et: EType, frontier: torch.Tensor) -> Tuple[Dict[str, torch.Tensor], torch.Tensor]:
        """One relation at one hop: the frontier's in-edges, node by node in frontier order, and
        the source nodes they meet first (numbered after the source type's nodes so far)."""
        indptr, indices, eids = csc
        src_ids, dst_ids = self.new_id[et[0]], self.new_id[et[2]]
        starts, degrees = indptr[frontier], indptr[frontier + 1] - indptr[frontier]
        num = int(degrees.sum())
        walk = torch.arange(num, device=indptr.device)
        begin = torch.cumsum(degrees, 0) - degrees
        pos = torch.repeat_interleave(starts - begin, degrees, output_size=num) + walk
        src = indices[pos]
        dst = torch.repeat_interleave(dst_ids[frontier], degrees, output_size=num)
        first = torch.full_like(src_ids, num).scatter_reduce_(0, src, walk, "amin")
        fresh = src[(src_ids[src] < 0) & (first[src] == walk)]  # unseen, at its first edge: first-met order
        total = self.total[et[0]]
        src_ids[fresh] = torch.arange(total, total + fresh.numel(), device=indptr.device)
        self.total[et[0]] = total + int(fresh.numel())
        return {"src": src_ids[src], "dst": dst, "eid": eids[pos]}, fresh


def _node_value(view: Any, key: Optional[str]) -> Optional[torch.Tensor]:
    return view[key] if key and key in view else None


def _classes() -> Tuple[Any, Any]:
    from torch_geometric.data.storage import EdgeStorage, NodeStorage  # hetero_data_class checked the import
    return NodeStorage, EdgeStorage


def blocks_to_hetero_pyg(blocks: Sequence[Any], feat_key: Optional[str] = "feat", label_key: Optional[str] = "label",
                         edge_key: Optional[str] = "feat", seed_type: Optional[str] = None,
                         input_id: Optional[torch.Tensor] = None, attrs: Optional[Sequence[str]] = None) -> Any:
    """A PyG ``HeteroData`` with ``NeighborLoader``'s fields (module doc) from one batch's blocks of a
    heterograph (DGL's or torch's). ``x`` is each node type's ``feat_key`` data (where it has it),
    ``y`` each type's ``label_key`` (where it has it, every node as PyG's: the seeds' are
    ``y[:batch_size]``; ``""``: none), ``edge_attr`` each relation's ``edge_key`` (where every block
    has it); each type's other node data (each relation's edge data) under its own name, by ``n_id``
    (``e_id``; :mod:`.pyg_attrs`), the keys the blocks hold or, ``attrs``, those named.
    ``seed_type``: default, the one type with seeds. ``input_id``: the seeds' positions in the
    loader's ids, as PyG's (none: left out)."""
    data_class = hetero_data_class()
    if not blocks:
        raise ValueError("batch_format='pyg': a batch needs at least one block")
    seed_type = seed_type_of(blocks) if seed_type is None else seed_type
    hops = TypedHops(blocks, seed_type)
    depth, first, last = len(blocks), blocks[0], blocks[-1]
    data = data_class()
    node_class, edge_class = _classes()
    for nt, order in hops.order.items():
        store = data[nt]
        view = first.srcnodes[nt].data
        # Every key the type holds, so that one read as x makes x taken here, whatever attrs names.
        others, _ = carried(list(view), (), (feat_key, label_key, None), attrs, node_class, where=f"node type {nt!r}")
        for key, name in ((feat_key, "x"), (label_key, "y"), *((k, k) for k in others)):
            value = _node_value(view, key)
            if value is not None:
                setattr(store, name, value[order])
        store.n_id = view[NID][order].long() if NID in view else order
        store.num_sampled_nodes = hops.counts[nt]
    seeds = data[seed_type]
    seeds.batch_size = hops.counts[seed_type][0]
    y = None if "y" in seeds else _node_value(last.dstnodes[seed_type].data, label_key)
    if y is not None:  # blocks with the seeds' labels only
        seeds.y = y
    if input_id is not None:
        seeds.input_id = input_id.to(seeds.n_id.device).long()
    for et, per_hop in hops.edges.items():
        store = data[et]
        store.edge_index = torch.stack([torch.cat([h["src"] for h in per_hop]), torch.cat([h["dst"] for h in per_hop])])
        views = [blocks[depth - h].edges[et].data for h in range(1, depth + 1)]
        _, others = carried((), [k for k in views[0] if all(k in v for v in views)], (None, None, edge_key), attrs,
                            None, edge_class, where=f"relation {et!r}")
        for key, name in ((EID, "e_id"), (edge_key, "edge_attr"), *((k, k) for k in others)):
            if key and all(key in v for v in views):  # in edge_index's order: by hop
                value = torch.cat([views[h][key][hop["eid"]] for h, hop in enumerate(per_hop)])
                setattr(store, name, value.long() if key == EID else value)
        store.num_sampled_edges = [int(h["src"].numel()) for h in per_hop]
    return data


def to_hetero_pyg(batch: Any, feat_key: Optional[str] = "feat", label_key: Optional[str] = "label",
                  edge_key: Optional[str] = "feat", input_id: Optional[torch.Tensor] = None,
                  attrs: Optional[Sequence[str]] = None) -> Any:
    """The PyG ``HeteroData`` of a heterograph's node batch ``(input_nodes, output_nodes, blocks)``
    (``output_nodes``: ``{ntype: ids}`` of one type with seeds) or of a bare list of blocks
    (:func:`blocks_to_hetero_pyg`)."""
    if isinstance(batch, (list, tuple)) and len(batch) == 3 and isinstance(batch[1], dict) \
            and isinstance(batch[2], (list, tuple)):
        given = [nt for nt, ids in batch[1].items() if ids.numel()]
        seed_type = given[0] if len(given) == 1 else None
        return blocks_to_hetero_pyg(batch[2], feat_key, label_key, edge_key, seed_type, input_id, attrs)
    if isinstance(batch, (list, tuple)) and batch and not isinstance(batch[-1], (list, tuple)):
        return blocks_to_hetero_pyg(batch, feat_key, label_key, edge_key, None, input_id, attrs)
    raise TypeError(f"batch_format='pyg': cannot read {type(batch).__name__} as a heterograph's node batch; "
                    "expected (input_nodes, {ntype: seeds}, blocks) or a list of blocks")
