"""The torch neighbour sampler (graphtrainer.data.device) against DGL's meaning of a sample:
structure, exclusion, layout, and the distribution of the draws. On the CPU here; on a GPU
tests/integration/test_gpu.py runs this file again with ``GRAPHTRAINER_SAMPLER_DEVICE=cuda``."""
from __future__ import annotations

import os

import pytest
import torch

import graphtrainer  # noqa: F401  (DGL's compatibility layer first)
import dgl

from graphtrainer.data.device.batches import node_maps
from graphtrainer.data.device.graph import device_graph, plan_copy, structure_bytes
from graphtrainer.data.device.neighbors import Excluded, floyd, sample_layer
from graphtrainer.data.device.sampler import DeviceSampler, Unsupported
from graphtrainer.testing.op_count import OpCounter

DEV = torch.device(os.environ.get("GRAPHTRAINER_SAMPLER_DEVICE", "cpu"))
CPU_DEVICE = torch.device("cpu")


def skewed_graph(seed: int = 0, n: int = 300) -> dgl.DGLGraph:
    """In-degrees 0 (nodes 0-9), low (random edges) and high (nodes 10-12: 40, 80, 200)."""
    gen = torch.Generator().manual_seed(seed)
    src = [torch.randint(0, n, (900,), generator=gen)]
    dst = [torch.randint(13, n, (900,), generator=gen)]
    for node, deg in ((10, 40), (11, 80), (12, 200)):
        src.append(torch.randint(0, n, (deg,), generator=gen))  # repeats: a multigraph, as DGL allows
        dst.append(torch.full((deg,), node))
    g = dgl.graph((torch.cat(src), torch.cat(dst)), num_nodes=n)
    g.ndata["feat"] = torch.randn(n, 4, generator=gen)
    g.ndata["label"] = torch.arange(n) % 3
    g.edata["w"] = torch.rand(g.num_edges(), generator=gen)
    return g


def sample(g, fanouts, seeds, seed=0, replace=False, exclude=None, **prefetch):
    s = DeviceSampler.from_dgl(dgl.dataloading.NeighborSampler(fanouts, replace=replace, **prefetch), g)
    dg = device_graph(g, DEV, s.node_keys(), s.edge_keys())
    seeds = seeds if isinstance(seeds, dict) else {g.ntypes[0]: seeds}
    seeds = {nt: ids.to(DEV) for nt, ids in seeds.items()}
    exclude = None if exclude is None else {et: ids.to(DEV) for et, ids in exclude.items()}
    inputs, blocks = s.sample(dg, node_maps(dg), seeds, torch.Generator(DEV).manual_seed(seed), exclude)
    return {nt: ids.cpu() for nt, ids in inputs.items()}, [b.to("cpu") for b in blocks]


def check_block(g, block, k, replace=False, excluded=()):
    """Every edge exists with its id; per destination the count DGL gives; layout as DGL's."""
    src_ids, dst_ids = block.srcdata["_ID"], block.dstdata["_ID"]
    assert torch.equal(src_ids[:block.num_dst], dst_ids)  # destinations first
    assert src_ids.unique().numel() == block.num_src
    s, d = block.edges()
    eids = block.edata["_ID"]
    u, v = g.find_edges(eids)
    assert torch.equal(u, src_ids[s]) and torch.equal(v, dst_ids[d])
    assert not set(eids.tolist()) & set(excluded)
    kept = torch.ones(g.num_edges(), dtype=torch.bool)
    kept[list(excluded)] = False
    _, all_dst, all_eid = g.in_edges(dst_ids, form="all")
    deg = torch.bincount(all_dst[kept[all_eid]], minlength=g.num_nodes())[dst_ids]
    got = block.in_degrees()
    if k == -1:
        assert torch.equal(got, deg)
    elif replace:
        assert torch.equal(got, torch.where(deg > 0, k, 0))
    else:
        assert torch.equal(got, deg.clamp(max=k))
        for node in range(block.num_dst):  # no edge twice
            ids = eids[block.indptr[node]:block.indptr[node + 1]]
            assert ids.unique().numel() == ids.numel()


