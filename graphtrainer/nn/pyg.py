"""PyG-style batches from sampled blocks: what PyG's ``NeighborLoader`` and
``LinkNeighborLoader`` yield, made from graphtrainer's blocks, so a PyG model's step
(``model(batch.x, batch.edge_index)[:batch.batch_size]``) runs unchanged.

The input is blocks in DGL's layout from any source (DGL's CPU sampling, torch blocks, a
device sampler). A block's destination nodes are the first of its source nodes and the next
block's source nodes, so all blocks share ``blocks[0].srcdata["_ID"]``'s numbering, the seeds first.

As in PyG's neighbour sampling, **each node's in-edges are sampled once**, at the hop where
the node first appears: DGL samples every destination again in every block, so hop ``h``
(``blocks[-h]``) keeps only the in-edges of the nodes new at hop ``h - 1`` (hop 1: the seeds).
Edges are ordered by hop, and ``num_sampled_nodes``/``num_sampled_edges`` count them per hop,
so PyG's ``trim_to_layer`` (and ``BasicGNN``'s ``num_sampled_*_per_hop``) work.

Fanouts keep DGL's order (``fanouts[i]`` is ``blocks[i]``'s: the input layer first), so
PyG's ``num_neighbors=[25, 10]`` (hop 1 first) is ``fanouts=[10, 25]``.

torch-geometric is optional: nothing here imports it until a batch is made.
"""
from __future__ import annotations

import sys
from typing import Any, Dict, List, Sequence, Tuple

import torch

from .blocks import TorchBlock
from .convert import csc_tensors, is_dgl_graph

PYG_INSTALL = "pip install 'graphtrainer[pyg]' (or pip install torch-geometric)"
NID, EID = "_ID", "_ID"


def pyg_data_class() -> Any:
    """``torch_geometric.data.Data``, or an ``ImportError`` that names the install command."""
    try:
        from torch_geometric.data import Data
    except ImportError as exc:
        raise ImportError(f"batch_format='pyg' needs torch-geometric, which cannot be imported here ({exc}). "
                          f"Fix: {PYG_INSTALL}; or keep DGL's batches (batch_format='dgl').") from None
    return Data


def is_pyg_data(obj: Any) -> bool:
    """Whether ``obj`` is a PyG ``Data``/``HeteroData`` (without importing PyG)."""
    module = sys.modules.get("torch_geometric.data.data")
    return module is not None and isinstance(obj, module.BaseData)


def _lean(block: Any, src_keys: Sequence[str], dst_keys: Sequence[str], edge_key: str) -> Any:
    """A DGL block as a :class:`TorchBlock` with only the data a PyG batch reads (DGL's lazy
    views of every column would otherwise gather features for every block)."""
    if not is_dgl_graph(block) or len(block.canonical_etypes) != 1 or len(block.srctypes) != 1:
        return block
    indptr, indices, eids = csc_tensors(block, layer="batch_format='pyg'")
    return TorchBlock(indptr, indices, eids, block.num_src_nodes(), block.num_dst_nodes(),
                      srcdata=_pick(block.srcdata, src_keys), dstdata=_pick(block.dstdata, dst_keys),
                      edata=_pick(block.edata, [EID, edge_key] if edge_key else [EID]))


def _pick(view: Any, keys: Sequence[str]) -> Dict[str, torch.Tensor]:
    return {k: view[k] for k in keys if k in view}


def _homogeneous(blocks: Sequence[Any], feat_key: str, label_key: str, edge_key: str) -> List[TorchBlock]:
    out = []
    last = len(blocks) - 1
    for i, block in enumerate(blocks):
        block = _lean(block, [feat_key, NID] if i == 0 else [], [label_key] if i == last else [], edge_key)
        if not isinstance(block, TorchBlock) or not block.is_block:
            raise ValueError(f"batch_format='pyg' takes sampled blocks of a homogeneous graph, got "
                             f"{type(block).__name__}: a heterograph's blocks have no PyG Data form here. Fix: "
                             "keep DGL's batches (batch_format='dgl') with HeteroGraphConv, or train on "
                             "dgl.to_homogeneous(graph)")
        out.append(block)
    for inner, outer in zip(out, out[1:]):
        if inner.num_dst != outer.num_src:
            raise ValueError(f"batch_format='pyg': consecutive blocks must chain (a block's {inner.num_dst} "
                             f"destination nodes are the next block's source nodes, got {outer.num_src})")
    return out


def _hop_edges(blocks: List[TorchBlock]) -> Tuple[List[int], List[Dict[str, torch.Tensor]]]:
    """Nodes within each hop (``nodes[h]``: hops ``0..h``) and, per hop, the kept edges:
    ``src``, ``dst`` (shared numbering), ``eid`` (positions in the block's edge data)."""
    depth = len(blocks)
    nodes = [blocks[-1].num_dst] + [blocks[depth - h].num_src for h in range(1, depth + 1)]
    # Hop h keeps destinations [nodes[h-2], nodes[h-1]); one host sync for all hops' int counts.
    starts = [nodes[h - 2] if h > 1 else 0 for h in range(1, depth + 1)]
    cuts = torch.stack([blocks[depth - h].indptr[starts[h - 1]] for h in range(1, depth + 1)]).tolist()
    hops = []
    for h in range(1, depth + 1):
        block, lo = blocks[depth - h], starts[h - 1]
        first, last = int(cuts[h - 1]), block.num_edges()
        degrees = (block.indptr[lo + 1:] - block.indptr[lo:-1]).long()
        dst = torch.repeat_interleave(torch.arange(lo, block.num_dst, device=block.device), degrees,
                                      output_size=last - first)
        hops.append({"src": block.indices[first:last].long(), "dst": dst, "eid": block.edge_ids[first:last].long()})
    return nodes, hops


