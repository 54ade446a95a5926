"""What a link-prediction batch holds, on DGL's CPU path and on the device: pair graphs whose
edge data line up with their edges (DGL 2.1 sorts them out of line under ``exclude=``), the
data DGL's pair graph carries, int32 graphs, and the checks on ``negatives`` and
``reverse_etypes``."""
from __future__ import annotations

import pytest
import torch

import graphtrainer  # noqa: F401  (DGL's compatibility layer first)
import dgl

from graphtrainer.data.device import mode
from graphtrainer.data.edge_loader import EdgeLoader
from graphtrainer.data.node_loader import NodeLoader, default_sampler

from link_tasks import symmetric_graph

CPU = torch.device("cpu")


def _graph():
    """Each edge and its reverse (second half); edge data ``w`` is the edge id."""
    g, reverse = symmetric_graph()
    g.edata["w"] = torch.arange(g.num_edges(), dtype=torch.float32)
    return g, reverse


def _bipartite(seed=1):
    gen = torch.Generator().manual_seed(seed)
    u, i = torch.randint(0, 30, (120,), generator=gen), torch.randint(0, 20, (120,), generator=gen)
    g = dgl.heterograph({("user", "rates", "item"): (u, i), ("item", "rated-by", "user"): (i, u)})
    g.nodes["user"].data["feat"] = torch.randn(30, 3, generator=gen)
    g.nodes["item"].data["feat"] = torch.randn(20, 3, generator=gen)
    g.edges["rates"].data["rating"] = torch.arange(120, dtype=torch.float32) / 10
    return g


def _loaders(g, seeds, **kwargs):
    cpu = EdgeLoader(g, seeds, [3, 3], 16, seed=5, **kwargs)
    dev = EdgeLoader(g, seeds, [3, 3], 16, seed=5, **kwargs)
    assert mode.place(dev, CPU, "device", announce=False) == "device"
    return {"cpu": cpu, "device": dev}


@pytest.mark.parametrize("exclude", [None, "self", "reverse_id"])
def test_a_pair_graphs_edge_ids_and_edge_data_line_up_with_its_edges(exclude):
    g, reverse = _graph()
    seeds = torch.randperm(600, generator=torch.Generator().manual_seed(3))[:96]
    kwargs = dict(negatives=1, exclude=exclude, reverse_eids=reverse if exclude == "reverse_id" else None)
    for where, loader in _loaders(g, seeds, **kwargs).items():
        for _, pos, _, blocks in loader:
            eids = pos.edata["_ID"]
            u, v = pos.edges()
            gu, gv = g.find_edges(eids)
            assert torch.equal(pos.ndata["_ID"][u], gu) and torch.equal(pos.ndata["_ID"][v], gv), where
            assert torch.equal(pos.edata["w"], eids.float()), where  # data of the edge, not of another
            assert torch.equal(pos.ndata["feat"], g.ndata["feat"][pos.ndata["_ID"]]), where


def test_a_heterographs_pair_graph_carries_its_ratings_in_line_under_reverse_types():
    g = _bipartite()
    rates = ("user", "rates", "item")
    kwargs = dict(negatives=1, exclude="reverse_types", reverse_etypes={"rates": "rated-by", "rated-by": "rates"})
    for where, loader in _loaders(g, {"rates": torch.arange(0, 120, 2)}, **kwargs).items():
        seen = 0
        for _, pos, _, _ in loader:
            eids = pos.edges[rates].data["_ID"] if where == "cpu" else pos.edata["_ID"][rates]
            rating = pos.edges[rates].data["rating"] if where == "cpu" else pos.edata["rating"][rates]
            u, v = pos.edges(etype=rates)
            ids = pos.ndata["_ID"]
            gu, gv = g.find_edges(eids, etype=rates)
            assert torch.equal(ids["user"][u], gu) and torch.equal(ids["item"][v], gv), where
            assert torch.allclose(rating, eids.float() / 10), where
            seen += eids.numel()
        assert seen == 60


def test_an_int32_graph_samples_on_the_cpu_as_in_dgl_with_the_int64_graphs_negatives():
    g64, _ = _graph()
    g = g64.int()
    nodes = NodeLoader(g, torch.arange(0, 60, 2), default_sampler(g, [3, 3]), 8)
    for inputs, outputs, blocks in nodes:
        assert inputs.dtype == outputs.dtype == torch.int32
        assert torch.equal(blocks[-1].dstdata["_ID"], outputs)
    negatives = {}
    for graph in (g, g64):
        edges = EdgeLoader(graph, torch.arange(0, 600, 7), [3], 32, negatives=2, exclude="self")
        pairs = [torch.stack([neg.ndata["_ID"][t] for t in neg.edges()]).long() for _, _, neg, _ in edges]
        negatives[graph.idtype] = torch.cat(pairs, 1)
    assert negatives[torch.int32].shape == (2, 172)
    assert torch.equal(negatives[torch.int32], negatives[torch.int64])