@pytest.mark.parametrize("fanouts,replace", [([5, 3], False), ([5, 3], True), ([-1, 4], False), ([-1, -1], False)])
def test_blocks_have_dgl_structure_and_layout(fanouts, replace):
    g = skewed_graph()
    seeds = torch.tensor([0, 1, 10, 11, 12, 50, 77, 299])
    inputs, blocks = sample(g, fanouts, seeds, replace=replace)
    assert len(blocks) == len(fanouts)
    assert torch.equal(blocks[-1].dstdata["_ID"], seeds)
    assert torch.equal(inputs["_N"], blocks[0].srcdata["_ID"])
    for block, k in zip(blocks, fanouts):
        check_block(g, block, k, replace)
    for outer, inner in zip(blocks, blocks[1:]):  # each layer's sources are the next one's... destinations
        assert torch.equal(outer.dstdata["_ID"], inner.srcdata["_ID"])


def test_features_labels_and_edge_data_are_gathered():
    g = skewed_graph()
    seeds = torch.tensor([10, 11, 40])
    _, blocks = sample(g, [4, 4], seeds, prefetch_node_feats=["feat"], prefetch_labels=["label"],
                       prefetch_edge_feats=["w"])
    assert torch.equal(blocks[0].srcdata["feat"], g.ndata["feat"][blocks[0].srcdata["_ID"]])
    assert torch.equal(blocks[-1].dstdata["label"], g.ndata["label"][seeds])
    for b in blocks:
        assert torch.equal(b.edata["w"], g.edata["w"][b.edata["_ID"]])


@pytest.mark.parametrize("sampler", [dgl.dataloading.MultiLayerFullNeighborSampler(2),
                                     dgl.dataloading.NeighborSampler([4, 4])])
def test_a_sampler_that_prefetches_nothing_gathers_every_key_dgls_blocks_show(sampler):
    g = skewed_graph()
    g.ndata["train_mask"] = torch.arange(g.num_nodes()) % 2 == 0
    s = DeviceSampler.from_dgl(sampler, g)
    dg = device_graph(g, DEV, s.node_keys(), s.edge_keys())
    seeds = torch.tensor([10, 11, 40])
    _, blocks = s.sample(dg, node_maps(dg), {"_N": seeds.to(DEV)}, torch.Generator(DEV).manual_seed(0))
    src_ids, dst_ids = blocks[0].srcdata["_ID"], blocks[-1].dstdata["_ID"]
    for key in ("feat", "label", "train_mask"):  # what a DGL user reads off blocks without prefetching
        assert torch.equal(blocks[0].srcdata[key], g.ndata[key][src_ids.cpu()].to(DEV))
        assert torch.equal(blocks[-1].dstdata[key], g.ndata[key][dst_ids.cpu()].to(DEV))
    for b in blocks:
        assert torch.equal(b.edata["w"], g.edata["w"][b.edata["_ID"].cpu()].to(DEV))


def test_a_fanout_above_every_in_degree_draws_only_as_many_slots_as_the_largest(monkeypatch):
    """Without replacement a fanout of a million takes what -1 takes, in slots as wide as the
    largest in-degree (200 here), not a million per destination."""
    from graphtrainer.data.device import neighbors

    widths = []
    real = neighbors.floyd
    monkeypatch.setattr(neighbors, "floyd", lambda deg, k, gen: widths.append(k) or real(deg, k, gen))
    g = skewed_graph()
    seeds = torch.tensor([0, 10, 11, 12, 50])
    _, blocks = sample(g, [10**6], seeds)
    check_block(g, blocks[0], -1)
    assert widths == [200]


def test_a_graph_given_new_data_or_nodes_is_copied_again():
    """The copy lives as long as the graph; a second fit in the same process after
    ``g.ndata["feat"] = ...`` or ``g.add_nodes`` must not sample the old graph."""
    g = skewed_graph()
    s = DeviceSampler.from_dgl(dgl.dataloading.NeighborSampler([3], prefetch_node_feats=["feat"]), g)
    first = device_graph(g, DEV, s.node_keys(), {})
    assert device_graph(g, DEV, s.node_keys(), {}) is first  # unchanged: shared
    g.ndata["feat"] = torch.ones(g.num_nodes(), 4)
    second = device_graph(g, DEV, s.node_keys(), {})
    assert second is not first and torch.equal(second.ndata["_N"]["feat"].cpu(), g.ndata["feat"])
    assert plan_copy(g, DEV, s.node_keys(), {}, None).structure == 0  # the new copy counts as made
    g.add_nodes(5, {"feat": torch.zeros(5, 4), "label": torch.zeros(5, dtype=torch.int64)})
    assert plan_copy(g, DEV, s.node_keys(), {}, None).structure > 0  # the old copy no longer counts
    third = device_graph(g, DEV, s.node_keys(), {})
    assert third.num_nodes["_N"] == 305 and third.relations[g.canonical_etypes[0]].indptr.numel() == 306


