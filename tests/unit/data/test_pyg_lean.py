"""PyG batches gather only what they keep (graphtrainer/data/pyg_loader.py, nn/pyg.py): their
blocks are sampled without data, and ``x``, ``y`` and ``edge_attr`` are read for the batch's own
nodes and edges. The batches stay what converting the gathered blocks gives (``to_pyg`` of the
wrapped loader's batches, as PygLoader made them before), field by field, on DGL's CPU sampling
and the device sampler (run on the CPU), node and link batches, random graphs and Cora."""
from __future__ import annotations

import graphtrainer  # noqa: F401  (first: its DGL compatibility layer must precede `import dgl`)
import dgl
import pytest
import torch

from graphtrainer import datasets
from graphtrainer.nn.pyg import to_pyg

from link_tasks import rand_link_graph
from pyg_graphs import PygTask, placed, random_graph

SAMPLING = ["cpu", "device"]
FANOUTS = [[5, 5], [3, 0, 4], [2, 3, 4], [-1, 2]]


@pytest.fixture(autouse=True)
def one_thread():
    """DGL 2.1's fused sampler (taken with more than one thread) draws differently on each run
    with the same seed, so two iterations are compared with one thread."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def assert_same(new, old):
    assert list(new.keys()) == list(old.keys())
    for key in old.keys():
        a, b = new[key], old[key]
        if isinstance(b, torch.Tensor):
            assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b), key
        else:
            assert a == b, key


def assert_todays(loader, **link):
    """Every batch of a PyG loader equals ``to_pyg`` of its wrapped loader's (gathered) batch."""
    keys = (loader.feat_key, loader.label_key, loader.edge_key)
    new, old = list(loader), list(loader.inner)
    assert len(new) == len(old) > 0
    for data, batch in zip(new, old):
        assert_same(data, to_pyg(batch, *keys, **link))


def graph_with_edge_data(seed, idtype=torch.int64):
    g = random_graph(seed).int() if idtype == torch.int32 else random_graph(seed)
    g.edata["feat"] = torch.randn(g.num_edges(), 3, generator=torch.Generator().manual_seed(seed))
    return g


class Counted(torch.Tensor):
    """A data table that records the rows of each gather from it (index_select or indexing)."""

    rows: list = []

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        with torch._C.DisableTorchFunctionSubclass():
            out = func(*args, **(kwargs or {}))
        mine = bool(args) and isinstance(args[0], cls)
        if mine and getattr(func, "__name__", "") in ("index_select", "__getitem__") and isinstance(out, torch.Tensor):
            cls.rows.append(out.shape[0])
        elif mine and isinstance(out, torch.Tensor) and out.shape == args[0].shape:
            out = out.as_subclass(cls)  # the whole table again (DGL's views and copies): still counted
        return out


class NodeRows(Counted):
    rows: list = []


class EdgeRows(Counted):
    rows: list = []


@pytest.mark.parametrize("sampling", SAMPLING)
def test_batches_gather_only_the_rows_they_keep(sampling):
    """Gathering for the blocks read every source node's features and every block's edges' data
    (then copied the kept rows again); now a batch reads x for its nodes and edge_attr for its
    edges, once."""
    g = graph_with_edge_data(0)
    g.ndata["feat"] = g.ndata["feat"].as_subclass(NodeRows)
    g.edata["feat"] = g.edata["feat"].as_subclass(EdgeRows)
    loader = placed(PygTask(g).node_dataloader(torch.arange(96), [4, 4], 16), sampling)
    dropped = False
    NodeRows.rows.clear()
    EdgeRows.rows.clear()
    for data in loader:
        assert NodeRows.rows == [data.num_nodes] and EdgeRows.rows == [data.edge_index.shape[1]]
        assert torch.equal(data.x, g.ndata["feat"].as_subclass(torch.Tensor)[data.n_id])
        NodeRows.rows.clear()
        EdgeRows.rows.clear()
    for _, _, blocks in loader.inner:  # the blocks do hold nodes and edges the batches leave out
        data = to_pyg(blocks)
        dropped |= blocks[0].num_src_nodes() > data.num_nodes
        assert sum(b.num_edges() for b in blocks) > data.edge_index.shape[1]
    assert dropped


@pytest.mark.parametrize("sampling", SAMPLING)
@pytest.mark.parametrize("fanouts", FANOUTS, ids=str)
def test_node_batches_are_as_before(sampling, fanouts):
    for seed, idtype in ((0, torch.int64), (1, torch.int32)):
        loader = PygTask(graph_with_edge_data(seed, idtype)).node_dataloader(torch.arange(150), fanouts, 32, seed=seed)
        assert_todays(placed(loader, sampling))


@pytest.mark.parametrize("sampling", SAMPLING)
@pytest.mark.parametrize("neg_sampling", ["binary", "triplet"])
def test_link_batches_are_as_before(sampling, neg_sampling):
    g = rand_link_graph(seed=2)
    g.edata["feat"] = torch.randn(g.num_edges(), 2)
    task = PygTask(g)
    m = g.num_edges() // 2
    reverse = torch.cat([torch.arange(m, 2 * m), torch.arange(m)])
    loader = task.edge_dataloader(torch.arange(m), [3, 5], 24, negatives=2, neg_sampling=neg_sampling,
                                  exclude="reverse_id", reverse_eids=reverse)
    assert_todays(placed(loader, sampling), neg_sampling=neg_sampling)
    pairs = (torch.randint(0, 120, (60,)), torch.randint(0, 120, (60,)))
    loader = placed(task.edge_dataloader(pairs, [3, 5], 16, negatives=None, shuffle=False), sampling)
    for data, batch, ids in zip(loader, loader.inner, loader.local_batches()):
        assert_same(data, to_pyg(batch, loader.feat_key, "", loader.edge_key, input_id=ids))


@pytest.mark.parametrize("sampling", SAMPLING)
def test_cora_batches_are_as_before(sampling):
    g = datasets.load("cora")
    task = PygTask(g)
    for fanouts in ([10, 25], [5, 10, 15]):
        loader = placed(task.node_dataloader(torch.arange(0, g.num_nodes(), 4), fanouts, 256), sampling)
        assert_todays(loader)


class OwnFeatures(dgl.dataloading.NeighborSampler):
    """A sampler whose blocks carry data of its own: its PyG batches read the blocks."""

    def sample_blocks(self, g, seed_nodes, exclude_eids=None):
        inputs, outputs, blocks = super().sample_blocks(g, seed_nodes, exclude_eids)
        blocks[0].srcdata["feat"] = torch.full((blocks[0].num_src_nodes(), 5), 7.0)
        return inputs, outputs, blocks


def test_a_sampler_that_sets_its_own_data_is_read_as_before():
    loader = PygTask(random_graph(3)).node_dataloader(torch.arange(64), OwnFeatures([3, 3]), 16)
    assert_todays(loader)
    assert all(bool((data.x == 7).all()) for data in loader)


def test_batches_from_worker_processes_are_as_before():
    g = graph_with_edge_data(4)
    task = PygTask(g)
    loader = task.node_dataloader(torch.arange(96), [3, 4], 16, num_workers=1)
    in_rank = task.node_dataloader(torch.arange(96), [3, 4], 16)
    for data, batch in zip(loader, in_rank.inner):
        assert_same(data, to_pyg(batch, loader.feat_key, loader.label_key, loader.edge_key))
