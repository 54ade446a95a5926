"""``batch_format="pyg"``: any of graphtrainer's node or edge loaders, yielding PyG batches.

:class:`PygLoader` turns each batch of a loader into PyG's ``Data`` (:mod:`graphtrainer.nn.pyg`);
the split, epochs, evaluation mode, ``len`` and formats stay the wrapped loader's.
"""
from __future__ import annotations

import warnings
from typing import Any, Iterator, List, Optional, Sequence, Tuple

import torch

from ..nn.pyg import PYG_INSTALL, PYG_KEYS, GraphRows, default_key, is_pyg_data, pyg_data_class, to_pyg
from ..nn.pyg_attrs import SKIPPED, carried, check_attrs
from .prefetch import check_data_key
from .pyg_hetero import HETERODATA_REFUSAL, HeteroBatches, check_hetero_loader, is_heterograph, resolve_hetero_keys
from .pyg_negatives import read_neg_sampling, take_amount, take_weights
from .sharded_loader import ShardedLoader

BATCH_FORMATS = ("dgl", "pyg")


def check_batch_format(batch_format: Any) -> str:
    if batch_format not in BATCH_FORMATS:
        raise ValueError(f"batch_format={batch_format!r}: choose 'dgl' (DGL's blocks and pair graphs) or 'pyg' "
                         f"(PyG's Data, as NeighborLoader/LinkNeighborLoader yield it; needs {PYG_INSTALL})")
    return batch_format


def check_pyg_ready(graph: Any = None, typed: bool = False) -> None:
    """Raise before any batch (and, from ``Trainer.fit``, before any rank starts) when
    ``batch_format="pyg"`` cannot work: torch-geometric missing, a PyG ``Data`` as the graph, or
    typed ids on a homogeneous graph (a heterograph's batches are ``HeteroData``: :mod:`.pyg_hetero`)."""
    pyg_data_class()
    require_dgl_graph(graph)
    if typed and not is_heterograph(graph):
        raise ValueError("batch_format='pyg': {ntype: ids} on a graph with one node type and one edge type, whose "
                         "PyG batches are Data, not HeteroData. Fix: pass the ids as a tensor")


def require_dgl_graph(graph: Any) -> None:
    """A PyG ``Data`` where a DGL graph belongs is refused, with the conversion (PyG users' habit)."""
    if is_pyg_data(graph) and type(graph).__name__ == "HeteroData":
        raise TypeError(HETERODATA_REFUSAL)
    if is_pyg_data(graph):
        raise TypeError("the graph is a torch_geometric Data: graphtrainer's loaders sample a DGLGraph and give "
                        "PyG batches with batch_format='pyg'. Convert it once: g = torch_geometric.utils.to_dgl(data) "
                        "(it keeps PyG's names, which PyG batches read: x, y, edge_attr)")


def resolve_batch_keys(graph: Any, feat_key: Optional[str], label_key: Optional[str],
                       edge_key: Optional[str]) -> Tuple[str, str, str]:
    """The node and edge data a PyG batch of a homogeneous ``graph`` reads as ``x``, ``y`` and
    ``edge_attr``: the keys named, else :func:`~graphtrainer.nn.pyg.default_key`'s (``feat`` or
    ``x``, ``label`` or ``y``, edge data ``feat`` or ``edge_attr``, whichever the graph has)."""
    ndata, edata = (_keys(getattr(graph, name, None)) for name in ("ndata", "edata"))
    return (default_key("x", ndata) if feat_key is None else feat_key,
            default_key("y", ndata) if label_key is None else label_key,
            default_key("edge_attr", edata) if edge_key is None else edge_key)


def _keys(view: Any) -> List[str]:
    return list(view.keys()) if view is not None and hasattr(view, "keys") else []


