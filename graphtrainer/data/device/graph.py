"""The graph as the device sampler reads it: each relation's CSC in-edges and the data the loaders
gather, copied to one device once per rank. Sizes are counted first (:func:`plan_copy`), so
``sampling="auto"`` can decide, and ``"device"`` refuse, beforehand. Data that does not fit
beside the structure may stay on the host: its rows are gathered there, into pinned memory,
and copied over (:func:`gather`).
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, Optional, Tuple

import torch

from ..._moved import deprecated

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
    #: The largest in-degree (read on the host when copied): a larger fanout draws as many.
    max_degree: int
    #: ``NeighborSampler(prob=/mask=)`` weights by edge data key, in CSC order (:mod:`.weighted`).
    weights: Dict[str, torch.Tensor] = field(default_factory=dict)
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
    node and edge data gathered into batches, on ``device`` (data that did not fit: on the host)."""

    def __init__(self, relations: Dict[EType, Relation], num_nodes: Dict[str, int],
                 ndata: Dict[str, Dict[str, torch.Tensor]], edata: Dict[EType, Dict[str, torch.Tensor]],
                 device: torch.device, hetero: bool, idtype: torch.dtype = torch.int64):
        self.relations, self.num_nodes = relations, num_nodes
        self.idtype = idtype  # the graph's: ids handed out are in it, as DGL's (sampling works in int64)
        self.ndata, self.edata = ndata, edata
        self.device, self.hetero = device, hetero
        #: The graph's tensors each key was copied from, to notice a key given new data.
        self.sources: Dict[Tuple[bool, Any, str], "weakref.ref[torch.Tensor]"] = {}
        self.host_keys: set = set()  # (is_edge, type, key) of data left on the host

    @property
    def ntypes(self) -> list:
        return list(self.num_nodes)

    def ids(self, values: torch.Tensor) -> torch.Tensor:
        """Node or edge ids in the graph's id type (a no-op on int64 graphs)."""
        return values if values.dtype == self.idtype else values.to(self.idtype)

    def add_data(self, graph: Any, node_keys: Keys, edge_keys: Keys, on_host: Tuple[Keys, Keys] = ({}, {})) -> None:
        """Copy data a later loader gathers that an earlier one did not; keys in ``on_host``
        (node keys, edge keys) stay the graph's own host tensors."""
        for is_edge, (data, have_all, wanted, host) in enumerate(((graph.nodes, self.ndata, node_keys, on_host[0]),
                                                                  (graph.edges, self.edata, edge_keys, on_host[1]))):
            for t, keys in wanted.items():
                have = have_all.setdefault(t, {})
                for key in keys:
                    if key not in have:
                        value, kept = data[t].data[key], key in host.get(t, ())
                        have[key] = value if kept else value.to(self.device)
                        self.sources[(bool(is_edge), t, key)] = weakref.ref(value)
                        if kept:
                            self.host_keys.add((bool(is_edge), t, key))

    def add_weights(self, graph: Any, key: Optional[str]) -> None:
        """Copy edge data ``key`` of every relation that has it, in CSC order, as sampling weights."""
        if not key:
            return
        for et, rel in self.relations.items():
            value = graph.edges[et].data.get(key)
            if value is not None and key not in rel.weights:
                rel.weights[key] = value.reshape(-1).to(self.device).index_select(0, rel.eids)
                self.sources[(True, et, key)] = weakref.ref(value)

    def device_bytes(self) -> int:
        """Bytes this copy holds on its device: structure, id maps and the data not left on the host."""
        data = [v for is_edge, all_data in enumerate((self.ndata, self.edata)) for t, per_type in all_data.items()
                for k, v in per_type.items() if (bool(is_edge), t, k) not in self.host_keys]
        return sum(relation_bytes(rel.indptr.numel() - 1, rel.num_edges)
                   + (0 if rel._position is None else 8 * rel.num_edges)
                   + sum(w.numel() * w.element_size() for w in rel.weights.values())
                   for rel in self.relations.values()) + \
            16 * sum(self.num_nodes.values()) + sum(v.numel() * v.element_size() for v in data)

    def is_current(self, graph: Any) -> bool:
        """Whether ``graph`` still has the nodes, edges and data tensors this copy was made from
        (data changed in place is not noticed: :func:`drop_copies` then)."""
        if any(graph.num_nodes(nt) != n for nt, n in self.num_nodes.items()) or \
                any(graph.num_edges(et) != rel.num_edges for et, rel in self.relations.items()):
            return False
        views = (graph.nodes, graph.edges)
        return all(source() is not None and source() is views[is_edge][t].data.get(key)
                   for (is_edge, t, key), source in self.sources.items())


