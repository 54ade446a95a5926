"""Data dicts of device-sampled blocks that read, on first access, a key of the sampled graph the
sampler did not gather, as DGL's blocks do (their frames index every column of the graph on access).

:class:`LazyData` is a homogeneous block's ``srcdata``/``dstdata``/``edata`` (``{key: tensor}``),
:class:`LazyStore` one side of a ``TorchHeteroBlock`` (``{key: {type: tensor}}``). Both hold
what was gathered or set, and read a key they lack from a *source* (the loader's, shared by
every batch: a reference to the graph, never a copy; see
:class:`graphtrainer.data.device.host_reads.GraphSource`) by the block's ``_ID`` rows; the value
is then kept in the block. As DGL's block frames list every column of the graph, ``keys()``,
iteration, ``len()`` and ``in`` see the graph's keys too (those deleted from the block left out,
those set on it added last, DGL's order), without reading any; ``[key]``, ``get``, ``values()``,
``items()`` and ``dict(view)`` read what they return. Moving (``.to()``) and copying keep the
source; pickling keeps only what the block holds and drops the source (which would pickle the
graph), so a pickled block lists what it held. Printing shows what is held; ``dict.keys(data)``
and :func:`held_items` give it, reading nothing.
"""
from __future__ import annotations

import copy
from collections.abc import ItemsView, KeysView, ValuesView
from typing import Any, Dict, Iterable, Iterator, List, Optional, Protocol, Set, Tuple

import torch

NID = "_ID"  # dgl.NID and dgl.EID
ANY = object()  # "some type" for LazyStore.has
_NO = object()  # no default given


class Source(Protocol):
    """Where a block's missing keys are read (``edge``: edge data; ``type_``: the node type, or
    the canonical edge type)."""

    def has(self, edge: bool, type_: Any, key: str) -> bool: ...

    def keys(self, edge: bool, type_: Any) -> List[str]:
        """The graph's keys of ``type_`` (not ``_ID``), in the graph's order."""

    def read(self, edge: bool, type_: Any, key: str, ids: torch.Tensor, where: str) -> torch.Tensor: ...


def _unknown(key: str, where: str, held: Any, available: Any, source: Optional[Source], edge: bool) -> KeyError:
    kind = "edge" if edge else "node"
    if source is None:
        return KeyError(f"{where}[{key!r}]: this block holds {held} only; it was pickled (or built without "
                        f"its graph), so the graph's other {kind} data cannot be read from it. Fix: read the "
                        "data before pickling, or gather it with the batch (prefetch_node_feats=[...] / "
                        "prefetch_labels=[...] / prefetch_edge_feats=[...] of the sampler)")
    available = sorted(available) if isinstance(available, list) else {t: sorted(v) for t, v in available.items()}
    return KeyError(f"{where}[{key!r}]: neither the block nor the graph has {kind} data {key!r} (the block holds "
                    f"{held}; the graph has {available}). Fix: read one of those, or set it first "
                    f"(block.{where}[{key!r}] = ...)")


class LazyData(dict):
    """A homogeneous block's data dict of node type (``edge``: canonical edge type) ``type_``
    that reads a key it lacks from ``source`` by its own ``_ID`` rows (``where``: its name,
    for messages). It lists the graph's keys too (none read), as DGL's block frames. A key
    deleted is gone, as in DGL, until set again."""

    def __init__(self, data: Dict[str, Any], source: Optional[Source], edge: bool, type_: Any, where: str):
        super().__init__(data)
        self.source, self.edge, self.type, self.where = source, edge, type_, where
        self._gone: Set[str] = set()

    def _servable(self, key: Any) -> bool:
        return (self.source is not None and isinstance(key, str) and key != NID and key not in self._gone
                and dict.__contains__(self, NID) and self.source.has(self.edge, self.type, key))

    def __missing__(self, key: str) -> Any:
        if not self._servable(key):
            raise self.unknown(key)
        assert self.source is not None
        value = self.source.read(self.edge, self.type, key, dict.__getitem__(self, NID), self.where)
        dict.__setitem__(self, key, value)
        return value

    def unknown(self, key: str) -> KeyError:
        held = [k for k in dict.keys(self) if k != NID]
        available = [] if self.source is None else self.source.keys(self.edge, self.type)
        return _unknown(key, self.where, held, available, self.source, self.edge)

    def _names(self) -> List[str]:
        """DGL's listing: the graph's keys (in its order, those deleted left out), then the rest held."""
        graph = [k for k in self.source.keys(self.edge, self.type) if k not in self._gone] \
            if self.source is not None and dict.__contains__(self, NID) else []
        return list(dict.fromkeys([*graph, *dict.keys(self)]))

    def __iter__(self) -> Iterator[str]:
        return iter(self._names())

    def __len__(self) -> int:
        return len(self._names())

    def keys(self) -> KeysView:  # type: ignore[override]
        return KeysView(self)

    def items(self) -> ItemsView:  # type: ignore[override]
        return ItemsView(self)  # each value read as it is reached, as DGL's

    def values(self) -> ValuesView:  # type: ignore[override]
        return ValuesView(self)

    def __contains__(self, key: object) -> bool:
        return dict.__contains__(self, key) or self._servable(key)

    def get(self, key: str, default: Any = None) -> Any:
        return self[key] if key in self else default

    def pop(self, key: str, default: Any = _NO) -> Any:
        if key not in self:
            if default is _NO:
                raise self.unknown(key)
            return default
        value = self[key]
        del self[key]
        return value

    def setdefault(self, key: str, default: Any = None) -> Any:
        if key not in self:
            self[key] = default
        return self[key]

    def __delitem__(self, key: str) -> None:
        if not (dict.__contains__(self, key) or self._servable(key)):
            raise self.unknown(key)
        dict.pop(self, key, None)
        self._gone.add(key)

    def held(self) -> Dict[str, Any]:
        """What the block holds (gathered, read or set), as a plain dict: nothing is read."""
        return dict(dict.items(self))

    def like(self, data: Dict[str, Any]) -> "LazyData":
        """``data`` (this dict's values, moved) read lazily from the same source."""
        out = LazyData(data, self.source, self.edge, self.type, self.where)
        out._gone = set(self._gone)
        return out

    def __copy__(self) -> "LazyData":
        return self.like(self.held())

    def __deepcopy__(self, memo: dict) -> "LazyData":
        return self.like(copy.deepcopy(self.held(), memo))  # the source is shared: it is the graph

    def __reduce__(self) -> Any:
        return LazyData, (self.held(), None, self.edge, self.type, self.where)


