"""A fanout of 0 on DGL's CPU path: DGL 2.1's fused sampler (taken with more than one thread)
builds blocks with fewer source nodes than destinations there, so graphtrainer's loaders give
such samplers DGL's unfused path. Blocks keep DGL's layout: destinations first."""
from __future__ import annotations

import pytest
import torch

import graphtrainer  # noqa: F401  (DGL's compatibility layer first)
import dgl

from graphtrainer.data.edge_loader import EdgeLoader
from graphtrainer.data.node_loader import NodeLoader


@pytest.fixture
def two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)  # DGL takes its fused path only then
    yield
    torch.set_num_threads(before)


def _bipartite():
    gen = torch.Generator().manual_seed(0)
    u, i = torch.randint(0, 5, (30,), generator=gen), torch.randint(0, 10, (30,), generator=gen)
    return dgl.heterograph({("user", "buys", "item"): (u, i), ("item", "rev", "user"): (i, u)})


def _destinations_first(block):
    for nt in block.dsttypes:
        n = block.num_dst_nodes(nt)
        assert block.num_src_nodes(nt) >= n
        src, dst = block.srcnodes[nt].data[dgl.NID], block.dstnodes[nt].data[dgl.NID]
        assert torch.equal(src[:n], dst)


def test_a_zero_fanout_layer_keeps_every_seed_as_a_source(two_threads):
    g = dgl.rand_graph(50, 300)
    for sampler in (dgl.dataloading.NeighborSampler([0]), dgl.dataloading.NeighborSampler([3, 0])):
        for _, seeds, blocks in NodeLoader(g, torch.arange(20), sampler, 8):
            for block in blocks:
                _destinations_first(block)
            assert blocks[-1].num_edges() == 0 and blocks[-1].num_src_nodes() == seeds.numel()
    assert dgl.dataloading.NeighborSampler([0]).fused  # the user's sampler is left as it was


def test_a_relation_left_out_keeps_the_other_types_seeds(two_threads):
    g = _bipartite()
    ids = {"item": torch.arange(10), "user": torch.arange(5)}
    sampler = dgl.dataloading.NeighborSampler([{"buys": 0, "rev": 2}])
    for inputs, seeds, blocks in NodeLoader(g, ids, sampler, 6, shuffle=False):
        _destinations_first(blocks[0])
        assert blocks[0].num_edges("buys") == 0
    edges = EdgeLoader(g, {"buys": torch.arange(30)}, dgl.dataloading.NeighborSampler([{"buys": 0, "rev": 2}]), 8)
    for _, pos, _, blocks in edges:
        _destinations_first(blocks[0])
