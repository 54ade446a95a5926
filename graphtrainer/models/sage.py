"""GraphSAGE for block (minibatch) training as in DGL's examples, on homogeneous graphs and
heterographs.

Their layers are :mod:`graphtrainer.nn`'s, so each model takes DGL's graphs and blocks or
graphtrainer's torch-only blocks (a GPU rank with DGL's CPU-only wheel gets the latter), with
the parameter names and results of the ``dgl.nn`` layers they replace."""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

import torch
from torch import nn


class SAGE(nn.Module):
    """GraphSAGE over a list of DGL blocks, one ``SAGEConv`` per block.

    ``forward(blocks, x)``: ``x`` holds features of ``blocks[0]``'s source nodes; the
    result has one row per destination node of ``blocks[-1]`` (the seeds).
    """

    def __init__(self, in_feats: int, hidden: int, out_feats: int, num_layers: int = 2,
                 dropout: float = 0.5, aggregator: str = "mean"):
        super().__init__()
        from ..nn import Dropout, SAGEConv

        if num_layers < 1:
            raise ValueError("num_layers must be at least 1")
        sizes: List[int] = [in_feats] + [hidden] * (num_layers - 1) + [out_feats]
        self.layers = nn.ModuleList(SAGEConv(sizes[i], sizes[i + 1], aggregator) for i in range(num_layers))
        self.dropout = Dropout(dropout)

    def forward(self, blocks: Sequence[Any], x: torch.Tensor) -> torch.Tensor:
        if len(blocks) != len(self.layers):
            raise ValueError(f"SAGE has {len(self.layers)} layers but got {len(blocks)} blocks: "
                             "use as many fanouts as layers")
        h = x
        for i, block in enumerate(blocks):
            h = self.inference_layer(i, block, h)
        return h

    def inference_layer(self, i: int, block: Any, h: torch.Tensor) -> torch.Tensor:
        """Layer ``i`` and what follows it (used by :func:`graphtrainer.data.inference.layerwise`)."""
        h = self.layers[i](block, h)
        if i != len(self.layers) - 1:
            h = self.dropout(torch.relu(h))
        return h


def _check_sparse(sparse: Dict[str, Any], num_nodes: Dict[str, int], in_feats: Dict[str, int]) -> None:
    """HeteroSAGE's ``sparse_embeddings``: featureless types only, enough rows for each."""
    for nt, emb in sparse.items():
        if nt not in num_nodes or nt in in_feats:
            raise ValueError(f"sparse_embeddings[{nt!r}]: give featureless node types of num_nodes only")
        if getattr(emb, "num_rows", 0) < num_nodes[nt]:
            raise ValueError(f"sparse_embeddings[{nt!r}] has {getattr(emb, 'num_rows', 0)} rows for "
                             f"{num_nodes[nt]} nodes: build it with SparseEmbedding({num_nodes[nt]}, dim)")


class HeteroSAGE(nn.Module):
    """GraphSAGE on a heterograph (an R-GCN with ``SAGEConv`` per relation): each layer is
    a ``HeteroGraphConv`` with one mean-aggregating ``SAGEConv`` per relation, summed over
    the relations that reach a node type (``aggregate``: "sum", "mean", "max", ...).

    Args:
        canonical_etypes: the graph's ``(src type, relation, dst type)`` triples.
        num_nodes: ``{ntype: count}`` of every node type.
        in_feats: ``{ntype: feature size}`` of the types that have features; every other type
            gets a learned embedding of ``embed_dim`` (a dense ``nn.Embedding`` per rank).
        hidden, out_feats, num_layers, dropout: as in :class:`SAGE`.
        embed_dim: the dense embeddings' size.
        aggregate: how relations into one type combine ("sum", "mean", "max", ...).
        sparse_embeddings: ``{ntype: SparseEmbedding}`` for featureless types to embed with a
            table shared by all ranks and updated sparsely instead
            (:mod:`graphtrainer.nn.sparse_embedding`; made in the task's ``__init__``).

    ``forward(blocks, x)``: ``x`` holds the features of ``blocks[0]``'s source nodes per
    type (embedded types may be left out: they are looked up); the result is
    ``{ntype: [seeds, out_feats]}``. Relations whose weights a batch does not use exist
    (the last layer's relations into non-seed types), so DDP needs
    ``Trainer(find_unused_parameters=True)``.
    """

    def __init__(self, canonical_etypes: Sequence[Any], num_nodes: Dict[str, int], in_feats: Dict[str, int],
                 hidden: int, out_feats: int, num_layers: int = 2, dropout: float = 0.5, embed_dim: int = 64,
                 aggregate: str = "sum", sparse_embeddings: Optional[Dict[str, Any]] = None):
        super().__init__()
        from ..nn import Dropout, HeteroGraphConv, SAGEConv

        if num_layers < 1:
            raise ValueError("num_layers must be at least 1")
        unknown = sorted(set(in_feats) - set(num_nodes))
        if unknown:
            raise ValueError(f"in_feats names node types {unknown} that are not in num_nodes {sorted(num_nodes)}")
        sparse = dict(sparse_embeddings or {})
        _check_sparse(sparse, num_nodes, in_feats)
        self.sparse_embed = nn.ModuleDict(sparse)
        self.embed = nn.ModuleDict({nt: nn.Embedding(n, embed_dim) for nt, n in num_nodes.items()
                                    if nt not in in_feats and nt not in sparse})
        dims = {nt: in_feats.get(nt, sparse[nt].dim if nt in sparse else embed_dim) for nt in num_nodes}
        sizes = [hidden] * (num_layers - 1) + [out_feats]
        layers = []
        for out in sizes:
            layers.append(HeteroGraphConv({
                etype: SAGEConv((dims[src], dims[dst]), out, "mean")
                for src, etype, dst in canonical_etypes}, aggregate=aggregate))
            dims = {nt: out for nt in num_nodes}
        self.layers = nn.ModuleList(layers)
        self.dropout = Dropout(dropout)

    def input_features(self, graph: Any, feat_key: str = "feat") -> Dict[str, torch.Tensor]:
        """Every type's input features over the whole graph (embeddings for featureless types),
        for :func:`graphtrainer.data.inference.layerwise`."""
        x = {nt: graph.nodes[nt].data[feat_key] for nt in graph.ntypes if nt not in self.embed}
        x.update({nt: emb.weight.detach() for nt, emb in [*self.embed.items(), *self.sparse_embed.items()]})
        return x

    def forward(self, blocks: Sequence[Any], x: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
        if len(blocks) != len(self.layers):
            raise ValueError(f"HeteroSAGE has {len(self.layers)} layers but got {len(blocks)} blocks: "
                             "use as many fanouts as layers")
        h = dict(x)
        ids = blocks[0].srcdata["_ID"]
        for nt, emb in [*self.embed.items(), *self.sparse_embed.items()]:
            if nt not in h:
                h[nt] = emb(ids[nt] if isinstance(ids, dict) else ids)
        for i, block in enumerate(blocks):
            h = self.inference_layer(i, block, h)
        return h

    def inference_layer(self, i: int, block: Any, h: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
        """Layer ``i`` and what follows it (used by :func:`graphtrainer.data.inference.layerwise`)."""
        h = self.layers[i](block, h)
        if i != len(self.layers) - 1:
            h = {nt: self.dropout(torch.relu(v)) for nt, v in h.items()}
        return h
