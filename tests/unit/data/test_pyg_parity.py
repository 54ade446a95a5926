"""PyG batches that PyG's own loaders would give, where DGL's blocks differ from them
(graphtrainer/nn/pyg.py, graphtrainer/data/pyg_loader.py): the node set of
``NeighborLoader`` (no nodes from a hop that samples nothing, none from DGL's re-sampling of
older nodes, PyG's order), ``LinkNeighborLoader``'s binary and triplet negatives, and its
``edge_label=``. On DGL's CPU sampling and on the device sampler (run here on the CPU)."""
from __future__ import annotations

import graphtrainer  # noqa: F401  (first: its DGL compatibility layer must precede `import dgl`)
import dgl
import pytest
import torch
from scipy.stats import chisquare

from graphtrainer.data.device import mode
from graphtrainer.data.edge_loader import EdgeLoader
from graphtrainer.data.node_loader import NodeLoader, default_sampler
from graphtrainer.data.pyg_loader import PygLoader
from graphtrainer.nn import TorchBlock
from graphtrainer.nn.pyg import to_pyg

from link_tasks import rand_link_graph
from pyg_graphs import random_graph

CPU = torch.device("cpu")
SAMPLING = ["cpu", "device"]


def placed(loader, sampling):
    assert mode.place(loader, CPU, sampling, announce=False) == sampling
    return loader


def node_batches(g, fanouts, sampling, seeds=64, batch_size=16):
    """DGL-format batches of a loader (PyG's subgraph is read out of their blocks) and their PyG form."""
    inner = placed(NodeLoader(g, torch.arange(seeds), default_sampler(g, fanouts), batch_size, seed=1), sampling)
    raw = list(inner)
    return raw, [to_pyg(b) for b in raw]


def pyg_walk(blocks):
    """PyG's sampler, read out of DGL's blocks with plain Python: from the seeds, hop by hop, each
    node new at the previous hop (in order) takes its in-edges from that hop's block, and a source
    not met before is new at this hop. Returns the graph's node ids in that order and the count per hop."""
    ids = blocks[0].srcdata[dgl.NID].tolist()
    seeds = blocks[-1].num_dst_nodes()
    order, counts, seen, frontier = list(range(seeds)), [seeds], set(range(seeds)), list(range(seeds))
    for block in reversed(blocks):
        csc = (block.indptr, block.indices) if isinstance(block, TorchBlock) else block.adj_tensors("csc")[:2]
        indptr, indices = (t.tolist() for t in csc)
        fresh = []
        for v in frontier:
            for u in indices[indptr[v]:indptr[v + 1]]:
                if u not in seen:
                    seen.add(u)
                    fresh.append(u)
        order += fresh
        counts.append(len(fresh))
        frontier = fresh
    return [ids[i] for i in order], counts


@pytest.mark.parametrize("sampling", SAMPLING)
def test_a_hop_that_samples_nothing_adds_no_nodes(sampling):
    """fanouts [5, 0] (PyG's num_neighbors=[0, 5]): the seeds alone, as PyG gives them; DGL's
    blocks hold the seeds' re-sampled neighbours at the input layer."""
    g = random_graph(1)
    raw, pyg = node_batches(g, [5, 0], sampling)
    assert any(b[2][0].num_src_nodes() > b[1].numel() for b in raw)  # DGL's blocks do hold them
    for (_, seeds, _), data in zip(raw, pyg):
        bs = seeds.numel()
        assert data.num_nodes == data.x.shape[0] == bs and torch.equal(data.n_id, seeds)
        assert data.num_sampled_nodes == [bs, 0, 0] and data.num_sampled_edges == [0, 0]
        assert data.edge_index.shape == (2, 0) and torch.equal(data.x, g.ndata["feat"][seeds])
    _, pyg = node_batches(g, [3, 0, 4], sampling)  # num_neighbors=[4, 0, 3]: nothing after hop 2
    for data in pyg:
        assert data.num_sampled_nodes[2:] == [0, 0] and data.num_sampled_edges[1:] == [0, 0]
        assert data.num_nodes == sum(data.num_sampled_nodes[:2]) == data.x.shape[0]


