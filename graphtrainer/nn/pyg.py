"""PyG-style batches from sampled blocks: what PyG's ``NeighborLoader`` and
``LinkNeighborLoader`` yield, made from graphtrainer's blocks, so a PyG model's step
(``model(batch.x, batch.edge_index)[:batch.batch_size]``) runs unchanged.

The input is blocks in DGL's layout from any source (DGL's CPU sampling, torch blocks, a
device sampler). A block's destination nodes are the first of its source nodes and the next
block's source nodes, so all blocks share ``blocks[0].srcdata["_ID"]``'s numbering, the seeds first.

As in PyG's neighbour sampling, **each node's in-edges are sampled once**, at the hop where
the node first appears: DGL samples every destination again in every block, so hop ``h``
(``blocks[-h]``) keeps only the in-edges of the nodes new at hop ``h - 1`` (hop 1: the seeds),
and the batch holds only the nodes those edges reach: the sources DGL's re-sampling alone
reached (a whole hop's after a fanout of 0) are left out. Nodes are numbered as PyG's sampler
numbers them: the seeds, then each hop's new nodes in the order first met (walking the
previous hop's nodes in order). Edges are ordered by hop, and ``num_sampled_nodes``/
``num_sampled_edges`` count them per hop, so PyG's ``trim_to_layer`` (and ``BasicGNN``'s
``num_sampled_*_per_hop``) work.

Fanouts keep DGL's order (``fanouts[i]`` is ``blocks[i]``'s: the input layer first), so
PyG's ``num_neighbors=[25, 10]`` (hop 1 first) is ``fanouts=[10, 25]``.

torch-geometric is optional: nothing here imports it until a batch is made.
"""
from __future__ import annotations

import sys
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

from .blocks import TorchBlock
from .convert import csc_tensors, is_dgl_graph
from .pyg_attrs import carried

PYG_INSTALL = "pip install 'graphtrainer[pyg]' (or pip install torch-geometric)"
NID, EID = "_ID", "_ID"
#: What a PyG batch reads as ``x``, ``y`` and ``edge_attr`` when no key is named: graphtrainer's
#: name, else PyG's own (kept by ``torch_geometric.utils.to_dgl``); node data for ``x``/``y``.
PYG_KEYS = {"x": ("feat", "x"), "y": ("label", "y"), "edge_attr": ("feat", "edge_attr")}


def default_key(field: str, present: Any) -> str:
    """The data a PyG batch reads as ``field`` (``"x"``, ``"y"``, ``"edge_attr"``) when no key is
    named: the first of :data:`PYG_KEYS` that ``present`` (a data view or the keys) holds, else
    graphtrainer's name (the batch then lacks the field)."""
    names = PYG_KEYS[field]
    return next((k for k in names if k in present), names[0])


def pyg_data_class(name: str = "Data") -> Any:
    """``torch_geometric.data.Data`` (or another class there, ``"HeteroData"``), or an ``ImportError``
    that names the install command."""
    try:
        from torch_geometric import data
    except ImportError as exc:
        raise ImportError(f"batch_format='pyg' needs torch-geometric, which cannot be imported here ({exc}). "
                          f"Fix: {PYG_INSTALL}; or keep DGL's batches (batch_format='dgl').") from None
    return getattr(data, name)


def is_pyg_data(obj: Any) -> bool:
    """Whether ``obj`` is a PyG ``Data``/``HeteroData`` (without importing PyG)."""
    module = sys.modules.get("torch_geometric.data.data")
    return module is not None and isinstance(obj, module.BaseData)


def _lean(block: Any, src_keys: Sequence[str], dst_keys: Sequence[str], edge_keys: Sequence[str]) -> Any:
    """A DGL block as a :class:`TorchBlock` with only the data a PyG batch reads (DGL's lazy
    views of every column would otherwise gather features for every block)."""
    if not is_dgl_graph(block) or len(block.canonical_etypes) != 1 or len(block.srctypes) != 1:
        return block
    indptr, indices, eids = csc_tensors(block, layer="batch_format='pyg'")
    return TorchBlock(indptr, indices, eids, block.num_src_nodes(), block.num_dst_nodes(),
                      srcdata=_pick(block.srcdata, src_keys), dstdata=_pick(block.dstdata, dst_keys),
                      edata=_pick(block.edata, [EID, *edge_keys]))


def _pick(view: Any, keys: Sequence[str]) -> Dict[str, torch.Tensor]:
    return {k: view[k] for k in keys if k in view}


