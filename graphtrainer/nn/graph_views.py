"""DGL's graph API pieces shared by the torch-only graphs of :mod:`graphtrainer.nn.blocks`:
data views (a tensor with one type, a dict with several, as DGL's), per-type data views,
``g.srcnodes`` / ``g.edges`` style views, ``local_scope()``, node counts by type, and DGL's
arguments of ``edges()`` and ``in_degrees(v)``."""
from __future__ import annotations

import numbers
from contextlib import contextmanager
from typing import Any, Callable, Dict, Iterator, Mapping, MutableMapping, Optional

import torch

from .lazy_data import (ANY, delete_key, has_key, held_items, key_names, lazy_state, missing_key,
                        per_type as read_key, set_lazy_state, unreadable)

ALL = "__ALL__"  # dgl.ALL: "every node"
EDGE_FORMS = ("uv", "eid", "all")
EDGE_ORDERS = (None, "eid", "srcdst")

FIXES = ("for dgl.nn layers, use graphtrainer.nn layers (SAGEConv, GraphConv, GATConv, HeteroGraphConv, "
         "readouts), which take DGL's graphs and torch blocks alike; to keep DGL graphs, install DGL's CUDA "
         "build (DGL's own wheel index) so blocks stay DGL graphs on the GPU, or, on CPU ranks, "
         "Trainer(block_type='dgl'); or compute it in torch from block.edges() and the data views")


def dgl_only(obj: Any, name: str) -> AttributeError:
    """The error for DGL API a torch-only graph does not have (a ``dgl.nn`` layer, a DGL
    function or a DGL method such as ``apply_edges`` used on a torch block)."""
    return AttributeError(
        f"{type(obj).__name__} has no {name!r}: this is a torch-only graph (graphtrainer converts DGL's "
        "blocks, pair graphs and batched graphs into torch tensors when DGL cannot run on the rank's device, "
        "or when Trainer(block_type='torch')). It has DGL's data views, node and edge counts, edges() and "
        "degrees (docs/gpus.md lists them), not DGL's message passing, queries or graph functions. "
        f"Fix: {FIXES}.")


class TypeData(MutableMapping):
    """One type's data inside a per-type store ``{key: {type: tensor}}`` (a
    ``TorchHeteroBlock``'s ``src_store``, ``dst_store`` or ``edge_store``): reads give the store's
    tensors (no copies), writes and deletions go to the store, as DGL's per-type views."""

    __slots__ = ("_store", "_type")

    def __init__(self, store: Dict[str, Dict[Any, Any]], type_: Any) -> None:
        self._store, self._type = store, type_

    def __getitem__(self, key: str) -> Any:
        per_type = read_key(self._store, key, self._type)
        if per_type is None or self._type not in per_type:
            raise missing_key(self._store, key, self._type)
        return per_type[self._type]

    def __contains__(self, key: object) -> bool:
        return has_key(self._store, key, self._type)  # without reading a key a device block lacks

    def __setitem__(self, key: str, value: Any) -> None:
        self._store.setdefault(key, {})[self._type] = value

    def __delitem__(self, key: str) -> None:
        delete_key(self._store, key, self._type)

    def __iter__(self) -> Iterator[str]:  # a device block's: the graph's keys too, as DGL's (none read)
        return iter(key_names(self._store, self._type))

    def __len__(self) -> int:
        return len(key_names(self._store, self._type))

    def held(self) -> Dict[str, Any]:
        """This type's tensors the store holds, reading nothing."""
        return {k: v[self._type] for k, v in held_items(self._store) if self._type in v}

    def __repr__(self) -> str:  # what is held: printing reads nothing
        return repr(self.held())


_SEVERAL = object()


