"""The device sampler's weighted (``NeighborSampler(prob=...)``) and masked (``mask=...``) draws
against DGL's: whole k-subsets as likely as DGL's successive sampling makes them (checked against
the exact probabilities and against DGL's own draws on the same graph), draws with replacement
proportional to weight and independent, masks uniform over the edges they keep, exclusion and
per-relation weights. Each distribution test also fails a sampler that gets the weights wrong.
On a GPU tests/integration/test_gpu.py runs this file again with ``GRAPHTRAINER_SAMPLER_DEVICE=cuda``."""
from __future__ import annotations

import itertools
import os

import torch
from scipy.stats import chi2

import graphtrainer  # noqa: F401  (DGL's compatibility layer first)
import dgl

from graphtrainer.data.device.graph import device_graph
from graphtrainer.data.device.neighbors import Excluded
from graphtrainer.data.device.weighted import sample_weighted

DEV = torch.device(os.environ.get("GRAPHTRAINER_SAMPLER_DEVICE", "cpu"))
P = 0.999  # each test's chi-square quantile: a correct sampler fails it 1 time in 1000 seeds


def _copies(weights: torch.Tensor, trials: int) -> dgl.DGLGraph:
    """``trials`` destinations, each with in-edges from sources ``0..d-1`` weighted ``weights``
    (edge ``e``: offset ``e % d``)."""
    d = weights.numel()
    g = dgl.graph((torch.arange(d).repeat(trials), torch.arange(d, d + trials).repeat_interleave(d)))
    g.edata["w"] = weights.repeat(trials)
    return g


def _ours(g, k, replace=False, excluded=None, seed=0, key="w"):
    """Our sampled offsets per destination, ``[trials, k]`` (in draw-slot order), and the counts."""
    rel = device_graph(g, DEV, {}, {}, weights=key).relations[g.canonical_etypes[0]]
    d = int(rel.max_degree)
    seeds = torch.arange(d, g.num_nodes(), device=DEV)
    ex = None if excluded is None else Excluded(rel, excluded.to(DEV))
    out = sample_weighted(rel, seeds, k, replace, torch.Generator(DEV).manual_seed(seed), rel.weights[key], ex)
    assert out.valid is None or bool(out.valid.all()), "every destination here has k edges to draw"
    return (out.eid.cpu() % d).view(seeds.numel(), k), out.counts.cpu()


def _dgls(g, k, replace=False, seed=0, key="w"):
    """DGL's sampled offsets per destination, ``[trials, k]``."""
    d = int(g.in_degrees().max())
    dgl.seed(seed)
    eids = g.sample_neighbors(torch.arange(d, g.num_nodes()), k, prob=key, replace=replace).edata["_ID"]
    eids = eids[torch.argsort(g.find_edges(eids)[1], stable=True)]
    return (eids % d).view(-1, k)


def _successive(weights: torch.Tensor, k: int) -> dict:
    """Exact probability of each k-subset (sorted tuple) drawn one edge at a time, each draw
    proportional to weight among the edges not drawn yet (DGL's draw without replacement)."""
    out: dict = {}
    positive = [i for i in range(weights.numel()) if weights[i] > 0]
    for seq in itertools.permutations(positive, k):
        p, left = 1.0, float(weights.sum())
        for i in seq:
            p *= float(weights[i]) / left
            left -= float(weights[i])
        key = tuple(sorted(seq))
        out[key] = out.get(key, 0.0) + p
    return out


def _counts(rows: torch.Tensor, cells: list) -> torch.Tensor:
    index = {c: i for i, c in enumerate(cells)}
    return torch.bincount(torch.tensor([index[tuple(r)] for r in rows.sort(1).values.tolist()]),
                          minlength=len(cells)).double()


