"""The rest of LinkNeighborLoader's negative sampling in PyG link batches: a fractional binary
amount (``ceil(p * amount)`` per batch, PyG's count), PyG's ``NegativeSampling`` (object, dict,
tuple) with ``src_weight``/``dst_weight``, and the seeds numbered as PyG's (its ``unique`` of
the pairs' ends: by node id) with the pairs in the batch's order; on DGL's CPU sampling and on
the device sampler (run here on the CPU), which give the same link fields."""
from __future__ import annotations

import math

import graphtrainer  # noqa: F401  (first: its DGL compatibility layer must precede `import dgl`)
import dgl
import pytest
import torch
from scipy.stats import chisquare
from torch_geometric.sampler import NegativeSampling

from graphtrainer import GraphTask
from graphtrainer.data.edge_loader import EdgeLoader
from graphtrainer.data.pyg_loader import PygLoader

from link_tasks import rand_link_graph
from pyg_graphs import placed

SAMPLING = ["cpu", "device"]
LINK_FIELDS = ("input_id", "edge_label_index", "edge_label", "src_index", "dst_pos_index", "dst_neg_index")


def _loader(g, sampling, edges=None, neg_sampling=None, batch_size=32, epoch=0, **kwargs):
    edges = torch.arange(g.num_edges()) if edges is None else edges
    inner = EdgeLoader(g, edges, [2], batch_size, seed=kwargs.pop("seed", 5), **kwargs)
    loader = placed(PygLoader(inner, neg_sampling=neg_sampling), sampling)
    loader.set_epoch(epoch)
    return loader


def _negative_ends(data):
    """The graph's node ids of a binary batch's negative pairs, ``[2, n]``."""
    return data.n_id[data.edge_label_index[:, data.batch_size:]]


@pytest.mark.parametrize("sampling", SAMPLING)
@pytest.mark.parametrize("amount", [0.5, 1.5, 0.3, 2.25])
@pytest.mark.parametrize("given", ["negatives", "object", "dict"])
def test_a_fractional_binary_amount_draws_pygs_count_per_batch(sampling, amount, given):
    """PyG's binary amount may be a float: ceil(p * amount) negatives per batch of p positives."""
    g = rand_link_graph(num_nodes=90, num_edges=150)
    how = {"negatives": dict(negatives=amount, neg_sampling="binary"),
           "object": dict(neg_sampling=NegativeSampling("binary", amount)),
           "dict": dict(neg_sampling={"mode": "binary", "amount": amount})}[given]
    sizes, drawn = set(), []
    for data in _loader(g, sampling, batch_size=20, **how):  # 300 edges: 15 batches of 20
        p = data.batch_size
        neg = math.ceil(p * amount)
        assert data.edge_label_index.shape == (2, p + neg)
        assert torch.equal(data.edge_label, torch.cat([torch.ones(p), torch.zeros(neg)]))
        sizes.add(p)
        drawn.append(_negative_ends(data))
    assert sizes == {20}
    ends = torch.cat(drawn, dim=1)
    assert ends.shape[1] == 15 * math.ceil(20 * amount)
    assert int(ends.unique().numel()) > 0.6 * 90  # drawn over the nodes, not a few


def test_a_fractional_amount_is_the_same_on_both_paths_and_reproducible():
    g = rand_link_graph(num_nodes=80, num_edges=200)

    def ends(sampling, epoch):
        return [_negative_ends(d) for d in _loader(g, sampling, negatives=0.7, shuffle=False, epoch=epoch)]

    first = ends("cpu", 0)
    assert all(torch.equal(a, b) for a, b in zip(first, ends("device", 0)))
    assert all(torch.equal(a, b) for a, b in zip(first, ends("cpu", 0)))
    assert not all(torch.equal(a, b) for a, b in zip(first, ends("cpu", 1)))


@pytest.mark.parametrize("spec", [NegativeSampling("binary", amount=2), {"mode": "binary", "amount": 2},
                                  ("binary", 2)])