def relations_of(graph: Any) -> Iterable[EType]:
    return list(graph.canonical_etypes)


def structure_bytes(graph: Any) -> int:
    """Bytes the structure takes on the device: int64 ``indptr``, in-degrees, ``indices`` and ``eids``."""
    return sum(relation_bytes(graph.num_nodes(et[2]), graph.num_edges(et)) for et in relations_of(graph))


def relation_bytes(num_dst: int, num_edges: int) -> int:
    """One relation's structure: int64 ``indptr`` and in-degrees per destination, ``indices`` and ``eids``."""
    return 8 * (2 * num_dst + 1) + 16 * num_edges


def data_bytes(graph: Any, node_keys: Keys, edge_keys: Keys) -> int:
    """Deprecated, goes in graphtrainer 0.3.0 (nothing uses it): bytes of the node and edge data
    named per type."""
    deprecated(f"{__name__}.data_bytes")
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
    plan = plan_copy(graph, device, node_keys, edge_keys, allowed=None)
    return plan.structure + plan.data


@dataclass
class CopyPlan:
    """What a loader adds to its graph's copy on a device: ``structure`` bytes (with the id
    maps; 0 once copied), ``data`` bytes of gathered data that go there, and the keys (node
    keys, edge keys) and bytes of the data that stay on the host."""

    structure: int
    data: int
    on_host: Tuple[Keys, Keys]
    host_bytes: int

    def names_on_host(self) -> str:
        """``'feat'``, or ``'user/feat'`` where the type is not a homogeneous graph's."""
        return ", ".join(repr(k if t in ("_N", ("_N", "_E", "_N")) else f"{t[1] if isinstance(t, tuple) else t}/{k}")
                         for keys in self.on_host for t, ks in keys.items() for k in ks)


def plan_copy(graph: Any, device: torch.device, node_keys: Keys, edge_keys: Keys,
              allowed: Optional[int], edge_index: bool = False, weights: Optional[str] = None) -> CopyPlan:
    """Which data not copied yet fits within ``allowed`` bytes beside the structure, smallest
    first (labels before features); the rest stays on the host (``allowed=None``: all fits).
    ``edge_index``: an edge loader's, which also indexes the structure by edge id; ``weights``:
    the sampler's ``prob``/``mask`` key, copied with the structure."""
    copy = _current_copy(graph, device)
    structure = 0 if copy is not None else structure_bytes(graph) + 16 * sum(graph.num_nodes(nt) for nt in graph.ntypes)
    structure += position_bytes(graph, device) if edge_index else 0
    structure += weight_bytes(graph, device, weights)
    have = ({}, {}) if copy is None else (copy.ndata, copy.edata)
    missing = []  # (bytes, is_edge, type, key)
    for is_edge, (wanted, view) in enumerate(((node_keys, graph.nodes), (edge_keys, graph.edges))):
        for t, keys in wanted.items():
            for k in keys:
                if k not in have[is_edge].get(t, {}):
                    value = view[t].data[k]
                    missing.append((value.numel() * value.element_size(), is_edge, t, k))
    room = None if allowed is None else allowed - structure
    data = host_bytes = 0
    on_host: Tuple[Keys, Keys] = ({}, {})
    for size, is_edge, t, k in sorted(missing, key=lambda m: m[0]):
        if room is None or data + size <= room:
            data += size
        else:
            host_bytes += size
            on_host[is_edge][t] = on_host[is_edge].get(t, ()) + (k,)
    return CopyPlan(structure, data, on_host, host_bytes)