def resolve_attrs(graph: Any, mapped: Tuple[str, Optional[str], str], attrs: Any) -> Tuple[List[str], List[str]]:
    """The node and edge data keys PyG batches of ``graph`` carry under their own names
    (:mod:`graphtrainer.nn.pyg_attrs`): all but ``_ID``/``_TYPE`` and ``mapped`` (the keys read as
    ``x``, ``y``, ``edge_attr``; ``None``: a link batch's, which has no ``y``), or those ``attrs``
    names; on a heterograph, of any type (each type's own: :mod:`graphtrainer.nn.pyg_hetero`). A name
    the graph lacks, or one a batch cannot hold, is refused before any batch, naming the fix."""
    attrs = check_attrs(attrs)
    if is_heterograph(graph):
        from torch_geometric.data.storage import EdgeStorage, NodeStorage  # check_pyg_ready imported PyG
        per_type = [carried(_keys(graph.nodes[nt].data), (), (*mapped[:2], None), attrs, NodeStorage,
                            where=f"node type {nt!r}")[0] for nt in graph.ntypes]
        per_rel = [carried((), _keys(graph.edges[et].data), (None, None, mapped[2]), attrs, None, EdgeStorage,
                           where=f"relation {et!r}")[1] for et in graph.canonical_etypes]
        nodes, edges = _union(per_type, attrs), _union(per_rel, attrs)
        held = {k for nt in graph.ntypes for k in _keys(graph.nodes[nt].data)} | \
            {k for et in graph.canonical_etypes for k in _keys(graph.edges[et].data)}
    else:
        ndata, edata = _keys(getattr(graph, "ndata", None)), _keys(getattr(graph, "edata", None))
        nodes, edges = carried(ndata, edata, mapped, attrs, pyg_data_class(), pyg_data_class())
        held = set(ndata) | set(edata)
    wrong = [a for a in attrs or () if a not in held or a in SKIPPED]
    if wrong:
        why = {"_ID": "n_id and e_id hold it", "_TYPE": "it is DGL's bookkeeping, dgl.to_homogeneous's node (edge) "
               "type; to carry it, copy it under another name first: g.ndata['node_type'] = g.ndata['_TYPE']"}.get(
            wrong[0], "the graph has no such node or edge data")
        raise ValueError(f"attrs names {wrong[0]!r}, which a PyG batch cannot carry: {why} (the graph has "
                         f"{sorted(held - set(SKIPPED))}). Fix: name the graph's node or edge data to carry under "
                         "their own names (attrs=() for none, None for all)")
    return nodes, edges


def _union(lists: List[List[str]], attrs: Optional[Sequence[str]]) -> List[str]:
    names = {k for keys in lists for k in keys}
    return [a for a in attrs if a in names] if attrs is not None else sorted(names)