@pytest.mark.parametrize("sampling", SAMPLING)
@pytest.mark.parametrize("fanouts", [[3, 3], [3, 2, 4], [2, 0, 5]])
def test_the_node_set_and_order_are_pygs(sampling, fanouts):
    """Only nodes a kept edge reaches (DGL's re-sampling of older nodes reaches others), seeds
    first, then by hop, each hop in the order PyG's sampler meets them."""
    g = random_graph(len(fanouts) + 7)
    raw, pyg = node_batches(g, fanouts, sampling)
    extra = 0
    for (input_nodes, _, blocks), data in zip(raw, pyg):
        want, counts = pyg_walk(blocks)
        assert data.n_id.tolist() == want and data.num_sampled_nodes == counts
        assert torch.equal(data.x, g.ndata["feat"][data.n_id])
        # Every node but the seeds is the source of an edge of the hop it is new at.
        src, dst = data.edge_index
        bs, first = data.batch_size, 0
        starts = torch.tensor([0] + data.num_sampled_nodes).cumsum(0).tolist()
        for hop, count in enumerate(data.num_sampled_edges, 1):
            hop_src = src[first:first + count]
            new = set(range(starts[hop], starts[hop + 1]))
            assert new <= set(hop_src.tolist()) and bool((hop_src < starts[hop + 1]).all())
            assert bool((dst[first:first + count].diff() >= 0).all())  # node by node, as PyG walks them
            first += count
        assert set(torch.cat([torch.arange(bs), src]).tolist()) == set(range(data.num_nodes))
        extra += input_nodes.numel() - data.num_nodes
    if fanouts != [3, 3]:
        return
    assert extra > 0  # DGL's blocks held nodes PyG never reaches, and they are gone


def _link_loader(g, sampling, edges=None, **kwargs):
    edges = torch.arange(g.num_edges()) if edges is None else edges
    options = {k: kwargs.pop(k) for k in ("neg_sampling", "edge_label") if k in kwargs}
    inner = EdgeLoader(g, edges, [2], kwargs.pop("batch_size", 32), seed=kwargs.pop("seed", 5), **kwargs)
    return placed(PygLoader(inner, **options), sampling)


@pytest.mark.parametrize("sampling", SAMPLING)
def test_binary_negatives_draw_both_ends_as_pygs(sampling):
    """LinkNeighborLoader(neg_sampling="binary"): each negative pair is drawn at both ends, not
    the positive's source kept; positives first, then k per positive, labels 1.0 then 0.0."""
    n, k = 150, 3
    g = rand_link_graph(num_nodes=n, num_edges=400)
    loader = _link_loader(g, sampling, negatives=k)
    sources, dests, kept = [], [], 0
    for epoch in range(3):
        loader.set_epoch(epoch)
        for data in loader:
            p = data.batch_size
            assert data.edge_label_index.shape == (2, p * (1 + k)) and data.edge_label.dtype == torch.float32
            assert torch.equal(data.edge_label, torch.cat([torch.ones(p), torch.zeros(p * k)]))
            ends = data.n_id[data.edge_label_index]
            u, v = g.find_edges(data.input_id)
            assert torch.equal(ends[:, :p], torch.stack([u, v]))
            kept += int((ends[0, p:] == u.repeat_interleave(k)).sum())
            sources.append(ends[0, p:])
            dests.append(ends[1, p:])
    src, dst = torch.cat(sources), torch.cat(dests)
    draws = src.numel()
    assert draws == 3 * g.num_edges() * k
    assert kept < 0.05 * draws  # DGL's Uniform keeps every one (1/n by chance)
    for ends in (src, dst):  # uniform over all nodes
        counts = torch.bincount(ends, minlength=n)
        assert int((counts > 0).sum()) == n and chisquare(counts.numpy()).pvalue > 1e-3
    assert abs(torch.corrcoef(torch.stack([src.double(), dst.double()]))[0, 1]) < 0.05  # drawn apart