class DataView(MutableMapping):
    """DGL's ``srcdata`` / ``dstdata`` / ``ndata`` / ``edata`` of a ``TorchHeteroBlock`` over its
    per-type store ``{key: {type: tensor}}``: with one type (one node type on that side, one
    relation), ``view[key]`` is that type's tensor and a tensor is set; with several, a new
    ``{type: tensor}`` dict of the types that have ``key`` (``{}`` where none has it), and a dict
    is set (merged per type); deleting a key no type has does nothing: all as DGL. ``types``:
    the graph's live ``{type: ...}``; ``resolve``: a type name checked (an edge type to its triple)."""

    __slots__ = ("_store", "_types", "_resolve", "_what")

    def __init__(self, store: Dict[str, Dict[Any, Any]], types: Mapping, resolve: Callable[[Any], Any],
                 what: str) -> None:
        self._store, self._types, self._resolve, self._what = store, types, resolve, what

    def _one(self) -> Any:
        """The only type, or ``_SEVERAL``."""
        return next(iter(self._types)) if len(self._types) == 1 else _SEVERAL

    def __getitem__(self, key: str) -> Any:
        one = self._one()
        per_type = read_key(self._store, key, ANY if one is _SEVERAL else one)
        if one is _SEVERAL:
            if not per_type and unreadable(self._store):  # a pickled device block cannot tell: say why
                raise missing_key(self._store, key)
            return dict(per_type or {})  # DGL's dict is new on each read: changing it leaves the graph as is
        if per_type is None or one not in per_type:
            raise missing_key(self._store, key, one)
        return per_type[one]

    def __setitem__(self, key: str, value: Any) -> None:
        one = self._one()
        if one is _SEVERAL:
            if not isinstance(value, Mapping):
                raise TypeError(f"{self._what}[{key!r}] = {type(value).__name__}: the graph has several types "
                                f"({list(self._types)}); pass {{type: tensor}}, as in DGL")
            value = {self._resolve(t): v for t, v in value.items()}
            self._store[key] = {**dict.get(self._store, key, {}), **value}  # a set reads nothing from the graph
        elif isinstance(value, Mapping):
            raise TypeError(f"{self._what}[{key!r}] = dict: the graph has one type ({one!r}) here; pass the "
                            "tensor itself, as in DGL")
        else:
            self._store[key] = {one: value}

    def __delitem__(self, key: str) -> None:
        one = self._one()
        if one is _SEVERAL and not has_key(self._store, key):
            return  # DGL deletes it from each type that has it: none here
        delete_key(self._store, key, ANY if one is _SEVERAL else one)

    def __contains__(self, key: object) -> bool:
        """Whether some type (the one type) has ``key`` (DGL's multi-type view says True for any key)."""
        one = self._one()
        return has_key(self._store, key, ANY if one is _SEVERAL else one)

    def __iter__(self) -> Iterator[str]:  # a device block's: the graph's keys too, as DGL's (none read)
        one = self._one()
        return iter(key_names(self._store, ANY if one is _SEVERAL else one))

    def __len__(self) -> int:
        return len(list(iter(self)))

    def __repr__(self) -> str:  # what is held: printing reads nothing
        one = self._one()
        if one is _SEVERAL:
            return repr({k: dict(v) for k, v in held_items(self._store) if v})
        return repr({k: v[one] for k, v in held_items(self._store) if one in v})


class _Space:
    """``g.srcnodes[ntype]`` / ``g.edges[etype]``: the type's ``data``."""

    __slots__ = ("data",)

    def __init__(self, data: MutableMapping) -> None:
        self.data = data


class NodeView:
    """DGL's ``g.srcnodes`` (``dstnodes``, ``nodes``): called, the node ids of a type;
    indexed by a type, that type's ``.data``."""

    __slots__ = ("_ids", "_data")

    def __init__(self, ids: Callable[[Optional[str]], torch.Tensor], data: Callable[[str], MutableMapping]) -> None:
        self._ids, self._data = ids, data

    def __call__(self, ntype: Optional[str] = None) -> torch.Tensor:
        return self._ids(ntype)

    def __getitem__(self, ntype: str) -> _Space:
        return _Space(self._data(ntype))


class EdgeView:
    """DGL's ``g.edges``: called, ``edges(form='uv', order='eid', etype=None)``; indexed by a
    relation (name or triple), that relation's ``.data``."""

    __slots__ = ("_call", "_data")

    def __init__(self, call: Callable[..., Any], data: Callable[[Any], MutableMapping]) -> None:
        self._call, self._data = call, data

    def __call__(self, form: str = "uv", order: Optional[str] = "eid", etype: Any = None) -> Any:
        return self._call(form, order, etype)

    def __getitem__(self, etype: Any) -> _Space:
        return _Space(self._data(etype))


