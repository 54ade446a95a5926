"""Whole batches of blocks on the device, and DGL's samplers read into the device sampler's settings.

:class:`DeviceSampler` does what DGL's ``NeighborSampler.sample_blocks`` does, giving
:class:`~graphtrainer.nn.blocks.TorchBlock` (``TorchHeteroBlock``) in DGL's layout: ``blocks[i]``
sampled with ``fanouts[i]``, graph ids in ``srcdata``/``dstdata``/``edata["_ID"]``, and prefetched
features gathered on the device (``blocks[0].srcdata``, ``blocks[-1].dstdata``, every ``edata``;
data kept on the host is gathered there and copied over). A sampler that prefetches nothing gets
every node and edge data key there, as DGL's blocks show them all; other keys are read from the
graph when a step asks for them (:mod:`.host_reads`).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import torch

from ...nn.blocks import TorchBlock, TorchHeteroBlock
from ...nn.pyg import GraphRows
from ..prefetch import per_type
from .compact import NodeMaps, compact_layer
from .graph import DeviceGraph, EType, Keys, gather
from .host_reads import GraphSource, reads_graph
from .neighbors import Excluded, Sampled, sample_layer
from .weighted import check_weights, sample_weighted

NID, EID = "_ID", "_ID"


class Unsupported(ValueError):
    """A sampler or loader option the device sampler does not reproduce (named in the message)."""


def _keys(spec: Any, graph: Any, edges: bool) -> Keys:
    """DGL's prefetch argument (a list of keys, or ``{type: keys}``) as ``{type: keys}``; a flat list
    on several types: the types having each key, as the loaders give DGL (:mod:`..prefetch`)."""
    spec = per_type(spec, graph, edges)
    if not spec:
        return {}
    if isinstance(spec, dict):
        out = {}
        for t, keys in spec.items():
            t = graph.to_canonical_etype(t) if edges else t
            out[t] = tuple([keys] if isinstance(keys, str) else keys)
        return out
    types = graph.canonical_etypes if edges else graph.ntypes
    return {types[0]: tuple([spec] if isinstance(spec, str) else spec)}


def _all_keys(view: Any, types: Any) -> Keys:
    """Every data key of every type (but the graph's own ``_ID``)."""
    out = {t: tuple(k for k in view[t].data.keys() if k != NID) for t in types}
    return {t: keys for t, keys in out.items() if keys}


def merge_keys(*specs: Keys) -> Keys:
    """The keys of every spec, per type, each once in order of first appearance."""
    out: Dict[Any, Tuple[str, ...]] = {}
    for keys in specs:
        for t, k in keys.items():
            out[t] = tuple(dict.fromkeys(out.get(t, ()) + tuple(k)))
    return out


@dataclass
class DeviceSampler:
    """``fanouts`` per layer, input layer first (an int, or ``{etype: int}``; ``-1``: every
    in-edge); ``node_feats``/``labels``/``edge_feats``: what is gathered, per type."""

    fanouts: List[Union[int, Dict[EType, int]]]
    replace: bool = False
    node_feats: Optional[Keys] = None
    labels: Optional[Keys] = None
    edge_feats: Optional[Keys] = None
    #: How ``k`` of ``d`` in-edges are drawn without replacement: "floyd" or "sort" (see
    #: :mod:`.neighbors`).
    method: str = "floyd"
    #: DGL's ``prob``/``mask``: the edge data key weighing the draw (:mod:`.weighted`), or None.
    prob: Optional[str] = None

    @classmethod
    def from_dgl(cls, sampler: Any, graph: Any) -> "DeviceSampler":
        """The settings of DGL's ``NeighborSampler`` or ``MultiLayerFullNeighborSampler``, or
        :class:`Unsupported` naming what the device sampler cannot reproduce."""
        import dgl

        kinds = (dgl.dataloading.NeighborSampler, dgl.dataloading.MultiLayerFullNeighborSampler)
        name = type(sampler).__name__
        if type(sampler) not in kinds:
            why = f"DGL's {name} draws in its own way" if type(sampler).__module__.startswith("dgl.") else \
                "a custom sampler's sample_blocks cannot run on the device"
            raise Unsupported(f"the sampler {name} is not DGL's NeighborSampler (prob=/mask= included) or "
                              f"MultiLayerFullNeighborSampler ({why})")
        if getattr(sampler, "edge_dir", "in") != "in":
            raise Unsupported(f"{name}(edge_dir={sampler.edge_dir!r}): the device sampler follows in-edges only")
        prob = getattr(sampler, "prob", None)  # DGL keeps mask= there too
        if prob is not None:
            check_weights(graph, prob, name)
        fanouts = []
        for f in sampler.fanouts:
            if isinstance(f, dict):
                f = {graph.to_canonical_etype(et): int(k) for et, k in f.items()}
                missing = [et for et in graph.canonical_etypes if et not in f]
                if missing:  # DGL needs every relation too: no fallback can run it
                    raise ValueError(f"{name}: a per-relation fanout must name every relation (DGL's sampler needs "
                                     f"them all too); missing {missing}: give them a fanout, 0 to leave one out")
            fanouts.append(f if isinstance(f, dict) else int(f))
        feats, labels = _keys(sampler.prefetch_node_feats, graph, False), _keys(sampler.prefetch_labels, graph, False)
        edge_feats = _keys(sampler.prefetch_edge_feats, graph, True)
        if not (feats or labels or edge_feats):  # DGL's blocks show every key (read on access): gather them all
            feats = labels = _all_keys(graph.nodes, graph.ntypes)
            edge_feats = _all_keys(graph.edges, graph.canonical_etypes)
        return cls(fanouts, bool(sampler.replace), feats, labels, edge_feats, prob=prob)

    def with_batch_keys(self, graph: Any, feat_key: str, label_key: str, edge_key: str,
                        attrs: Tuple[Sequence[str], Sequence[str]] = ((), ())) -> "DeviceSampler":
        """These settings also gathering ``feat_key`` and ``label_key`` (``blocks[0].srcdata``: a
        PyG batch's ``y`` is every node's), ``label_key`` (``blocks[-1].dstdata``), ``edge_key`` (every
        block) and the other node and edge keys ``attrs`` names, for each node type (relation) that
        has them: what a PyG batch reads (and the device copy of the graph holds)."""
        nodes = [k for k in (feat_key, label_key, *attrs[0]) if k]
        add = {nt: tuple(k for k in nodes if k in graph.nodes[nt].data) for nt in graph.ntypes}
        labels = {nt: (label_key,) for nt in graph.ntypes if label_key and label_key in graph.nodes[nt].data}
        edges = {et: tuple(k for k in (edge_key, *attrs[1]) if k and k in graph.edges[et].data)
                 for et in graph.canonical_etypes}
        return replace(self, node_feats=merge_keys(self.node_feats or {}, {t: k for t, k in add.items() if k}),
                       labels=merge_keys(self.labels or {}, labels),
                       edge_feats=merge_keys(self.edge_feats or {}, {t: k for t, k in edges.items() if k}))

    def node_keys(self) -> Keys:
        return merge_keys(self.node_feats or {}, self.labels or {})

    def edge_keys(self) -> Keys:
        return dict(self.edge_feats or {})

    def sample(self, dg: DeviceGraph, maps: NodeMaps, seeds: Dict[str, torch.Tensor], gen: torch.Generator,
               exclude: Optional[Dict[EType, torch.Tensor]] = None, source: Optional[GraphSource] = None,
               gather: bool = True) -> Tuple[Dict[str, torch.Tensor], list]:
        """``(input nodes per type, blocks)`` for unique ``seeds`` per type (every node type a
        key); ``exclude``: graph edge ids per relation that no block may contain; ``source``: the
        blocks read what they did not gather from it, as DGL's (:mod:`.host_reads`); ``gather=False``:
        nothing gathered (a PyG batch reads the rows it keeps itself: :func:`device_rows`)."""
        if self.prob and not any(self.prob in rel.weights for rel in dg.relations.values()):
            raise ValueError(f"this device graph lacks the weights {self.prob!r}: copy it with "
                             "device_graph(..., weights=sampler.prob)")  # not a silent uniform draw
        excluded = {et: Excluded(dg.relations[et], ids) for et, ids in (exclude or {}).items() if ids.numel()}
        maps.begin(seeds)
        dst = seeds
        blocks = []
        try:
            for fanout in reversed(self.fanouts):
                sampled: Dict[EType, Sampled] = {}
                for et, rel in dg.relations.items():
                    k = fanout[et] if isinstance(fanout, dict) else fanout
                    w = rel.weights.get(self.prob) if self.prob else None  # a relation without them: uniform
                    sampled[et] = sample_layer(rel, dst[et[2]], k, self.replace, gen, excluded.get(et), self.method) \
                        if w is None else sample_weighted(rel, dst[et[2]], k, self.replace, gen, w, excluded.get(et))
                src, edges = compact_layer(maps, dst, sampled)
                blocks.insert(0, _block(dg, src, dst, edges))
                dst = src
        finally:
            maps.end(dst)
        if gather:
            self._gather(dg, blocks, dst, seeds)
        if source is not None:
            blocks = [reads_graph(block, source) for block in blocks]
        return dst, blocks

    def _gather(self, dg: DeviceGraph, blocks: list, inputs: Dict[str, torch.Tensor],
                seeds: Dict[str, torch.Tensor]) -> None:
        host_ids: Dict[int, torch.Tensor] = {}  # ids copied to the host, for data kept there
        hetero = dg.hetero  # a TorchHeteroBlock's per-type stores, whatever its number of types
        first, last = blocks[0], blocks[-1]
        for keys, where, ids in ((self.node_feats, first.src_store if hetero else first.srcdata, inputs),
                                 (self.labels, last.dst_store if hetero else last.dstdata, seeds)):
            for nt, names in (keys or {}).items():
                for key in names:
                    value = gather(dg.ndata[nt][key], ids[nt], host_ids)
                    if hetero:
                        where.setdefault(key, {})[nt] = value
                    else:
                        where[key] = value
        for block in blocks:
            for et, names in (self.edge_feats or {}).items():
                for key in names:
                    if hetero:
                        store = block.edge_store
                        store.setdefault(key, {})[et] = gather(dg.edata[et][key], store[EID][et], host_ids)
                    else:
                        block.edata[key] = gather(dg.edata[et][key], block.edata[EID], host_ids)


def device_rows(dg: DeviceGraph, graph: Any) -> GraphRows:
    """Where a PyG batch of a homogeneous graph sampled on the device reads its rows: the device
    copy's data (kept on the host where it did not fit), else the graph's own."""
    if dg.hetero:
        raise ValueError("PyG batches read rows of a homogeneous graph; this one has several node or edge types")
    ndata, edata = dict(graph.ndata), dict(graph.edata)
    ndata.update(dg.ndata.get(dg.ntypes[0], {}))
    edata.update(dg.edata.get(next(iter(dg.relations)), {}))
    return GraphRows(ndata, edata, read=lambda data, ids: gather(data, ids, {}))


def _block(dg: DeviceGraph, src: Dict[str, torch.Tensor], dst: Dict[str, torch.Tensor],
           edges: Dict[EType, Tuple[torch.Tensor, torch.Tensor, torch.Tensor]]) -> Any:
    def one(et: EType, with_data: bool) -> TorchBlock:
        indptr, indices, eids = edges[et]
        local = torch.arange(indices.numel(), device=indices.device)
        kwargs = dict(srcdata={NID: dg.ids(src[et[0]])}, dstdata={NID: dg.ids(dst[et[2]])},
                      edata={EID: dg.ids(eids)}) if with_data else {}
        # Structure in the graph's id type, as DGL's blocks (block.idtype, edges()); sampled in int64.
        return TorchBlock(dg.ids(indptr), dg.ids(indices), dg.ids(local), src[et[0]].numel(), dst[et[2]].numel(),
                          canonical_etype=et, **kwargs)

    if not dg.hetero:
        return one(next(iter(edges)), True)
    return TorchHeteroBlock({et: one(et, False) for et in edges},
                            {nt: ids.numel() for nt, ids in src.items()}, {nt: ids.numel() for nt, ids in dst.items()},
                            src_store={NID: {nt: dg.ids(v) for nt, v in src.items()}},
                            dst_store={NID: {nt: dg.ids(v) for nt, v in dst.items()}},
                            edge_store={EID: {et: dg.ids(e[2]) for et, e in edges.items()}})