def test_data_kept_on_the_host_is_gathered_there_into_the_same_batch_on_the_device():
    """Features and edge data left on the host (they did not fit beside the structure) give the
    batch that data on the device gives, every gathered tensor on the sampler's device (on a
    GPU: gathered into pinned memory and copied over)."""
    prefetch = dict(prefetch_node_feats=["feat"], prefetch_labels=["label"], prefetch_edge_feats=["w"])
    s = DeviceSampler.from_dgl(dgl.dataloading.NeighborSampler([4, 4], **prefetch), skewed_graph())
    seeds = {"_N": torch.tensor([10, 11, 40, 41]).to(DEV)}
    batches = []
    for on_host in (({}, {}), ({"_N": ("feat",)}, {("_N", "_E", "_N"): ("w",)})):
        g = skewed_graph()  # a graph of its own: its own copy on the device
        dg = device_graph(g, DEV, s.node_keys(), s.edge_keys(), on_host)
        kept = [dg.ndata["_N"]["feat"], dg.edata[("_N", "_E", "_N")]["w"]]
        assert all(t.device == (torch.device("cpu") if on_host[0] else DEV) for t in kept)
        assert dg.ndata["_N"]["label"].device == DEV
        batches.append(s.sample(dg, node_maps(dg), seeds, torch.Generator(DEV).manual_seed(0)))
    (inputs, blocks), (inputs_h, blocks_h) = batches
    assert torch.equal(inputs["_N"], inputs_h["_N"])
    pairs = [(blocks[0].srcdata["feat"], blocks_h[0].srcdata["feat"]),
             (blocks[-1].dstdata["label"], blocks_h[-1].dstdata["label"])]
    pairs += [(a.edata["w"], b.edata["w"]) for a, b in zip(blocks, blocks_h)]
    for on_device, via_host in pairs:
        assert via_host.device == DEV and torch.equal(on_device, via_host)
    g = skewed_graph()
    assert torch.equal(blocks_h[0].srcdata["feat"].cpu(), g.ndata["feat"][inputs_h["_N"].cpu()])


def test_a_copy_plan_puts_the_smallest_data_beside_the_structure_and_the_rest_on_the_host():
    g = skewed_graph()
    g.ndata["feat"] = torch.randn(300, 16)
    keys = ({"_N": ("feat", "label")}, {("_N", "_E", "_N"): ("w",)})
    structure = structure_bytes(g) + 16 * g.num_nodes()
    sizes = {"label": 8 * 300, "w": 4 * g.num_edges(), "feat": 4 * 16 * 300}
    everything = plan_copy(g, DEV, *keys, allowed=None)
    assert (everything.structure, everything.data, everything.host_bytes) == (structure, sum(sizes.values()), 0)
    room = structure + sizes["label"] + sizes["w"]  # not feat, the largest
    plan = plan_copy(g, DEV, *keys, allowed=room)
    assert plan.on_host == ({"_N": ("feat",)}, {}) and plan.host_bytes == sizes["feat"]
    assert plan.data == room - structure and plan.names_on_host() == "'feat'"
    nothing = plan_copy(g, DEV, *keys, allowed=structure)
    assert nothing.data == 0 and nothing.host_bytes == sum(sizes.values())
    assert sorted(nothing.on_host[0]["_N"]) == ["feat", "label"] and nothing.on_host[1] == {("_N", "_E", "_N"): ("w",)}


def test_excluded_edges_never_appear_and_the_rest_fill_the_fanout():
    g = skewed_graph()
    _, _, hub_eids = g.in_edges(torch.tensor([10, 11, 12]), form="all")
    excluded = hub_eids[::3].tolist() + [0, 1, 2]
    for seed in range(5):
        _, blocks = sample(g, [-1, 30], torch.tensor([10, 11, 12, 20]), seed=seed,
                           exclude={g.canonical_etypes[0]: torch.tensor(excluded)})
        for block, k in zip(blocks, [-1, 30]):
            check_block(g, block, k, excluded=excluded)


