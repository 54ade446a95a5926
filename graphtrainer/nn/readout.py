"""Graph readouts (sum, mean, max over each graph of a batch) and edge scores for pair
graphs (dot product, MLP), for DGL graphs and torch graphs alike."""
from __future__ import annotations

from typing import Any, Optional, Tuple

import torch
from torch import nn

from .blocks import TorchBlock, TorchHeteroBlock
from .convert import is_dgl_graph
from .ops import segment_max

READOUTS = ("sum", "mean", "max")


def batch_num_nodes(graph: Any) -> torch.Tensor:
    """Nodes per graph of a batched graph (one entry for a single graph)."""
    if isinstance(graph, TorchBlock) or is_dgl_graph(graph):
        if graph.is_block:
            raise ValueError("graph readouts need a (batched) graph, not a sampled block")
        return graph.batch_num_nodes()
    raise TypeError(f"graph readouts expect a DGL graph or a graphtrainer.nn.TorchBlock, got {type(graph).__name__}")


def readout(graph: Any, feat: torch.Tensor, op: str = "mean") -> torch.Tensor:
    """One row per graph of ``graph`` (``dgl.batch`` order): the sum, mean or max of its nodes'
    ``feat``, as ``dgl.sum_nodes``/``mean_nodes``/``max_nodes`` (zeros for an empty graph)."""
    if op not in READOUTS:
        raise ValueError(f"graphtrainer.nn.readout: op={op!r}; choose one of {list(READOUTS)}")
    lengths = batch_num_nodes(graph).to(feat.device)
    if int(lengths.sum()) != feat.shape[0]:
        raise ValueError(f"readout: {feat.shape[0]} feature rows for a batch of {int(lengths.sum())} nodes")
    graph_of = torch.repeat_interleave(torch.arange(lengths.numel(), device=feat.device), lengths,
                                       output_size=feat.shape[0])
    if op == "max":
        return segment_max(feat, graph_of, lengths.numel())
    total = feat.new_zeros((lengths.numel(), *feat.shape[1:])).index_add_(0, graph_of, feat)
    if op == "sum":
        return total
    return total / lengths.clamp(min=1).to(feat.dtype).reshape(-1, *([1] * (feat.dim() - 1)))


class _Pooling(nn.Module):
    op = "sum"

    def forward(self, graph: Any, feat: torch.Tensor) -> torch.Tensor:
        return readout(graph, feat, self.op)


class SumPooling(_Pooling):
    """``dgl.nn.SumPooling``: the sum of each graph's node features."""
    op = "sum"


class AvgPooling(_Pooling):
    """``dgl.nn.AvgPooling``: the mean of each graph's node features."""
    op = "mean"


class MaxPooling(_Pooling):
    """``dgl.nn.MaxPooling``: the elementwise maximum of each graph's node features."""
    op = "max"


def edge_endpoints(pair_graph: Any, etype: Any = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(src, dst)`` of every edge of a pair graph, in edge-id order."""
    if isinstance(pair_graph, TorchHeteroBlock) or (is_dgl_graph(pair_graph) and etype is not None):
        return pair_graph.edges(etype=etype)
    return pair_graph.edges()


def score_edges(pair_graph: Any, h: torch.Tensor, mlp: Optional[nn.Module] = None, etype: Any = None) -> torch.Tensor:
    """One logit per edge of ``pair_graph`` (edge-id order): ``h_u · h_v``, or ``mlp(h_u * h_v)``."""
    src, dst = edge_endpoints(pair_graph, etype)
    prod = h[src] * h[dst]
    return prod.sum(-1) if mlp is None else mlp(prod).squeeze(-1)


class EdgeScorer(nn.Module):
    """Edge scores for link prediction: ``op="dot"`` (as ``dgl.function.u_dot_v``) or
    ``op="mlp"`` (``Linear -> ReLU -> Linear`` on ``h_u * h_v``; needs ``in_feats``)."""

    def __init__(self, op: str = "dot", in_feats: Optional[int] = None, hidden: Optional[int] = None):
        super().__init__()
        if op not in ("dot", "mlp"):
            raise ValueError(f"graphtrainer.nn.EdgeScorer: op={op!r}; choose 'dot' or 'mlp'")
        if op == "mlp" and in_feats is None:
            raise ValueError("graphtrainer.nn.EdgeScorer(op='mlp') needs in_feats, the embedding size")
        self.op = op
        width = hidden or in_feats
        self.mlp = (nn.Sequential(nn.Linear(in_feats, width), nn.ReLU(), nn.Linear(width, 1))
                    if op == "mlp" else None)

    def forward(self, pair_graph: Any, h: torch.Tensor, etype: Any = None) -> torch.Tensor:
        return score_edges(pair_graph, h, self.mlp, etype)
