"""A node loader's batches sampled on the device: the counterpart of
:class:`~graphtrainer.data.workers.BatchSampling` for ``sampling="device"``.

Each batch draws from its own device generator seeded from ``(seed, rank, epoch, batch
index)``, as DGL is on the CPU path: reruns and resumed epochs give the same batches. The
share moves to the device once per epoch.

Batches are sampled in the loop, not a batch ahead in a thread: on the H100 that gave the same
seeds/s (62,251 vs 61,494; the sampler's host work holds the GIL) and a higher peak (3.34 vs
3.07 GiB; ``benchmarks/results/gpu/h100-device-sampling/``).
"""
from __future__ import annotations

from typing import Any, Dict, Iterator, Optional, Sequence, Tuple

import torch

from ...nn.pyg import GraphRows
from ..hetero import split_flat
from ..workers import batch_seed
from .compact import NodeMaps
from .graph import DeviceGraph, Keys, device_graph
from .host_reads import GraphSource
from .sampler import DeviceSampler, device_rows

def node_maps(dg: DeviceGraph) -> NodeMaps:
    """The scratch id maps of a device graph (one set: a rank samples one batch at a time,
    and each batch leaves them clear)."""
    maps = getattr(dg, "_maps", None)
    if maps is None:
        maps = dg._maps = NodeMaps(dg.num_nodes, dg.device)  # type: ignore[attr-defined]
    return maps


def batch_generator(device: torch.device, seed: int, rank: int, epoch: int, index: int) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(batch_seed(seed, rank, epoch, index))


def batch_ranges(n: int, batch_size: int, drop_last: bool) -> Iterator[Tuple[int, int, int]]:
    """``(index, start, stop)`` of each batch of a share of ``n`` ids."""
    count = n // batch_size if drop_last else -(-n // batch_size)
    for i in range(count):
        yield i, i * batch_size, min((i + 1) * batch_size, n)


class DeviceNodeBatches:
    """``(input_nodes, output_nodes, blocks)`` batches of a share, sampled on ``device``.
    ``types``: the heterograph's ``(type, offset, count)`` spans of the flat ids (or None);
    ``on_host``: node and edge data keys gathered on the host."""

    def __init__(self, graph: Any, sampler: DeviceSampler, batch_size: int, drop_last: bool,
                 types: Optional[Sequence[Tuple[str, int, int]]], device: torch.device,
                 on_host: Tuple[Keys, Keys] = ({}, {})):
        self.sampler, self.batch_size, self.drop_last, self.types = sampler, batch_size, drop_last, types
        self.graph = device_graph(graph, device, sampler.node_keys(), sampler.edge_keys(), on_host, sampler.prob)
        self.device = device
        self.source = GraphSource(graph)  # keys not gathered, read when asked (one for every batch)

    def seeds(self, ids: torch.Tensor) -> Dict[str, torch.Tensor]:
        """Every node type's seeds (empty where the batch has none), on the device."""
        if self.types is None:
            return {self.graph.ntypes[0]: ids.to(self.device, non_blocking=True)}
        typed = split_flat(ids, self.types)
        empty = torch.empty(0, dtype=torch.int64)
        return {nt: typed.get(nt, empty).to(self.device, non_blocking=True) for nt in self.graph.ntypes}

    def rows(self) -> GraphRows:
        """Where a PyG batch reads the rows it keeps (batches sampled with ``gather=False``)."""
        return device_rows(self.graph, self.source.graph)

    def iterate(self, share: torch.Tensor, seed: int, rank: int, epoch: int, gather: bool = True) -> Iterator[Any]:
        """The share's batches; ``gather=False``: their blocks gather no data (:meth:`rows` holds it)."""
        if self.types is None:
            share = share.to(self.device)
        maps = node_maps(self.graph)
        for i, lo, hi in batch_ranges(share.numel(), self.batch_size, self.drop_last):
            gen = batch_generator(self.device, seed, rank, epoch, i)
            seeds = self.seeds(share[lo:hi])
            inputs, blocks = self.sampler.sample(self.graph, maps, seeds, gen, source=self.source, gather=gather)
            ids = self.graph.ids
            if self.types is None:
                yield ids(inputs[self.graph.ntypes[0]]), ids(next(iter(seeds.values()))), blocks
            else:
                given = [nt for nt, _, _ in self.types]
                yield {nt: ids(v) for nt, v in inputs.items()}, {nt: ids(seeds[nt]) for nt in given}, blocks