class PygLoader(ShardedLoader):
    """A node or edge loader whose batches are PyG ``Data`` objects.

    Node batches carry ``x``, ``edge_index``, ``edge_attr`` (where the graph has edge data
    ``edge_key``), ``y``, ``batch_size``, ``n_id``, ``e_id``, ``num_sampled_nodes`` and
    ``num_sampled_edges``; edge batches also ``input_id`` and, by ``neg_sampling``, PyG's
    ``"binary"`` fields ``edge_label_index`` and ``edge_label`` (the default; negatives drawn at
    both ends) or its ``"triplet"`` fields ``src_index``, ``dst_pos_index`` and ``dst_neg_index``
    (negatives keep the positive's source); ``neg_sampling`` may be PyG's ``NegativeSampling`` (or
    a dict of its fields): its ``amount`` (a float: ``ceil(p * amount)`` per batch, binary) and
    ``src_weight``/``dst_weight`` (node weights of the drawn ends). ``edge_label``: one value (row) per seed edge as the
    edge loader was given them, the positives' ``edge_label`` (as PyG's, shifted by 1 when its
    least value is 0 and there are negatives, 0 being theirs). ``feat_key``/``label_key``/``edge_key``:
    the data read as ``x``, ``y`` and ``edge_attr`` (default: node data ``feat``, else PyG's ``x``;
    ``label``, else ``y``; edge data ``feat``, else ``edge_attr``; ``label_key=""``: no ``y``, node
    data ``y`` not carried as one either; ``""`` switches ``x`` or ``edge_attr`` off alike);
    sampled on the device, the loader gathers them whatever its sampler prefetches. A key named
    here that the graph lacks is refused (:func:`check_batch_keys`); no ``x`` gives a warning.
    ``y`` holds every node's label, as PyG's (``y[:batch_size]``: the seeds'). The graph's other
    node and edge data ride along under their own names, by ``n_id`` and ``e_id``, as
    ``NeighborLoader`` slices a ``Data``'s (``batch.train_mask``); ``attrs``: only those named
    (``()``: none). A name a batch cannot hold is refused (:mod:`graphtrainer.nn.pyg_attrs`).
    On a heterograph a node loader of one seed type yields ``HeteroData`` (:mod:`.pyg_hetero`).
    """

    def __init__(self, loader: ShardedLoader, feat_key: Optional[str] = None, label_key: Optional[str] = None,
                 edge_key: Optional[str] = None, neg_sampling: Any = None, edge_label: Any = None,
                 attrs: Optional[Sequence[str]] = None):
        graph = getattr(loader, "graph", None)
        check_pyg_ready(graph, typed=getattr(loader, "typed", None) is not None)
        check_batch_keys(graph, feat_key, label_key, edge_key)
        tried = PYG_KEYS["x"] if feat_key is None else (feat_key,)
        self.hetero: Optional[HeteroBatches] = None
        if is_heterograph(graph):  # HeteroData batches (NeighborLoader on a HeteroData)
            seed_type = check_hetero_loader(loader)
            feat_key, label_key, edge_key = resolve_hetero_keys(graph, seed_type, feat_key, label_key, edge_key)
        else:
            feat_key, label_key, edge_key = resolve_batch_keys(graph, feat_key, label_key, edge_key)
        # A link batch has no y: its node data y is an ordinary key (None), not a switched-off field ("").
        nodes, edges = resolve_attrs(graph, (feat_key, None if hasattr(loader, "pairs") else label_key, edge_key),
                                     attrs)
        self.attrs = tuple(dict.fromkeys(nodes + edges))  # one name on a node type and a relation: once
        if is_heterograph(graph):  # each type's own (x may be one type's data and another's feat)
            self.hetero = HeteroBatches(loader, seed_type, (feat_key, label_key, edge_key), check_attrs(attrs))
        self.inner, self.feat_key, self.label_key, self.edge_key = loader, feat_key, label_key, edge_key
        self.neg_sampling = link_mode(loader, neg_sampling, edge_label)
        self.edge_labels = None if edge_label is None else EdgeLabels(edge_label, loader, self.neg_sampling)
        loader.batch_keys = (feat_key, label_key, edge_key)  # gathered on the device whatever the sampler names
        loader.batch_attrs = (nodes, edges)
        ndata = getattr(graph, "ndata", None)
        if self.hetero is None and hasattr(ndata, "keys") and feat_key not in ndata.keys():
            has = sorted(k for k in ndata.keys() if k != "_ID")
            warnings.warn(f"the graph has no node data {' or '.join(map(repr, tried))} (it has {has}), so these PyG "
                          "batches carry no x. Fix: pass feat_key= naming its input features to the loader, or "
                          "store them: g.ndata['feat'] = ...; a featureless model reads n_id",
                          UserWarning, stacklevel=3)

    def __getattr__(self, name: str) -> Any:
        # Everything not defined here is the wrapped loader's (graph, sampler, ids, epoch, ...).
        if name in ("inner", "feat_key", "label_key", "edge_key", "neg_sampling", "edge_labels", "hetero", "attrs") or \
                name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.inner, name)

    typed = property(lambda self: self.inner.typed)  # type: ignore[assignment]
    spans = property(lambda self: self.inner.spans)  # type: ignore[assignment]

    def set_epoch(self, epoch: int) -> None:
        self.inner.set_epoch(epoch)

    def for_evaluation(self) -> "PygLoader":
        self.inner.for_evaluation()
        return self

    def local_ids(self) -> torch.Tensor:
        return self.inner.local_ids()

    def split_place(self) -> Tuple[int, int]:
        return self.inner.split_place()

    def local_batches(self) -> List[torch.Tensor]:
        return self.inner.local_batches()

    def __len__(self) -> int:
        return len(self.inner)

    def check_world(self, world_size: int) -> None:
        self.inner.check_world(world_size)

    def _batches(self) -> Tuple[Iterator[Any], Optional[GraphRows]]:
        """The wrapped loader's batches and, where it can leave their data out, where the rows
        a batch keeps are read: a PyG batch drops nodes and edges of the blocks (those only DGL's
        re-sampling reached), so gathering for the blocks gathers rows it drops, then copies
        those it keeps (``benchmarks/results/pyg_gather``)."""
        lean = getattr(self.inner, "lean_batches", None)
        made = lean() if callable(lean) else None
        return made if made is not None else (iter(self.inner), None)

    def __iter__(self) -> Iterator[Any]:
        keys = (self.feat_key, self.label_key, self.edge_key)
        if self.hetero is not None:
            yield from map(self.hetero, self.inner)
            return
        batches, rows = self._batches()
        if self.neg_sampling is None:  # node batches
            for batch in batches:
                yield to_pyg(batch, *keys, rows=rows, attrs=self.attrs)
            return
        # Pairs: each batch's positions in the pair list (its input_id, as PyG's), batch by batch.
        positions = iter(self.inner.local_batches()) if self.inner.pairs is not None else None
        for batch in batches:
            ids = None if positions is None else next(positions)
            if ids is not None and ids.numel() != batch[1].num_edges():
                raise RuntimeError(f"batch_format='pyg': a batch of {batch[1].num_edges()} pairs met {ids.numel()} "
                                   "positions (the loader's batches and local_batches() disagree)")
            label = None
            if self.edge_labels is not None:
                label = self.edge_labels.rows(ids if ids is not None else batch[1].edata["_ID"])
            yield to_pyg(batch, *keys, neg_sampling=self.neg_sampling, edge_label=label, input_id=ids, rows=rows,
                         attrs=self.attrs)


