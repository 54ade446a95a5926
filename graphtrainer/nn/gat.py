"""``GATConv`` in plain torch, taking a DGL graph/block or a torch block; the same
arguments, parameter names, initialisation order and results as ``dgl.nn.GATConv``."""
from __future__ import annotations

from typing import Any, Callable, Optional, Tuple, Union

import torch
from torch import nn

from . import ops


class GATConv(nn.Module):
    """Graph attention (Velickovic et al.): per head, the in-edge softmax of ``leaky_relu(a_l·Wh_u
    + a_r·Wh_v)`` weights the sum of ``Wh_u``; output ``[num_dst, num_heads, out_feats]``.
    ``feat_drop``/``attn_drop`` drop inputs/attention; ``residual`` adds the destination input."""

    def __init__(self, in_feats: Union[int, Tuple[int, int]], out_feats: int, num_heads: int, feat_drop: float = 0.0,
                 attn_drop: float = 0.0, negative_slope: float = 0.2, residual: bool = False,
                 activation: Optional[Callable[[torch.Tensor], torch.Tensor]] = None,
                 allow_zero_in_degree: bool = False, bias: bool = True):
        super().__init__()
        if num_heads < 1:
            raise ValueError(f"graphtrainer.nn.GATConv: num_heads must be at least 1, got {num_heads}")
        self._num_heads = num_heads
        pair = isinstance(in_feats, (tuple, list))
        self._in_src_feats, self._in_dst_feats = (in_feats[0], in_feats[1]) if pair else (in_feats, in_feats)
        self._out_feats = out_feats
        self._allow_zero_in_degree = allow_zero_in_degree
        if pair:
            self.fc_src = nn.Linear(self._in_src_feats, out_feats * num_heads, bias=False)
            self.fc_dst = nn.Linear(self._in_dst_feats, out_feats * num_heads, bias=False)
        else:
            self.fc = nn.Linear(self._in_src_feats, out_feats * num_heads, bias=False)
        self.attn_l = nn.Parameter(torch.empty(1, num_heads, out_feats))
        self.attn_r = nn.Parameter(torch.empty(1, num_heads, out_feats))
        self.feat_drop = nn.Dropout(feat_drop)
        self.attn_drop = nn.Dropout(attn_drop)
        self.leaky_relu = nn.LeakyReLU(negative_slope)
        self.has_linear_res = False
        self.has_explicit_bias = False
        if residual:
            if self._in_dst_feats != out_feats * num_heads:
                self.res_fc = nn.Linear(self._in_dst_feats, num_heads * out_feats, bias=bias)
                self.has_linear_res = True
            else:
                self.res_fc = nn.Identity()
        else:
            self.register_buffer("res_fc", None)
        if bias and not self.has_linear_res:
            self.bias = nn.Parameter(torch.empty(num_heads * out_feats))
            self.has_explicit_bias = True
        else:
            self.register_buffer("bias", None)
        self.reset_parameters()
        self.activation = activation

    def reset_parameters(self) -> None:
        """Glorot-normal weights with ReLU gain, zero biases, in DGL's order."""
        gain = nn.init.calculate_gain("relu")
        if hasattr(self, "fc"):
            nn.init.xavier_normal_(self.fc.weight, gain=gain)
        else:
            nn.init.xavier_normal_(self.fc_src.weight, gain=gain)
            nn.init.xavier_normal_(self.fc_dst.weight, gain=gain)
        nn.init.xavier_normal_(self.attn_l, gain=gain)
        nn.init.xavier_normal_(self.attn_r, gain=gain)
        if self.has_explicit_bias:
            nn.init.constant_(self.bias, 0)
        if isinstance(self.res_fc, nn.Linear):
            nn.init.xavier_normal_(self.res_fc.weight, gain=gain)
            if self.res_fc.bias is not None:
                nn.init.constant_(self.res_fc.bias, 0)

    def set_allow_zero_in_degree(self, set_value: bool) -> None:
        self._allow_zero_in_degree = set_value

    def _project(self, s: ops.Structure, feat: Any) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(feat_src, feat_dst, h_dst)``: projected per head, and the dropped-out destination input."""
        heads, out = self._num_heads, self._out_feats
        if isinstance(feat, (tuple, list)):
            h_src, h_dst = self.feat_drop(feat[0]), self.feat_drop(feat[1])
            fc_src, fc_dst = (self.fc, self.fc) if hasattr(self, "fc") else (self.fc_src, self.fc_dst)
            return (fc_src(h_src).view(*h_src.shape[:-1], heads, out),
                    fc_dst(h_dst).view(*h_dst.shape[:-1], heads, out), h_dst)
        h_src = h_dst = self.feat_drop(feat)
        feat_src = feat_dst = self.fc(h_src).view(*h_src.shape[:-1], heads, out)
        if s.is_block:
            feat_dst, h_dst = feat_src[:s.num_dst], h_dst[:s.num_dst]
        return feat_src, feat_dst, h_dst

    def forward(self, graph: Any, feat: Any, edge_weight: Optional[torch.Tensor] = None,
                get_attention: bool = False) -> Any:
        """Per-head outputs for the destination nodes (and, with ``get_attention``, the
        attention of every edge in edge-id order, ``[E, num_heads, 1]``)."""
        s = ops.structure(graph, "graphtrainer.nn.GATConv")
        ops.check_in_degrees(s, "graphtrainer.nn.GATConv", self._allow_zero_in_degree)
        feat_src, feat_dst, h_dst = self._project(s, feat)
        el = (feat_src * self.attn_l).sum(dim=-1).unsqueeze(-1)
        er = (feat_dst * self.attn_r).sum(dim=-1).unsqueeze(-1)
        e = self.leaky_relu(el[s.indices] + er[s.dst])
        a = ops.edge_softmax(s, e)
        if self.training and self.attn_drop.p > 0:
            # Dropped in edge-id order, as DGL does, so a seed drops the same edges on either graph.
            a = s.to_csc_order(self.attn_drop(s.to_edge_order(a)))
        if edge_weight is not None:
            a = a * s.to_csc_order(edge_weight).reshape(-1, 1, 1)
        rst = ops.neighbour_sum(s, feat_src, a)
        if self.res_fc is not None:
            rst = rst + self.res_fc(h_dst).view(*h_dst.shape[:-1], -1, self._out_feats)
        if self.has_explicit_bias:
            rst = rst + self.bias.view(*((1,) * (rst.dim() - 2)), self._num_heads, self._out_feats)
        if self.activation:
            rst = self.activation(rst)
        return (rst, s.to_edge_order(a)) if get_attention else rst
