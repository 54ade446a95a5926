"""``feat_key``/``label_key``/``edge_key`` on the task's loader helpers: PyG batches from a graph
whose data are not under ``feat``/``label`` (PyG's ``x``, ``features``), sampled on the CPU (DGL)
and on the device; keys the graph lacks refused before any batch, naming the key and the fix."""
from __future__ import annotations

import pytest
import torch

import graphtrainer  # noqa: F401  (DGL's compatibility layer first)
import dgl

from graphtrainer import GraphTask
from graphtrainer.data.device import mode
from graphtrainer.data.node_loader import NodeLoader
from graphtrainer.data.pyg_loader import PygLoader

from pyg_graphs import PygTask as _Task, placed as _placed

pytest.importorskip("torch_geometric")

CPU = torch.device("cpu")


def _graph(seed: int = 3, n: int = 200, m: int = 1500):
    gen = torch.Generator().manual_seed(seed)
    g = dgl.graph((torch.randint(0, n, (m,), generator=gen), torch.randint(0, n, (m,), generator=gen)), num_nodes=n)
    g.ndata["x"] = torch.randn(n, 4, generator=gen)  # PyG's names, not feat/label
    g.ndata["target"] = torch.randint(0, 3, (n,), generator=gen)
    g.edata["w"] = torch.randn(m, 2, generator=gen)
    return g


@pytest.mark.parametrize("sampling", ["cpu", "device"])
@pytest.mark.parametrize("given", ["fanouts", "sampler"])
def test_node_batches_read_the_keys_named(sampling, given):
    g = _graph()
    # A sampler naming only the labels: the device path gathers x and edge_attr for PyG all the same.
    sampler = [3, 2] if given == "fanouts" else dgl.dataloading.NeighborSampler([3, 2], prefetch_labels=["target"])
    loader = _Task(g).node_dataloader(torch.arange(40), sampler, 16, feat_key="x", label_key="target", edge_key="w")
    batches = list(_placed(loader, sampling))
    assert len(batches) == 3
    for data in batches:
        assert torch.equal(data.x, g.ndata["x"][data.n_id])
        assert torch.equal(data.y, g.ndata["target"][data.n_id])
        assert torch.equal(data.edge_attr, g.edata["w"][data.e_id])


@pytest.mark.parametrize("sampling", ["cpu", "device"])
def test_link_batches_read_the_keys_named(sampling):
    g = _graph()
    g.ndata["features"] = g.ndata.pop("x")
    loader = _Task(g).edge_dataloader(torch.arange(60), [3], 16, negatives=1, exclude="self",
                                      feat_key="features", edge_key="w")
    for data in _placed(loader, sampling):
        assert torch.equal(data.x, g.ndata["features"][data.n_id])
        assert torch.equal(data.edge_attr, g.edata["w"][data.e_id])
        assert data.edge_label_index.shape[1] == 2 * data.batch_size


@pytest.mark.parametrize("sampling", ["cpu", "device"])
def test_dgl_batches_from_fanouts_prefetch_the_keys_named(sampling):
    """With DGL's batches the keys name what a list of fanouts prefetches: the device path, which
    gathers only what the sampler names, then has them too."""
    g = _graph()
    loader = GraphTask().node_dataloader(torch.arange(40), [3, 2], 16, graph=g, batch_format="dgl",
                                         feat_key="x", label_key="target", edge_key="w")
    input_nodes, seeds, blocks = next(iter(_placed(loader, sampling)))
    assert torch.equal(blocks[0].srcdata["x"], g.ndata["x"][input_nodes])
    assert torch.equal(blocks[-1].dstdata["target"], g.ndata["target"][seeds])
    assert torch.equal(blocks[0].edata["w"], g.edata["w"][blocks[0].edata["_ID"]])


@pytest.mark.parametrize("key,arg,pattern", [
    ("feats", "feat_key", r"feat_key='feats': the graph has no node data 'feats' \(its node data: \['target', 'x'\]\)"
                          r"\. Fix: pass feat_key= one of those"),
    ("label", "label_key", r"label_key='label': the graph has no node data 'label' .*\['target', 'x'\]"),
    ("feat", "edge_key", r"edge_key='feat': the graph has no edge data 'feat' \(its edge data: \['w'\]\).*"
                         r"g\.edata\['feat'\] = "),
])
def test_a_key_the_graph_lacks_is_refused_before_any_batch(key, arg, pattern):
    g = _graph()
    with pytest.raises(ValueError, match=pattern):
        _Task(g).node_dataloader(torch.arange(8), [2], 4, **{arg: key})
    with pytest.raises(ValueError, match=pattern):  # PygLoader itself, keys named
        PygLoader(NodeLoader(g, torch.arange(8), dgl.dataloading.NeighborSampler([2]), 4), **{arg: key})
    if arg != "label_key":
        with pytest.raises(ValueError, match=pattern):
            _Task(g).edge_dataloader(torch.arange(8), [2], 4, **{arg: key})


def test_label_key_on_an_edge_loader_says_link_batches_carry_no_y():
    g = _graph()
    with pytest.raises(ValueError, match=r"label_key= is node_dataloader's: link batches carry no y"):
        _Task(g).edge_dataloader(torch.arange(8), [2], 4, label_key="target")  # before any sampling mode


def test_keys_that_would_change_nothing_are_refused_naming_the_sampler_argument():
    g = _graph()
    sampler = dgl.dataloading.NeighborSampler([2])
    with pytest.raises(ValueError, match=r"feat_key='x': with batch_format='dgl' and a sampler object.*"
                                         r"prefetch_node_feats"):
        GraphTask().node_dataloader(torch.arange(8), sampler, 4, graph=g, feat_key="x")
    with pytest.raises(ValueError, match="feat_key=3: give the name"):
        _Task(g).node_dataloader(torch.arange(8), [2], 4, feat_key=3)
