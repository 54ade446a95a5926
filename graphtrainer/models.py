"""Reference GNNs for block (minibatch) training: GraphSAGE as in DGL's examples."""
from __future__ import annotations

from typing import Any, List, Sequence

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
        from dgl.nn import SAGEConv

        if num_layers < 1:
            raise ValueError("num_layers must be at least 1")
        sizes: List[int] = [in_feats] + [hidden] * (num_layers - 1) + [out_feats]
        self.layers = nn.ModuleList(SAGEConv(sizes[i], sizes[i + 1], aggregator) for i in range(num_layers))
        self.dropout = nn.Dropout(dropout)

    def forward(self, blocks: Sequence[Any], x: torch.Tensor) -> torch.Tensor:
        if len(blocks) != len(self.layers):
            raise ValueError(f"SAGE has {len(self.layers)} layers but got {len(blocks)} blocks: "
                             "use as many fanouts as layers")
        h = x
        for i, (layer, block) in enumerate(zip(self.layers, blocks)):
            h = layer(block, h)
            if i != len(self.layers) - 1:
                h = self.dropout(torch.relu(h))
        return h
