"""Checking a loader before its first batch: graphtrainer's own split, and DGL's loaders'
ids, which DGL would otherwise take into a C++ abort or an uneven ``use_ddp`` split."""
from __future__ import annotations

import math
import sys
import warnings
from typing import Any

import torch

from .edge_loader import check_reverse_eids
from .sharded_loader import ShardedLoader
from .sharding import check_seed_ids


def check_loader(loader: Any, world_size: int, evaluation: bool = False) -> None:
    """A clear ``ValueError`` for a loader that would crash its process in C++ or cannot be
    split between ``world_size`` ranks. Run in each rank before the first batch.

    graphtrainer's loaders check their ids when built and their split here. DGL's
    ``DataLoader`` gets its node ids, or edge and reverse edge ids, checked (DGL aborts on
    out-of-range ids, and 2.1's ``use_ddp`` split of tiny id sets pads with uninitialised ids,
    then segfaults); ``GraphDataLoader`` needs a graph per rank with ``use_ddp``. With
    ``evaluation``, a ``use_ddp`` split padding with repeats is warned about (scored twice).
    """
    if isinstance(loader, ShardedLoader):
        loader.check_world(world_size)
        if not evaluation:
            loader.check_training_batches()
        return
    dgl = sys.modules.get("dgl")
    if dgl is None:
        return
    if isinstance(loader, dgl.dataloading.GraphDataLoader):
        n = len(loader.dataset)
        if n == 0:
            raise ValueError("GraphDataLoader: the dataset has no graphs")
        if getattr(loader, "use_ddp", False) and n < world_size:
            raise ValueError(f"GraphDataLoader(use_ddp=True): {n} graphs cannot be split between "
                             f"{world_size} ranks; use fewer ranks")
        if evaluation and getattr(loader, "use_ddp", False):
            _warn_padded(n, world_size, "GraphDataLoader(use_ddp=True)", "self.graph_dataloader(...)")
        return
    if not isinstance(loader, dgl.dataloading.DataLoader):
        return
    ids, graph = getattr(loader, "indices", None), getattr(loader, "graph", None)
    if not isinstance(ids, torch.Tensor) or not isinstance(graph, dgl.DGLGraph) or len(graph.ntypes) != 1:
        return
    edge_sampler = getattr(loader, "graph_sampler", None)
    if isinstance(edge_sampler, dgl.dataloading.EdgePredictionSampler):
        check_seed_ids(ids, graph.num_edges(), "DataLoader edge ids", unit="edge")
        if getattr(edge_sampler, "reverse_eids", None) is not None:
            check_reverse_eids(graph, edge_sampler.reverse_eids)
    else:
        check_seed_ids(ids, graph.num_nodes(), "DataLoader indices")
    if evaluation and getattr(loader, "use_ddp", False) and not getattr(loader, "drop_last", False):
        _warn_padded(ids.numel(), world_size, "dgl.dataloading.DataLoader(use_ddp=True)",
                     "self.node_dataloader(...) or self.edge_dataloader(...)")
    if getattr(loader, "use_ddp", False) and not getattr(loader, "drop_last", False):
        n, share = ids.numel(), math.ceil(ids.numel() / world_size)
        if any(2 * min(share, n - r * share) < share for r in range(world_size)):
            raise ValueError(
                f"dgl.dataloading.DataLoader(use_ddp=True) cannot split {n} ids between {world_size} "
                "ranks: DGL 2.1 would pad a rank with uninitialised ids and crash. Use "
                "self.node_dataloader(...) or self.edge_dataloader(...) (any number of ids), "
                "drop_last=True, or fewer ranks."
            )


def _warn_padded(n: int, world_size: int, what: str, instead: str) -> None:
    extra = -n % world_size
    if extra:
        warnings.warn(f"{what} pads {n} evaluation ids to {n + extra} for {world_size} ranks: {extra} of them "
                      f"are scored twice and predictions are not in the given order. Use {instead}, which "
                      "scores each one exactly once.", UserWarning, stacklevel=3)