class LazyStore(dict):
    """One side of a ``TorchHeteroBlock`` (``{key: {type: tensor}}``) that reads the rows of a
    type in its ``_ID`` the graph has ``key`` for and it lacks from ``source``, once per key and
    type (deleted afterwards, it stays deleted). ``[key]`` and ``get`` read every type."""

    def __init__(self, data: Dict[str, Any], source: Optional[Source], edge: bool, where: str):
        super().__init__(data)
        self.source, self.edge, self.where = source, edge, where
        self._checked: Set[Tuple[str, Any]] = set()

    def _types(self) -> Dict[Any, torch.Tensor]:
        return dict.get(self, NID) or {}

    def _missing(self, key: Any, type_: Any = ANY) -> list:
        """The types (``type_``, or every type) the graph has ``key`` for that this store lacks."""
        if self.source is None or not isinstance(key, str) or key == NID:
            return []
        held = dict.get(self, key) or {}
        types = self._types() if type_ is ANY else [type_] if type_ in self._types() else []
        out = []
        for t in types:
            if t not in held and (key, t) not in self._checked:
                if self.source.has(self.edge, t, key):
                    out.append(t)
                else:  # asked again each layer (a model's own keys): the graph is asked once
                    self._checked.add((key, t))
        return out

    def fill(self, key: str, type_: Any = ANY) -> None:
        """Read the rows of ``key`` (of ``type_``, or every type) the graph has and this store lacks."""
        missing = self._missing(key, type_)
        if missing:
            assert self.source is not None
            ids, per_type = self._types(), dict.setdefault(self, key, {})
            for t in missing:
                per_type[t] = self.source.read(self.edge, t, key, ids[t], self.where)
                self._checked.add((key, t))

    def has(self, key: Any, type_: Any = ANY) -> bool:
        """Whether ``key`` is held or readable (for ``type_``, or some type), without reading it."""
        held = dict.get(self, key)
        if held and (type_ is ANY or type_ in held):
            return True
        return bool(self._missing(key, type_))

    def names(self, type_: Any = ANY) -> List[str]:
        """Every key held or readable (for ``type_``, or some type), reading nothing: per type, as
        DGL lists a block's frames, the graph's keys in its order, then the rest held."""
        out: List[str] = []
        for t in list(self._types()) if type_ is ANY else [type_]:
            if self.source is not None and t in self._types():
                out += [k for k in self.source.keys(self.edge, t) if self.has(k, t)]
            out += [k for k, v in dict.items(self) if v and t in v]
        if type_ is ANY:
            out += [k for k, v in dict.items(self) if v]
        return list(dict.fromkeys(out))

    def __getitem__(self, key: str) -> Any:
        self.fill(key)
        if not dict.__contains__(self, key):
            raise self.unknown(key)
        return dict.__getitem__(self, key)

    def get(self, key: str, default: Any = None) -> Any:
        self.fill(key)
        return dict.get(self, key, default)

    def __contains__(self, key: object) -> bool:
        return dict.__contains__(self, key) or self.has(key)

    def delete(self, key: str, type_: Any = ANY) -> None:
        """Delete ``key`` (of ``type_``, or every type), read or not, so that it is not read again."""
        if not self.has(key, type_):
            raise self.unknown(key, type_)
        types = list(self._types()) if type_ is ANY else [type_]
        self._checked.update((key, t) for t in types)
        per_type = dict.get(self, key) or {}
        for t in types:
            per_type.pop(t, None)
        if not per_type or type_ is ANY:
            dict.pop(self, key, None)

    def __delitem__(self, key: str) -> None:
        self.delete(key)

    def clear(self) -> None:  # local_scope's restore (which then restores what was read or deleted)
        dict.clear(self)
        self._checked.clear()

    def unknown(self, key: str, type_: Any = ANY) -> KeyError:
        types = [type_] if type_ is not ANY else list(self._types())
        held = {t: [k for k, v in dict.items(self) if k != NID and t in v] for t in types}
        available = {} if self.source is None else {t: self.source.keys(self.edge, t) for t in types}
        return _unknown(key, self.where, held, available, self.source, self.edge)

    def like(self, data: Dict[str, Any]) -> "LazyStore":
        out = LazyStore(data, self.source, self.edge, self.where)
        out._checked = set(self._checked)
        return out

    def __copy__(self) -> "LazyStore":
        return self.like(dict(self))

    def __deepcopy__(self, memo: dict) -> "LazyStore":
        return self.like(copy.deepcopy(dict(self), memo))

    def __reduce__(self) -> Any:
        return LazyStore, (dict(self), None, self.edge, self.where)