def edges_in(src: torch.Tensor, dst: torch.Tensor, form: str, order: Optional[str]) -> Any:
    """DGL's ``edges(form, order)`` for edges given in edge-id order: ``order='srcdst'`` sorts
    by source, then destination, as DGL; parallel edges (same source and destination) then come
    in edge-id order, where DGL's order among them follows how it built its CSR."""
    if form not in EDGE_FORMS:
        raise ValueError(f"edges(form={form!r}): form is one of 'uv', 'eid', 'all', as in DGL")
    if order not in EDGE_ORDERS:
        raise ValueError(f"edges(order={order!r}): order is one of None, 'eid', 'srcdst', as in DGL")
    eid = torch.arange(src.numel(), dtype=src.dtype, device=src.device)
    if order == "srcdst":  # two stable sorts: by source, ties by destination, then by edge id
        perm = torch.argsort(dst, stable=True)
        perm = perm[torch.argsort(src[perm], stable=True)]
        src, dst, eid = src[perm], dst[perm], perm.to(src.dtype)
    if form == "uv":
        return src, dst
    return eid if form == "eid" else (src, dst, eid)


def degrees_of(deg: torch.Tensor, v: Any, name: str) -> Any:
    """DGL's ``in_degrees(v)`` / ``out_degrees(u)`` read from every node's degrees ``deg``:
    ``ALL`` gives ``deg``, an int gives an int, ids (tensor, list) give a tensor."""
    if isinstance(v, str) and v == ALL:
        return deg
    if isinstance(v, numbers.Integral) and not isinstance(v, bool):
        if not 0 <= int(v) < deg.numel():
            raise ValueError(f"{name}({v}): node ids run from 0 to {deg.numel() - 1}")
        return int(deg[int(v)])
    ids = torch.as_tensor(v, device=deg.device)
    if ids.is_floating_point() or ids.dtype == torch.bool:
        raise TypeError(f"{name}: node ids must be integers, got a {ids.dtype} tensor")
    if ids.numel() and bool(((ids < 0) | (ids >= deg.numel())).any()):
        raise ValueError(f"{name}: node ids run from 0 to {deg.numel() - 1}; got {ids.min()} to {ids.max()}")
    return deg[ids.long()]


def count_nodes(ntype: Optional[str], src: Dict[str, int], dst: Dict[str, int], is_block: bool) -> int:
    """DGL's ``num_nodes(ntype)``: a block counts its source and destination nodes (all of
    them without ``ntype``; a type's source nodes where it has some, else its destination nodes;
    ``'SRC/t'`` and ``'DST/t'`` choose); a graph counts each type once."""
    if ntype is None:
        return sum(src.values()) + (sum(dst.values()) if is_block else 0)
    if is_block and ntype[:4] in ("SRC/", "DST/"):
        side = src if ntype.startswith("SRC/") else dst
        if ntype[4:] in side:
            return side[ntype[4:]]
    for side in (src, dst):
        if ntype in side:
            return side[ntype]
    raise KeyError(f"node type {ntype!r} does not exist; the graph has {list(dict.fromkeys([*src, *dst]))}")


def _snapshot(store: MutableMapping) -> tuple:
    """What ``store`` holds (not what a device block's could still read) and what it read or deleted."""
    return [(k, v, dict(v) if isinstance(v, dict) else None) for k, v in held_items(store)], lazy_state(store)


def _restore(store: MutableMapping, saved: tuple) -> None:
    items, lazy = saved
    store.clear()
    for key, value, inner in items:
        if inner is not None:  # a per-type dict: the same object again, with its old entries
            value.clear()
            value.update(inner)
        store[key] = value
    set_lazy_state(store, lazy)


@contextmanager
def local_scope(*stores: MutableMapping) -> Iterator[None]:
    """DGL's ``local_scope()`` over a graph's data ``stores``: keys set, replaced or deleted
    inside are as before afterwards; tensors changed in place stay changed, as in DGL. A
    relation's views (``block[etype]``) scope the whole stores they view (their order kept)."""
    stores = tuple(s._store if isinstance(s, TypeData) else s for s in stores)
    unique = list({id(s): s for s in stores}.values())  # a graph's ndata is its srcdata and dstdata
    saved = [_snapshot(s) for s in unique]
    try:
        yield
    finally:
        for store, snap in zip(unique, saved):
            _restore(store, snap)


