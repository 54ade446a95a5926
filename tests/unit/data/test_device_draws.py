"""What the device sampler's draws must be beyond their structure, each test failing a sampler
biased in a way the structure and marginal tests cannot see: whole k-subsets equally likely
(both draw methods, as DGL's), draws with replacement uniform and independent, exclusion drawing
evenly among the edges left, and each batch drawn from its own generator keyed by
``(seed, rank, epoch, batch)``, whatever came before it in the epoch. On the CPU here; on a GPU
tests/integration/test_gpu.py runs the draws again with ``GRAPHTRAINER_SAMPLER_DEVICE=cuda``."""
from __future__ import annotations

import itertools
import os

import pytest
import torch
from scipy.stats import chi2

import graphtrainer  # noqa: F401  (DGL's compatibility layer first)
import dgl

from graphtrainer.data.device import mode
from graphtrainer.data.device.graph import device_graph
from graphtrainer.data.device.neighbors import Excluded, sample_layer
from graphtrainer.data.edge_loader import EdgeLoader
from graphtrainer.data.node_loader import NodeLoader, default_sampler
from graphtrainer.data.workers import batch_seed

from link_tasks import symmetric_graph
from test_device_sampler import skewed_graph

CPU = torch.device("cpu")
DEV = torch.device(os.environ.get("GRAPHTRAINER_SAMPLER_DEVICE", "cpu"))
P = 0.999  # each test's chi-square quantile: a correct sampler fails it 1 time in 1000 seeds


def _copies(deg: int, trials: int) -> dgl.DGLGraph:
    """``trials`` destinations, each with in-edges from sources ``0..deg-1`` (edge ``e``: offset ``e % deg``)."""
    return dgl.graph((torch.arange(deg).repeat(trials), torch.arange(deg, deg + trials).repeat_interleave(deg)))


def _draw(g, k, replace=False, method="floyd", excluded=None, seed=0):
    """Each destination's drawn offsets, ``[trials, k]`` (sorted within a row)."""
    rel = device_graph(g, DEV, {}, {}).relations[g.canonical_etypes[0]]
    deg = int(rel.max_degree)
    seeds = torch.unique(g.edges()[1]).to(DEV)
    ex = None if excluded is None else Excluded(rel, excluded.to(DEV))
    out = sample_layer(rel, seeds, k, replace, torch.Generator(DEV).manual_seed(seed), ex, method)
    eid = out.eid if out.valid is None else out.eid[out.valid]
    return (eid.cpu() % deg).view(seeds.numel(), k).sort(1).values


def _by_destination(g, eids: torch.Tensor) -> torch.Tensor:
    """DGL's sampled edge ids grouped by destination (one row per destination after ``view``)."""
    return eids[torch.argsort(g.find_edges(eids)[1], stable=True)]


def _chi2(counts: torch.Tensor) -> float:
    expected = counts.double().mean()
    return float(((counts.double() - expected) ** 2 / expected).sum())


def _subset_counts(rows: torch.Tensor, deg: int) -> torch.Tensor:
    """How often each ``k``-subset of ``0..deg-1`` came out (rows sorted, distinct)."""
    k = rows.shape[1]
    index = {s: i for i, s in enumerate(itertools.combinations(range(deg), k))}
    return torch.bincount(torch.tensor([index[tuple(r)] for r in rows.tolist()]), minlength=len(index))


@pytest.mark.parametrize("method", ["floyd", "sort"])
def test_every_k_subset_is_equally_likely_as_with_dgl(method):
    """3 of 6: the 20 subsets equally often, DGL's as well; a sampler with uniform marginals and
    distinct edges (a random window of 3 consecutive offsets) fails: only the marginals were tested."""
    deg, k, trials = 6, 3, 6000
    limit = chi2.ppf(P, 19)
    g = _copies(deg, trials)
    ours = _draw(g, k, method=method)
    assert _chi2(_subset_counts(ours, deg)) < limit
    dgl.seed(0)
    theirs = _by_destination(g, g.sample_neighbors(torch.arange(deg, deg + trials), k).edata["_ID"])
    assert _chi2(_subset_counts((theirs % deg).view(trials, k).sort(1).values, deg)) < limit
    start = torch.randint(0, deg, (trials, 1), generator=torch.Generator().manual_seed(1))
    window = ((start + torch.arange(k)) % deg).sort(1).values
    assert (window[:, 1:] != window[:, :-1]).all()  # distinct, and each offset drawn k/deg of the time
    assert _chi2(torch.bincount(window.flatten(), minlength=deg)) < chi2.ppf(P, deg - 1)
    assert _chi2(_subset_counts(window, deg)) > limit