def test_binary_negatives_are_the_same_on_the_cpu_and_the_device_and_reproducible():
    """One hash of (seed, epoch, edge) on both paths: the same pairs, the sources drawn on both."""
    g = rand_link_graph(num_nodes=100, num_edges=300)

    def negatives(sampling, epoch):
        loader = _link_loader(g, sampling, negatives=2, shuffle=False)
        loader.set_epoch(epoch)
        out, kept = [], 0
        for data in loader:
            out.append(data.n_id[data.edge_label_index[:, data.batch_size:]])
            kept += int((out[-1][0] == g.find_edges(data.input_id)[0].repeat_interleave(2)).sum())
        assert kept < 0.05 * sum(ends.shape[1] for ends in out)  # not the positives' sources
        return out

    first = negatives("cpu", 0)
    assert all(torch.equal(a, b) for a, b in zip(first, negatives("device", 0)))
    assert all(torch.equal(a, b) for a, b in zip(first, negatives("cpu", 0)))
    assert not all(torch.equal(a, b) for a, b in zip(first, negatives("cpu", 1)))  # new ones each epoch


@pytest.mark.parametrize("sampling", SAMPLING)
@pytest.mark.parametrize("k", [1, 3])
def test_triplet_negatives_keep_the_source_as_pygs(sampling, k):
    """neg_sampling="triplet": src_index, dst_pos_index ([p]) and dst_neg_index ([p] for one
    negative per positive, else [p, k]); no edge_label_index or edge_label."""
    n = 120
    g = rand_link_graph(num_nodes=n, num_edges=300)
    loader = _link_loader(g, sampling, negatives=k, neg_sampling="triplet")
    far = []
    for data in loader:
        p = data.batch_size
        assert "edge_label_index" not in data and "edge_label" not in data
        assert data.src_index.shape == data.dst_pos_index.shape == (p,)
        assert data.dst_neg_index.shape == ((p,) if k == 1 else (p, k))
        u, v = g.find_edges(data.input_id)
        assert torch.equal(data.n_id[data.src_index], u) and torch.equal(data.n_id[data.dst_pos_index], v)
        ends = torch.cat([data.src_index, data.dst_pos_index, data.dst_neg_index.reshape(-1)])
        assert ends.unique().tolist() == list(range(data.num_sampled_nodes[0]))  # the seeds, first
        far.append(data.n_id[data.dst_neg_index].reshape(-1))
    counts = torch.bincount(torch.cat(far), minlength=n)
    assert int((counts > 0).sum()) > 0.9 * n


@pytest.mark.parametrize("sampling", SAMPLING)
def test_edge_label_reaches_the_positives_as_pygs(sampling):
    """edge_label=: one value per seed edge as given; with binary negatives a 0-based label is
    shifted by 1 (0 is the negatives'), its dtype kept; without negatives, as given."""
    g = rand_link_graph(num_nodes=100, num_edges=300)
    eids = torch.randperm(g.num_edges(), generator=torch.Generator().manual_seed(0))[:250]
    classes = torch.randint(0, 4, (eids.numel(),), generator=torch.Generator().manual_seed(1))
    label_of = dict(zip(eids.tolist(), classes.tolist()))
    seen = 0
    for data in _link_loader(g, sampling, edges=eids, negatives=2, edge_label=classes):
        p = data.batch_size
        want = torch.tensor([label_of[e] + 1 for e in data.input_id.tolist()])
        assert data.edge_label.dtype == torch.int64
        assert torch.equal(data.edge_label, torch.cat([want, torch.zeros(2 * p, dtype=torch.int64)]))
        seen += p
    assert seen == eids.numel()
    rating = torch.rand(eids.numel(), generator=torch.Generator().manual_seed(2))
    for data in _link_loader(g, sampling, edges=eids, negatives=None, edge_label=rating):
        position = [eids.tolist().index(e) for e in data.input_id.tolist()]
        assert torch.equal(data.edge_label, rating[position])