def test_exclusion_selects_the_rth_free_edge():
    g = dgl.graph((torch.arange(6), torch.zeros(6, dtype=torch.int64)), num_nodes=6)
    dg = device_graph(g, DEV, {}, {})
    rel = dg.relations[g.canonical_etypes[0]]
    ex = Excluded(rel, torch.tensor([1, 2, 4], device=DEV))  # free positions among 0..5: 0, 3, 5
    start = torch.zeros(3, dtype=torch.int64, device=DEV)
    assert ex.count(start[:1], torch.tensor([6], device=DEV)).tolist() == [3]
    assert rel.eids[ex.select(start, torch.arange(3, device=DEV))].tolist() == [0, 3, 5]


def test_floyd_draws_distinct_offsets_below_the_degree():
    deg = torch.tensor([0, 3, 7, 8, 100, 10**6], device=DEV)
    out = floyd(deg, 7, torch.Generator(DEV).manual_seed(0)).cpu()
    for row, d in zip(out, deg.cpu().tolist()):
        if d > 7:
            assert row.unique().numel() == 7 and int(row.min()) >= 0 and int(row.max()) < d
        else:
            assert row.tolist() == list(range(7))


def floyd_sequential(deg: torch.Tensor, k: int, gen: torch.Generator) -> torch.Tensor:
    """``floyd`` a round at a time, as Floyd wrote it: the reference the one-pass draw must equal."""
    n, dev = deg.numel(), deg.device
    steps = torch.arange(k, device=dev)
    base = (deg.unsqueeze(1) - k).clamp(min=0)
    draws = (torch.rand((n, k), generator=gen, device=dev, dtype=torch.float64) * (base + steps + 1)).to(torch.int64)
    out = draws.clone()
    for j in range(1, k):
        taken = (out[:, :j] == draws[:, j:j + 1]).any(1)
        out[:, j] = torch.where(taken, base[:, 0] + j, draws[:, j])
    return out


@pytest.mark.parametrize("k", [1, 2, 5, 10, 15, 16, 33])
def test_floyd_in_one_pass_takes_what_floyds_rounds_take(k):
    """The pointer-doubling draw gives exactly the offsets of Floyd's round-by-round loop on the
    same random numbers: degrees below, at and just above ``k`` (where rounds collide most)."""
    gen = torch.Generator().manual_seed(k)
    deg = torch.cat([torch.randint(0, 3 * k + 3, (3000,), generator=gen),
                     torch.randint(k, k + 3, (3000,), generator=gen),
                     torch.tensor([0, 1, k, k + 1, 10**6])]).to(DEV)
    one_pass = floyd(deg, k, torch.Generator(DEV).manual_seed(1))
    assert torch.equal(one_pass, floyd_sequential(deg, k, torch.Generator(DEV).manual_seed(1)))
    assert ((one_pass < deg.unsqueeze(1)).sum(1) == deg.clamp(max=k)).all()


def test_a_batch_launches_as_many_ops_for_8_seeds_as_for_256_and_few_more_for_a_larger_fanout():
    """Vectorised over the batch: no op per seed, and no round of ops per draw (a fanout of 32
    adds only Floyd's pointer-doubling steps, at most 3 ops each, over a fanout of 2). On a GPU
    each op is a kernel the host launches: the host bounded the sampler on an H100."""
    g = skewed_graph()
    s = {k: DeviceSampler.from_dgl(dgl.dataloading.NeighborSampler([k, k], prefetch_node_feats=["feat"]), g)
         for k in (2, 32)}
    dg = device_graph(g, DEV, s[2].node_keys(), {})

    def ops(k, n):
        seeds = {g.ntypes[0]: torch.arange(13, 13 + n, device=DEV)}
        s[k].sample(dg, node_maps(dg), seeds, torch.Generator(DEV).manual_seed(0))  # constants made once
        with OpCounter() as counter:
            s[k].sample(dg, node_maps(dg), seeds, torch.Generator(DEV).manual_seed(1))
        return counter.kernels

    assert ops(2, 8) == ops(2, 256)
    assert ops(32, 8) == ops(32, 256)
    layers, extra_steps = 2, (31).bit_length() - (1).bit_length()
    assert ops(2, 256) < ops(32, 256) <= ops(2, 256) + layers * 3 * extra_steps


