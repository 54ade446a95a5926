"""Link-prediction batches sampled on the device: what DGL's ``as_edge_prediction_sampler``
gives, as torch graphs.

Seed edges (edge ids, or positions in a pair list) give a pair graph, a negative pair graph
(``k`` per edge, :class:`~graphtrainer.data.edge_loader.PerEdgeUniform`'s hash computed on the
device: the CPU's negatives) and their nodes' blocks, without the excluded edges.
"""
from __future__ import annotations

from typing import Any, Dict, Iterator, List, Optional, Tuple

import torch

from ...nn.blocks import TorchBlock, TorchHeteroBlock
from ...nn.lazy_data import held_items
from ...nn.pyg import GraphRows
from ..edge_loader import PerEdgeUniform
from ..hetero import split_flat
from .batches import batch_generator, batch_ranges, node_maps
from .graph import EType, Keys, device_graph, gather
from .host_reads import GraphSource, reads_graph
from .sampler import DeviceSampler, Unsupported, device_rows, merge_keys


def _relation(src: torch.Tensor, dst: torch.Tensor, num_src: int, num_dst: int, same_set: bool,
              idtype: torch.dtype = torch.int64) -> TorchBlock:
    """Edges ``src -> dst`` (local ids, in that edge order) in CSC form, in ``idtype`` (the graph's, as DGL's)."""
    order = torch.argsort(dst, stable=True)
    indptr = torch.zeros(num_dst + 1, dtype=torch.int64, device=dst.device)
    torch.cumsum(torch.bincount(dst, minlength=num_dst), 0, out=indptr[1:])
    return TorchBlock(indptr.to(idtype), src[order].to(idtype), order.to(idtype), num_src, num_dst,
                      is_block=not same_set)


def pair_graph(src: torch.Tensor, dst: torch.Tensor, nodes: torch.Tensor, eids: Optional[torch.Tensor],
               idtype: torch.dtype = torch.int64) -> TorchBlock:
    """A graph over ``nodes`` with edges ``src -> dst`` (local ids) in that edge order, as DGL's
    compacted pair graphs: ``ndata["_ID"]`` the graph's node ids, ``edata["_ID"]`` its edge ids."""
    g = _relation(src, dst, nodes.numel(), nodes.numel(), True, idtype)
    g.srcdata = g.dstdata = {"_ID": nodes}
    g.edata = {"_ID": eids} if eids is not None else {}
    return g


def hetero_pair_graph(edges: Dict[EType, Tuple[torch.Tensor, torch.Tensor]], nodes: Dict[str, torch.Tensor],
                      eids: Optional[Dict[EType, torch.Tensor]], idtype: torch.dtype = torch.int64) -> TorchHeteroBlock:
    """DGL's compacted heterograph pair graph: every relation (empty where the batch has none of
    it), every node type, ``ndata["_ID"]`` and ``edata["_ID"]`` per type."""
    counts = {nt: ids.numel() for nt, ids in nodes.items()}
    relations = {et: _relation(u, v, counts[et[0]], counts[et[2]], et[0] == et[2], idtype)
                 for et, (u, v) in edges.items()}
    return TorchHeteroBlock(relations, dict(counts), dict(counts), src_store={"_ID": dict(nodes)},
                            edge_store={"_ID": dict(eids)} if eids is not None else {}, is_block=False)


def pair_edge_keys(loader: Any) -> Keys:
    """Every edge data key of an edge-id loader's seed relations: DGL's pair graph carries them
    (ratings, edge labels), so the device copy holds them for the pair graphs."""
    if loader.pairs is not None:
        return {}
    graph = loader.graph
    types = [et for et, _, _ in loader.spans] if loader.spans else list(graph.canonical_etypes)
    out = {et: tuple(k for k in graph.edges[et].data.keys() if k != "_ID") for et in types}
    return {et: keys for et, keys in out.items() if keys}