def _require_homogeneous(blocks: Sequence[Any]) -> None:
    """A ``ValueError`` naming :func:`~graphtrainer.nn.pyg_hetero.to_hetero_pyg` for a heterograph's
    blocks, before their data is read (a node type and a relation may share a data name there)."""
    for block in blocks:
        typed = is_dgl_graph(block) and (len(block.canonical_etypes) != 1 or len(block.srctypes) != 1)
        if typed or not (is_dgl_graph(block) or isinstance(block, TorchBlock) and block.is_block):
            raise ValueError(f"batch_format='pyg' takes sampled blocks of a homogeneous graph, got "
                             f"{type(block).__name__}: a heterograph's blocks make PyG's HeteroData. Fix: "
                             "graphtrainer.nn.pyg_hetero.to_hetero_pyg(batch) (a loader with batch_format='pyg' "
                             "uses it on a heterograph)")


def _homogeneous(blocks: Sequence[Any], src_keys: Sequence[str], label_key: str,
                 edge_keys: Sequence[str]) -> List[TorchBlock]:
    out = []
    last = len(blocks) - 1
    for i, block in enumerate(blocks):
        out.append(_lean(block, [*src_keys, NID] if i == 0 else [], [label_key] if i == last else [], edge_keys))
    for inner, outer in zip(out, out[1:]):
        if inner.num_dst != outer.num_src:
            raise ValueError(f"batch_format='pyg': consecutive blocks must chain (a block's {inner.num_dst} "
                             f"destination nodes are the next block's source nodes, got {outer.num_src})")
    return out


def _hops(blocks: List[TorchBlock], seed_order: Optional[torch.Tensor] = None
          ) -> Tuple[torch.Tensor, List[int], List[Dict[str, torch.Tensor]]]:
    """PyG's subgraph within the blocks: ``order`` (the kept nodes as positions among
    ``blocks[0]``'s sources, in PyG's order), the nodes new at each hop (seeds first) and, per hop,
    the kept edges: ``src``, ``dst`` (PyG's numbering) and ``eid`` (rows of the block's edge data).

    Hop ``h`` keeps the in-edges (from ``blocks[-h]``) of the nodes new at hop ``h - 1`` only, and
    a node is kept where a kept edge reaches it: DGL's re-sampling of older nodes adds sources
    (all of a hop with fanout 0 after it) that PyG never reaches. As PyG's sampler numbers them,
    nodes new at a hop come in the order they are first met, walking the previous hop's nodes in order.
    ``seed_order``: the seeds' positions in the order the batch lists them (default: as the blocks do)."""
    depth, seeds = len(blocks), blocks[-1].num_dst
    device = blocks[0].indptr.device
    new_id = torch.full((blocks[0].num_src,), -1, dtype=torch.int64, device=device)
    # Old positions of the nodes new at the previous hop, in the batch's order.
    frontier = torch.arange(seeds, device=device) if seed_order is None else seed_order
    new_id[frontier] = torch.arange(seeds, device=device)
    parts, counts, hops, total = [frontier], [seeds], [], seeds
    for h in range(1, depth + 1):
        block = blocks[depth - h]
        indptr = block.indptr.long()
        starts, degrees = indptr[frontier], indptr[frontier + 1] - indptr[frontier]
        num = int(degrees.sum())
        walk = torch.arange(num, device=device)
        # CSC positions of the frontier's in-edges, node by node in frontier order.
        begin = torch.cumsum(degrees, 0) - degrees
        pos = torch.repeat_interleave(starts - begin, degrees, output_size=num) + walk
        src = block.indices[pos].long()
        dst = torch.repeat_interleave(new_id[frontier], degrees, output_size=num)
        first = torch.full_like(new_id, num).scatter_reduce_(0, src, walk, "amin")
        fresh = src[(new_id[src] < 0) & (first[src] == walk)]  # unseen, at its first edge: in first-met order
        new_id[fresh] = torch.arange(total, total + fresh.numel(), device=device)
        total += fresh.numel()
        hops.append({"src": new_id[src], "dst": dst, "eid": block.edge_ids[pos].long()})
        parts.append(fresh)
        counts.append(int(fresh.numel()))
        frontier = fresh
    return torch.cat(parts), counts, hops


