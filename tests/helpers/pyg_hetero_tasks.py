"""Heterograph node classification with a PyG heterogeneous model on ``HeteroData`` batches
(``batch_format="pyg"``), at module level so spawned ranks import it. It is the DGL-format task
(graphtrainer.examples.hetero_classification.HeteroClassification, HeteroSAGE) with only the
model and the step's reading of the batch changed, so their metrics compare: what a PyG user
writes for ogbn-mag, ``to_hetero(GraphSAGE-ish, metadata, aggr="sum")`` on ``batch.x_dict`` and
``batch.edge_index_dict``, featureless types embedded by ``batch[ntype].n_id``."""
from __future__ import annotations

from typing import Any, Dict

import torch
from torch import nn

from graphtrainer.examples.hetero_classification import HeteroClassification


class Sage(nn.Module):
    """A homogeneous GraphSAGE, written as for PyG's ``to_hetero`` (dropout as a module: traced)."""

    def __init__(self, in_dim: int, hidden: int, out_dim: int, num_layers: int, dropout: float):
        super().__init__()
        from torch_geometric.nn import SAGEConv

        dims = [in_dim] + [hidden] * (num_layers - 1) + [out_dim]
        self.convs = nn.ModuleList(SAGEConv(a, b) for a, b in zip(dims, dims[1:]))
        self.dropout = nn.Dropout(dropout)

    def forward(self, x, edge_index):  # no annotations: torch.fx (to_hetero) reads them as globals
        for i, conv in enumerate(self.convs):
            x = conv(x, edge_index)
            if i < len(self.convs) - 1:
                x = self.dropout(x.relu())
        return x


class PygHeteroSage(nn.Module):
    """``to_hetero(Sage)`` over the graph's metadata; types without ``x`` get an embedding of
    the feature size, looked up by ``n_id``."""

    def __init__(self, graph: Any, target: str, hidden: int, out_dim: int, num_layers: int, dropout: float):
        super().__init__()
        from torch_geometric.nn import to_hetero

        dim = graph.nodes[target].data["feat"].shape[1]
        self.embed = nn.ModuleDict({nt: nn.Embedding(graph.num_nodes(nt), dim) for nt in graph.ntypes
                                    if "feat" not in graph.nodes[nt].data})
        metadata = (list(graph.ntypes), list(graph.canonical_etypes))
        self.gnn = to_hetero(Sage(dim, hidden, out_dim, num_layers, dropout), metadata, aggr="sum")

    def forward(self, batch: Any) -> Dict[str, torch.Tensor]:
        x = dict(batch.x_dict)
        x.update({nt: emb(batch[nt].n_id) for nt, emb in self.embed.items()})
        return self.gnn(x, batch.edge_index_dict)


class PygHeteroClassification(HeteroClassification):
    """HeteroClassification on ``HeteroData`` batches; the step is PyG's ogbn-mag one:
    ``model(...)[target][:batch_size]`` against ``batch[target].y[:batch_size]``."""

    batch_format = "pyg"

    def configure_model(self) -> nn.Module:
        return PygHeteroSage(self.graph, self.target, self.hidden, self.num_classes, len(self.fanouts), self.dropout)

    def _forward(self, batch: Any) -> tuple:
        seeds = batch[self.target]
        return self.model(batch)[self.target][:seeds.batch_size], seeds.y[:seeds.batch_size]