def blocks_to_pyg(blocks: Sequence[Any], feat_key: str = "feat", label_key: str = "label",
                  edge_key: str = "feat") -> Any:
    """A PyG ``Data`` with ``NeighborLoader``'s fields from one batch's blocks (DGL's or torch's):
    ``x`` (``blocks[0].srcdata[feat_key]``), ``edge_index`` (hop 1 first), ``edge_attr`` (the
    edges' ``edata[edge_key]``, where every block has it), ``y`` (one row per seed),
    ``batch_size``, ``n_id``, ``e_id`` (the graph's node and edge ids, to index other data),
    ``num_sampled_nodes``, ``num_sampled_edges``."""
    data_class = pyg_data_class()
    if not blocks:
        raise ValueError("batch_format='pyg': a batch needs at least one block")
    blocks = _homogeneous(blocks, feat_key, label_key, edge_key)
    nodes, hops = _hop_edges(blocks)
    depth = len(blocks)
    data = data_class()
    if feat_key in blocks[0].srcdata:
        data.x = blocks[0].srcdata[feat_key]
    if label_key and label_key in blocks[-1].dstdata:
        data.y = blocks[-1].dstdata[label_key]
    data.edge_index = torch.cat([torch.stack([hop["src"], hop["dst"]]) for hop in hops], dim=1)
    if NID in blocks[0].srcdata:
        data.n_id = blocks[0].srcdata[NID].long()
    for key, name in ((EID, "e_id"), (edge_key, "edge_attr")):
        if key and all(key in block.edata for block in blocks):  # in edge_index's order: by hop
            value = torch.cat([blocks[depth - h].edata[key][hop["eid"]] for h, hop in enumerate(hops, 1)])
            setattr(data, name, value.long() if key == EID else value)
    data.batch_size = nodes[0]
    data.num_sampled_nodes = [nodes[0]] + [nodes[h] - nodes[h - 1] for h in range(1, depth + 1)]
    data.num_sampled_edges = [int(hop["src"].numel()) for hop in hops]
    return data


def _pairs(graph: Any) -> torch.Tensor:
    src, dst = graph.edges()  # DGL's graph or a TorchBlock: edge-id order, the batch's pair order
    return torch.stack([src.long(), dst.long()])


def link_to_pyg(pair_graph: Any, neg_pair_graph: Any, blocks: Sequence[Any], feat_key: str = "feat",
                edge_key: str = "feat") -> Any:
    """``LinkNeighborLoader``'s batch (binary negatives) from an edge batch: :func:`blocks_to_pyg`'s
    fields plus ``edge_label_index`` (positive pairs, then negative ones, in the batch's
    numbering), ``edge_label`` (1.0 / 0.0) and, over edge ids, ``input_id`` (the positive pairs'
    edge ids: ``g.edata["rating"][batch.input_id]`` is their data); ``batch_size`` is the number
    of positive pairs."""
    data = blocks_to_pyg(blocks, feat_key=feat_key, label_key="", edge_key=edge_key)
    if EID in pair_graph.edata:
        data.input_id = pair_graph.edata[EID].long()
    pos = _pairs(pair_graph)
    parts = [pos] if neg_pair_graph is None else [pos, _pairs(neg_pair_graph)]
    data.edge_label_index = torch.cat(parts, dim=1)
    labels = [torch.ones(pos.shape[1], device=pos.device)]
    if neg_pair_graph is not None:
        labels.append(torch.zeros(parts[1].shape[1], device=pos.device))
    data.edge_label = torch.cat(labels)
    data.batch_size = int(pos.shape[1])
    return data


def _is_graph(obj: Any) -> bool:
    return is_dgl_graph(obj) or isinstance(obj, TorchBlock)


def to_pyg(batch: Any, feat_key: str = "feat", label_key: str = "label", edge_key: str = "feat") -> Any:
    """The PyG batch of one of graphtrainer's batches: a node batch ``(input_nodes, output_nodes,
    blocks)``, an edge batch ``(input_nodes, pair_graph[, neg_pair_graph], blocks)``, or a bare
    list of blocks."""
    if isinstance(batch, (list, tuple)) and batch and all(_is_graph(b) for b in batch):
        return blocks_to_pyg(batch, feat_key, label_key, edge_key)
    if isinstance(batch, (list, tuple)) and len(batch) in (3, 4) and isinstance(batch[-1], (list, tuple)):
        if _is_graph(batch[1]):
            return link_to_pyg(batch[1], batch[2] if len(batch) == 4 else None, batch[-1], feat_key, edge_key)
        if len(batch) == 3:
            return blocks_to_pyg(batch[-1], feat_key, label_key, edge_key)
    raise TypeError(f"batch_format='pyg': cannot read {type(batch).__name__} as a sampled batch; expected "
                    "(input_nodes, output_nodes, blocks), (input_nodes, pair_graph[, neg_pair_graph], blocks) "
                    "or a list of blocks")
