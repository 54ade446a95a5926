"""Torch-only graphs: sampled blocks, pair graphs and batched graphs as plain torch tensors,
for devices DGL cannot use (DGL's PyPI wheel is CPU-only).

:class:`TorchBlock` keeps the structure in CSC form (``indptr`` over destinations, ``indices``
into sources, ``edge_ids``: the graph's id of each CSC position) and data in dicts; ``edata``
stays in edge-id order, as in DGL. The methods tasks usually call on DGL's graphs exist with
DGL's names and meanings (``num_src_nodes()``, ``edges()``, ``in_degrees()``, ``srcdata``,
``batch_num_nodes()``, ...); the rest of DGL's API raises an error naming the fixes
(:func:`dgl_only`). :class:`TorchHeteroBlock` holds one :class:`TorchBlock` per relation.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, Dict, Optional, Tuple, Union

import torch

from .graph_views import ALL, DataView, GraphViews, TypeData, dgl_only, degrees_of, edges_in, local_scope, one_type
from .lazy_data import held_items, is_lazy

Device = Union[str, torch.device]
EType = Tuple[str, str, str]


def _pinned(t: torch.Tensor) -> torch.Tensor:
    """``t`` in page-locked memory; a tensor already on a device (sampled there) stays."""
    return t if t.device.type != "cpu" or t.is_pinned() else t.pin_memory()


def _move(data: Dict[str, Any], fn: Any) -> Dict[str, Any]:
    out = {k: (_move(v, fn) if isinstance(v, dict) else fn(v)) for k, v in held_items(data)}
    return data.like(out) if is_lazy(data) else out  # a device block's data still reads the graph's other keys


@dataclass
class TorchBlock(GraphViews):
    """One relation's structure and data as torch tensors.

    ``is_block``: True for a sampled block (the first ``num_dst`` source nodes are the
    destinations, as in DGL); False for a pair or batched graph, whose ``srcdata``, ``dstdata``
    and ``ndata`` are one dict. ``batch_num_nodes_``: nodes per graph of a batched graph.
    ``canonical_etype``: the relation (DGL's ``("_N", "_E", "_N")`` for a homogeneous graph).
    """

    indptr: torch.Tensor
    indices: torch.Tensor
    edge_ids: torch.Tensor
    num_src: int
    num_dst: int
    srcdata: Dict[str, Any] = field(default_factory=dict)
    dstdata: Dict[str, Any] = field(default_factory=dict)
    edata: Dict[str, Any] = field(default_factory=dict)
    is_block: bool = True
    batch_num_nodes_: Optional[torch.Tensor] = None
    canonical_etype: EType = ("_N", "_E", "_N")
    _dst_index: Optional[torch.Tensor] = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.indptr.dim() != 1 or self.indptr.numel() != self.num_dst + 1:
            raise ValueError(f"TorchBlock: indptr needs num_dst + 1 = {self.num_dst + 1} entries, "
                             f"got shape {tuple(self.indptr.shape)}")
        if self.indices.shape != self.edge_ids.shape:
            raise ValueError("TorchBlock: indices and edge_ids must have one entry per edge "
                             f"(got {tuple(self.indices.shape)} and {tuple(self.edge_ids.shape)})")
        if not self.is_block:
            if self.num_src != self.num_dst:
                raise ValueError("TorchBlock: a graph (is_block=False) has as many source as destination nodes")
            self.dstdata = self.srcdata  # one node set: one dict, as DGL's ndata

    # ---- DGL's names ---------------------------------------------------------------------
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("_dst_index",):
            raise AttributeError(name)
        raise dgl_only(self, name)

    @property
    def ndata(self) -> Dict[str, Any]:
        if self.is_block:
            raise dgl_only(self, "ndata (a block has srcdata and dstdata)")
        return self.srcdata

    @property
    def device(self) -> torch.device:
        return self.indptr.device

    @property
    def idtype(self) -> torch.dtype:
        return self.indices.dtype

    @property
    def batch_size(self) -> int:
        return 1 if self.batch_num_nodes_ is None else int(self.batch_num_nodes_.numel())

    def batch_num_nodes(self, ntype: Optional[str] = None) -> torch.Tensor:
        if self.batch_num_nodes_ is None:
            return torch.tensor([self.num_dst], device=self.device)
        return self.batch_num_nodes_

    def num_src_nodes(self, ntype: Optional[str] = None) -> int:
        return self.num_src

    def num_dst_nodes(self, ntype: Optional[str] = None) -> int:
        return self.num_dst

    def _src_counts(self) -> Dict[str, int]:
        return {self.canonical_etype[0]: self.num_src}

    def _dst_counts(self) -> Dict[str, int]:
        return {self.canonical_etype[2]: self.num_dst}

    def _type_data(self, side: str, ntype: str) -> Dict[str, Any]:
        return self.srcdata if side == "src" else self.dstdata

    def _edge_data(self, etype: Any) -> Dict[str, Any]:
        if etype not in (self.canonical_etype, self.canonical_etype[1]):
            raise KeyError(f"edge type {etype!r} does not exist; the graph has {self.canonical_etypes}")
        return self.edata

    @property
    def etypes(self) -> list:
        return [self.canonical_etype[1]]

    @property
    def canonical_etypes(self) -> list:
        return [self.canonical_etype]

    number_of_dst_nodes = num_dst_nodes
    number_of_src_nodes = num_src_nodes

    def num_edges(self, etype: Any = None) -> int:
        return int(self.indices.numel())

    def in_degrees(self, v: Any = ALL, etype: Any = None) -> Any:
        """DGL's ``in_degrees(v=ALL, etype=None)``: every destination's, or those of ids ``v``
        (an int gives an int)."""
        return degrees_of(self.indptr[1:] - self.indptr[:-1], v, "in_degrees")

    def out_degrees(self, u: Any = ALL, etype: Any = None) -> Any:
        """DGL's ``out_degrees(u=ALL, etype=None)``: every source's, or those of ids ``u``."""
        return degrees_of(torch.bincount(self.indices, minlength=self.num_src), u, "out_degrees")

    def dst_index(self) -> torch.Tensor:
        """The destination node of each CSC position (int64, computed once)."""
        if self._dst_index is None:
            self._dst_index = torch.repeat_interleave(
                torch.arange(self.num_dst, device=self.device), self.in_degrees().long(),
                output_size=self.indices.numel())
        return self._dst_index

    def _edges(self, form: str = "uv", order: Optional[str] = "eid", etype: Any = None) -> Any:
        """DGL's ``edges()``: ``(src, dst)`` in edge-id order; ``form='eid'`` / ``'all'`` and
        ``order='srcdst'`` (by source, then destination, then edge id) as DGL's."""
        src = torch.empty_like(self.indices)
        dst = torch.empty_like(self.indices)
        src[self.edge_ids.long()] = self.indices
        dst[self.edge_ids.long()] = self.dst_index().to(dst.dtype)
        return edges_in(src, dst, form, order)

    # ---- PyG's names: a MessagePassing layer runs on a block --------------------------------
    @property
    def edge_index(self) -> torch.Tensor:
        """``[2, E]`` int64 (source, destination) in edge-id order, local ids: for a PyG layer,
        ``conv((x, x[:block.num_dst]), block.edge_index)``, or ``size=block.size`` with one input."""
        return torch.stack(self.edges()).long()

    @property
    def size(self) -> Tuple[int, int]:
        """``(num_src, num_dst)``: PyG's ``size`` argument for message passing on a block."""
        return self.num_src, self.num_dst

    # ---- moving ----------------------------------------------------------------------------
    def _map(self, fn: Any) -> "TorchBlock":
        src = _move(self.srcdata, fn)
        return replace(self, indptr=fn(self.indptr), indices=fn(self.indices), edge_ids=fn(self.edge_ids),
                       srcdata=src, dstdata=src if not self.is_block else _move(self.dstdata, fn),
                       edata=_move(self.edata, fn),
                       batch_num_nodes_=None if self.batch_num_nodes_ is None else fn(self.batch_num_nodes_),
                       _dst_index=None if self._dst_index is None else fn(self._dst_index))

    def to(self, device: Device, non_blocking: bool = False) -> "TorchBlock":
        """A copy on ``device`` (``non_blocking`` as ``Tensor.to``: asynchronous from pinned memory)."""
        device = torch.device(device)
        return self._map(lambda t: t.to(device, non_blocking=non_blocking))

    def pin_memory(self) -> "TorchBlock":
        """A copy in page-locked memory (needs CUDA), for ``to(cuda, non_blocking=True)``."""
        return self._map(_pinned)

    def tensors(self) -> Dict[str, torch.Tensor]:
        """Every tensor held, by a descriptive name (for checks and tests)."""
        out = {"indptr": self.indptr, "indices": self.indices, "edge_ids": self.edge_ids}
        for prefix, data in (("srcdata", self.srcdata), ("dstdata", self.dstdata), ("edata", self.edata)):
            out.update({f"{prefix}.{k}": v for k, v in held_items(data) if isinstance(v, torch.Tensor)})
        if self.batch_num_nodes_ is not None:
            out["batch_num_nodes"] = self.batch_num_nodes_
        return out


def _node_type(counts: Dict[str, int], side: str, ntype: str) -> str:
    return one_type(ntype, counts, side)


def _canonical(relations: Dict[EType, Any], etype: Any) -> EType:
    if isinstance(etype, tuple):
        if etype not in relations:
            raise KeyError(f"no relation {etype}; the graph has {list(relations)}")
        return etype
    found = [et for et in relations if et[1] == etype]
    if len(found) != 1:
        raise KeyError(f"relation name {etype!r} matches {len(found)} relations of {list(relations)}: "
                       "pass the (src type, relation, dst type) triple")
    return found[0]


@dataclass
class TorchHeteroBlock(GraphViews):
    """A heterogeneous block or graph: one structure-only :class:`TorchBlock` per relation
    (``relations``, keyed by canonical edge type), node counts per type, and data in per-type
    stores ``src_store[key] == {ntype: tensor}`` (``dst_store``; ``edge_store`` by canonical edge
    type). ``srcdata``, ``dstdata``, ``ndata`` and ``edata`` read them as DGL's views do
    (:class:`~graphtrainer.nn.graph_views.DataView`): a tensor where that side has one type (one
    relation for ``edata``), ``{type: tensor}`` where it has several."""

    relations: Dict[EType, TorchBlock]
    num_src_per_type: Dict[str, int]
    num_dst_per_type: Dict[str, int]
    src_store: Dict[str, Dict[str, torch.Tensor]] = field(default_factory=dict)
    dst_store: Dict[str, Dict[str, torch.Tensor]] = field(default_factory=dict)
    edge_store: Dict[str, Dict[EType, torch.Tensor]] = field(default_factory=dict)
    is_block: bool = True
    _slices: Dict[EType, TorchBlock] = field(default_factory=dict, init=False, repr=False, compare=False)
    _views: Tuple[DataView, ...] = field(default=(), init=False, repr=False, compare=False)

    def __init__(self, relations: Dict[EType, TorchBlock], num_src_per_type: Dict[str, int],
                 num_dst_per_type: Dict[str, int], src_store: Optional[Dict[str, Any]] = None,
                 dst_store: Optional[Dict[str, Any]] = None, edge_store: Optional[Dict[str, Any]] = None,
                 is_block: bool = True, **renamed: Any) -> None:
        stores = {"src_store": src_store, "dst_store": dst_store, "edge_store": edge_store}
        for old, value in renamed.items():  # the names before srcdata/dstdata/edata became views
            new = {"srcdata": "src_store", "dstdata": "dst_store", "edata": "edge_store"}.get(old)
            if new is None:
                raise TypeError(f"TorchHeteroBlock() got an unexpected keyword argument {old!r}")
            warnings.warn(f"TorchHeteroBlock({old}=...) is now {new}=...; the old name goes in the next release",
                          DeprecationWarning, stacklevel=2)
            stores[new] = value
        self.relations, self.num_src_per_type, self.num_dst_per_type = relations, num_src_per_type, num_dst_per_type
        self.src_store, self.dst_store, self.edge_store = (v if v is not None else {} for v in stores.values())
        self.is_block, self._slices = is_block, {}
        self.__post_init__()

    def __post_init__(self) -> None:
        if not self.is_block:
            self.dst_store = self.src_store
        src, dst, rels = self.num_src_per_type, self.num_dst_per_type, self.relations  # no cycle back to self
        self._views = (DataView(self.src_store, src, partial(_node_type, src, "source"), "srcdata"),
                       DataView(self.dst_store, dst, partial(_node_type, dst, "destination"), "dstdata"),
                       DataView(self.edge_store, rels, partial(_canonical, rels), "edata"))

    @property
    def srcdata(self) -> DataView:
        return self._views[0]

    @property
    def dstdata(self) -> DataView:
        return self._views[1] if self.is_block else self._views[0]

    @property
    def edata(self) -> DataView:
        return self._views[2]

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise dgl_only(self, name)

    @property
    def canonical_etypes(self) -> list:
        return list(self.relations)

    @property
    def etypes(self) -> list:
        return [et[1] for et in self.relations]

    def _src_counts(self) -> Dict[str, int]:
        return self.num_src_per_type

    def _dst_counts(self) -> Dict[str, int]:
        return self.num_dst_per_type

    def _type_data(self, side: str, ntype: str) -> TypeData:
        return TypeData(self.src_store if side == "src" else self.dst_store, ntype)

    def _edge_data(self, etype: Any) -> TypeData:
        return TypeData(self.edge_store, self.canonical(etype))

    @property
    def ndata(self) -> DataView:
        if self.is_block:
            raise dgl_only(self, "ndata (a block has srcdata and dstdata)")
        return self.srcdata

    def local_scope(self) -> Any:
        """DGL's ``with g.local_scope():`` over the per-type stores (see :meth:`GraphViews.local_scope`)."""
        return local_scope(self.src_store, self.dst_store, self.edge_store)

    @property
    def device(self) -> torch.device:
        return next(iter(self.relations.values())).device if self.relations else torch.device("cpu")

    @property
    def idtype(self) -> torch.dtype:
        return next(iter(self.relations.values())).idtype if self.relations else torch.int64

    def canonical(self, etype: Any) -> EType:
        """The canonical edge type of ``etype`` (a triple or a relation name used once)."""
        return _canonical(self.relations, etype)

    def __getitem__(self, etype: Any) -> TorchBlock:
        """The relation ``etype`` as a :class:`TorchBlock`, as DGL's ``block[etype]``: its
        source type's ``srcdata``, its destination type's ``dstdata`` and its ``edata``. These
        are views of this graph's data (the same tensors): a key set or deleted on the relation
        is set or deleted here for that type, as in DGL."""
        et = self.canonical(etype)
        view = self._slices.get(et)
        if view is None:  # kept: a layer asks each forward, and the view caches its dst_index
            rel = self.relations[et]
            src = TypeData(self.src_store, et[0])
            dst = src if not rel.is_block else TypeData(self.dst_store, et[2])
            view = self._slices[et] = replace(rel, srcdata=src, dstdata=dst, edata=TypeData(self.edge_store, et),
                                              canonical_etype=et)
        return view

    def _only(self, etype: Any) -> EType:
        if etype is None:
            if len(self.relations) != 1:
                raise ValueError(f"the graph has {len(self.relations)} relations: pass etype=")
            return next(iter(self.relations))
        return self.canonical(etype)

    def num_src_nodes(self, ntype: Optional[str] = None) -> int:
        if ntype is None:
            return sum(self.num_src_per_type.values())
        return self.num_src_per_type[one_type(ntype, self.num_src_per_type, "source")]

    def num_dst_nodes(self, ntype: Optional[str] = None) -> int:
        if ntype is None:
            return sum(self.num_dst_per_type.values())
        return self.num_dst_per_type[one_type(ntype, self.num_dst_per_type, "destination")]

    number_of_dst_nodes = num_dst_nodes
    number_of_src_nodes = num_src_nodes

    def num_edges(self, etype: Any = None) -> int:
        if etype is None:
            return sum(r.num_edges() for r in self.relations.values())
        return self[etype].num_edges()

    def _edges(self, form: str = "uv", order: Optional[str] = "eid", etype: Any = None) -> Any:
        return self.relations[self._only(etype)].edges(form, order)

    def in_degrees(self, v: Any = ALL, etype: Any = None) -> Any:
        """DGL's ``in_degrees(v=ALL, etype=None)`` of relation ``etype`` (needed with several)."""
        return self.relations[self._only(etype)].in_degrees(v)

    def out_degrees(self, u: Any = ALL, etype: Any = None) -> Any:
        """DGL's ``out_degrees(u=ALL, etype=None)`` of relation ``etype`` (needed with several)."""
        return self.relations[self._only(etype)].out_degrees(u)

    def _map(self, fn: Any) -> "TorchHeteroBlock":
        src = _move(self.src_store, fn)
        return replace(self, relations={et: r._map(fn) for et, r in self.relations.items()}, src_store=src,
                       dst_store=src if not self.is_block else _move(self.dst_store, fn),
                       edge_store=_move(self.edge_store, fn))

    def to(self, device: Device, non_blocking: bool = False) -> "TorchHeteroBlock":
        device = torch.device(device)
        return self._map(lambda t: t.to(device, non_blocking=non_blocking))

    def pin_memory(self) -> "TorchHeteroBlock":
        return self._map(_pinned)

    def tensors(self) -> Dict[str, torch.Tensor]:
        out: Dict[str, torch.Tensor] = {}
        for et, rel in self.relations.items():
            out.update({f"{et}.{k}": v for k, v in rel.tensors().items()})
        for prefix, data in (("srcdata", self.src_store), ("dstdata", self.dst_store)):
            out.update({f"{prefix}.{k}.{nt}": v for k, d in data.items() for nt, v in d.items()})
        out.update({f"edata.{k}.{et}": v for k, d in self.edge_store.items() for et, v in d.items()})
        return out


AnyTorchGraph = Union[TorchBlock, TorchHeteroBlock]


def is_torch_graph(obj: Any) -> bool:
    return isinstance(obj, (TorchBlock, TorchHeteroBlock))
