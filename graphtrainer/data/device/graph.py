"""The graph as the device sampler reads it: each relation's CSC in-edges and the data the loaders
gather, copied to one device once per rank. Sizes are counted first (:func:`structure_bytes`,
:func:`data_bytes`), so ``sampling="auto"`` can decide, and ``"device"`` refuse, beforehand.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, Optional, Tuple

import torch

EType = Tuple[str, str, str]
#: Keys of node data per node type (and of edge data per edge type) a loader gathers.
Keys = Dict[Any, Tuple[str, ...]]


@dataclass
class Relation:
    """One relation's in-edges: ``indices[indptr[v]:indptr[v + 1]]`` are the sources of
    destination ``v`` and ``eids`` the graph's ids of those edges (all int64)."""

    indptr: torch.Tensor
    indices: torch.Tensor
    eids: torch.Tensor
    _position: Optional[torch.Tensor] = field(default=None, repr=False)
    _degrees: Optional[torch.Tensor] = field(default=None, repr=False)

    @property
    def num_edges(self) -> int:
        return int(self.indices.numel())

    @property
    def degrees(self) -> torch.Tensor:
        """In-degree of every destination (kept: one gather per layer instead of three)."""
        if self._degrees is None:
            self._degrees = self.indptr.diff()
        return self._degrees

    def position_of(self, eids: torch.Tensor) -> torch.Tensor:
        """CSC positions of graph edge ids (the inverse of ``eids``, built on first use:
        only loaders that exclude edges or take edge ids need it)."""
        if self._position is None:
            self._position = torch.empty_like(self.eids)
            self._position[self.eids] = torch.arange(self.eids.numel(), device=self.eids.device)
        return self._position[eids]

    def endpoints(self, eids: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """``(src, dst)`` of graph edge ids."""
        pos = self.position_of(eids)
        dst = torch.searchsorted(self.indptr, pos, right=True) - 1
        return self.indices[pos], dst


class DeviceGraph:
    """Structure (one :class:`Relation` per canonical edge type), node counts per type, and the
    node and edge data gathered into batches, all on ``device``."""

    def __init__(self, relations: Dict[EType, Relation], num_nodes: Dict[str, int],
                 ndata: Dict[str, Dict[str, torch.Tensor]], edata: Dict[EType, Dict[str, torch.Tensor]],
                 device: torch.device, hetero: bool):
        self.relations, self.num_nodes = relations, num_nodes
        self.ndata, self.edata = ndata, edata
        self.device, self.hetero = device, hetero

    @property
    def ntypes(self) -> list:
        return list(self.num_nodes)

    def add_data(self, graph: Any, node_keys: Keys, edge_keys: Keys) -> None:
        """Copy data a later loader gathers that an earlier one did not."""
        for nt, keys in node_keys.items():
            have = self.ndata.setdefault(nt, {})
            for key in keys:
                if key not in have:
                    have[key] = graph.nodes[nt].data[key].to(self.device)
        for et, keys in edge_keys.items():
            have = self.edata.setdefault(et, {})
            for key in keys:
                if key not in have:
                    have[key] = graph.edges[et].data[key].to(self.device)


def relations_of(graph: Any) -> Iterable[EType]:
    return list(graph.canonical_etypes)


def structure_bytes(graph: Any) -> int:
    """Bytes the structure takes on the device: int64 ``indptr``, in-degrees, ``indices`` and ``eids``."""
    total = 0
    for et in relations_of(graph):
        total += 8 * (2 * graph.num_nodes(et[2]) + 1) + 16 * graph.num_edges(et)
    return total


def data_bytes(graph: Any, node_keys: Keys, edge_keys: Keys) -> int:
    """Bytes of the node and edge data the loaders gather."""
    total = 0
    for nt, keys in node_keys.items():
        data = graph.nodes[nt].data
        total += sum(data[k].numel() * data[k].element_size() for k in keys)
    for et, keys in edge_keys.items():
        data = graph.edges[et].data
        total += sum(data[k].numel() * data[k].element_size() for k in keys)
    return total


def bytes_to_copy(graph: Any, device: torch.device, node_keys: Keys, edge_keys: Keys) -> int:
    """Bytes :func:`device_graph` would add on ``device``: the structure and the id maps
    (``16 x nodes``) unless a loader copied them already, and the data not there yet."""
    copy = _COPIES.get(graph, {}).get(str(device))
    if copy is None:
        return structure_bytes(graph) + 16 * sum(graph.num_nodes(nt) for nt in graph.ntypes) \
            + data_bytes(graph, node_keys, edge_keys)
    missing_nodes = {nt: tuple(k for k in keys if k not in copy.ndata.get(nt, {})) for nt, keys in node_keys.items()}
    missing_edges = {et: tuple(k for k in keys if k not in copy.edata.get(et, {})) for et, keys in edge_keys.items()}
    return data_bytes(graph, missing_nodes, missing_edges)


def _relation(graph: Any, etype: EType, device: torch.device) -> Relation:
    from ...nn.convert import csc_tensors

    indptr, indices, eids = csc_tensors(graph, etype if len(graph.canonical_etypes) > 1 else None,
                                        layer="sampling='device'")
    return Relation(indptr.to(device, torch.int64), indices.to(device, torch.int64), eids.to(device, torch.int64))


# One copy per (graph, device) in a rank: the training and evaluation loaders share it.
_COPIES: "weakref.WeakKeyDictionary[Any, Dict[str, DeviceGraph]]" = weakref.WeakKeyDictionary()


def device_graph(graph: Any, device: torch.device, node_keys: Keys, edge_keys: Keys) -> DeviceGraph:
    """``graph``'s structure and the data named by the keys on ``device``, copied once per rank."""
    per_device = _COPIES.setdefault(graph, {})
    copy = per_device.get(str(device))
    if copy is None:
        relations = {et: _relation(graph, et, device) for et in relations_of(graph)}
        copy = DeviceGraph(relations, {nt: graph.num_nodes(nt) for nt in graph.ntypes}, {}, {}, device,
                           hetero=len(graph.ntypes) > 1 or len(graph.canonical_etypes) > 1)
        per_device[str(device)] = copy
    copy.add_data(graph, node_keys, edge_keys)
    return copy