def test_draws_with_replacement_are_uniform_and_independent_as_with_dgl():
    """5 of 40 with replacement: every edge k/deg of the time and rows with a repeat as often as
    independent draws give them (the birthday rate), as DGL's; one never drawing the last edge fails."""
    deg, k, trials = 40, 5, 4000
    limit = chi2.ppf(P, deg - 1)
    g = _copies(deg, trials)
    dgl.seed(0)
    theirs = _by_destination(g, g.sample_neighbors(torch.arange(deg, deg + trials), k, replace=True).edata["_ID"])
    no_repeat = torch.prod(1 - torch.arange(k, dtype=torch.float64) / deg)  # P(k independent draws distinct)
    mean, sd = trials * (1 - no_repeat), (trials * no_repeat * (1 - no_repeat)).sqrt()
    for rows in (_draw(g, k, replace=True), (theirs % deg).view(trials, k).sort(1).values):
        assert _chi2(torch.bincount(rows.flatten(), minlength=deg)) < limit
        repeats = int((rows[:, 1:] == rows[:, :-1]).any(1).sum())
        assert abs(repeats - mean) < 4.5 * sd, (repeats, float(mean))
    gen = torch.Generator().manual_seed(1)
    short = (torch.rand(trials * k, generator=gen) * (deg - 1)).long()  # the rounding slip: never deg - 1
    assert _chi2(torch.bincount(short, minlength=deg)) > limit


def test_exclusion_draws_evenly_among_the_edges_left():
    """5 of the 30 edges left when 10 of 40 are excluded (a different 10 per destination): each
    left edge k/30 of the time, no excluded one, 5 distinct per destination."""
    deg, k, trials = 40, 5, 4000
    g = _copies(deg, trials)
    gen = torch.Generator().manual_seed(2)
    out_offsets = torch.rand(trials, deg, generator=gen).argsort(1)[:, :10]
    excluded = (out_offsets + deg * torch.arange(trials).unsqueeze(1)).flatten()  # edge ids: row-major
    rows = _draw(g, k, excluded=excluded)
    assert (rows[:, 1:] != rows[:, :-1]).all()
    banned = torch.zeros(trials, deg, dtype=torch.bool)
    banned.scatter_(1, out_offsets, True)
    assert not banned.gather(1, rows).any()
    # Each row's free edges renumbered 0..29 in offset order: their counts must be even.
    rank_among_free = torch.cumsum(~banned, 1) - 1
    assert _chi2(torch.bincount(rank_among_free.gather(1, rows).flatten(), minlength=deg - 10)) < chi2.ppf(P, 29)


def _signatures(batches) -> list:
    """Each batch's sampled edge ids, block by block."""
    return [torch.cat([b.edata["_ID"] for b in batch[-1]]).cpu() for batch in batches]


def _node_batches():
    g = skewed_graph()
    loader = NodeLoader(g, torch.arange(g.num_nodes()), dgl.dataloading.NeighborSampler([3, 3]), 4)
    return g, mode.device_batches(loader, DEV)


def test_each_node_batch_draws_from_its_own_generator_keyed_by_seed_rank_epoch_and_index():
    """Batch 1 of hubs samples the same edges after a batch of isolated nodes as after a batch of
    other nodes (one generator per epoch would not), the sampler's draw under the key
    ``batch_seed(seed, rank, epoch, 1)``, and other edges when any of the four changes."""
    g, batches = _node_batches()
    hubs = torch.tensor([10, 11, 12, 40])
    after_isolated = _signatures(batches.iterate(torch.cat([torch.arange(4), hubs]), 5, 1, 2))
    after_others = _signatures(batches.iterate(torch.cat([torch.arange(50, 54), hubs]), 5, 1, 2))
    assert not torch.equal(after_isolated[0], after_others[0])
    assert torch.equal(after_isolated[1], after_others[1])
    from graphtrainer.data.device.batches import node_maps

    gen = torch.Generator(DEV).manual_seed(batch_seed(5, 1, 2, 1))
    _, alone = batches.sampler.sample(batches.graph, node_maps(batches.graph), {"_N": hubs.to(DEV)}, gen)
    assert torch.equal(torch.cat([b.edata["_ID"] for b in alone]).cpu(), after_isolated[1])
    for key in ((6, 1, 2), (5, 0, 2), (5, 1, 3)):  # seed, rank, epoch: each changes the draw
        other = _signatures(batches.iterate(torch.cat([torch.arange(4), hubs]), *key))
        assert not torch.equal(other[1], after_isolated[1]), key


