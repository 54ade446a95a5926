"""A block sampler's prefetch lists on a heterograph: one meaning on the CPU and on the device.

DGL documents ``prefetch_node_feats``, ``prefetch_labels`` and ``prefetch_edge_feats`` as a
list of keys or ``{type: keys}``, and marks a flat list on every type at once
(``_set_lazy_features`` updates ``srcdata`` as a whole). DGL 2.1 fails on that with a graph of
several node (edge) types (``TypeError: list indices must be integers or slices, not list``
from ``dgl/view.py``), and a type without the key could not be fetched anyway. The device
sampler reads a flat list as "every type that has the key"; :func:`per_type_prefetch` gives
DGL that meaning as the ``{type: keys}`` dict it handles, so one sampler works in both modes.
"""
from __future__ import annotations

import copy
from typing import Any, Dict, List, Tuple

#: A block sampler's prefetch attributes, and whether each names edge data.
PREFETCH_ATTRS: Tuple[Tuple[str, bool], ...] = (
    ("prefetch_node_feats", False), ("prefetch_labels", False), ("prefetch_edge_feats", True))


def per_type(spec: Any, graph: Any, edges: bool, what: str = "prefetch") -> Any:
    """``spec`` (a prefetch argument) as ``{type: [keys that type has]}`` where it is a flat list
    on a graph of several node (``edges``: edge) types; otherwise ``spec`` itself. A key that no
    type has raises a ``ValueError`` naming it, each type's keys and the fix."""
    if not spec or isinstance(spec, dict):
        return spec
    types = list(graph.canonical_etypes if edges else graph.ntypes)
    if len(types) < 2:
        return spec  # one type: DGL reads a flat list itself
    keys = [spec] if isinstance(spec, str) else list(spec)
    view = graph.edges if edges else graph.nodes
    has = {t: [k for k in view[t].data.keys() if k != "_ID"] for t in types}
    missing = [k for k in keys if not any(k in names for names in has.values())]
    if missing:
        kind = "edge" if edges else "node"
        raise ValueError(f"{what}={keys!r}: no {kind} type of the graph has {missing} ({kind} data per type: "
                         f"{has}). Fix: name keys the graph has, or give {{{kind[0]}type: [keys]}} per type")
    out: Dict[Any, List[str]] = {t: [k for k in keys if k in has[t]] for t in types}
    return {t: names for t, names in out.items() if names}


def per_type_prefetch(sampler: Any, graph: Any) -> Any:
    """``sampler``, or a shallow copy whose flat prefetch lists are :func:`per_type` dicts (the
    user's sampler is left as it was: it may serve a homogeneous graph too)."""
    changed = {}
    for attr, edges in PREFETCH_ATTRS:
        spec = getattr(sampler, attr, None)
        if spec and not isinstance(spec, dict):
            typed = per_type(spec, graph, edges, what=f"{type(sampler).__name__}({attr}=)")
            if typed is not spec:
                changed[attr] = typed
    if not changed:
        return sampler
    sampler = copy.copy(sampler)
    for attr, value in changed.items():
        setattr(sampler, attr, value)
    return sampler


def one_type_keys(spec: Any, graph: Any, edges: bool = False, what: str = "prefetch") -> List[str]:
    """The keys ``spec`` (a key, a list of keys, or ``{type: keys}``: every form DGL's samplers
    take) names on a graph of one node (``edges``: edge) type, for loaders that read data by key
    (DistDGL's). A type the graph does not have, or a key its data lacks, raises a ``ValueError``
    naming it, what the graph has and the fix."""
    if not spec:
        return []
    kind = "edge" if edges else "node"
    types = list(graph.canonical_etypes if edges else graph.ntypes)
    if isinstance(spec, dict):
        accepted = set(types) | ({t[1] for t in types} if edges else set())  # a relation's name or triple
        unknown = [t for t in spec if t not in accepted]
        if unknown:
            raise ValueError(f"{what}={spec!r}: the graph has no {kind} type {unknown} (its {kind} types: {types}). "
                             f"Fix: name its type{'s' if len(types) > 1 else ''}, or pass a list of keys")
        keys = [k for ks in spec.values() for k in ([ks] if isinstance(ks, str) else ks)]
    else:
        keys = [spec] if isinstance(spec, str) else list(spec)
    keys = list(dict.fromkeys(keys))
    data = graph.edata if edges else graph.ndata
    has = sorted(k for k in data.keys() if k != "_ID")
    missing = [k for k in keys if k not in has]
    if missing:
        raise ValueError(f"{what}={spec!r}: the graph has no {kind} data {missing} (its {kind} data: {has}). Fix: "
                         "name keys the graph has")
    return keys


def check_data_key(graph: Any, key: str, edges: bool, arg: str) -> None:
    """A ``ValueError`` naming ``key``, the keys the graph has and the fix, where no node
    (``edges``: edge) type of a DGL graph has ``key`` (DGL would fail at the first batch, or a
    PyG batch would lack the field). Other graphs (a ``DistGraph``) are left to their loaders."""
    import dgl  # here: the engine imports without DGL (plain-torch tasks)

    if not isinstance(graph, dgl.DGLGraph):
        return
    types = list(graph.canonical_etypes if edges else graph.ntypes)
    view = graph.edges if edges else graph.nodes
    has = {t: sorted(k for k in view[t].data.keys() if k != "_ID") for t in types}
    if any(key in names for names in has.values()):
        return
    kind, store = ("edge", "edata") if edges else ("node", "ndata")
    shown = has[types[0]] if len(types) == 1 else has
    raise ValueError(f"{arg}={key!r}: the graph has no {kind} data {key!r} (its {kind} data: {shown}). Fix: pass "
                     f"{arg}= one of those, or store the data under that name first (g.{store}[{key!r}] = ...)")
