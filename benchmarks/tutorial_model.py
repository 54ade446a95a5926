"""The 2-layer GraphSAGE of DGL's multi-GPU node-classification tutorial ("Single Machine
Multi-GPU Minibatch Node Classification"), in one module so that the tutorial's script
(``dgl_tutorial.py``) and its GraphTask port (``tutorial_task.py``) train the same network."""
from __future__ import annotations

import torch.nn as nn
import torch.nn.functional as F
from dgl.nn import SAGEConv

#: The tutorial's hidden width (``Model(num_features, 128, num_classes)``).
HIDDEN = 128


class Model(nn.Module):
    """Two mean-aggregator SAGE convolutions on a pair of message-flow graphs, ReLU between."""

    def __init__(self, in_feats: int, h_feats: int, num_classes: int):
        super().__init__()
        self.conv1 = SAGEConv(in_feats, h_feats, aggregator_type="mean")
        self.conv2 = SAGEConv(h_feats, num_classes, aggregator_type="mean")
        self.h_feats = h_feats

    def forward(self, mfgs, x):
        # The destination nodes of an MFG are the first of its source nodes.
        h_dst = x[: mfgs[0].num_dst_nodes()]
        h = F.relu(self.conv1(mfgs[0], (x, h_dst)))
        h_dst = h[: mfgs[1].num_dst_nodes()]
        return self.conv2(mfgs[1], (h, h_dst))
