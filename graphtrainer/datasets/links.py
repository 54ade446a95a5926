"""The classic link-prediction split of a graph's edges."""
from __future__ import annotations

from typing import Tuple

import torch

import dgl

from ._checks import _check_frac


class LinkSplit:
    """Edges of one graph split for link prediction (see :func:`link_split`).

    - ``graph``: the training graph: all nodes and ``ndata``; edge ``i < m`` is the ``i``-th
      training edge ``(u, v)`` and edge ``m + i`` its reverse ``(v, u)``.
    - ``train_eids``: ``arange(m)``, each undirected training edge once.
    - ``reverse_eids``: the reverse of every edge of ``graph``, for ``exclude="reverse_id"``.
    - ``val``, ``test``: ``(src, dst)`` node pairs of held-out edges, not in ``graph``.
    """

    def __init__(self, graph: dgl.DGLGraph, train_eids: torch.Tensor, reverse_eids: torch.Tensor,
                 val: Tuple[torch.Tensor, torch.Tensor], test: Tuple[torch.Tensor, torch.Tensor]):
        self.graph, self.train_eids, self.reverse_eids = graph, train_eids, reverse_eids
        self.val, self.test = val, test

    def __repr__(self) -> str:
        return (f"LinkSplit({self.graph.num_nodes()} nodes; undirected edges train/val/test "
                f"{self.train_eids.numel()}/{self.val[0].numel()}/{self.test[0].numel()})")


def link_split(graph: dgl.DGLGraph, val_frac: float = 0.05, test_frac: float = 0.10,
               seed: int = 0) -> LinkSplit:
    """The classic link-prediction split (as in the GAE paper): the undirected edges, each once
    (no self-loops or duplicates), permuted with ``seed``: ``test_frac`` (rounded down) test,
    the next ``val_frac`` validation, the rest (85 % by default) train. Node data is kept, edge
    data is not; negatives come from the loaders.
    """
    val_frac, test_frac = _check_frac("val_frac", val_frac), _check_frac("test_frac", test_frac)
    if val_frac + test_frac >= 1:
        raise ValueError(f"val_frac + test_frac must be below 1, got {val_frac + test_frac}")
    src, dst = graph.edges()
    lo, hi = torch.minimum(src, dst), torch.maximum(src, dst)
    keep = lo != hi
    n = graph.num_nodes()
    key = torch.unique(lo[keep].to(torch.int64) * n + hi[keep].to(torch.int64))  # sorted: reproducible
    if key.numel() < 3:
        raise ValueError(f"link_split: the graph has {key.numel()} undirected edges; need at least 3")
    key = key[torch.randperm(key.numel(), generator=torch.Generator().manual_seed(int(seed)))]
    u, v = key // n, key % n
    n_test, n_val = int(key.numel() * test_frac), int(key.numel() * val_frac)
    test = (u[:n_test], v[:n_test])
    val = (u[n_test:n_test + n_val], v[n_test:n_test + n_val])
    tu, tv = u[n_test + n_val:], v[n_test + n_val:]
    m = tu.numel()
    train = dgl.graph((torch.cat([tu, tv]), torch.cat([tv, tu])), num_nodes=n)
    for k, value in graph.ndata.items():
        train.ndata[k] = value
    reverse = torch.cat([torch.arange(m, 2 * m), torch.arange(m)])
    return LinkSplit(train, torch.arange(m), reverse, val, test)
