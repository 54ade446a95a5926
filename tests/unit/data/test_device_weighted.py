"""``NeighborSampler(prob=...)`` and ``mask=...`` on the device sampler: blocks with DGL's structure
and per-destination counts (only positive-weight edges), loaders that sample there (``"auto"`` no
longer falls back), weights counted in the memory plan and copied again when replaced, an int32
graph, the waits and ops of a layer, and bad weights refused naming the fix. The draws' distribution:
tests/unit/data/test_device_weighted_draws.py."""
from __future__ import annotations

import os

import pytest
import torch

import graphtrainer  # noqa: F401  (DGL's compatibility layer first)
import dgl

from graphtrainer.data.device import mode
from graphtrainer.data.device.batches import node_maps
from graphtrainer.data.device.graph import device_graph, drop_copies, plan_copy
from graphtrainer.data.device.sampler import DeviceSampler, Unsupported
from graphtrainer.data.edge_loader import EdgeLoader
from graphtrainer.data.node_loader import NodeLoader
from graphtrainer.testing.op_count import OpCounter

from link_tasks import symmetric_graph
from test_device_sampler import skewed_graph

DEV = torch.device(os.environ.get("GRAPHTRAINER_SAMPLER_DEVICE", "cpu"))
CPU = torch.device("cpu")


def weighted_graph(seed: int = 0) -> dgl.DGLGraph:
    """:func:`skewed_graph` with weights ``w`` (about a third 0) and a mask ``m`` (about half True)."""
    g = skewed_graph(seed)
    gen = torch.Generator().manual_seed(seed + 1)
    w = torch.rand(g.num_edges(), generator=gen) * 3
    g.edata["w"] = torch.where(w < 1, 0.0, w)
    g.edata["m"] = torch.rand(g.num_edges(), generator=gen) < 0.5
    return g


def _sample(g, fanouts, seeds, key="w", replace=False, seed=0):
    s = DeviceSampler.from_dgl(dgl.dataloading.NeighborSampler(fanouts, prob=key, replace=replace,
                                                               prefetch_node_feats=["feat"]), g)
    assert s.prob == key
    dg = device_graph(g, DEV, s.node_keys(), s.edge_keys(), weights=s.prob)
    seeds = {g.ntypes[0]: seeds.to(DEV)}
    inputs, blocks = s.sample(dg, node_maps(dg), seeds, torch.Generator(DEV).manual_seed(seed))
    return inputs[g.ntypes[0]].cpu(), [b.to("cpu") for b in blocks]


def _dgl_counts(g, fanout, dst_ids, key, replace):
    """Sampled edges per destination with DGL's sampler (deterministic for these fanouts)."""
    frontier = g.sample_neighbors(dst_ids, fanout, prob=key, replace=replace)
    return frontier.in_degrees(dst_ids)


def _check(g, block, fanout, key, replace):
    """Every edge exists with its id and positive weight; per destination DGL's count."""
    src_ids, dst_ids = block.srcdata["_ID"], block.dstdata["_ID"]  # in the graph's id type, as DGL's
    assert torch.equal(src_ids[:block.num_dst], dst_ids)
    s, d = block.edges()
    eids = block.edata["_ID"]
    u, v = g.find_edges(eids)
    assert torch.equal(u, src_ids[s]) and torch.equal(v, dst_ids[d])
    assert bool((g.edata[key][eids.long()].double() > 0).all())
    _, all_dst, all_eid = g.in_edges(dst_ids, form="all")
    positive = torch.bincount(all_dst[g.edata[key][all_eid.long()] > 0].long(),
                              minlength=g.num_nodes())[dst_ids.long()]
    want = positive if fanout == -1 else torch.where(positive > 0, fanout, 0) if replace else \
        positive.clamp(max=fanout)
    assert torch.equal(block.in_degrees().long(), want)
    assert torch.equal(want, _dgl_counts(g, fanout, dst_ids, key, replace).long())
    if not replace:
        for node in range(block.num_dst):
            ids = eids[block.indptr[node]:block.indptr[node + 1]]
            assert ids.unique().numel() == ids.numel()


@pytest.mark.parametrize("key", ["w", "m"])
@pytest.mark.parametrize("fanouts,replace", [([5, 3], False), ([5, 3], True), ([-1, 4], False), ([-1, 2], True),
                                             ([300, 1], False)])