def _fit(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson's chi-square of ``counts`` against probabilities ``probs``."""
    expected = counts.sum() * probs
    return float(((counts - expected) ** 2 / expected).sum())


def _same(a: torch.Tensor, b: torch.Tensor) -> float:
    """Two-sample (homogeneity) chi-square of two count vectors over the same cells."""
    total = a + b
    ea, eb = total * a.sum() / total.sum(), total * b.sum() / total.sum()
    keep = total > 0
    return float((((a - ea) ** 2 / ea)[keep]).sum() + (((b - eb) ** 2 / eb)[keep]).sum())


def test_k_subsets_follow_successive_sampling_by_weight_as_dgls_do():
    """3 of 6 positive edges (and one of weight 0, never drawn): the 20 subsets as often as
    successive sampling gives them, DGL's too, ours and DGL's alike (two-sample test); keys
    ``u * w`` (a common mistake: proportional-looking, wrong) and a uniform draw both fail."""
    weights = torch.tensor([1.0, 0.0, 1.0, 2.0, 3.0, 5.0, 8.0])
    k, trials = 3, 6000
    exact = _successive(weights, k)
    cells = sorted(exact)
    probs = torch.tensor([exact[c] for c in cells], dtype=torch.float64)
    limit = chi2.ppf(P, len(cells) - 1)
    g = _copies(weights, trials)
    ours, counts = _ours(g, k)
    assert not (ours == 1).any() and bool((counts == k).all())
    assert (ours.sort(1).values.diff(dim=1) > 0).all()  # distinct within a destination
    theirs = _dgls(g, k)
    mine, dgls = _counts(ours, cells), _counts(theirs, cells)
    assert _fit(mine, probs) < limit
    assert _fit(dgls, probs) < limit
    assert _same(mine, dgls) < limit
    u = torch.rand((trials, weights.numel()), generator=torch.Generator().manual_seed(1))
    linear = (u * weights).topk(k, dim=1).indices  # weight 0 never in the top 3 of 6 positive
    assert _fit(_counts(linear, cells), probs) > limit
    uniform = torch.where(weights > 0, u, -1.0).topk(k, dim=1).indices
    assert _fit(_counts(uniform, cells), probs) > limit


def test_fewer_positive_edges_than_the_fanout_are_all_taken():
    weights = torch.tensor([0.0, 2.0, 0.0, 0.5, 0.0])
    g = _copies(weights, 50)
    rel = device_graph(g, DEV, {}, {}, weights="w").relations[g.canonical_etypes[0]]
    out = sample_weighted(rel, torch.arange(5, 55, device=DEV), 4, False, torch.Generator(DEV).manual_seed(0),
                          rel.weights["w"])
    assert torch.equal(out.counts.cpu(), torch.full((50,), 2))
    picked = (out.eid[out.valid].cpu() % 5).view(50, 2).sort(1).values
    assert bool((picked == torch.tensor([1, 3])).all())


def test_draws_with_replacement_are_proportional_to_weight_and_independent():
    """4 draws per destination from weights 1..4, 6 (and a 0): each draw's edge with probability
    w / sum (ours and DGL's), ordered pairs of draws as the product (independent); a draw
    uniform over the positive edges fails."""
    weights = torch.tensor([1.0, 2.0, 0.0, 3.0, 4.0, 6.0])
    k, trials = 4, 3000
    positive = [i for i in range(weights.numel()) if weights[i] > 0]
    probs = weights[positive].double() / weights.sum()
    limit = chi2.ppf(P, len(positive) - 1)
    g = _copies(weights, trials)
    ours, counts = _ours(g, k, replace=True)
    assert not (ours == 2).any() and bool((counts == k).all())

    def per_edge(rows):
        return torch.bincount(rows.reshape(-1), minlength=weights.numel())[positive].double()

    assert _fit(per_edge(ours), probs) < limit
    assert _fit(per_edge(_dgls(g, k, replace=True)), probs) < limit
    pairs = [(a, b) for a in positive for b in positive]
    index = {p: i for i, p in enumerate(pairs)}
    seen = torch.bincount(torch.tensor([index[(a, b)] for a, b in ours[:, :2].tolist()]), minlength=len(pairs))
    joint = torch.tensor([float(weights[a] * weights[b]) for a, b in pairs], dtype=torch.float64) / weights.sum() ** 2
    assert _fit(seen.double(), joint) < chi2.ppf(P, len(pairs) - 1)
    uniform = torch.tensor(positive)[torch.randint(0, len(positive), (trials, k),
                                                   generator=torch.Generator().manual_seed(1))]
    assert _fit(per_edge(uniform), probs) > limit


def test_a_mask_draws_uniformly_among_the_edges_it_keeps_as_dgls_mask():
    mask = torch.tensor([True, False, True, True, False, True, True])
    k, trials = 3, 4000
    g = _copies(mask, trials)
    cells = list(itertools.combinations([i for i in range(7) if mask[i]], k))
    probs = torch.full((len(cells),), 1.0 / len(cells), dtype=torch.float64)
    limit = chi2.ppf(P, len(cells) - 1)
    ours, counts = _ours(g, k)
    assert bool((counts == k).all())
    assert _fit(_counts(ours, cells), probs) < limit  # (a masked edge has no cell: _counts would raise)
    assert _fit(_counts(_dgls(g, k), cells), probs) < limit
    assert _same(_counts(ours, cells), _counts(_dgls(g, k), cells)) < limit


def test_excluded_edges_are_taken_out_before_the_weighted_draw():
    """Excluding the heaviest edge and one other of every destination: 3 drawn from the 4
    positive edges left, by successive sampling over their weights (as the uniform draw, the
    device sampler takes exclusions out first; DGL drops them after its draw)."""
    weights = torch.tensor([1.0, 1.0, 2.0, 3.0, 5.0, 8.0, 0.0])
    k, trials, d = 3, 4000, 7
    g = _copies(weights, trials)
    excluded = torch.cat([torch.arange(trials) * d + 5, torch.arange(trials) * d + 1])
    ours, counts = _ours(g, k, excluded=excluded)
    assert bool((counts == k).all()) and not ((ours == 5) | (ours == 1) | (ours == 6)).any()
    left = weights.clone()
    left[[1, 5]] = 0
    exact = _successive(left, k)
    cells = sorted(exact)
    probs = torch.tensor([exact[c] for c in cells], dtype=torch.float64)
    assert _fit(_counts(ours, cells), probs) < chi2.ppf(P, len(cells) - 1)


def test_heterograph_relations_each_draw_by_their_own_weights_or_uniformly_without_them():
    """Per destination: ``clicks`` edges weighted 1 and 9 (and a 0), ``buys`` edges without the key
    (uniform, as DGL draws a relation the key is missing from); one of each per destination."""
    trials = 3000
    dst = torch.arange(trials)
    g = dgl.heterograph({("user", "clicks", "item"): (torch.tensor([0, 1, 2]).repeat(trials),
                                                      dst.repeat_interleave(3)),
                         ("user", "buys", "item"): (torch.tensor([0, 1]).repeat(trials), dst.repeat_interleave(2))},
                        num_nodes_dict={"user": 3, "item": trials})
    g.edges["clicks"].data["w"] = torch.tensor([1.0, 9.0, 0.0]).repeat(trials)
    from graphtrainer.data.device.batches import node_maps
    from graphtrainer.data.device.sampler import DeviceSampler

    s = DeviceSampler.from_dgl(dgl.dataloading.NeighborSampler([1], prob="w"), g)
    dg = device_graph(g, DEV, s.node_keys(), s.edge_keys(), weights=s.prob)
    assert set(r for r, rel in dg.relations.items() if rel.weights) == {("user", "clicks", "item")}
    seeds = {"user": torch.empty(0, dtype=torch.int64, device=DEV), "item": dst.to(DEV)}
    _, blocks = s.sample(dg, node_maps(dg), seeds, torch.Generator(DEV).manual_seed(0))
    block = blocks[0].to("cpu")
    clicks = block.edge_store["_ID"][("user", "clicks", "item")] % 3
    buys = block.edge_store["_ID"][("user", "buys", "item")] % 2
    assert clicks.numel() == buys.numel() == trials and not (clicks == 2).any()
    for freq, p in (((clicks == 1).double().mean(), 0.9), ((buys == 1).double().mean(), 0.5)):
        assert abs(float(freq) - p) < 4 * (p * (1 - p) / trials) ** 0.5, (float(freq), p)

