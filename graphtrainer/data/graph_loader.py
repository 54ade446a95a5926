"""Minibatches of whole graphs (graph classification/regression) over this rank's share.

Many small graphs are packed into a :class:`PackedGraphs`: edges and features concatenated
into a few flat tensors with offsets, labels stacked. With spawn these few tensors go to
shared memory once (a list of ``DGLGraph`` objects would each be pickled with its own
segments and file descriptors); a batch rebuilt from slices equals ``dgl.batch`` of the
originals. 2,000 MiniGC graphs as a list could not be spawned under ``ulimit -n 1024``;
packed, they trained an epoch in 4.3 s (10.9 s for the list with a higher limit);
:func:`graphtrainer.launch.preflight.prepare_graphs` warns about such lists.
"""
from __future__ import annotations

import warnings
from typing import Any, Dict, Iterator, Optional, Sequence, Tuple

import torch

from .sharded_loader import ShardedLoader


def _ranges(starts: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """``cat([arange(s, s + n) for s, n in zip(starts, lengths)])`` without a Python loop."""
    total = int(lengths.sum())
    if total == 0:
        return torch.zeros(0, dtype=torch.int64)
    offsets = torch.cumsum(lengths, 0) - lengths
    return torch.arange(total) - torch.repeat_interleave(offsets - starts, lengths)


class PackedGraphs:
    """A dataset of graphs as flat tensors: ``len``, ``[i]`` gives ``(graph, label)``,
    :meth:`batch` ``(dgl.batch(graphs), labels)``. ``dataset``: a ``DGLDataset`` or sequence
    of ``(graph, label)`` of homogeneous graphs; features kept are those every graph has (a key
    only some graphs have is left out with a warning naming it; one whose shape differs is refused)."""

    def __init__(self, dataset: Any):
        import dgl  # here: the engine imports without DGL (plain-torch tasks)

        try:
            n = len(dataset)
        except TypeError:
            raise ValueError(f"graph_dataloader: expected a dataset with len() (a DGLDataset or a list of "
                             f"(graph, label) pairs), got {type(dataset).__name__}") from None
        if n == 0:
            raise ValueError("graph_dataloader: the dataset has no graphs")
        graphs, labels = [], []
        for i in range(n):
            item = dataset[i]
            if not (isinstance(item, (tuple, list)) and len(item) == 2 and isinstance(item[0], dgl.DGLGraph)):
                raise ValueError(f"graph_dataloader: item {i} of the dataset is {type(item).__name__}; "
                                 "expected a (DGLGraph, label) pair")
            if len(item[0].ntypes) != 1 or len(item[0].etypes) != 1:
                raise ValueError(f"graph_dataloader: graph {i} is heterogeneous; only homogeneous graphs are packed")
            graphs.append(item[0])
            labels.append(torch.as_tensor(item[1]))
        self.num_nodes = torch.tensor([g.num_nodes() for g in graphs], dtype=torch.int64)
        self.num_edges = torch.tensor([g.num_edges() for g in graphs], dtype=torch.int64)
        self.node_ptr = torch.cumsum(self.num_nodes, 0) - self.num_nodes
        self.edge_ptr = torch.cumsum(self.num_edges, 0) - self.num_edges
        ends = [g.edges() for g in graphs]
        self.src = torch.cat([s for s, _ in ends]).to(torch.int64)  # local node ids of each graph
        self.dst = torch.cat([d for _, d in ends]).to(torch.int64)
        self.ndata = self._common([g.ndata for g in graphs], "node")
        self.edata = self._common([g.edata for g in graphs], "edge")
        self.labels = torch.stack(labels)
        # Batches in the graphs' id type, as dgl.batch gives them (int32 graphs stay int32).
        self.idtype = graphs[0].idtype if all(g.idtype == graphs[0].idtype for g in graphs) else torch.int64

    @staticmethod
    def _common(frames: Sequence[Any], kind: str) -> Dict[str, torch.Tensor]:
        keys = set(frames[0].keys())
        for frame in frames[1:]:
            keys &= set(frame.keys())
        # A key some graphs lack is left out of every batch: say so here, not as a KeyError in a rank's step.
        partial = sorted({k for frame in frames for k in frame.keys() if not k.startswith("_")} - keys)
        for k in partial:
            missing = [i for i, frame in enumerate(frames) if k not in frame.keys()]
            warnings.warn(f"graph_dataloader: {kind} data {k!r} is missing from {len(missing)} of {len(frames)} "
                          f"graphs (e.g. graph {missing[0]}), so no batch has it (dgl.batch refuses such a "
                          f"dataset). Fix: give every graph {k!r}, or delete it from all", UserWarning, stacklevel=3)
        out = {}
        for k in sorted(keys):
            if k.startswith("_"):
                continue
            shapes = {tuple(frame[k].shape[1:]) for frame in frames}
            if len(shapes) > 1:
                raise ValueError(f"graph_dataloader: {kind} data {k!r} has different shapes per row across the "
                                 f"graphs: {sorted(shapes)}; every graph's {k!r} needs the same shape past its first "
                                 "dimension, as dgl.batch needs")
            out[k] = torch.cat([frame[k] for frame in frames])
        return out

    def __len__(self) -> int:
        return self.num_nodes.numel()

    def __getitem__(self, i: int) -> Tuple[Any, torch.Tensor]:
        graph, labels = self.batch(torch.tensor([int(i)]))
        graph.set_batch_num_nodes(graph.batch_num_nodes()[:1])  # a plain graph, batch_size 1
        return graph, labels[0]

    def batch(self, indices: torch.Tensor) -> Tuple[Any, torch.Tensor]:
        """``(batched graph, labels)`` of graphs ``indices``, in that order."""
        import dgl  # here: the engine imports without DGL (plain-torch tasks)

        indices = torch.as_tensor(indices, dtype=torch.int64)
        nn_, ne = self.num_nodes[indices], self.num_edges[indices]
        nodes = _ranges(self.node_ptr[indices], nn_)
        edges = _ranges(self.edge_ptr[indices], ne)
        new_base = torch.cumsum(nn_, 0) - nn_  # first node of each graph in the batch
        shift = torch.repeat_interleave(new_base, ne)
        g = dgl.graph((self.src[edges] + shift, self.dst[edges] + shift), num_nodes=int(nn_.sum()),
                      idtype=self.idtype)
        for key, value in self.ndata.items():
            g.ndata[key] = value[nodes]
        for key, value in self.edata.items():
            g.edata[key] = value[edges]
        g.set_batch_num_nodes(nn_.to(self.idtype))
        g.set_batch_num_edges(ne.to(self.idtype))
        return g, self.labels[indices]


class GraphLoader(ShardedLoader):
    """Batches of whole graphs, ``(dgl.batch(graphs), labels)``, over this rank's share of
    the graph indices ``indices`` (default: all). Evaluation sees every graph once, and
    ``Trainer.predict`` returns rows in the order of ``indices``."""

    def __init__(self, graphs: PackedGraphs, batch_size: int, indices: Any = None, *,
                 shuffle: bool = True, drop_last: bool = False, even: Optional[str] = None, seed: int = 0):
        if not isinstance(graphs, PackedGraphs):
            graphs = PackedGraphs(graphs)
        n = len(graphs)
        if indices is None:
            ids = torch.arange(n)
        else:
            ids = torch.as_tensor(indices)
            if ids.dtype == torch.bool:
                if ids.numel() != n:
                    raise ValueError(f"graph_dataloader indices: a boolean mask needs one entry per graph ({n})")
                ids = ids.nonzero(as_tuple=True)[0]
            if ids.dtype not in (torch.int64, torch.int32) or ids.dim() != 1:
                raise ValueError("graph_dataloader indices: expected a 1-D integer tensor of graph indices")
            if ids.numel() == 0:
                raise ValueError("graph_dataloader indices: the index set is empty")
            if int(ids.min()) < 0 or int(ids.max()) >= n:
                raise ValueError(f"graph_dataloader indices: must lie in [0, {n}), found min "
                                 f"{int(ids.min())} and max {int(ids.max())}")
            ids = ids.to(torch.int64)
        super().__init__(ids, batch_size, shuffle=shuffle, drop_last=drop_last, even=even, seed=seed)
        self.graphs = graphs

    def check_world(self, world_size: int) -> None:
        # Fewer graphs than ranks: a rank would train on padding only, almost surely a mistake.
        if self.ids.numel() < world_size:
            raise ValueError(f"graph_dataloader: {self.ids.numel()} graphs cannot be split between "
                             f"{world_size} ranks; give every rank at least one graph (more graphs "
                             "or fewer ranks)")

    def __iter__(self) -> Iterator[Tuple[Any, torch.Tensor]]:
        return (self.graphs.batch(b) for b in self.local_batches())