def gather(data: torch.Tensor, ids: torch.Tensor, host_ids: Dict[int, torch.Tensor]) -> torch.Tensor:
    """Rows ``ids`` of ``data``, on the device of ``ids``. Data kept on the host is gathered
    there into pinned memory and copied without the host waiting (torch's pinned-memory cache
    keeps that buffer until its copy is done); ``host_ids`` holds each ``ids`` copied to the host
    once per batch (one wait)."""
    if data.device == ids.device:
        return data.index_select(0, ids)
    if id(ids) not in host_ids:
        host_ids[id(ids)] = ids.to(data.device)
    pinned = ids.device.type == "cuda"
    out = torch.empty((ids.numel(), *data.shape[1:]), dtype=data.dtype, pin_memory=pinned)
    torch.index_select(data, 0, host_ids[id(ids)], out=out)
    return out.to(ids.device, non_blocking=pinned)


def _relation(graph: Any, etype: EType, device: torch.device) -> Relation:
    from ...nn.convert import csc_tensors

    indptr, indices, eids = csc_tensors(graph, etype if len(graph.canonical_etypes) > 1 else None,
                                        layer="sampling='device'")
    max_degree = int(indptr.diff().max()) if indptr.numel() > 1 else 0
    return Relation(indptr.to(device, torch.int64), indices.to(device, torch.int64), eids.to(device, torch.int64),
                    max_degree)


# One copy per (graph, device) in a rank: the training and evaluation loaders share it.
_COPIES: "weakref.WeakKeyDictionary[Any, Dict[str, DeviceGraph]]" = weakref.WeakKeyDictionary()


def drop_copies(graph: Any) -> None:
    """Forget ``graph``'s copies in this process (a copy lives as long as its graph, so that a
    later fit or test reuses it); the next loader copies again, with its own plan."""
    _COPIES.pop(graph, None)


def _current_copy(graph: Any, device: torch.device) -> Optional[DeviceGraph]:
    """``graph``'s copy on ``device``, unless the graph changed since (then it is dropped)."""
    per_device = _COPIES.get(graph, {})
    copy = per_device.get(str(device))
    if copy is not None and not copy.is_current(graph):
        del per_device[str(device)]
        return None
    return copy


def position_bytes(graph: Any, device: torch.device) -> int:
    """Bytes the edge-id index (:meth:`Relation.position_of`, built for edge loaders) adds on
    ``device``: ``8 x edges`` of each relation that does not have it yet."""
    copy = _current_copy(graph, device)
    return sum(8 * graph.num_edges(et) for et in relations_of(graph)
               if copy is None or copy.relations[et]._position is None)


def weight_bytes(graph: Any, device: torch.device, key: Optional[str]) -> int:
    """Bytes the sampling weights ``key`` (:meth:`DeviceGraph.add_weights`) add on ``device``:
    their own size, in each relation that has them and whose copy lacks them."""
    if not key:
        return 0
    copy = _current_copy(graph, device)
    sizes = [(et, graph.edges[et].data.get(key)) for et in relations_of(graph)]
    return sum(w.numel() * w.element_size() for et, w in sizes
               if w is not None and (copy is None or key not in copy.relations[et].weights))


def copied_bytes(graph: Any, device: torch.device) -> int:
    """Bytes ``graph``'s current copy already holds on ``device`` (0 without one)."""
    copy = _current_copy(graph, device)
    return 0 if copy is None else copy.device_bytes()


def device_graph(graph: Any, device: torch.device, node_keys: Keys, edge_keys: Keys,
                 on_host: Tuple[Keys, Keys] = ({}, {}), weights: Optional[str] = None) -> DeviceGraph:
    """``graph``'s structure and the data named by the keys on ``device``, copied once per rank
    (but the keys ``on_host``: node keys, edge keys), with the sampling ``weights`` key's edge
    data; copied again once the graph changed."""
    copy = _current_copy(graph, device)
    per_device = _COPIES.setdefault(graph, {})
    if copy is None:
        relations = {et: _relation(graph, et, device) for et in relations_of(graph)}
        copy = DeviceGraph(relations, {nt: graph.num_nodes(nt) for nt in graph.ntypes}, {}, {}, device,
                           hetero=len(graph.ntypes) > 1 or len(graph.canonical_etypes) > 1, idtype=graph.idtype)
        per_device[str(device)] = copy
    copy.add_data(graph, node_keys, edge_keys, on_host)
    copy.add_weights(graph, weights)
    return copy