class GraphRows:
    """Rows of a homogeneous graph's node and edge data, read by id: where a PyG batch reads
    ``x``, ``y``, ``edge_attr`` and the other data it carries for the nodes and edges it keeps only,
    so the blocks need no data gathered (``PygLoader`` samples them so).
    ``ndata``/``edata``: key to tensor (DGL's data views work); ``read(data, ids)``: the rows, on
    the device of ``ids`` (default: ``index_select`` where the data is, then moved)."""

    def __init__(self, ndata: Any, edata: Any, read: Optional[Callable[[torch.Tensor, torch.Tensor],
                                                                         torch.Tensor]] = None):
        self.ndata, self.edata, self._read = ndata, edata, read

    def read(self, edges: bool, key: Optional[str], ids: torch.Tensor) -> Optional[torch.Tensor]:
        """Rows ``ids`` of node (``edges``: edge) data ``key``; None where the graph has no such key."""
        view = self.edata if edges else self.ndata
        if not key or key == NID or key not in view:
            return None
        data = view[key]
        if self._read is not None:
            return self._read(data, ids)
        return data.index_select(0, ids.to(data.device)).to(ids.device)


def blocks_to_pyg(blocks: Sequence[Any], feat_key: Optional[str] = None, label_key: Optional[str] = None,
                  edge_key: Optional[str] = None, rows: Optional[GraphRows] = None,
                  attrs: Optional[Sequence[str]] = None) -> Any:
    """A PyG ``Data`` with ``NeighborLoader``'s fields from one batch's blocks (DGL's or torch's):
    ``x`` (``blocks[0].srcdata[feat_key]``), ``edge_index`` (hop 1 first), ``edge_attr`` (the
    edges' ``edata[edge_key]``, where every block has it), ``y`` (``label_key`` of every node, as
    PyG's, the seeds first: ``y[:batch_size]``; one row per seed where only ``blocks[-1].dstdata``
    has it; ``label_key=""``: none, and node data ``y`` is not carried as one), ``batch_size``,
    ``n_id``, ``e_id`` (the graph's node and edge ids), ``num_sampled_nodes``,
    ``num_sampled_edges``, and the other node data of ``blocks[0].srcdata`` (edge data every
    block has) under its own name, by ``n_id`` (``e_id``): :mod:`.pyg_attrs`;
    ``attrs``: only those named. A key not named is :func:`default_key`'s: ``feat`` else ``x``,
    ``label`` else ``y``, edge data ``feat`` else ``edge_attr``. ``rows``: read the node and edge
    data there, by ``n_id`` and ``e_id``, for the kept nodes and edges only (the same values; the
    blocks' own data is not read)."""
    return _subgraph(blocks, feat_key, label_key, edge_key, link=False, rows=rows, attrs=attrs)[0]


def _subgraph(blocks: Sequence[Any], feat_key: Optional[str], label_key: Optional[str], edge_key: Optional[str],
              link: bool, rows: Optional[GraphRows] = None,
              attrs: Optional[Sequence[str]] = None) -> Tuple[Any, Optional[torch.Tensor]]:
    """:func:`blocks_to_pyg`'s batch and, for a ``link`` batch (no ``y``: node data ``y`` is an
    ordinary key; PyG's ``unique`` of the pairs' ends numbers the seeds by node id), the seeds'
    new positions (``None``: unchanged)."""
    data_class = pyg_data_class()
    if not blocks:
        raise ValueError("batch_format='pyg': a batch needs at least one block")
    _require_homogeneous(blocks)
    first, last = blocks[0], blocks[-1]
    nodes, edges = (rows.ndata, rows.edata) if rows is not None else (
        getattr(first, "srcdata", ()), getattr(first, "edata", ()))
    feat_key = default_key("x", nodes) if feat_key is None else feat_key
    label_key = default_key("y", nodes if rows is not None else getattr(last, "dstdata", ())) \
        if label_key is None else label_key
    edge_key = default_key("edge_attr", edges) if edge_key is None else edge_key
    if rows is None:  # edge data every block has
        edges = [k for k in edges if all(k in getattr(b, "edata", ()) for b in blocks)]
    # A link batch has no y: there node data y is an ordinary key (None), not a switched-off field ("").
    others = carried(nodes, edges, (feat_key, None if link else label_key, edge_key), attrs, data_class, data_class)
    blocks = _homogeneous(blocks, *(((), "", ()) if rows is not None else (
        [feat_key, label_key, *others[0]], label_key, [edge_key, *others[1]])))
    seed_order, moved = None, None
    if link and NID in blocks[0].srcdata:
        seed_ids = blocks[0].srcdata[NID][:blocks[-1].num_dst]
        if seed_ids.numel() > 1 and not bool((seed_ids[1:] > seed_ids[:-1]).all()):  # DGL's compaction: as met
            seed_order = torch.argsort(seed_ids)
            moved = torch.empty_like(seed_order)
            moved[seed_order] = torch.arange(seed_order.numel(), device=seed_order.device)
    order, counts, hops = _hops(blocks, seed_order)
    depth = len(blocks)
    data = data_class()
    if rows is not None:
        return _counted(_from_rows(data, rows, blocks, order, hops, (feat_key, label_key, edge_key), others),
                        counts, hops), moved
    # Every source node kept, in the blocks' own order: the batch reads their rows as they are.
    same = order.numel() == blocks[0].num_src and bool((order == torch.arange(
        order.numel(), device=order.device)).all())
    src = blocks[0].srcdata
    for key, name in ((feat_key, "x"), (label_key, "y")):
        if key and key in src:
            setattr(data, name, src[key] if same else src[key][order])
    if label_key and label_key not in src and label_key in blocks[-1].dstdata:  # the seeds' only
        y = blocks[-1].dstdata[label_key]
        data.y = y if seed_order is None else y[seed_order]
    data.edge_index = _edge_index(hops)
    if NID in src:
        n_id = src[NID].long()
        data.n_id = n_id if same else n_id[order]
    for key, name in ((EID, "e_id"), (edge_key, "edge_attr"), *((k, k) for k in others[1])):
        if key and all(key in block.edata for block in blocks):  # in edge_index's order: by hop
            value = torch.cat([blocks[depth - h].edata[key][hop["eid"]] for h, hop in enumerate(hops, 1)])
            setattr(data, name, value.long() if key == EID else value)
    for key in others[0]:
        setattr(data, key, src[key] if same else src[key][order])
    return _counted(data, counts, hops), moved


