"""Keys of the graph that a device batch did not gather, read when a step asks for them.

DGL's CPU blocks read any node or edge data key of the graph on access
(``blocks[0].srcdata["train_mask"]``, ``blocks[-1].dstdata["year"]``); device-sampled blocks
gather only what the sampler names. So that code written for DGL's blocks keeps working, the
blocks (and an edge loader's positive pair graph) read a missing key from the graph by their
``_ID`` rows (:mod:`graphtrainer.nn.lazy_data`): the same values as DGL's, gathered on the host
and copied to the block's device at each read. That costs a host gather, a copy and a wait per
batch, so the first read of each key in a process warns, naming the prefetch argument that
gathers it with the batch instead.
"""
from __future__ import annotations

import os
import sys
import warnings
from typing import Any, List, Set, Tuple

import torch

from ...nn.blocks import TorchBlock, TorchHeteroBlock
from ...nn.lazy_data import NID, LazyData, LazyStore

_PACKAGE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + os.sep
#: (edge data?, key) already warned about in this process.
WARNED: Set[Tuple[bool, str]] = set()


class HostReadWarning(UserWarning):
    """A step read graph data the device sampler did not gather (read per batch from the host)."""


class GraphSource:
    """The sampled graph's data, read by the blocks of every batch of a loader. It holds the
    graph itself (the loader holds it too): no copy is made, and data set on the graph since
    is what is read, as with DGL's blocks."""

    def __init__(self, graph: Any):
        self.graph = graph

    def _data(self, edge: bool, type_: Any) -> Any:
        return (self.graph.edges if edge else self.graph.nodes)[type_].data

    def has(self, edge: bool, type_: Any, key: str) -> bool:
        return key != NID and key in self._data(edge, type_)

    def keys(self, edge: bool, type_: Any) -> List[str]:
        return [k for k in self._data(edge, type_).keys() if k != NID]  # the graph's order, as DGL lists

    def read(self, edge: bool, type_: Any, key: str, ids: torch.Tensor, where: str) -> torch.Tensor:
        """Rows ``ids`` of the graph's ``key`` of ``type_``, on the device of ``ids``."""
        _warn_once(edge, key, where, ids.device, self.graph)
        value = self._data(edge, type_)[key]
        rows = value.index_select(0, ids.to(value.device, torch.int64))
        return rows.to(ids.device)

    def __copy__(self) -> "GraphSource":
        return self

    def __deepcopy__(self, memo: dict) -> "GraphSource":
        return self  # the graph is shared, never copied

    def __reduce__(self) -> Any:
        raise TypeError("GraphSource holds the sampled graph and is not pickled (a pickled block drops it)")


def _warn_once(edge: bool, key: str, where: str, device: torch.device, graph: Any) -> None:
    if (edge, key) in WARNED:
        return
    WARNED.add((edge, key))
    if edge:
        fix = f"prefetch_edge_feats=[{key!r}] of the NeighborSampler, or edge_key={key!r} with a list of fanouts"
    else:
        fix = (f"prefetch_node_feats=[{key!r}] (blocks[0].srcdata) or prefetch_labels=[{key!r}] "
               f"(blocks[-1].dstdata) of the NeighborSampler, or feat_key={key!r} / label_key={key!r} with a "
               "list of fanouts")
    flat = "; a flat list means every type that has the key" if len(graph.ntypes) > 1 or \
        len(graph.canonical_etypes) > 1 else ""
    warnings.warn(f"{where}[{key!r}]: the device sampler did not gather {'edge' if edge else 'node'} data {key!r}, "
                  f"so it is read from the graph on the host and copied to {device} at each read, in every batch. "
                  f"Fix: gather it with the batch: {fix} (node_dataloader / edge_dataloader){flat}. Shown once "
                  "per key.", HostReadWarning, stacklevel=_outside_graphtrainer())


def _outside_graphtrainer() -> int:
    """The ``stacklevel`` of the first caller outside graphtrainer (the step that read the key)."""
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        frame, level = frame.f_back, level + 1
    return level


def reads_graph(graph: Any, source: GraphSource, edges: bool = True) -> Any:
    """``graph`` (a device block or pair graph) with its node data (``edges``: and edge data)
    reading the keys it lacks from ``source``; in place, and returned."""
    if isinstance(graph, TorchHeteroBlock):
        graph.src_store = LazyStore(graph.src_store, source, False, "srcdata" if graph.is_block else "ndata")
        graph.dst_store = LazyStore(graph.dst_store, source, False, "dstdata") if graph.is_block else graph.src_store
        if edges:
            graph.edge_store = LazyStore(graph.edge_store, source, True, "edata")
        graph.__post_init__()  # the views over the new stores
        return graph
    assert isinstance(graph, TorchBlock)
    src, _, dst = graph.canonical_etype
    graph.srcdata = LazyData(graph.srcdata, source, False, src, "srcdata" if graph.is_block else "ndata")
    graph.dstdata = LazyData(graph.dstdata, source, False, dst, "dstdata") if graph.is_block else graph.srcdata
    if edges:
        graph.edata = LazyData(graph.edata, source, True, graph.canonical_etype, "edata")
    return graph
