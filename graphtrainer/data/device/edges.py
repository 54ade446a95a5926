"""Link-prediction batches sampled on the device: what DGL's ``as_edge_prediction_sampler``
gives, as torch graphs.

A batch of seed edges (graph edge ids, or positions in a list of node pairs) becomes a
positive pair graph, a negative pair graph with ``k`` uniform negatives per edge, and the
blocks of their nodes, with the seed edges (and their reverses) kept out of every block
when ``exclude`` asks. The negatives are :class:`~graphtrainer.data.edge_loader.PerEdgeUniform`'s
own hash of ``(seed, epoch, edge)``, computed on the device: the same negatives as on the CPU.
"""
from __future__ import annotations

from typing import Any, Iterator, Optional, Tuple

import torch

from ...nn.blocks import TorchBlock
from ..edge_loader import PerEdgeUniform, edge_hash
from .batches import batch_generator, batch_ranges, node_maps
from .graph import device_graph
from .sampler import DeviceSampler, Unsupported


def pair_graph(src: torch.Tensor, dst: torch.Tensor, nodes: torch.Tensor, eids: Optional[torch.Tensor]) -> TorchBlock:
    """A graph over ``nodes`` with edges ``src -> dst`` (local ids) in that edge order, as DGL's
    compacted pair graphs: ``ndata["_ID"]`` the graph's node ids, ``edata["_ID"]`` its edge ids."""
    n = nodes.numel()
    order = torch.argsort(dst, stable=True)
    indptr = torch.zeros(n + 1, dtype=torch.int64, device=dst.device)
    torch.cumsum(torch.bincount(dst, minlength=n), 0, out=indptr[1:])
    edata = {"_ID": eids} if eids is not None else {}
    return TorchBlock(indptr, src[order], order, n, n, srcdata={"_ID": nodes}, edata=edata, is_block=False)


class DeviceEdgeBatches:
    """``(input_nodes, pair_graph, neg_pair_graph, blocks)`` batches (no ``neg_pair_graph``
    without negatives) of an :class:`~graphtrainer.data.edge_loader.EdgeLoader`'s share."""

    def __init__(self, loader: Any, sampler: DeviceSampler, device: torch.device):
        if loader.typed is not None:
            raise Unsupported("a heterograph edge loader samples on the CPU (device sampling of typed seed "
                              "edges is not built yet)")
        if loader.negatives is not None and not isinstance(loader.negatives, PerEdgeUniform):
            raise Unsupported(f"negatives={type(loader.negatives).__name__}: the device sampler draws uniform "
                              "negatives (negatives=k)")
        self.loader, self.sampler, self.device = loader, sampler, device
        self.graph = device_graph(loader.graph, device, sampler.node_keys(), sampler.edge_keys())
        (self.etype, self.rel), = self.graph.relations.items()
        self.pairs = None if loader.pairs is None else tuple(p.to(device) for p in loader.pairs)
        rev = loader.reverse_eids
        self.reverse = rev.to(device) if rev is not None and loader.exclude == "reverse_id" else None

    def iterate(self, share: torch.Tensor, seed: int, rank: int, epoch: int) -> Iterator[Tuple[Any, ...]]:
        share = share.to(self.device)
        maps = node_maps(self.graph)
        nt = self.graph.ntypes[0]
        num_nodes = self.graph.num_nodes[nt]
        negatives = self.loader.negatives
        for i, lo, hi in batch_ranges(share.numel(), self.loader.batch_size, self.loader.drop_last):
            ids = share[lo:hi]
            src, dst = (self.pairs[0][ids], self.pairs[1][ids]) if self.pairs is not None else self.rel.endpoints(ids)
            ends = [src, dst]
            if negatives is not None:
                ends += [src.repeat_interleave(negatives.k),
                         (edge_hash(negatives.seed, negatives.epoch, ids, negatives.k) % num_nodes).reshape(-1)]
            nodes, local = torch.unique(torch.cat(ends), return_inverse=True)
            parts = torch.split(local, [e.numel() for e in ends])
            pair = pair_graph(parts[0], parts[1], nodes, ids if self.pairs is None else None)
            exclude = None
            if self.loader.exclude is not None:
                excluded = ids if self.reverse is None else torch.cat([ids, self.reverse[ids]])
                exclude = {self.etype: excluded}
            inputs, blocks = self.sampler.sample(self.graph, maps, {nt: nodes}, batch_generator(
                self.device, seed, rank, epoch, i), exclude)
            if negatives is None:
                yield inputs[nt], pair, blocks
            else:
                yield inputs[nt], pair, pair_graph(parts[2], parts[3], nodes, None), blocks