def _from_rows(data: Any, rows: GraphRows, blocks: List[TorchBlock], order: torch.Tensor,
               hops: List[Dict[str, torch.Tensor]], keys: Tuple[str, str, str],
               others: Tuple[List[str], List[str]]) -> Any:
    """``data`` with its ids and every field read from ``rows`` by ``n_id`` and ``e_id``, in the
    order the blocks' path sets them."""
    depth = len(blocks)
    if NID not in blocks[0].srcdata or not all(EID in block.edata for block in blocks):
        raise ValueError("batch_format='pyg': reading rows by id needs the blocks' node and edge ids (_ID)")
    n_id = blocks[0].srcdata[NID].long()[order]
    e_id = torch.cat([blocks[depth - h].edata[EID][hop["eid"]] for h, hop in enumerate(hops, 1)]).long()
    for name, value in (("x", rows.read(False, keys[0], n_id)), ("y", rows.read(False, keys[1], n_id))):
        if value is not None:
            setattr(data, name, value)
    data.edge_index = _edge_index(hops)
    data.n_id, data.e_id = n_id, e_id
    for edge, key, name in ((True, keys[2], "edge_attr"), *((True, k, k) for k in others[1]),
                            *((False, k, k) for k in others[0])):
        value = rows.read(edge, key, e_id if edge else n_id)
        if value is not None:
            setattr(data, name, value)
    return data


def _edge_index(hops: List[Dict[str, torch.Tensor]]) -> torch.Tensor:
    return torch.cat([torch.stack([hop["src"], hop["dst"]]) for hop in hops], dim=1)


def _counted(data: Any, counts: List[int], hops: List[Dict[str, torch.Tensor]]) -> Any:
    data.batch_size = counts[0]
    data.num_sampled_nodes = counts
    data.num_sampled_edges = [int(hop["src"].numel()) for hop in hops]
    return data


def _pairs(graph: Any) -> torch.Tensor:
    src, dst = graph.edges()  # DGL's graph or a TorchBlock: edge-id order, the batch's pair order
    return torch.stack([src.long(), dst.long()])


NEG_SAMPLING = ("binary", "triplet")