@pytest.mark.parametrize("reverse_dtype", [torch.int64, torch.int32])
def test_an_int32_graph_excludes_reverse_edges_on_the_cpu_and_the_device(reverse_dtype):
    """exclude="reverse_id" on an int32 graph: DGL's exclusion refuses int64 ids there (the loader
    kept reverse_eids in int64, so every CPU batch failed deep in DGL); both paths keep the seed
    edges and their reverses out of the blocks."""
    g64, reverse = _graph()
    g = g64.int()
    seeds = torch.arange(0, 300, 7)
    for where in ("cpu", "device"):
        loader = EdgeLoader(g, seeds, [3, 3], 16, negatives=1, exclude="reverse_id",
                            reverse_eids=reverse.to(reverse_dtype))
        if where == "device":
            assert mode.place(loader, CPU, "device", announce=False) == "device"
        seen = 0
        for _, pos, _, blocks in loader:
            eids = pos.edata["_ID"].long()
            banned = set(eids.tolist()) | set(reverse[eids].tolist())
            assert all(not banned & set(b.edata["_ID"].tolist()) for b in blocks), where
            seen += eids.numel()
        assert seen == seeds.numel(), where


def test_a_heterographs_negatives_on_an_int32_graph_hash_offsets_past_int32_as_the_int64_graphs():
    """A relation's flat offset (edges of the relations before it) can pass 2**31 on a big int32
    graph: it was added in int32 and wrapped, so the CPU drew other negatives than the device."""
    from graphtrainer.data.edge_loader import PerEdgeUniform

    g64 = dgl.heterograph({("u", "a", "v"): ([0, 1, 2], [1, 2, 0]), ("v", "b", "u"): ([0, 1, 2, 0], [2, 1, 0, 1])})
    draws = {}
    for g in (g64, g64.int()):
        negatives = PerEdgeUniform(3)
        negatives.offsets = {("v", "b", "u"): 2**31 + 5}  # as EdgeLoader sets them
        draws[g.idtype] = negatives(g, {"b": torch.arange(4, dtype=g.idtype)})[("v", "b", "u")][1]
    flat = PerEdgeUniform(3).draw(torch.zeros(4, dtype=torch.int64), torch.arange(4) + 2**31 + 5, 3)[1]
    assert torch.equal(draws[torch.int32].long(), draws[torch.int64]) and torch.equal(draws[torch.int64], flat)


def test_negatives_must_be_a_count_a_sampler_or_none():
    g, _ = _graph()
    for bad in (0.0, float("nan"), True, 0, -1, "2"):
        with pytest.raises(ValueError, match=rf"negatives={bad!r}: give k, an int of 1 or more"):
            EdgeLoader(g, torch.arange(10), [3], 4, negatives=bad)
    # A float is PyG's binary ratio (a whole one is k).
    assert EdgeLoader(g, torch.arange(10), [3], 4, negatives=2.0).negatives.amount == 2
    assert EdgeLoader(g, torch.arange(10), [3], 4, negatives=0.5).negatives.amount == 0.5
    assert EdgeLoader(g, torch.arange(10), [3], 4, negatives=None).negatives is None
    uniform = dgl.dataloading.negative_sampler.Uniform(2)
    assert EdgeLoader(g, torch.arange(10), [3], 4, negatives=uniform).negatives is uniform


def test_reverse_etypes_must_name_reverse_relations_edge_for_edge():
    g = _bipartite()
    u, i = g.edges(etype="rates")
    g2 = dgl.heterograph({("user", "rates", "item"): (u, i), ("item", "rated-by", "user"): (i.flip(0), u),
                          ("user", "follows", "user"): (u[:5], u[5:10])})
    seeds = {"rates": torch.arange(10)}
    kwargs = dict(negatives=1, exclude="reverse_types")
    with pytest.raises(ValueError, match=r"'follows' is not the reverse of 'rates'"):
        EdgeLoader(g2, seeds, [3], 4, reverse_etypes={"rates": "follows"}, **kwargs)
    with pytest.raises(ValueError, match=r"edge \d+ of \('item', 'rated-by', 'user'\) .* does not reverse edge"):
        EdgeLoader(g2, seeds, [3], 4, reverse_etypes={"rates": "rated-by"}, **kwargs)
    with pytest.raises(ValueError, match=r"reverse_etypes: 'rates' -> 'likes'"):
        EdgeLoader(g, seeds, [3], 4, reverse_etypes={"rates": "likes"}, **kwargs)
    loader = EdgeLoader(g, seeds, [3], 4, reverse_etypes={"rates": "rated-by"}, **kwargs)
    assert loader.reverse_etypes == {("user", "rates", "item"): ("item", "rated-by", "user")}


def test_the_device_path_names_dgls_uniform_and_the_count_that_replaces_it():
    g, _ = _graph()
    loader = EdgeLoader(g, torch.arange(10), [3], 4, negatives=dgl.dataloading.negative_sampler.Uniform(2))
    with pytest.raises(ValueError, match=r"PerSourceUniform\(\.\.\.\) \(DGL's Uniform is this class\).*"
                                         r"Pass negatives=k"):
        mode.place(loader, CPU, "device", announce=False)
