"""A rank's side of a DistDGL run: joining the graph servers, the ``DistGraph``, leaving.

Before the ranks start a task holds a :class:`PartitionedGraph` as ``self.graph``: a light,
picklable handle giving ``__init__`` and ``configure_model`` feature shapes, number of classes
and split sizes (from the files :mod:`graphtrainer.cli.partition` writes). In every rank the
trainer replaces it with the opened ``dgl.distributed.DistGraph``.
"""
from __future__ import annotations

import contextlib
import io
import logging
import os
import sys
from typing import Any, Dict, Optional, Tuple

from .cluster import Cluster, config_path

_cluster: Optional[Cluster] = None  # this rank's, from connect()
_local_rank = 0


class PartitionedGraph:
    """A partitioned graph on disk, as a task holds it before the ranks open it:
    ``PartitionedGraph("parts/cora.json")`` (or the folder). A fit of such a task runs on
    DistDGL, this machine alone, or several with ``Trainer(ip_config=...)``."""

    def __init__(self, part_config: os.PathLike | str):
        from .partition import read_meta  # here: partition imports dgl, and a task holding this needs none

        self.part_config = config_path(part_config)
        self.meta: Dict[str, Any] = read_meta(self.part_config)

    @property
    def name(self) -> str:
        return str(self.meta["name"])

    def num_nodes(self) -> int:
        return int(self.meta["num_nodes"])

    def num_edges(self) -> int:
        return int(self.meta["num_edges"])

    @property
    def num_classes(self) -> Optional[int]:
        """Classes of the ``label`` node data (max + 1), when the graph has labels."""
        value = self.meta.get("num_classes")
        return None if value is None else int(value)

    def feature_shape(self, key: str = "feat") -> Tuple[int, ...]:
        """The shape of one node's ``key`` data (``(1433,)`` for Cora's ``feat``)."""
        ndata = self.meta.get("ndata", {})
        if key not in ndata:
            raise KeyError(f"{self.part_config} has no node data {key!r}; it has {sorted(ndata)}")
        return tuple(int(d) for d in ndata[key]["shape"])

    @property
    def ndata(self) -> Dict[str, Any]:
        """Node data as shape-only ``meta`` tensors (``g.ndata["feat"].shape[1]`` works, as on
        an in-memory graph); the values live with the graph servers."""
        import torch

        return {key: torch.empty((self.num_nodes(), *spec["shape"]), dtype=getattr(torch, spec["dtype"].split(".")[-1]),
                                 device="meta")
                for key, spec in self.meta.get("ndata", {}).items()}

    def __repr__(self) -> str:
        return f"PartitionedGraph({self.part_config!r}: {self.num_nodes()} nodes, {self.meta.get('num_parts')} parts)"


def connect(cluster: Cluster, local_rank: int) -> None:
    """Join the graph servers (DGL's ``initialize``). Before ``torch.distributed``'s
    process group, as DGL requires; blocks until every server has all its clients."""
    import dgl  # here: the engine imports without DGL (plain-torch tasks)

    global _cluster, _local_rank
    logging.getLogger("dgl-distributed-socket").setLevel(logging.ERROR)  # a line per address-less interface
    os.environ.update(DGL_DIST_MODE="distributed", DGL_ROLE="client",
                      DGL_NUM_SERVER=str(cluster.options.num_servers), DGL_NUM_SAMPLER="0",
                      DGL_GROUP_ID="0", DGL_IP_CONFIG=cluster.ip_config_path)
    with _quiet():
        dgl.distributed.initialize(cluster.ip_config_path)
    _cluster, _local_rank = cluster, local_rank


def open_graph(cluster: Cluster) -> Any:
    """This rank's ``DistGraph`` of the partitioned graph."""
    import dgl  # here: the engine imports without DGL (plain-torch tasks)

    with _quiet():
        return dgl.distributed.DistGraph(cluster.options.graph_name, part_config=cluster.options.part_config)


def disconnect() -> None:
    """Leave the servers; the clients' rank 0 asks them to shut down. Must be called on all
    ranks (DGL's client barrier), and only after a successful run."""
    import dgl  # here: the engine imports without DGL (plain-torch tasks)

    global _cluster
    with _quiet():
        dgl.distributed.exit_client()
    _cluster = None


def machine_share() -> Tuple[int, int]:
    """``(index of this rank on its machine, trainer ranks per machine)``; ``(0, 1)`` outside
    a DistDGL run."""
    if _cluster is None:
        return 0, 1
    return _local_rank, _cluster.trainers_per_machine


def is_dist_graph(graph: Any) -> bool:
    dgl_distributed = _dgl_distributed()
    return dgl_distributed is not None and isinstance(graph, dgl_distributed.DistGraph)


def is_dist_tensor(value: Any) -> bool:
    dgl_distributed = _dgl_distributed()
    return dgl_distributed is not None and isinstance(value, dgl_distributed.DistTensor)


def _dgl_distributed() -> Any:
    dgl = sys.modules.get("dgl")
    return getattr(dgl, "distributed", None) if dgl is not None else None


@contextlib.contextmanager
def _quiet() -> Any:
    """DGL prints a line per client and step of its handshake; keep them out of the run's output."""
    with contextlib.redirect_stdout(io.StringIO()):
        yield