def one_type(ntype: Optional[str], counts: Dict[str, int], side: str) -> str:
    """``ntype`` checked against a graph's ``side`` types; without it, the only one (as DGL)."""
    if ntype is None:
        if len(counts) != 1:
            raise ValueError(f"the graph has {side} node types {list(counts)}: pass the type, as in DGL")
        return next(iter(counts))
    if ntype not in counts:
        raise KeyError(f"{side} node type {ntype!r} does not exist; the graph has {list(counts)}")
    return ntype


class GraphViews:
    """DGL's type lists, node counts, ``srcnodes`` / ``dstnodes`` / ``nodes`` / ``edges`` views
    and ``local_scope()`` for a torch graph that has ``is_block``, ``srcdata``, ``dstdata``,
    ``edata``, ``idtype``, ``device``, ``num_edges``, and gives ``_src_counts()`` /
    ``_dst_counts()`` (nodes per type), ``_type_data(side, ntype)``, ``_edge_data(etype)`` and
    ``_edges(form, order, etype)``."""

    @property
    def srctypes(self) -> list:
        return list(self._src_counts())

    @property
    def dsttypes(self) -> list:
        return list(self._dst_counts())

    @property
    def ntypes(self) -> list:
        """As DGL: a block's source types, then its destination types (``['_N', '_N']``)."""
        return self.srctypes + self.dsttypes if self.is_block else self.srctypes

    def num_nodes(self, ntype: Optional[str] = None) -> int:
        """DGL's count: a block's source and destination nodes; with ``ntype``, a block's source
        nodes of that type where it has some ('SRC/t', 'DST/t' choose)."""
        return count_nodes(ntype, self._src_counts(), self._dst_counts(), self.is_block)

    def number_of_nodes(self, ntype: Optional[str] = None) -> int:
        return self.num_nodes(ntype)

    def number_of_edges(self, etype: Any = None) -> int:
        return self.num_edges(etype)

    def _ids(self, n: int) -> torch.Tensor:
        return torch.arange(n, dtype=self.idtype, device=self.device)

    def _side(self, side: str) -> Any:
        counts = self._src_counts() if side == "src" else self._dst_counts()
        return NodeView(lambda nt: self._ids(counts[one_type(nt, counts, side)]),
                        lambda nt: self._type_data(side, one_type(nt, counts, side)))

    @property
    def srcnodes(self) -> NodeView:
        return self._side("src")

    @property
    def dstnodes(self) -> NodeView:
        return self._side("dst")

    @property
    def nodes(self) -> NodeView:
        """DGL's ``g.nodes``; on a block a type means its source nodes where it has some, as in DGL."""
        src, dst = self._src_counts(), self._dst_counts()

        def resolve(ntype: Optional[str]) -> Any:
            if not self.is_block:
                return "src", one_type(ntype, src, "")
            if ntype is None:
                raise ValueError(f"a block has node types {self.ntypes}: pass one, or use srcnodes / dstnodes")
            if ntype[:4] in ("SRC/", "DST/") and ntype[4:] in (src if ntype[0] == "S" else dst):
                return ("src" if ntype[0] == "S" else "dst"), ntype[4:]
            return ("src", ntype) if ntype in src else ("dst", one_type(ntype, dst, "destination"))

        def ids(ntype: Optional[str]) -> torch.Tensor:
            side, nt = resolve(ntype)
            return self._ids((src if side == "src" else dst)[nt])

        return NodeView(ids, lambda ntype: self._type_data(*resolve(ntype)))

    @property
    def edges(self) -> EdgeView:
        """DGL's ``g.edges``: ``g.edges(form='uv', order='eid', etype=None)`` and ``g.edges[etype].data``."""
        return EdgeView(self._edges, self._edge_data)

    def local_scope(self) -> Any:
        """DGL's ``with g.local_scope():``: data keys set, replaced or deleted inside are as
        before afterwards (tensors changed in place stay changed, as in DGL)."""
        return local_scope(self.srcdata, self.dstdata, self.edata)