def test_blocks_hold_only_positive_edges_as_many_as_dgl_takes(key, fanouts, replace):
    g = weighted_graph()
    inputs, blocks = _sample(g, fanouts, torch.arange(0, 60), key, replace)
    for block, fanout in zip(blocks, fanouts):
        _check(g, block, fanout, key, replace)
    assert torch.equal(blocks[0].srcdata["feat"], g.ndata["feat"][inputs])


def test_an_int32_graph_samples_by_weight_and_gives_int32_ids():
    g = weighted_graph().int()
    _, blocks = _sample(g, [4, 4], torch.arange(0, 60, dtype=torch.int32))
    for block in blocks:
        assert block.idtype == torch.int32 and block.edata["_ID"].dtype == torch.int32
        _check(g, block, 4, "w", False)


def test_a_heterograph_weighs_the_relations_that_have_the_key_and_draws_the_others_uniformly():
    gen = torch.Generator().manual_seed(0)
    g = dgl.heterograph({("user", "clicks", "item"): (torch.randint(0, 30, (300,), generator=gen),
                                                      torch.randint(0, 20, (300,), generator=gen)),
                         ("user", "buys", "item"): (torch.randint(0, 30, (200,), generator=gen),
                                                    torch.randint(0, 20, (200,), generator=gen)),
                         ("item", "rev", "user"): (torch.randint(0, 20, (300,), generator=gen),
                                                   torch.randint(0, 30, (300,), generator=gen))})
    g.edges["clicks"].data["w"] = torch.where(torch.rand(300, generator=gen) < 0.5, 0.0, 1.0)
    g.edges["rev"].data["w"] = torch.rand(300, generator=gen) < 0.3  # a bool mask on another relation
    s = DeviceSampler.from_dgl(dgl.dataloading.NeighborSampler([-1, 3], prob="w"), g)
    dg = device_graph(g, DEV, s.node_keys(), s.edge_keys(), weights=s.prob)
    seeds = {"user": torch.arange(10, device=DEV), "item": torch.arange(10, device=DEV)}
    _, blocks = s.sample(dg, node_maps(dg), seeds, torch.Generator(DEV).manual_seed(0))
    for block, fanout in zip((b.to("cpu") for b in blocks), (-1, 3)):
        dst = {nt: block.dst_store["_ID"][nt] for nt in g.ntypes}
        theirs = g.sample_neighbors(dst, fanout, prob="w")
        for et in g.canonical_etypes:
            eids = block.edge_store["_ID"][et]
            if et[1] != "buys":
                assert bool((g.edges[et].data["w"][eids].double() > 0).all())
            assert torch.equal(block[et].in_degrees(), theirs.in_degrees(dst[et[2]], etype=et))


def test_edge_loader_blocks_never_hold_the_seed_edges_or_zero_weights():
    g, reverse = symmetric_graph()
    g.edata["w"] = torch.where(torch.arange(g.num_edges()) % 3 == 0, 0.0, 1.0 + torch.arange(g.num_edges()) % 5)
    seeds = torch.arange(0, 600, 3)
    loader = EdgeLoader(g, seeds, dgl.dataloading.NeighborSampler([4, 4], prob="w"), 32, negatives=2,
                        exclude="reverse_id", reverse_eids=reverse, seed=7)
    assert mode.place(loader, CPU, "device", announce=False) == "device"
    for _, pos, _, blocks in loader:
        banned = set(pos.edata["_ID"].tolist()) | set(reverse[pos.edata["_ID"]].tolist())
        for block in blocks:
            eids = block.edata["_ID"]
            assert not banned & set(eids.tolist()) and bool((g.edata["w"][eids] > 0).all())