@pytest.mark.parametrize("fanouts,replace,waits", [([5, 3, 4], False, 3), ([5, 3], True, 2), ([-1, 4], False, 3)])
def test_a_layer_waits_for_the_device_once_and_a_whole_neighbourhood_once_more(fanouts, replace, waits):
    """The host reads one value set per layer (its sizes), plus the edge count of a fanout of -1
    (its slots are laid out by it): on a GPU each read is a synchronisation."""
    g = skewed_graph()
    s = DeviceSampler.from_dgl(dgl.dataloading.NeighborSampler(fanouts, replace=replace, prefetch_labels=["label"]), g)
    dg = device_graph(g, DEV, s.node_keys(), {})
    seeds = {g.ntypes[0]: torch.arange(5, 60, device=DEV)}
    s.sample(dg, node_maps(dg), seeds, torch.Generator(DEV).manual_seed(0))  # constants made once
    with OpCounter() as counter:
        s.sample(dg, node_maps(dg), seeds, torch.Generator(DEV).manual_seed(1))
    assert counter.host_reads == waits, counter.by_op


def chi_square(counts: torch.Tensor, expected: float) -> float:
    return float(((counts.double() - expected) ** 2 / expected).sum())


# 39 degrees of freedom: the 0.999 quantile of chi-square is 72.05.
CHI2_39_999 = 72.05


def _frequencies(eids: torch.Tensor, dst: torch.Tensor, deg: int, k: int) -> torch.Tensor:
    """How often each of the ``deg`` in-edges was drawn, checking each draw took ``k`` distinct ones."""
    order = torch.argsort(dst * deg + eids % deg)
    per_draw = (eids % deg)[order].view(-1, k)
    assert (per_draw[:, 1:] != per_draw[:, :-1]).all()  # without replacement: no edge twice
    return torch.bincount(eids % deg, minlength=deg)


def test_draws_are_uniform_like_dgls_and_the_test_fails_a_biased_sampler():
    """Each in-edge of a degree-40 destination, k=5, over 4000 draws (4000 copies of the
    destination, sampled at once): chosen with frequency k/deg, as with DGL's sampler on the
    same graph; first-k fails the same test."""
    deg, k, trials = 40, 5, 4000
    g = dgl.graph((torch.arange(deg).repeat(trials), torch.arange(trials).repeat_interleave(deg)), num_nodes=trials)
    dg = device_graph(g, DEV, {}, {})
    rel = dg.relations[g.canonical_etypes[0]]
    seeds = torch.arange(trials)
    ours = sample_layer(rel, seeds.to(DEV), k, False, torch.Generator(DEV).manual_seed(0))
    ours_dst = torch.arange(trials).repeat_interleave(k)
    dgl.seed(0)
    frontier = g.sample_neighbors(seeds, k)
    theirs_eid = frontier.edata["_ID"]
    expected = trials * k / deg
    ours_freq = _frequencies(ours.eid.cpu(), ours_dst, deg, k)
    theirs_freq = _frequencies(theirs_eid, g.find_edges(theirs_eid)[1], deg, k)
    assert chi_square(ours_freq, expected) < CHI2_39_999, ours_freq
    assert chi_square(theirs_freq, expected) < CHI2_39_999, theirs_freq
    first_k = _frequencies(torch.arange(k).repeat(trials), ours_dst, deg, k)
    assert chi_square(first_k, expected) > CHI2_39_999


