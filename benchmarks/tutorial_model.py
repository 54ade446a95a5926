"""The 2-layer GraphSAGE of DGL's multi-GPU node-classification tutorial, shared by its script
(``dgl_tutorial.py``) and its GraphTask port (``tutorial_task.py``)."""
import torch.nn as nn
import torch.nn.functional as F
from dgl.nn import SAGEConv

HIDDEN = 128  # the tutorial's Model(num_features, 128, num_classes)


class Model(nn.Module):
    def __init__(self, in_feats: int, h_feats: int, num_classes: int):
        super().__init__()
        self.conv1 = SAGEConv(in_feats, h_feats, aggregator_type="mean")
        self.conv2 = SAGEConv(h_feats, num_classes, aggregator_type="mean")
        self.h_feats = h_feats

    def forward(self, mfgs, x):
        h_dst = x[: mfgs[0].num_dst_nodes()]  # an MFG's destination nodes come first among its sources
        h = F.relu(self.conv1(mfgs[0], (x, h_dst)))
        h_dst = h[: mfgs[1].num_dst_nodes()]
        return self.conv2(mfgs[1], (h, h_dst))