def link_mode(loader: Any, neg_sampling: Any, edge_label: Any) -> Optional[str]:
    """The PyG negative-sampling mode of an edge loader's batches (None for a node loader), after
    setting its negatives to draw as ``neg_sampling`` says (a mode, or PyG's ``NegativeSampling``,
    a dict or a tuple of its fields: :func:`~graphtrainer.data.pyg_negatives.read_neg_sampling`);
    a ``ValueError`` naming the fix for what does not fit."""
    if not hasattr(loader, "pairs"):
        if neg_sampling is not None or edge_label is not None:
            raise ValueError("neg_sampling= and edge_label= shape link batches (edge_dataloader); a node loader's "
                             "PyG batches have neither: its labels are y (label_key=)")
        return None
    spec = read_neg_sampling(neg_sampling)
    negatives = getattr(loader, "negatives", None)
    drawn_here = isinstance(getattr(negatives, "random_sources", None), bool)  # PerEdgeUniform: negatives=k
    take_amount(negatives, drawn_here, spec)
    mode = spec.mode
    if mode == "triplet":
        if not drawn_here:
            raise ValueError("neg_sampling='triplet' needs negatives=k (an int: k destinations drawn per positive "
                             f"edge, keeping its source), got negatives={negatives!r}")
        if not isinstance(negatives.amount, int):
            raise ValueError(f"neg_sampling='triplet' draws a whole number of destinations per positive edge (as "
                             f"PyG's, which refuses a fractional amount), got {negatives.amount}: give an int, or "
                             "neg_sampling='binary' for a ratio")
        if edge_label is not None:
            raise ValueError("edge_label= goes with neg_sampling='binary' (as in PyG, a triplet batch has no "
                             "edge_label); read the positives' data by batch.input_id instead")
    if drawn_here:
        negatives.random_sources = mode == "binary"
        take_weights(negatives, loader.graph, spec)
    return mode