def test_heterograph_per_relation_fanouts():
    g = dgl.heterograph({("user", "follows", "user"): (torch.randint(0, 30, (200,)), torch.randint(0, 30, (200,))),
                         ("item", "bought-by", "user"): (torch.randint(0, 20, (150,)), torch.randint(0, 30, (150,))),
                         ("user", "buys", "item"): (torch.randint(0, 30, (150,)), torch.randint(0, 20, (150,)))})
    g.nodes["user"].data["feat"] = torch.randn(30, 3)
    g.nodes["item"].data["feat"] = torch.randn(20, 3)
    fanouts = [{"follows": 2, "bought-by": 3, "buys": -1}, {"follows": 1, "bought-by": 2, "buys": 4}]
    seeds = {"user": torch.tensor([0, 5, 9]), "item": torch.tensor([1, 2])}
    inputs, blocks = sample(g, fanouts, seeds, prefetch_node_feats=["feat"])
    for block, fanout in zip(blocks, fanouts):
        for et in g.canonical_etypes:
            rel = block[et]
            s, d = rel.edges()
            src_ids, dst_ids = block.srcdata["_ID"][et[0]], block.dstdata["_ID"][et[2]]
            u, v = g.find_edges(block.edata["_ID"][et], etype=et)
            assert torch.equal(u, src_ids[s]) and torch.equal(v, dst_ids[d])
            deg = g.in_degrees(dst_ids, etype=et)
            k = fanout[et[1]]
            assert torch.equal(rel.in_degrees(), deg if k == -1 else deg.clamp(max=k))
        for nt in g.ntypes:
            n = block.dstdata["_ID"][nt].numel()
            assert torch.equal(block.srcdata["_ID"][nt][:n], block.dstdata["_ID"][nt])
    for nt in g.ntypes:
        assert torch.equal(blocks[0].srcdata["feat"][nt], g.nodes[nt].data["feat"][inputs[nt]])


def test_a_heterographs_data_left_on_the_host_is_named_with_its_type():
    g = dgl.heterograph({("user", "buys", "item"): (torch.tensor([0, 1]), torch.tensor([1, 0])),
                         ("item", "bought-by", "user"): (torch.tensor([1, 0]), torch.tensor([0, 1]))})
    g.nodes["user"].data["feat"] = torch.randn(2, 8)
    g.edges["buys"].data["w"] = torch.randn(2, 8)
    keys = ({"user": ("feat",)}, {("user", "buys", "item"): ("w",)})
    plan = plan_copy(g, DEV, *keys, allowed=structure_bytes(g) + 16 * 4)
    assert plan.names_on_host() == "'user/feat', 'buys/w'" and plan.host_bytes == 2 * 64


def test_samplers_it_cannot_reproduce_are_named():
    g = skewed_graph()

    class MySampler(dgl.dataloading.NeighborSampler):
        pass

    for sampler, name in ((MySampler([3]), "MySampler.*a custom sampler's sample_blocks"),
                          (dgl.dataloading.NeighborSampler([3], edge_dir="out"), "edge_dir='out'"),
                          (dgl.dataloading.LaborSampler([3]),
                           r"LaborSampler is not DGL's NeighborSampler \(prob=/mask= included\).*"
                           r"DGL's LaborSampler draws in its own way")):
        with pytest.raises(Unsupported, match=name):
            DeviceSampler.from_dgl(sampler, g)
    assert DeviceSampler.from_dgl(dgl.dataloading.NeighborSampler([3], prob="w"), g).prob == "w"
    full = DeviceSampler.from_dgl(dgl.dataloading.MultiLayerFullNeighborSampler(2), g)
    assert full.fanouts == [-1, -1]


def test_a_fixed_budget_counts_the_copy_an_earlier_loader_made(monkeypatch):
    """With GRAPHTRAINER_SAMPLING_BUDGET (a total), a second loader of the same graph that adds
    data must fit beside the first one's copy, not in the whole budget again."""
    from graphtrainer.data.device import graph as device_graph_module
    from graphtrainer.data.device import mode
    from graphtrainer.data.node_loader import NodeLoader

    g = skewed_graph()
    g.ndata["other"] = torch.randn(g.num_nodes(), 8)  # fits the whole budget, not what the first copy leaves
    first = NodeLoader(g, torch.arange(20), dgl.dataloading.NeighborSampler([3], prefetch_node_feats=["feat"]), 4)
    second = NodeLoader(g, torch.arange(20), dgl.dataloading.NeighborSampler([3], prefetch_node_feats=["other"]), 4)
    device_graph_module.drop_copies(g)
    need_first = device_graph_module.bytes_to_copy(g, CPU_DEVICE, {"_N": ("feat",)}, {})
    monkeypatch.setenv(mode.BUDGET_ENV, str(need_first + 1000))  # room for the first copy, not for 'other'
    assert mode.place(first, CPU_DEVICE, "device", announce=False) == "device"
    batches = mode.device_batches(second, CPU_DEVICE, host_data=True)
    assert "'other'" in batches.host_note  # kept on the host: it does not fit beside the first copy