@pytest.mark.parametrize("sampling", SAMPLING)
def test_pairs_take_edge_label_and_their_positions_are_input_id(sampling):
    """Held-out (src, dst) pairs, PyG's edge_label_index: input_id is each pair's position in
    the list, as LinkNeighborLoader's, and edge_label its given label."""
    g = rand_link_graph(num_nodes=80, num_edges=200)
    gen = torch.Generator().manual_seed(3)
    src, dst = torch.randint(0, 80, (90,), generator=gen), torch.randint(0, 80, (90,), generator=gen)
    label = torch.rand(90, generator=gen)
    positions = []
    for data in _link_loader(g, sampling, edges=(src, dst), negatives=1, edge_label=label, batch_size=16):
        p, pos = data.batch_size, data.input_id
        assert torch.equal(data.n_id[data.edge_label_index[:, :p]], torch.stack([src[pos], dst[pos]]))
        assert torch.equal(data.edge_label, torch.cat([label[pos], torch.zeros(p)]))
        positions.append(pos)
    assert sorted(torch.cat(positions).tolist()) == list(range(90))


def test_task_edge_dataloader_takes_neg_sampling_and_edge_label_and_refuses_what_does_not_fit():
    from graphtrainer import GraphTask

    g = rand_link_graph(num_nodes=60, num_edges=100)
    task = GraphTask()
    task.graph = g
    eids = torch.arange(50)
    data = next(iter(task.edge_dataloader(eids, [2], 8, batch_format="pyg", neg_sampling="triplet", negatives=2)))
    assert data.dst_neg_index.shape == (8, 2)
    data = next(iter(task.edge_dataloader(eids, [2], 8, batch_format="pyg", edge_label=torch.arange(50) % 3)))
    assert torch.equal(data.edge_label[:8], data.input_id % 3 + 1)
    with pytest.raises(ValueError, match=r"neg_sampling='binaryy'.*'binary'.*'triplet'"):
        task.edge_dataloader(eids, [2], 8, batch_format="pyg", neg_sampling="binaryy")
    with pytest.raises(ValueError, match=r"'triplet' needs negatives=k"):
        task.edge_dataloader(eids, [2], 8, batch_format="pyg", neg_sampling="triplet", negatives=None)
    with pytest.raises(ValueError, match=r"'triplet' needs negatives=k"):
        task.edge_dataloader(eids, [2], 8, batch_format="pyg", neg_sampling="triplet",
                             negatives=dgl.dataloading.negative_sampler.Uniform(2))
    with pytest.raises(ValueError, match=r"edge_label= goes with neg_sampling='binary'"):
        task.edge_dataloader(eids, [2], 8, batch_format="pyg", neg_sampling="triplet", edge_label=eids)
    with pytest.raises(ValueError, match=r"one value \(row\) per seed edge.*\(50\).*\(200,\).*edge_label\[mask\]"):
        task.edge_dataloader(eids, [2], 8, batch_format="pyg", edge_label=torch.zeros(200))
    with pytest.raises(ValueError, match=r"edge 3 is given twice with different labels"):
        task.edge_dataloader(torch.tensor([1, 3, 3]), [2], 8, batch_format="pyg", edge_label=torch.tensor([0, 1, 2]))
    with pytest.raises(ValueError, match=r"shape PyG batches \(batch_format='pyg'\)"):
        task.edge_dataloader(eids, [2], 8, batch_format="dgl", neg_sampling="binary")
    with pytest.raises(ValueError, match=r"link batches \(edge_dataloader\)"):
        PygLoader(NodeLoader(g, torch.arange(4), default_sampler(g, [2]), 2), neg_sampling="binary")