class EdgeLabels:
    """``edge_label`` of the seed edges (one row each, as given), found per batch by edge id
    (``input_id``) or by position in the pair list."""

    def __init__(self, edge_label: Any, loader: Any, mode: Optional[str]):
        label = edge_label if isinstance(edge_label, torch.Tensor) else torch.as_tensor(edge_label)
        ids = loader.ids
        if getattr(loader, "scope", None) == "machine":
            raise ValueError("edge_label= with a DistTensor edge mask: give edge ids or (src, dst) pairs, so "
                             "that each label has its edge")
        if label.dim() == 0 or label.shape[0] != ids.numel():
            also = " (one per seed edge, not per graph edge: edge_label[mask])" if label.dim() and \
                label.shape[0] == getattr(loader.graph, "num_edges", lambda: -1)() else ""
            raise ValueError(f"edge_label: one value (row) per seed edge, as edges lists them ({ids.numel()}), "
                             f"got shape {tuple(label.shape)}{also}")
        if mode == "binary" and loader.negatives is not None and label.numel() and bool(label.min() == 0):
            if bool(((label == 0) | (label == 1)).all()):  # RandomLinkSplit's val/test: negatives already there
                warnings.warn("edge_label= holds 0s and 1s, as labelled pairs that already include their negatives "
                              "(RandomLinkSplit's val/test edge_label), and negatives= draws more: the labels become "
                              "2 and 1, the drawn negatives 0 (PyG's rule with neg_sampling). For held-out pairs with "
                              "their own labels pass negatives=None (PyG's default)", UserWarning, stacklevel=4)
            label = label + 1  # as PyG: 0 is the negatives' label
        self.by_position = loader.pairs is not None
        self.keys: Optional[torch.Tensor] = None
        if not self.by_position:
            order = torch.argsort(ids, stable=True)
            self.keys, label = ids[order], label[order]
            same = (self.keys[1:] == self.keys[:-1]).nonzero(as_tuple=True)[0]
            unequal = label[same] != label[same + 1]
            differ = (unequal.flatten(1).any(1) if unequal.dim() > 1 else unequal).nonzero(as_tuple=True)[0]
            if differ.numel():
                e = int(self.keys[same[differ[0]]])
                raise ValueError(f"edge_label: edge {e} is given twice with different labels; give each edge once")
        self.label = label

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """The labels of the batch's seed edges: ``ids`` are edge ids, or positions in the pair list."""
        if self.label.device != ids.device:  # sampled on the device: the table moves once
            self.label = self.label.to(ids.device)
            self.keys = None if self.keys is None else self.keys.to(ids.device)
        if self.keys is None:
            return self.label[ids.long()]
        return self.label[torch.searchsorted(self.keys, ids.long())]


def check_batch_keys(graph: Any, feat_key: Optional[str], label_key: Optional[str], edge_key: Optional[str]) -> None:
    """A ``ValueError`` for a key named (not ``None``, not ``""``) that no node (edge) type of
    ``graph`` has, naming it, the graph's keys and the fix, before any batch is sampled."""
    for arg, key, edges in (("feat_key", feat_key, False), ("label_key", label_key, False),
                            ("edge_key", edge_key, True)):
        if key is not None and not isinstance(key, str):
            raise ValueError(f"{arg}={key!r}: give the name of the graph's {'edge' if edges else 'node'} data, a str")
        if key:
            check_data_key(graph, key, edges, arg)


def with_batch_format(loader: Any, batch_format: str, feat_key: Optional[str] = None,
                      label_key: Optional[str] = None, edge_key: Optional[str] = None,
                      neg_sampling: Any = None, edge_label: Any = None, attrs: Optional[Sequence[str]] = None) -> Any:
    """``loader`` as it is (``"dgl"``), or yielding PyG batches (``"pyg"``) that read ``x``, ``y``
    and ``edge_attr`` from the data named ``feat_key``, ``label_key`` and ``edge_key``, with
    ``neg_sampling``'s fields and ``edge_label`` (link batches) and the other data ``attrs`` names
    (default all)."""
    if check_batch_format(batch_format) == "pyg":
        return PygLoader(loader, feat_key=feat_key, label_key=label_key, edge_key=edge_key,
                         neg_sampling=neg_sampling, edge_label=edge_label, attrs=attrs)
    if attrs is not None:
        raise ValueError("attrs= names the graph data PyG batches carry (batch_format='pyg'); DGL's blocks read "
                         "any key of the graph on access (blocks[0].srcdata[key])")
    if neg_sampling is not None or edge_label is not None:
        raise ValueError("neg_sampling= and edge_label= shape PyG batches (batch_format='pyg'); DGL's batches hold "
                         "the negatives as neg_pair_graph (negatives=k keeps each edge's source) and the seed "
                         "edges' data as pair_graph.edata")
    amount = getattr(getattr(loader, "negatives", None), "amount", 1)
    if amount != int(amount):  # a ragged neg_pair_graph: DGL's samplers and [b, k] scoring assume k per edge
        raise ValueError(f"negatives={amount}: a fractional amount is PyG's binary ratio (batch_format='pyg'); DGL's "
                         "batches take k, a whole number of negatives per positive edge")
    return loader
