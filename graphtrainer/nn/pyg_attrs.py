"""The graph's other node and edge data in a PyG batch: PyG's ``NeighborLoader`` slices every
node-level attribute of the ``Data`` by ``n_id`` and every edge-level one by ``e_id``, so a PyG
step reads ``batch.train_mask[:batch.batch_size]`` or ``batch.edge_weight``. A batch carries each
node data key of the graph (other than DGL's ``_ID``/``_TYPE`` and those read as ``x``/``y``)
under its own name, one row per node in ``n_id`` order, and each edge data key (other than
``_ID``/``_TYPE`` and the one read as ``edge_attr``) one row per edge in ``e_id`` order.

``attrs`` names the keys to carry instead of all of them (``()``: none). A name PyG's batch
cannot hold under its own name is refused, naming the fix (:func:`check_clashes`).
"""
from __future__ import annotations

from typing import Any, Iterable, List, Optional, Sequence, Set, Tuple

#: DGL's bookkeeping, never carried: ``n_id``/``e_id`` hold ``_ID``; ``_TYPE`` is dgl.to_homogeneous's.
SKIPPED = ("_ID", "_TYPE")
#: The fields PyG's loaders set on a batch (and ``num_nodes``, which would count the nodes).
FIELDS = ("x", "y", "edge_attr", "edge_index", "batch_size", "n_id", "e_id", "num_sampled_nodes",
          "num_sampled_edges", "input_id", "edge_label", "edge_label_index", "src_index", "dst_pos_index",
          "dst_neg_index", "num_nodes")
MAPPED = {"x": 0, "y": 1, "edge_attr": 2}  # the field and its place in (feat_key, label_key, edge_key)


def check_attrs(attrs: Any) -> Optional[Tuple[str, ...]]:
    """``attrs`` as a tuple of names (None: every key), or a ``ValueError`` saying what it takes."""
    if attrs is None:
        return None
    if isinstance(attrs, str) or not all(isinstance(a, str) for a in attrs):
        raise ValueError(f"attrs={attrs!r}: give a list of the graph's node or edge data names for PyG batches "
                         "to carry under their own names (attrs=() for none; default None: all of them)")
    return tuple(attrs)


def carried(node_keys: Iterable[str], edge_keys: Iterable[str], mapped: Sequence[Optional[str]],
            attrs: Optional[Sequence[str]] = None, store: Any = None, edge_store: Any = None,
            where: str = "the graph") -> Tuple[List[str], List[str]]:
    """The node and edge keys a batch carries under their own names: of ``node_keys`` and
    ``edge_keys`` (what the data holds), every one but :data:`SKIPPED` and those :func:`_taken`,
    sorted; or those named in ``attrs`` that the data holds, in that order (a name both hold and
    one side takes is the other side's). ``mapped``: ``(feat_key, label_key, edge_key)``, the
    keys read as ``x``, ``y``, ``edge_attr`` (``""``: the batch has no such field; ``None``: not
    a field of this batch, its name an ordinary key). Clashes are refused (:func:`check_clashes`;
    ``store``/``edge_store``: the PyG class each lands in, for its own attribute names)."""
    nodes = [k for k in node_keys if k not in SKIPPED]
    edges = [k for k in edge_keys if k not in SKIPPED]
    present = (_present(mapped[0], nodes), _present(mapped[1], nodes), _present(mapped[2], edges))
    node_taken, edge_taken = _taken(present, ("x", "y")), _taken(present, ("edge_attr",))
    if attrs is None:
        out = (sorted(k for k in nodes if k not in node_taken), sorted(k for k in edges if k not in edge_taken))
    else:  # node label read as y and an edge label: attrs=["label"] means the edge one
        out = ([a for a in attrs if a in nodes and not (a in node_taken and a in edges and a not in edge_taken)],
               [a for a in attrs if a in edges and not (a in edge_taken and a in nodes and a not in node_taken)])
    check_clashes(out[0], out[1], present, store, edge_store, where)
    return out


def _present(key: Optional[str], keys: Sequence[str]) -> Optional[str]:
    return key if key == "" or key in keys else None  # "": the field switched off


def _taken(present: Sequence[Optional[str]], fields: Sequence[str]) -> Set[str]:
    """The names of node (``fields``: ``x``, ``y``) or edge (``edge_attr``) data that default
    batches leave out: the key read as each field (``present``: where the data has it), and the
    field's own name then (PyG's other candidate) or where the field is switched off (``""``:
    ``label_key=""`` means no ``y``, so node data ``y`` does not become one)."""
    out = set()
    for field in fields:
        key = present[MAPPED[field]]
        if key is not None:
            out.update({key, field} - {""})
    return out


def check_clashes(nodes: Sequence[str], edges: Sequence[str], mapped: Sequence[Optional[str]],
                  store: Any = None, edge_store: Any = None, where: str = "the graph") -> None:
    """A ``ValueError`` for a carried key a PyG batch cannot hold under its own name: a field PyG's
    loaders set (:data:`FIELDS`; ``x``, ``y``, ``edge_attr`` only where another key is read as
    them or the field is switched off, ``""``), an attribute of PyG's class that is not a
    settable property (a method: ``batch.keys`` would not read it), or one name for node and
    edge data (PyG's ``Data`` holds one)."""
    both = sorted(set(nodes) & set(edges))
    if both:
        raise ValueError(f"batch_format='pyg': {where} has node and edge data named {both[0]!r}, and a PyG batch holds "
                         f"one attribute per name (NeighborLoader slices it by n_id or e_id). Fix: rename one, e.g. "
                         f"g.edata['my_{both[0]}'] = g.edata.pop({both[0]!r}), or name the keys to carry with "
                         "attrs=[...] (loader option) without it")
    for edge, keys in ((False, nodes), (True, edges)):
        for key in keys:
            why = _clash(key, mapped, edge_store if edge else store)
            if why:
                kind = "edata" if edge else "ndata"
                raise ValueError(f"batch_format='pyg': {where}'s {'edge' if edge else 'node'} data {key!r} would be "
                                 f"carried under its own name, which is {why}. Fix: rename it (g.{kind}['my_{key}'] = "
                                 f"g.{kind}.pop({key!r})), or name the keys to carry with attrs=[...] (loader option; "
                                 "attrs=() for none), leaving it out")


def _clash(key: str, mapped: Sequence[Optional[str]], cls: Any) -> Optional[str]:
    if key in MAPPED:
        source = mapped[MAPPED[key]]
        if source is None or source == key:
            return None
        return f"the batch's {key}, read from {source!r}" if source else \
            f"the batch's {key}, which {('feat_key', 'label_key', 'edge_key')[MAPPED[key]]}='' leaves out"
    if key in FIELDS:
        return f"the field {key} that PyG's loaders set"
    attr = getattr(cls, key, None) if cls is not None else None
    if attr is not None and not (isinstance(attr, property) and attr.fset is not None):
        return f"PyG's {cls.__name__}.{key} (batch.{key} would not read the data)"
    return None
