"""Models built on :class:`~graphtrainer.models.sage.SAGE` and :mod:`graphtrainer.nn`'s layers: a link
predictor (SAGE encoder + edge scorer) and a graph classifier with a readout."""
from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import nn

from .sage import SAGE


class LinkPredictor(nn.Module):
    """A :class:`SAGE` encoder and an edge scorer, for link prediction on edge batches.

    ``forward(blocks, x)`` gives node embeddings of the pair graphs' nodes, and
    ``forward(blocks, x, pos_graph, neg_graph)`` their scores; ``score(pair_graph, h)`` gives one
    logit per edge of a (positive or negative) pair graph: the dot product
    ``h_u · h_v`` (``scorer="dot"``), or an MLP of ``h_u * h_v`` (``scorer="mlp"``).
    """

    def __init__(self, in_feats: int, hidden: int, num_layers: int = 2, dropout: float = 0.0,
                 scorer: str = "dot"):
        super().__init__()
        if scorer not in ("dot", "mlp"):
            raise ValueError(f"scorer={scorer!r}: choose 'dot' or 'mlp'")
        self.encoder = SAGE(in_feats, hidden, hidden, num_layers=num_layers, dropout=dropout)
        self.layers = self.encoder.layers  # full-graph inference passes [graph] * len(layers)
        self.mlp = (nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 1))
                    if scorer == "mlp" else None)

    def forward(self, blocks: Sequence[Any], x: torch.Tensor, *pair_graphs: Any) -> Any:
        """Node embeddings; or, given pair graphs (positive, negative, ...), a tuple with one
        score tensor per pair graph (scoring inside ``forward`` keeps DDP's hooks simple)."""
        h = self.encoder(blocks, x)
        if not pair_graphs:
            return h
        return tuple(self.score(g, h) for g in pair_graphs)

    def score(self, pair_graph: Any, h: torch.Tensor) -> torch.Tensor:
        from ..nn import score_edges

        return score_edges(pair_graph, h, self.mlp)


class GraphClassifier(nn.Module):
    """Graph classification: ``GraphConv`` layers, a mean (or sum/max) readout over each
    graph's nodes, and a linear classifier. ``forward(batched_graph, x)`` gives one row of
    logits per graph of the batch (``dgl.batch`` order)."""

    def __init__(self, in_feats: int, hidden: int, num_classes: int, num_layers: int = 2,
                 readout: str = "mean"):
        super().__init__()
        from ..nn import GraphConv

        if readout not in ("mean", "sum", "max"):
            raise ValueError(f"readout={readout!r}: choose 'mean', 'sum' or 'max'")
        sizes = [in_feats] + [hidden] * num_layers
        # allow_zero_in_degree: isolated nodes are common in small graphs; their self term
        # comes from the degree feature and the readout.
        self.convs = nn.ModuleList(GraphConv(sizes[i], sizes[i + 1], allow_zero_in_degree=True)
                                   for i in range(num_layers))
        self.readout = readout
        self.classify = nn.Linear(hidden, num_classes)

    def forward(self, graph: Any, x: torch.Tensor) -> torch.Tensor:
        from ..nn import readout

        h = x
        for conv in self.convs:
            h = torch.relu(conv(graph, h))
        return self.classify(readout(graph, h, self.readout))
