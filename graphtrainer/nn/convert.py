"""DGL graphs into torch-only graphs (:mod:`graphtrainer.nn.blocks`): sampled blocks, pair
graphs, batched graphs, homogeneous or not; on the CPU, where DGL works."""
from __future__ import annotations

import sys
from typing import Any, Dict, Tuple

import torch

from .blocks import AnyTorchGraph, TorchBlock, TorchHeteroBlock, is_torch_graph
from .collection import apply_to_leaves, leaves


def is_dgl_graph(obj: Any) -> bool:
    dgl = sys.modules.get("dgl")
    return dgl is not None and isinstance(obj, dgl.DGLGraph)


def csc_tensors(graph: Any, etype: Any = None, layer: str = "graphtrainer.nn") -> Tuple[torch.Tensor, ...]:
    """``(indptr, indices, edge_ids)`` of a DGL graph's (relation's) in-edges, or a clear error
    when the graph's formats were restricted so that CSC cannot be built."""
    try:
        return graph.adj_tensors("csc", etype=etype) if etype is not None else graph.adj_tensors("csc")
    except Exception as exc:  # DGLError: its class lives in DGL's FFI module
        formats = graph.formats() if hasattr(graph, "formats") else "?"
        raise ValueError(
            f"{layer}: cannot read the graph's in-edges in CSC form (DGL: {str(exc).splitlines()[0]}); the "
            f"graph's formats are {formats}. Fix: keep 'csc' allowed (do not restrict the graph with "
            "g.formats('coo') / g.formats(['coo', 'csr']), or call g = g.formats(['coo', 'csr', 'csc']) "
            "before sampling), or call g.create_formats_() so every format exists.") from None


def _node_counts(graph: Any, etype: Tuple[str, str, str]) -> Tuple[int, int]:
    stype, _, dtype = etype
    if graph.is_block:
        return graph.num_src_nodes(stype), graph.num_dst_nodes(dtype)
    return graph.num_nodes(stype), graph.num_nodes(dtype)


def _relation(graph: Any, etype: Tuple[str, str, str], with_data: bool) -> TorchBlock:
    indptr, indices, eids = csc_tensors(graph, etype if len(graph.canonical_etypes) > 1 else None)
    num_src, num_dst = _node_counts(graph, etype)
    is_block = graph.is_block or etype[0] != etype[2]
    if not with_data:
        return TorchBlock(indptr, indices, eids, num_src, num_dst, is_block=is_block, canonical_etype=etype)
    if graph.is_block:
        src, dst = dict(graph.srcdata), dict(graph.dstdata)
    else:
        src, dst = dict(graph.ndata), {}
    bnn = graph.batch_num_nodes() if not graph.is_block and graph.batch_size > 1 else None
    return TorchBlock(indptr, indices, eids, num_src, num_dst, srcdata=src, dstdata=dst,
                      edata=dict(graph.edata), is_block=graph.is_block, batch_num_nodes_=bnn, canonical_etype=etype)


def _per_type(view: Any, types: list) -> Dict[str, Dict[str, torch.Tensor]]:
    out: Dict[str, Dict[str, torch.Tensor]] = {}
    for nt in types:
        for key, value in view[nt].data.items():
            out.setdefault(key, {})[nt] = value
    return out


def _hetero(graph: Any) -> TorchHeteroBlock:
    relations = {et: _relation(graph, et, with_data=False) for et in graph.canonical_etypes}
    edata: Dict[str, Dict[Any, torch.Tensor]] = {}
    for et in graph.canonical_etypes:
        for key, value in graph.edges[et].data.items():
            edata.setdefault(key, {})[et] = value
    if graph.is_block:
        return TorchHeteroBlock(relations, {nt: graph.num_src_nodes(nt) for nt in graph.srctypes},
                                {nt: graph.num_dst_nodes(nt) for nt in graph.dsttypes},
                                src_store=_per_type(graph.srcnodes, graph.srctypes),
                                dst_store=_per_type(graph.dstnodes, graph.dsttypes), edge_store=edata)
    counts = {nt: graph.num_nodes(nt) for nt in graph.ntypes}
    return TorchHeteroBlock(relations, dict(counts), dict(counts), src_store=_per_type(graph.nodes, graph.ntypes),
                            edge_store=edata, is_block=False)


def to_torch_graph(graph: Any) -> AnyTorchGraph:
    """A DGL block, pair graph or (batched) graph as a :class:`TorchBlock` (heterographs: a
    :class:`TorchHeteroBlock`) on the same device; a torch graph is returned as it is."""
    if is_torch_graph(graph):
        return graph
    if not is_dgl_graph(graph):
        raise TypeError(f"to_torch_graph: expected a DGL graph or block, got {type(graph).__name__}")
    one_set = len(graph.srctypes) == 1 and len(graph.dsttypes) == 1 if graph.is_block else len(graph.ntypes) == 1
    if len(graph.canonical_etypes) == 1 and one_set:
        return _relation(graph, graph.canonical_etypes[0], with_data=True)
    if graph.batch_size > 1:
        raise ValueError("to_torch_graph: a batched heterograph is not supported by graphtrainer's torch "
                         "graphs; batch homogeneous graphs, or keep DGL graphs with Trainer(block_type='dgl')")
    return _hetero(graph)


def convert_batch(batch: Any) -> Any:
    """``batch`` with every DGL graph inside (tuples, lists, dicts) as a torch graph."""
    return apply_to_leaves(batch, to_torch_graph, is_dgl_graph)


def contains_dgl_graph(batch: Any) -> bool:
    return next(leaves(batch, is_dgl_graph), None) is not None
