"""``SAGEConv`` and ``GraphConv`` in plain torch, taking a DGL graph/block or a torch block.

Same arguments, parameter names, initialisation order (a seed gives the same weights) and
results as ``dgl.nn.SAGEConv`` / ``dgl.nn.GraphConv``: state_dicts load across either way.
"""
from __future__ import annotations

from typing import Any, Callable, Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import nn

from . import ops

Feats = Union[int, Tuple[int, int]]


def _pair(feats: Feats) -> Tuple[int, int]:
    return (feats[0], feats[1]) if isinstance(feats, (tuple, list)) else (feats, feats)


class SAGEConv(nn.Module):
    """GraphSAGE (Hamilton et al.): ``fc_self(h_v) + fc_neigh(agg(h_u))``. ``aggregator_type``:
    "mean", "gcn" (mean over neighbours and the node, no self weight) or "pool" (max of
    ``relu(fc_pool(h_u))``); DGL's "lstm" is not provided."""

    AGGREGATORS = ("mean", "gcn", "pool")

    def __init__(self, in_feats: Feats, out_feats: int, aggregator_type: str, feat_drop: float = 0.0,
                 bias: bool = True, norm: Optional[Callable[[torch.Tensor], torch.Tensor]] = None,
                 activation: Optional[Callable[[torch.Tensor], torch.Tensor]] = None):
        super().__init__()
        if aggregator_type not in self.AGGREGATORS:
            hint = " (DGL's 'lstm' needs dgl.nn.SAGEConv on DGL blocks)" if aggregator_type == "lstm" else ""
            raise ValueError(f"graphtrainer.nn.SAGEConv: aggregator_type={aggregator_type!r} is not supported; "
                             f"choose one of {list(self.AGGREGATORS)}{hint}")
        self._in_src_feats, self._in_dst_feats = _pair(in_feats)
        self._out_feats = out_feats
        self._aggre_type = aggregator_type
        self.norm = norm
        self.feat_drop = nn.Dropout(feat_drop)
        self.activation = activation
        if aggregator_type == "pool":
            self.fc_pool = nn.Linear(self._in_src_feats, self._in_src_feats)
        self.fc_neigh = nn.Linear(self._in_src_feats, out_feats, bias=False)
        if aggregator_type != "gcn":
            self.fc_self = nn.Linear(self._in_dst_feats, out_feats, bias=bias)
        elif bias:
            self.bias = nn.Parameter(torch.zeros(self._out_feats))
        else:
            self.register_buffer("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Glorot-uniform weights with ReLU gain, in DGL's order."""
        gain = nn.init.calculate_gain("relu")
        if self._aggre_type == "pool":
            nn.init.xavier_uniform_(self.fc_pool.weight, gain=gain)
        if self._aggre_type != "gcn":
            nn.init.xavier_uniform_(self.fc_self.weight, gain=gain)
        nn.init.xavier_uniform_(self.fc_neigh.weight, gain=gain)

    def forward(self, graph: Any, feat: Any, edge_weight: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Output rows for ``graph``'s destination nodes; ``feat`` is the source nodes' features
        (or a ``(src, dst)`` pair); ``edge_weight`` scales each message (edge-id order)."""
        s = ops.structure(graph, "graphtrainer.nn.SAGEConv")
        pair = isinstance(feat, (tuple, list))
        if pair:
            feat_src, feat_dst = self.feat_drop(feat[0]), self.feat_drop(feat[1])
        else:
            feat_src = feat_dst = self.feat_drop(feat)
            if s.is_block:
                feat_dst = feat_src[:s.num_dst]
        w = None if edge_weight is None else _column(s.to_csc_order(edge_weight), feat_src.dim())
        lin_before_mp = self._in_src_feats > self._out_feats
        if self._aggre_type == "mean":
            h_neigh = ops.neighbour_mean(s, self.fc_neigh(feat_src) if lin_before_mp else feat_src, w)
            if not lin_before_mp:
                h_neigh = self.fc_neigh(h_neigh)
        elif self._aggre_type == "gcn":
            h_neigh = self._gcn(s, feat_src, feat_dst, pair, lin_before_mp, w)
        else:
            h_neigh = self.fc_neigh(ops.neighbour_max(s, F.relu(self.fc_pool(feat_src)), w))
        if self._aggre_type == "gcn":
            rst = h_neigh if self.bias is None else h_neigh + self.bias
        else:
            rst = self.fc_self(feat_dst) + h_neigh
        if self.activation is not None:
            rst = self.activation(rst)
        if self.norm is not None:
            rst = self.norm(rst)
        return rst

    def _gcn(self, s: ops.Structure, feat_src: torch.Tensor, feat_dst: torch.Tensor, pair: bool,
             lin_before_mp: bool, w: Optional[torch.Tensor]) -> torch.Tensor:
        if feat_src.shape[-1] != feat_dst.shape[-1]:
            raise ValueError("graphtrainer.nn.SAGEConv('gcn') needs source and destination features of one size, "
                             f"got {feat_src.shape[-1]} and {feat_dst.shape[-1]}")
        h_src = self.fc_neigh(feat_src) if lin_before_mp else feat_src
        if pair:
            h_dst = self.fc_neigh(feat_dst) if lin_before_mp else feat_dst
        else:
            h_dst = h_src[:s.num_dst] if s.is_block else h_src
        degs = s.in_degrees().to(feat_dst)
        h_neigh = (ops.neighbour_sum(s, h_src, w) + h_dst) / (degs.unsqueeze(-1) + 1)
        return h_neigh if lin_before_mp else self.fc_neigh(h_neigh)


def _column(w: torch.Tensor, dim: int) -> torch.Tensor:
    """Per-edge weights shaped to broadcast against per-edge rows of ``dim`` dimensions."""
    return w.reshape(w.shape[0], *([1] * (dim - 1))) if w.dim() == 1 else w


class GraphConv(nn.Module):
    """GCN (Kipf and Welling): ``norm`` "both" (symmetric), "right" (mean over in-edges),
    "left" (by source out-degree) or "none". Like DGL's layer it adds no self-loops and
    refuses destinations without in-edges unless ``allow_zero_in_degree=True``."""

    def __init__(self, in_feats: int, out_feats: int, norm: str = "both", weight: bool = True, bias: bool = True,
                 activation: Optional[Callable[[torch.Tensor], torch.Tensor]] = None,
                 allow_zero_in_degree: bool = False):
        super().__init__()
        if norm not in ("none", "both", "right", "left"):
            raise ValueError(f"graphtrainer.nn.GraphConv: norm={norm!r}; choose 'none', 'both', 'right' or 'left'")
        self._in_feats, self._out_feats, self._norm = in_feats, out_feats, norm
        self._allow_zero_in_degree = allow_zero_in_degree
        if weight:
            self.weight = nn.Parameter(torch.empty(in_feats, out_feats))
        else:
            self.register_parameter("weight", None)
        if bias:
            self.bias = nn.Parameter(torch.empty(out_feats))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()
        self._activation = activation

    def reset_parameters(self) -> None:
        if self.weight is not None:
            nn.init.xavier_uniform_(self.weight)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def set_allow_zero_in_degree(self, set_value: bool) -> None:
        self._allow_zero_in_degree = set_value

    def forward(self, graph: Any, feat: Any, weight: Optional[torch.Tensor] = None,
                edge_weight: Optional[torch.Tensor] = None) -> torch.Tensor:
        s = ops.structure(graph, "graphtrainer.nn.GraphConv")
        ops.check_in_degrees(s, "graphtrainer.nn.GraphConv", self._allow_zero_in_degree)
        w = None if edge_weight is None else s.to_csc_order(edge_weight)
        feat_src, feat_dst, _ = ops.split_features(s, feat)
        if self._norm in ("left", "both"):
            degs = s.out_degrees().to(feat_src).clamp(min=1)
            norm = degs.pow(-0.5) if self._norm == "both" else 1.0 / degs
            feat_src = feat_src * norm.reshape(norm.shape + (1,) * (feat_src.dim() - 1))
        if weight is not None and self.weight is not None:
            raise ValueError("graphtrainer.nn.GraphConv: an external weight was given but the layer has its own; "
                             "construct it with weight=False")
        weight = self.weight if weight is None else weight
        if w is not None:
            w = _column(w, feat_src.dim())
        if self._in_feats > self._out_feats:
            if weight is not None:
                feat_src = torch.matmul(feat_src, weight)
            rst = ops.neighbour_sum(s, feat_src, w)
        else:
            rst = ops.neighbour_sum(s, feat_src, w)
            if weight is not None:
                rst = torch.matmul(rst, weight)
        if self._norm in ("right", "both"):
            degs = s.in_degrees().to(feat_dst).clamp(min=1)
            norm = degs.pow(-0.5) if self._norm == "both" else 1.0 / degs
            rst = rst * norm.reshape(norm.shape + (1,) * (feat_dst.dim() - 1))
        if self.bias is not None:
            rst = rst + self.bias
        if self._activation is not None:
            rst = self._activation(rst)
        return rst

    def extra_repr(self) -> str:
        return f"in={self._in_feats}, out={self._out_feats}, normalization={self._norm}"