def link_to_pyg(pair_graph: Any, neg_pair_graph: Any, blocks: Sequence[Any], feat_key: Optional[str] = None,
                edge_key: Optional[str] = None, neg_sampling: str = "binary", edge_label: Optional[torch.Tensor] = None,
                input_id: Optional[torch.Tensor] = None, rows: Optional[GraphRows] = None,
                attrs: Optional[Sequence[str]] = None) -> Any:
    """``LinkNeighborLoader``'s batch from an edge batch: :func:`blocks_to_pyg`'s fields plus
    ``input_id`` (the positive pairs' edge ids, ``g.edata["rating"][batch.input_id]`` being their
    data; else ``input_id`` as given; the pairs in the batch's order, the seeds numbered by node id
    as PyG's) and, with ``neg_sampling="binary"``, ``edge_label_index``
    (positive pairs, then negative ones, in the batch's numbering) and ``edge_label`` (``edge_label``
    as given for the positives, else 1.0; zeros for the negatives); with ``"triplet"``,
    ``src_index``, ``dst_pos_index`` and ``dst_neg_index`` (``[batch_size]`` for one negative per
    positive, else ``[batch_size, k]``: the negatives must keep their positive's source, ``k`` each,
    in order). ``batch_size`` is the number of positive pairs; no ``y``: node data ``label`` is carried
    as ``label`` (``y`` as ``y``); ``rows``, ``attrs``: :func:`blocks_to_pyg`'s."""
    if neg_sampling not in NEG_SAMPLING:
        raise ValueError(f"neg_sampling={neg_sampling!r}: choose 'binary' (edge_label_index and edge_label, "
                         "negatives drawn at both ends) or 'triplet' (src_index, dst_pos_index, dst_neg_index)")
    data, moved = _subgraph(blocks, feat_key, "", edge_key, link=True, rows=rows, attrs=attrs)
    pos = _pairs(pair_graph) if moved is None else moved[_pairs(pair_graph)]
    if EID in pair_graph.edata:
        data.input_id = pair_graph.edata[EID].long()
    elif input_id is not None:
        data.input_id = input_id.to(pos.device).long()
    p = int(pos.shape[1])
    data.batch_size = p
    neg = None if neg_pair_graph is None else _pairs(neg_pair_graph)
    if neg is not None and moved is not None:
        neg = moved[neg]
    if neg_sampling == "triplet":
        if neg is None or (p and neg.shape[1] % p):
            raise ValueError("neg_sampling='triplet' needs k negatives per positive pair (negatives=k), "
                             f"got {0 if neg is None else neg.shape[1]} for {p} pairs")
        data.src_index, data.dst_pos_index = pos[0], pos[1]
        data.dst_neg_index = neg[1].view(p, -1).squeeze(-1)
        return data
    data.edge_label_index = pos if neg is None else torch.cat([pos, neg], dim=1)
    label = torch.ones(p, device=pos.device) if edge_label is None else edge_label.to(pos.device)
    if neg is not None:
        label = torch.cat([label, label.new_zeros((neg.shape[1],) + tuple(label.shape[1:]))])
    data.edge_label = label
    return data


def _is_graph(obj: Any) -> bool:
    return is_dgl_graph(obj) or isinstance(obj, TorchBlock)


def to_pyg(batch: Any, feat_key: Optional[str] = None, label_key: Optional[str] = None,
           edge_key: Optional[str] = None, neg_sampling: str = "binary", edge_label: Optional[torch.Tensor] = None,
           input_id: Optional[torch.Tensor] = None, rows: Optional[GraphRows] = None,
           attrs: Optional[Sequence[str]] = None) -> Any:
    """The PyG batch of one of graphtrainer's batches: a node batch ``(input_nodes, output_nodes,
    blocks)``, an edge batch ``(input_nodes, pair_graph[, neg_pair_graph], blocks)`` (the last three
    arguments: :func:`link_to_pyg`'s), or a bare list of blocks. Keys not named: :func:`default_key`'s.
    ``rows``: read the batch's data there for the kept nodes and edges only; ``attrs``: the other node
    and edge data carried under their own names, default all (:func:`blocks_to_pyg`)."""
    if isinstance(batch, (list, tuple)) and batch and all(_is_graph(b) for b in batch):
        return blocks_to_pyg(batch, feat_key, label_key, edge_key, rows, attrs)
    if isinstance(batch, (list, tuple)) and len(batch) in (3, 4) and isinstance(batch[-1], (list, tuple)):
        if _is_graph(batch[1]):
            return link_to_pyg(batch[1], batch[2] if len(batch) == 4 else None, batch[-1], feat_key, edge_key,
                               neg_sampling, edge_label, input_id, rows, attrs)
        if len(batch) == 3:
            return blocks_to_pyg(batch[-1], feat_key, label_key, edge_key, rows, attrs)
    raise TypeError(f"batch_format='pyg': cannot read {type(batch).__name__} as a sampled batch; expected "
                    "(input_nodes, output_nodes, blocks), (input_nodes, pair_graph[, neg_pair_graph], blocks) "
                    "or a list of blocks")