class _Compaction:
    """Endpoints of several edge sets, numbered per node type in one sorted id list each."""

    def __init__(self, ntypes: List[str], device: torch.device):
        self.parts: Dict[str, List[torch.Tensor]] = {nt: [] for nt in ntypes}
        self.device = device

    def add(self, nt: str, ids: torch.Tensor) -> Tuple[str, int]:
        self.parts[nt].append(ids)
        return nt, len(self.parts[nt]) - 1

    def run(self) -> Tuple[Dict[str, torch.Tensor], Dict[str, List[torch.Tensor]]]:
        nodes, local = {}, {}
        for nt, parts in self.parts.items():
            if not parts:
                nodes[nt], local[nt] = torch.empty(0, dtype=torch.int64, device=self.device), []
                continue
            nodes[nt], inverse = torch.unique(torch.cat(parts), return_inverse=True)
            local[nt] = list(torch.split(inverse, [p.numel() for p in parts]))
        return nodes, local


class DeviceEdgeBatches:
    """An :class:`~graphtrainer.data.edge_loader.EdgeLoader`'s batches of its share, on a
    homogeneous graph or a heterograph (typed seed edges, ``exclude="reverse_types"``)."""

    def __init__(self, loader: Any, sampler: DeviceSampler, device: torch.device,
                 on_host: Tuple[Keys, Keys] = ({}, {})):
        if loader.negatives is not None and not isinstance(loader.negatives, PerEdgeUniform):
            name = type(loader.negatives).__name__
            alias = " (DGL's Uniform is this class)" if name == "PerSourceUniform" else ""
            raise Unsupported(f"negatives={name}(...){alias}: the device sampler draws its own negatives. Pass "
                              "negatives=k: k uniform destinations per edge, as DGL's Uniform(k) draws them, and "
                              "the same negatives on the CPU and the device")
        self.loader, self.sampler, self.device = loader, sampler, device
        self.pair_keys = pair_edge_keys(loader)
        self.graph = device_graph(loader.graph, device, sampler.node_keys(),
                                  merge_keys(sampler.edge_keys(), self.pair_keys), on_host, sampler.prob)
        self.pairs = None if loader.pairs is None else tuple(p.to(device) for p in loader.pairs)
        rev = loader.reverse_eids
        self.reverse = rev.to(device) if rev is not None and loader.exclude == "reverse_id" else None
        graph = loader.graph
        reverse_etypes = getattr(loader, "reverse_etypes", None) if loader.exclude == "reverse_types" else None
        self.reverse_types = {graph.to_canonical_etype(a): graph.to_canonical_etype(b)
                              for a, b in (reverse_etypes or {}).items()}
        self.offsets = {et: offset for et, offset, _ in (loader.spans or [])}
        self.source = GraphSource(graph)  # keys not gathered, read when asked (one for every batch)

    def typed_ids(self, ids: torch.Tensor) -> Dict[EType, torch.Tensor]:
        if self.loader.spans is None:
            return {next(iter(self.graph.relations)): ids}
        return {et: part.to(self.device, non_blocking=True) for et, part in split_flat(ids, self.loader.spans).items()}

    def _excluded(self, ids: Dict[EType, torch.Tensor]) -> Optional[Dict[EType, torch.Tensor]]:
        if self.loader.exclude is None:
            return None
        out: Dict[EType, List[torch.Tensor]] = {}
        for et, eids in ids.items():
            out.setdefault(et, []).append(eids)
            if self.reverse is not None:
                out[et].append(self.reverse[eids])
            if et in self.reverse_types:  # a relation's reverse edge has the same id in the reverse relation
                out.setdefault(self.reverse_types[et], []).append(eids)
        return {et: torch.cat(parts) for et, parts in out.items()}

    def rows(self) -> GraphRows:
        """Where a PyG batch reads the rows it keeps (batches sampled with ``gather=False``)."""
        return device_rows(self.graph, self.loader.graph)

    def iterate(self, share: torch.Tensor, seed: int, rank: int, epoch: int,
                gather: bool = True) -> Iterator[Tuple[Any, ...]]:
        """The share's batches; ``gather=False``: no data gathered into blocks or pair graph (:meth:`rows`)."""
        if self.loader.spans is None:
            share = share.to(self.device)
        maps = node_maps(self.graph)
        negatives = self.loader.negatives
        for i, lo, hi in batch_ranges(share.numel(), self.loader.batch_size, self.loader.drop_last):
            ids = self.typed_ids(share[lo:hi])
            compaction = _Compaction(self.graph.ntypes, self.device)
            slots = {}
            for et, eids in ids.items():
                if self.pairs is not None:
                    src, dst = self.pairs[0][eids], self.pairs[1][eids]
                else:
                    src, dst = self.graph.relations[et].endpoints(eids)
                ends = [compaction.add(et[0], src), compaction.add(et[2], dst)]
                if negatives is not None:
                    near, far = negatives.draw(src, eids + self.offsets.get(et, 0), self.graph.num_nodes[et[2]],
                                               self.graph.num_nodes[et[0]])
                    ends += [compaction.add(et[0], near), compaction.add(et[2], far)]
                slots[et] = ends
            nodes, local = compaction.run()
            edges = [{et: (local[s[j][0]][s[j][1]], local[s[j + 1][0]][s[j + 1][1]]) for et, s in slots.items()}
                     for j in ((0, 2) if negatives is not None else (0,))]
            inputs, blocks = self.sampler.sample(self.graph, maps, nodes, batch_generator(
                self.device, seed, rank, epoch, i), self._excluded(ids), self.source, gather)
            graphs = [self._pair(e, nodes, ids if (k == 0 and self.pairs is None) else None)
                      for k, e in enumerate(edges)]
            if self.pairs is None:  # DGL's positive pair graph reads the graph's node data too (not the negative)
                reads_graph(self._pair_data(graphs[0], ids, blocks) if gather else graphs[0], self.source,
                            edges=False)
            yield (self._one(inputs), *graphs, blocks)

    def _pair_data(self, pair: Any, ids: Dict[EType, torch.Tensor], blocks: list) -> Any:
        """What DGL's pair graph carries beside ids: the seed edges' data, and the node data the
        blocks gathered (its nodes are the last block's destinations, in order: views, no copy)."""
        host_ids: Dict[int, torch.Tensor] = {}
        hetero = self.graph.hetero
        empty = torch.empty(0, dtype=torch.int64, device=self.device)
        for et, keys in self.pair_keys.items():
            for key in keys:
                value = gather(self.graph.edata[et][key], ids.get(et, empty), host_ids)
                if hetero:  # the per-type stores, whatever the number of types
                    pair.edge_store.setdefault(key, {})[et] = value
                else:
                    pair.edata[key] = value
        first, last = blocks[0], blocks[-1]
        if hetero:
            nodes = pair.src_store
            for data, rows in ((first.src_store, last.num_dst_nodes), (last.dst_store, None)):
                for key, value in data.items():
                    if key != "_ID" and not dict.__contains__(nodes, key):  # held, not readable
                        nodes[key] = {nt: v if rows is None else v[:rows(nt)] for nt, v in value.items()}
            return pair
        for data, rows in ((first.srcdata, last.num_dst_nodes), (last.dstdata, None)):
            for key, value in held_items(data):  # what the blocks gathered, not what they could read
                if key != "_ID" and not dict.__contains__(pair.srcdata, key):
                    pair.srcdata[key] = value if rows is None else value[:rows()]
        return pair

    def _pair(self, edges: Dict[EType, Tuple[torch.Tensor, torch.Tensor]], nodes: Dict[str, torch.Tensor],
              eids: Optional[Dict[EType, torch.Tensor]]) -> Any:
        ids = self.graph.ids
        if not self.graph.hetero:
            (et, (u, v)), = edges.items()
            pair = pair_graph(u, v, ids(nodes[self.graph.ntypes[0]]),
                              None if eids is None else ids(next(iter(eids.values()))), self.graph.idtype)
            pair.canonical_etype = et
            return pair
        empty = torch.empty(0, dtype=torch.int64, device=self.device)
        every = {et: edges.get(et, (empty, empty)) for et in self.graph.relations}
        full_eids = None if eids is None else {et: ids(eids.get(et, empty)) for et in self.graph.relations}
        return hetero_pair_graph(every, {nt: ids(v) for nt, v in nodes.items()}, full_eids, self.graph.idtype)

    def _one(self, inputs: Dict[str, torch.Tensor]) -> Any:
        ids, ntypes = self.graph.ids, self.graph.ntypes
        if len(ntypes) == 1:  # as DGL's input nodes: a tensor with one node type, whatever the relations
            return ids(inputs[ntypes[0]])
        return {nt: ids(v) for nt, v in inputs.items()}
