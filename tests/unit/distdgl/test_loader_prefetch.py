"""DistDGL's loaders read the sampler's prefetch lists in every form DGL's samplers take (a list
of keys, or ``{ntype: keys}``) and refuse a type or key the graph lacks before the first batch.
Here on an in-memory graph read as a DistGraph is (``ndata[key][ids]``), no servers;
tests/integration/test_distgraph.py runs the same forms on a partitioned graph."""
from __future__ import annotations

import pytest
import torch

import graphtrainer  # noqa: F401  (DGL's compatibility layer first)
import dgl

from graphtrainer.distdgl import loader as dist_loader
from graphtrainer.distdgl.loader import DistEdgeLoader, DistNodeLoader


def _graph() -> dgl.DGLGraph:
    gen = torch.Generator().manual_seed(0)
    g = dgl.graph((torch.randint(0, 40, (200,), generator=gen), torch.randint(0, 40, (200,), generator=gen)),
                  num_nodes=40)
    g.ndata["feat"] = torch.randn(40, 3, generator=gen)
    g.ndata["label"] = torch.arange(40) % 4
    return g


@pytest.mark.parametrize("feats,labels", [({"_N": ["feat"]}, {"_N": ["label"]}), ({"_N": "feat"}, ["label"])])
def test_a_node_loader_reads_each_prefetch_form_by_key(monkeypatch, feats, labels):
    g = _graph()
    monkeypatch.setattr(dist_loader, "single_partition", lambda graph: None)  # every read as through a DistGraph
    read = []
    plain_read = DistNodeLoader._read

    def spy(self, key, ids):
        read.append(key)
        return plain_read(self, key, ids)

    monkeypatch.setattr(DistNodeLoader, "_read", spy)
    sampler = dgl.dataloading.NeighborSampler([2, 2], prefetch_node_feats=feats, prefetch_labels=labels)
    loader = DistNodeLoader(g, torch.arange(20), sampler, 8, shuffle=False)
    batches = list(loader)
    assert len(batches) == 3 and set(read) == {"feat", "label"}
    for input_nodes, seeds, blocks in batches:
        assert torch.equal(blocks[0].srcdata["feat"], g.ndata["feat"][input_nodes])
        assert torch.equal(blocks[-1].dstdata["label"], g.ndata["label"][seeds])


def test_an_edge_loader_takes_the_per_type_form():
    g = _graph()
    sampler = dgl.dataloading.NeighborSampler([2], prefetch_node_feats={"_N": ["feat"]})
    loader = DistEdgeLoader(g, torch.arange(30), sampler, 8)
    assert (loader.feat_keys, loader.label_keys) == (["feat"], [])


def test_a_type_or_key_the_graph_lacks_is_refused_before_the_first_batch():
    g = _graph()
    bad_type = dgl.dataloading.NeighborSampler([2], prefetch_node_feats={"paper": ["feat"]})
    with pytest.raises(ValueError, match=r"prefetch_node_feats=.*no node type \['paper'\] \(its node types: "
                                         r"\['_N'\]\)"):
        DistNodeLoader(g, torch.arange(8), bad_type, 4)
    bad_key = dgl.dataloading.NeighborSampler([2], prefetch_labels=["year"])
    with pytest.raises(ValueError, match=r"prefetch_labels=.*no node data \['year'\] \(its node data: "
                                         r"\['feat', 'label'\]\)"):
        DistNodeLoader(g, torch.arange(8), bad_key, 4)
    with pytest.raises(ValueError, match=r"no node data \['x'\]"):
        DistEdgeLoader(g, torch.arange(8), dgl.dataloading.NeighborSampler([2], prefetch_node_feats=["x"]), 4)
