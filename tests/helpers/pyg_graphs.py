"""What the PyG batch tests share: a random graph, a task asking for PyG batches, and a loader
placed for one sampling mode."""
from __future__ import annotations

import torch

import graphtrainer  # noqa: F401  (DGL's compatibility layer first)
import dgl

from graphtrainer import GraphTask
from graphtrainer.data.device import mode

CPU = torch.device("cpu")


def random_graph(seed: int, n: int = 300, m: int = 2400):
    gen = torch.Generator().manual_seed(seed)
    g = dgl.graph((torch.randint(0, n, (m,), generator=gen), torch.randint(0, n, (m,), generator=gen)), num_nodes=n)
    g.ndata["feat"] = torch.randn(n, 5, generator=gen)
    g.ndata["label"] = torch.randint(0, 3, (n,), generator=gen)
    return g


class PygTask(GraphTask):
    batch_format = "pyg"

    def __init__(self, graph):
        super().__init__()
        self.graph = graph


def placed(loader, sampling):
    assert mode.place(loader, CPU, sampling, announce=False) == sampling
    return loader