def per_type(store: Dict[str, Any], key: str, type_: Any = ANY) -> Optional[Dict[Any, Any]]:
    """A per-type store's ``{type: value}`` of ``key`` (None without it), having read the rows of
    ``type_`` (or every type) a :class:`LazyStore` lacks."""
    if isinstance(store, LazyStore):
        store.fill(key, type_)
    return dict.get(store, key)


def has_key(store: Dict[str, Any], key: Any, type_: Any = ANY) -> bool:
    """Whether a per-type store holds (or can read) ``key`` for ``type_`` (or some type)."""
    if isinstance(store, LazyStore):
        return store.has(key, type_)
    held = dict.get(store, key)
    return bool(held) and (type_ is ANY or type_ in held)


def delete_key(store: Dict[str, Any], key: str, type_: Any) -> None:
    """Delete ``key`` of ``type_`` (``ANY``: of every type) from a per-type store (a
    :class:`LazyStore` does not read it again)."""
    if isinstance(store, LazyStore):
        store.delete(key, type_)
        return
    held = dict.get(store, key)
    if not held or (type_ is not ANY and type_ not in held):
        raise KeyError(key)
    if type_ is ANY:
        del store[key]
        return
    del held[type_]
    if not held:
        del store[key]


def key_names(store: Dict[str, Any], type_: Any = ANY) -> List[str]:
    """The keys a per-type store holds (a :class:`LazyStore`: or can read) for ``type_`` (or some
    type), reading nothing."""
    if isinstance(store, LazyStore):
        return store.names(type_)
    return [k for k, v in store.items() if v and (type_ is ANY or type_ in v)]


def unreadable(store: Dict[str, Any]) -> bool:
    """Whether ``store`` is a device block's that lost its graph (pickled): it cannot tell which
    keys the graph has."""
    return isinstance(store, (LazyData, LazyStore)) and store.source is None


def held_items(data: Any) -> Iterable[Tuple[str, Any]]:
    """``data``'s items that are held, reading nothing (a device block's data lists the graph's
    too): a dict's own, or what a per-type view's ``held()`` gives."""
    if isinstance(data, dict):
        return dict.items(data)
    held = getattr(data, "held", None)
    return held().items() if callable(held) else data.items()


def lazy_state(data: Any) -> Any:
    """What a device block's dict has read or deleted (for ``local_scope`` to restore); None otherwise."""
    if isinstance(data, LazyData):
        return set(data._gone)
    return set(data._checked) if isinstance(data, LazyStore) else None


def set_lazy_state(data: Any, state: Any) -> None:
    """Put back what :func:`lazy_state` saved (what was read or deleted then)."""
    if isinstance(data, LazyData):
        data._gone = set(state)
    elif isinstance(data, LazyStore):
        data._checked = set(state)


def missing_key(store: Dict[str, Any], key: str, type_: Any = ANY) -> KeyError:
    """The ``KeyError`` for ``key``: naming what is held and readable where the store can say."""
    return store.unknown(key, type_) if isinstance(store, LazyStore) else KeyError(key)


def is_lazy(data: Any) -> bool:
    """Whether ``data`` is a device block's dict that reads what it lacks from the graph."""
    return isinstance(data, (LazyData, LazyStore))