def test_each_edge_batch_draws_from_its_own_generator():
    g, _ = symmetric_graph()
    loader = EdgeLoader(g, torch.arange(600), [4, 4], 8, negatives=None, seed=1)
    batches = mode.device_batches(loader, DEV)
    second = torch.arange(100, 108)
    one = _signatures(batches.iterate(torch.cat([torch.arange(8), second]), 5, 1, 2))
    two = _signatures(batches.iterate(torch.cat([torch.arange(200, 208), second]), 5, 1, 2))
    assert not torch.equal(one[0], two[0]) and torch.equal(one[1], two[1])
    for key in ((6, 1, 2), (5, 0, 2), (5, 1, 3)):
        assert not torch.equal(_signatures(batches.iterate(torch.cat([torch.arange(8), second]), *key))[1], one[1])


@pytest.mark.parametrize("drop_last,even", [(False, "pad"), (True, "drop"), (False, "none")])
def test_device_batches_cut_each_ranks_share_as_the_cpu_batches_do(drop_last, even):
    """37 ids over 2 ranks in batches of 5: the device path yields ``len(loader)`` batches of the
    seeds DGL's path yields (``len`` decides whether the epoch needs Join)."""
    g = skewed_graph()
    for rank in (0, 1):
        loaders = [NodeLoader(g, torch.arange(13, 50), default_sampler(g, [2]), 5, drop_last=drop_last, even=even)
                   for _ in range(2)]
        for loader in loaders:
            loader.split_place = lambda rank=rank: (rank, 2)
        assert mode.place(loaders[1], CPU, "device", announce=False) == "device"
        cpu, dev = ([seeds for _, seeds, _ in loader] for loader in loaders)
        assert len(dev) == len(loaders[1]) == len(cpu)
        assert all(torch.equal(a, b) for a, b in zip(cpu, dev))


def test_a_heterograph_node_loader_on_the_device_keeps_the_cpu_loaders_batches_and_order():
    """Typed seeds: the same ``{type: ids}`` per batch as DGL's path (each type permuted and split),
    blocks ending at them with each type's features, and for evaluation every id once, in order."""
    gen = torch.Generator().manual_seed(3)
    g = dgl.heterograph({("user", "follows", "user"): (torch.randint(0, 30, (200,), generator=gen),
                                                       torch.randint(0, 30, (200,), generator=gen)),
                         ("item", "bought-by", "user"): (torch.randint(0, 20, (150,), generator=gen),
                                                         torch.randint(0, 30, (150,), generator=gen)),
                         ("user", "buys", "item"): (torch.randint(0, 30, (150,), generator=gen),
                                                    torch.randint(0, 20, (150,), generator=gen))})
    for nt, n in (("user", 30), ("item", 20)):
        g.nodes[nt].data["feat"] = torch.randn(n, 3, generator=gen)
    ids = {"user": torch.arange(3, 30, 2), "item": torch.arange(0, 20, 3)}
    loaders = [NodeLoader(g, ids, default_sampler(g, [2, 2]), 5) for _ in range(2)]
    assert mode.place(loaders[1], CPU, "device", announce=False) == "device"
    for evaluation in (False, True):
        if evaluation:
            loaders = [loader.for_evaluation() for loader in loaders]
        cpu, dev = list(loaders[0]), list(loaders[1])
        assert len(cpu) == len(dev) == len(loaders[1])
        for (_, seeds_c, _), (inputs, seeds, blocks) in zip(cpu, dev):
            assert seeds.keys() == seeds_c.keys() and all(torch.equal(seeds[nt], seeds_c[nt]) for nt in seeds)
            for nt in seeds:
                assert torch.equal(blocks[-1].dstdata["_ID"][nt], seeds[nt])
                assert torch.equal(blocks[0].srcdata["feat"][nt], g.nodes[nt].data["feat"][inputs[nt]])
        if evaluation:
            for nt in ids:
                assert torch.equal(torch.cat([seeds[nt] for _, seeds, _ in dev]), ids[nt])