def test_pygs_negative_sampling_forms_are_the_same_as_negatives_k(spec):
    """LinkNeighborLoader takes NegativeSampling, a dict or a tuple of its fields: here too, giving
    the batches of negatives=2, neg_sampling='binary' (one hash per seed, epoch and edge)."""
    g = rand_link_graph(num_nodes=70, num_edges=120)
    task = GraphTask()
    task.graph = g
    eids = torch.arange(100)
    got = list(task.edge_dataloader(eids, [2], 16, batch_format="pyg", neg_sampling=spec, shuffle=False))
    want = list(task.edge_dataloader(eids, [2], 16, batch_format="pyg", negatives=2, shuffle=False))
    assert len(got) == len(want) == 7
    for a, b in zip(got, want):
        assert a.edge_label_index.shape == (2, 3 * a.batch_size)
        assert torch.equal(_negative_ends(a), _negative_ends(b)) and torch.equal(a.input_id, b.input_id)
    triplet = next(iter(task.edge_dataloader(eids, [2], 16, batch_format="pyg",
                                             neg_sampling=NegativeSampling("triplet", amount=3))))
    assert triplet.dst_neg_index.shape == (16, 3) and "edge_label" not in triplet


def _weights(n):
    """Destinations: nothing from the first third, then 1, 2, 3, ...; sources: 0 at every 4th node, else 1-3."""
    dst = torch.cat([torch.zeros(n // 3), torch.arange(1, n - n // 3 + 1)]).double()
    src = (torch.arange(n) % 4).float()
    return src, dst


def _fits(counts, weight):
    """Drawn counts against ``weight``: none where it is 0, and a chi-square fit elsewhere."""
    zero = weight == 0
    assert int(counts[zero].sum()) == 0
    expected = weight[~zero].double() / weight.sum() * counts.sum()
    return chisquare(counts[~zero].double().numpy(), expected.numpy()).pvalue > 1e-3


@pytest.mark.parametrize("sampling", SAMPLING)
def test_binary_negatives_follow_src_weight_and_dst_weight(sampling):
    """PyG's src_weight/dst_weight: each end drawn in proportion to its node's weight (need not
    sum to 1), a node of weight 0 never."""
    n = 60
    g = rand_link_graph(num_nodes=n, num_edges=200)
    src_w, dst_w = _weights(n)
    spec = NegativeSampling("binary", amount=2, src_weight=src_w, dst_weight=dst_w)
    sources, dests = [], []
    for epoch in range(4):
        for data in _loader(g, sampling, neg_sampling=spec, epoch=epoch):
            ends = _negative_ends(data)
            sources.append(ends[0])
            dests.append(ends[1])
    src, dst = torch.cat(sources), torch.cat(dests)
    assert src.numel() == 4 * 400 * 2
    assert _fits(torch.bincount(src, minlength=n), src_w)
    assert _fits(torch.bincount(dst, minlength=n), dst_w)


@pytest.mark.parametrize("sampling", SAMPLING)
def test_triplet_negatives_follow_dst_weight(sampling):
    n = 60
    g = rand_link_graph(num_nodes=n, num_edges=200)
    _, dst_w = _weights(n)
    spec = {"mode": "triplet", "amount": 3, "dst_weight": dst_w}
    drawn = []
    for epoch in range(3):
        for data in _loader(g, sampling, neg_sampling=spec, epoch=epoch):
            assert data.dst_neg_index.shape == (data.batch_size, 3)
            assert torch.equal(data.n_id[data.src_index], g.find_edges(data.input_id)[0])  # the source kept
            drawn.append(data.n_id[data.dst_neg_index].reshape(-1))
    assert _fits(torch.bincount(torch.cat(drawn), minlength=n), dst_w)


def test_weighted_negatives_are_the_same_on_both_paths_and_reproducible():
    g = rand_link_graph(num_nodes=50, num_edges=150)
    src_w, dst_w = _weights(50)
    spec = {"mode": "binary", "amount": 1.5, "src_weight": src_w, "dst_weight": dst_w}

    def ends(sampling, epoch, seed=5):
        return [_negative_ends(d) for d in _loader(g, sampling, neg_sampling=spec, shuffle=False, epoch=epoch,
                                                    seed=seed)]

    first = ends("cpu", 0)
    assert all(torch.equal(a, b) for a, b in zip(first, ends("device", 0)))
    assert all(torch.equal(a, b) for a, b in zip(first, ends("cpu", 0)))
    assert not all(torch.equal(a, b) for a, b in zip(first, ends("cpu", 1)))
    assert not all(torch.equal(a, b) for a, b in zip(first, ends("cpu", 0, seed=6)))


def _pyg_numbering(data, mode):
    """What PyG's edge_sample (disjoint=False) gives for the batch's pairs: the seeds are the
    unique ends (sorted node ids), and each pair's ends are positions among them, pairs in order."""
    s = data.num_sampled_nodes[0]
    seeds = data.n_id[:s]
    if mode == "binary":
        ends = data.n_id[data.edge_label_index]
        index = data.edge_label_index
    else:
        ends = data.n_id[torch.cat([data.src_index, data.dst_pos_index, data.dst_neg_index.reshape(-1)])]
        index = torch.cat([data.src_index, data.dst_pos_index, data.dst_neg_index.reshape(-1)])
    unique, inverse = ends.reshape(-1).unique(return_inverse=True)
    return torch.equal(seeds, unique) and torch.equal(index.reshape(-1), inverse)


@pytest.mark.parametrize("mode", ["binary", "triplet"])
@pytest.mark.parametrize("pairs", [False, True])
def test_link_seeds_are_numbered_as_pygs_and_pairs_keep_the_batch_order(mode, pairs):
    """PyG takes a batch's pairs in the loader's order (input_id, edge_label_index as given) and
    numbers the seeds by node id (torch.unique of the ends); DGL's compaction numbers them as met.
    On both paths (the device sampler's compaction sorts already)."""
    g = rand_link_graph(num_nodes=100, num_edges=300)
    gen = torch.Generator().manual_seed(4)
    edges = (torch.randint(0, 100, (120,), generator=gen), torch.randint(0, 100, (120,), generator=gen)) if pairs \
        else torch.randperm(600, generator=gen)[:200]
    for sampling in SAMPLING:
        loader = _loader(g, sampling, edges=edges, negatives=2, neg_sampling=mode, batch_size=24, shuffle=True)
        batches = loader.local_batches()
        for want, data in zip(batches, loader):
            assert torch.equal(data.input_id, want)  # the batch's order, as PyG's input_id
            assert _pyg_numbering(data, mode), sampling
        assert len(batches) == len(list(loader))


@pytest.mark.parametrize("mode", ["binary", "triplet"])
def test_link_fields_are_the_same_on_the_cpu_and_the_device(mode):
    """The seeds, pairs and labels do not depend on the sampler (the neighbours do)."""
    g = rand_link_graph(num_nodes=100, num_edges=300)
    label = torch.arange(600) % 3 if mode == "binary" else None
    runs = []
    for sampling in SAMPLING:
        inner = EdgeLoader(g, torch.arange(600), [3], 40, seed=2, negatives=2)
        loader = placed(PygLoader(inner, neg_sampling=mode, edge_label=label), sampling)
        runs.append(list(loader))
    for a, b in zip(*runs):
        s = a.num_sampled_nodes[0]
        assert s == b.num_sampled_nodes[0] and torch.equal(a.n_id[:s], b.n_id[:s])
        for field in LINK_FIELDS:
            assert (field in a) == (field in b)
            if field in a:
                assert torch.equal(a[field], b[field]), field


def test_negative_sampling_that_does_not_fit_is_refused_naming_the_fix():
    g = rand_link_graph(num_nodes=60, num_edges=100)
    task = GraphTask()
    task.graph = g
    eids = torch.arange(50)

    def make(**kwargs):
        return task.edge_dataloader(eids, [2], 8, batch_format="pyg", **kwargs)

    with pytest.raises(ValueError, match=r"'triplet' draws a whole number.*got 1\.5.*neg_sampling='binary'"):
        make(negatives=1.5, neg_sampling="triplet")
    with pytest.raises(ValueError, match=r"'triplet' draws a whole number.*got 0\.5"):
        make(neg_sampling={"mode": "triplet", "amount": 0.5})
    for bad in (0, -1.0, float("nan"), True):
        with pytest.raises(ValueError, match=r"neg_sampling amount=.*positive float for PyG's binary ratio"):
            make(neg_sampling={"mode": "binary", "amount": bad})
    with pytest.raises(ValueError, match=r"negatives=0\.0: give k.*a float is PyG's binary ratio"):
        make(negatives=0.0)
    with pytest.raises(ValueError, match=r"given negatives=None \(none\). Fix: leave negatives= at its default"):
        make(negatives=None, neg_sampling=NegativeSampling("binary", 2))
    with pytest.raises(ValueError, match=r"negatives=3 and neg_sampling with amount=2 disagree"):
        make(negatives=3, neg_sampling=NegativeSampling("binary", 2))
    with pytest.raises(ValueError, match=r"its own sampler, negatives=PerSourceUniform\(\.\.\.\). Fix: drop one"):
        make(negatives=dgl.dataloading.negative_sampler.Uniform(2), neg_sampling={"mode": "binary"})
    with pytest.raises(ValueError, match=r"NegativeSampling fields .*unknown: \['ratio'\]"):
        make(neg_sampling={"mode": "binary", "ratio": 2})
    with pytest.raises(ValueError, match=r"NegativeSampling fields .*no mode given"):
        make(neg_sampling={"amount": 2})
    with pytest.raises(ValueError, match=r"neg_sampling=\{'mode': 'binar'\}: choose 'binary'"):
        make(neg_sampling={"mode": "binar"})
    with pytest.raises(ValueError, match=r"neg_sampling=3: give 'binary' or 'triplet', or PyG's NegativeSampling"):
        make(neg_sampling=3)
    with pytest.raises(ValueError, match=r"'triplet' keeps each positive's source, so src_weight draws nothing"):
        make(neg_sampling={"mode": "triplet", "src_weight": torch.ones(60)})
    with pytest.raises(ValueError, match=r"dst_weight: one weight per node of the graph \(60\).*got shape \(59,\)"):
        make(neg_sampling={"mode": "binary", "dst_weight": torch.ones(59)})
    with pytest.raises(ValueError, match=r"src_weight: weights must be finite and non-negative"):
        make(neg_sampling={"mode": "binary", "src_weight": -torch.ones(60)})
    with pytest.raises(ValueError, match=r"src_weight: weights must be finite and non-negative"):
        make(neg_sampling={"mode": "binary", "src_weight": torch.full((60,), float("nan"))})
    with pytest.raises(ValueError, match=r"dst_weight: the weights sum to 0"):
        make(neg_sampling={"mode": "binary", "dst_weight": torch.zeros(60)})
    with pytest.raises(ValueError, match=r"neg_sampling_ratio= is PyG's.*a float too.*NegativeSampling\('binary'"):
        task.edge_dataloader(eids, [2], 8, batch_format="pyg", neg_sampling_ratio=0.5)


def test_dgl_batches_refuse_a_fractional_amount_and_take_a_whole_float():
    """DGL's batches hold k negatives per edge (scoring reshapes them to [b, k]); a ratio is PyG's."""
    task = GraphTask()
    task.graph = rand_link_graph(num_nodes=60, num_edges=100)
    with pytest.raises(ValueError, match=r"negatives=1\.5: a fractional amount is PyG's binary ratio.*whole number"):
        task.edge_dataloader(torch.arange(50), [2], 8, negatives=1.5)
    _, pair, neg, _ = next(iter(task.edge_dataloader(torch.arange(50), [2], 8, negatives=2.0, shuffle=False)))
    assert neg.num_edges() == 2 * pair.num_edges()