def test_auto_samples_a_weighted_loader_on_the_device_counting_the_weights(monkeypatch, capsys):
    g = weighted_graph()
    drop_copies(g)
    sampler = dgl.dataloading.NeighborSampler([3, 3], prob="w", prefetch_node_feats=["feat"])
    keys = ({"_N": ("feat",)}, {})
    plain, weighted = plan_copy(g, CPU, *keys, allowed=None), plan_copy(g, CPU, *keys, allowed=None, weights="w")
    assert weighted.structure - plain.structure == 4 * g.num_edges()  # float32 weights, one per edge
    monkeypatch.setattr(mode, "auto_samples_on", lambda device: True)  # as on a GPU rank
    loader = NodeLoader(g, torch.arange(20), sampler, 8)
    assert mode.place(loader, CPU, "auto", announce=True) == "device"
    assert "NodeLoader samples on cpu (structure and gathered data" in capsys.readouterr().err
    copy = device_graph(g, CPU, *keys, weights="w")
    assert copy.device_bytes() == weighted.structure + weighted.data
    assert plan_copy(g, CPU, *keys, allowed=None, weights="w").structure == 0  # copied: nothing more to add
    too_small = weighted.structure + weighted.data - 1  # room for all but the weights' last byte
    drop_copies(g)
    monkeypatch.setenv(mode.BUDGET_ENV, str(too_small))
    with pytest.raises(Unsupported, match="structure and gathered data need"):
        mode.device_batches(NodeLoader(g, torch.arange(20), sampler, 8), CPU, host_data=False)


def test_weights_given_new_values_are_copied_again():
    g = weighted_graph()
    drop_copies(g)
    first = device_graph(g, DEV, {}, {}, weights="w")
    g.edata["w"] = torch.ones(g.num_edges())
    second = device_graph(g, DEV, {}, {}, weights="w")
    assert second is not first
    assert bool((second.relations[g.canonical_etypes[0]].weights["w"] == 1).all())


def test_a_weighted_layer_waits_once_more_and_launches_as_many_ops_for_8_seeds_as_for_256():
    """Each layer lays out its destinations' in-edges: one wait for their number (as a fanout of -1
    does) beside the layer's one; no op per seed."""
    g = weighted_graph()
    s = DeviceSampler.from_dgl(dgl.dataloading.NeighborSampler([5, 3], prob="w"), g)
    dg = device_graph(g, DEV, {}, {}, weights=s.prob)
    s.edge_feats = s.node_feats = s.labels = None

    def count(n):
        seeds = {g.ntypes[0]: torch.arange(13, 13 + n, device=DEV)}
        s.sample(dg, node_maps(dg), seeds, torch.Generator(DEV).manual_seed(0))
        with OpCounter() as counter:
            s.sample(dg, node_maps(dg), seeds, torch.Generator(DEV).manual_seed(1))
        return counter

    assert count(40).host_reads == 4, count(40).by_op
    assert count(8).kernels == count(256).kernels


@pytest.mark.parametrize("value,match", [
    (None, r"no relation of the graph has edge data 'p'.*set g.edata\['p'\]"),
    (torch.ones(1220, dtype=torch.int64), r"'p' is torch.int64.*convert it"),
    (torch.ones(1220, 2), r"shape \(1220, 2\).*one value per edge"),
    (torch.tensor([1.0, -1.0]).repeat(610), r"negative weights.*0 for an edge never to draw"),
    (torch.tensor([1.0, float("nan")]).repeat(610), r"NaN or infinite"),
])
def test_bad_weights_are_refused_before_sampling_naming_the_fix(value, match):
    g = weighted_graph()
    assert g.num_edges() == 1220
    if value is not None:
        g.edata["p"] = value
    for sampler in (dgl.dataloading.NeighborSampler([3], prob="p"), dgl.dataloading.NeighborSampler([3], mask="p")):
        with pytest.raises(ValueError, match=match) as err:
            DeviceSampler.from_dgl(sampler, g)
        assert not isinstance(err.value, Unsupported)  # no CPU fallback: DGL fails or samples undefined there


def test_weights_of_shape_edges_by_one_are_read_as_dgl_reads_them():
    g = weighted_graph()
    g.edata["col"] = g.edata["w"].unsqueeze(1)
    _, blocks = _sample(g, [4], torch.arange(0, 60), key="col")
    _check(g, blocks[0], 4, "w", False)


def test_a_copy_made_without_the_weights_is_refused_not_drawn_uniformly():
    g = weighted_graph()
    drop_copies(g)
    s = DeviceSampler.from_dgl(dgl.dataloading.NeighborSampler([3], prob="w", prefetch_node_feats=["feat"]), g)
    dg = device_graph(g, DEV, s.node_keys(), s.edge_keys())
    with pytest.raises(ValueError, match=r"lacks the weights 'w'.*weights=sampler.prob"):
        s.sample(dg, node_maps(dg), {"_N": torch.arange(5, device=DEV)}, torch.Generator(DEV).manual_seed(0))
