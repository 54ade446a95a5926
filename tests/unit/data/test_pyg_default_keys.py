"""What PyG batches read when no key is named: ``x`` is node data ``feat``, else PyG's ``x``; ``y``
is ``label``, else ``y``; ``edge_attr`` is edge data ``feat``, else ``edge_attr``; so the graph
``torch_geometric.utils.to_dgl(data)`` makes of a PyG user's ``Data`` works with no renaming, on
every path: the task's node and link loaders (CPU and device sampling), ``PygLoader`` and
``to_pyg``. A PyG ``Data`` given as the graph is refused, naming ``to_dgl``."""
from __future__ import annotations

import warnings

import pytest
import torch

import graphtrainer  # noqa: F401  (DGL's compatibility layer first)
import dgl

from graphtrainer import GraphTask
from graphtrainer.data.device import mode
from graphtrainer.data.node_loader import NodeLoader
from graphtrainer.data.pyg_loader import PygLoader

from pyg_graphs import PygTask as _Task, placed as _placed
from graphtrainer.nn.pyg import to_pyg

pytest.importorskip("torch_geometric")
from torch_geometric.utils import to_dgl  # noqa: E402

from pyg_tasks import own_pyg_data  # noqa: E402

CPU = torch.device("cpu")


@pytest.mark.parametrize("nodes,edges,expected", [
    (["x", "y"], ["edge_attr"], ("x", "y", "edge_attr")),
    (["feat", "x", "label", "y"], ["feat", "edge_attr"], ("feat", "label", "feat")),  # graphtrainer's first
    (["feat", "y"], ["w"], ("feat", "y", "feat")),
    (["h"], [], ("feat", "label", "feat")),  # neither: graphtrainer's name, the batch lacks the field
])
def test_keys_not_named_resolve_to_feat_else_pyg_names(nodes, edges, expected):
    from graphtrainer.data.pyg_loader import resolve_batch_keys

    g = dgl.graph((torch.tensor([0, 1]), torch.tensor([1, 2])), num_nodes=3)
    for k in nodes:
        g.ndata[k] = torch.zeros(3)
    for k in edges:
        g.edata[k] = torch.zeros(2)
    assert resolve_batch_keys(g, None, None, None) == expected
    assert resolve_batch_keys(g, "h", "", "w") == ("h", "", "w")  # named keys are kept as named


@pytest.mark.parametrize("sampling", ["cpu", "device"])
def test_node_and_link_batches_of_to_dgl_read_pyg_names(sampling):
    data = own_pyg_data(seed=2)
    g = to_dgl(data)
    assert sorted(g.ndata.keys()) == ["train_mask", "x", "y"] and list(g.edata.keys()) == ["edge_attr"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "carry no x" warning
        node = _Task(g).node_dataloader(torch.arange(40), [3, 2], 16)
        link = _Task(g).edge_dataloader(torch.arange(50), [3], 16, negatives=1, exclude="self")
    if sampling == "cpu":  # a list of fanouts prefetches what the batches read
        assert node.sampler.prefetch_node_feats == ["x"] and node.sampler.prefetch_labels == ["y"]
    for data_batch in _placed(node, sampling):
        assert torch.equal(data_batch.x, data.x[data_batch.n_id])
        assert torch.equal(data_batch.y, data.y[data_batch.n_id])
        assert torch.equal(data_batch.edge_attr, data.edge_attr[data_batch.e_id])
    for data_batch in _placed(link, sampling):
        assert torch.equal(data_batch.x, data.x[data_batch.n_id])
        assert torch.equal(data_batch.edge_attr, data.edge_attr[data_batch.e_id])
        assert data_batch.edge_label_index.shape[1] == 2 * data_batch.batch_size


@pytest.mark.parametrize("sampling", ["cpu", "device"])
def test_each_field_falls_back_on_its_own_and_feat_comes_first(sampling):
    data = own_pyg_data(seed=3)
    g = to_dgl(data)
    g.ndata["feat"], g.edata["feat"] = -g.ndata["x"], -g.edata["edge_attr"]  # both names: feat is read
    for batch in _placed(_Task(g).node_dataloader(torch.arange(20), [2, 2], 8), sampling):
        assert torch.equal(batch.x, -data.x[batch.n_id])
        assert torch.equal(batch.y, data.y[batch.n_id])  # no label: PyG's y
        assert torch.equal(batch.edge_attr, -data.edge_attr[batch.e_id])


def test_pygloader_and_to_pyg_default_to_pyg_names():
    data = own_pyg_data(seed=4)
    g = to_dgl(data)
    sampler = dgl.dataloading.NeighborSampler([2, 2])  # prefetching nothing: DGL's blocks read on access
    loader = PygLoader(NodeLoader(g, torch.arange(16), sampler, 8))
    assert (loader.feat_key, loader.label_key, loader.edge_key) == ("x", "y", "edge_attr")
    for batch in loader:
        assert torch.equal(batch.x, data.x[batch.n_id]) and torch.equal(batch.edge_attr, data.edge_attr[batch.e_id])
    input_nodes, seeds, blocks = next(iter(NodeLoader(g, torch.arange(8), sampler, 8)))
    batch = to_pyg((input_nodes, seeds, blocks))
    assert torch.equal(batch.x, data.x[batch.n_id]) and torch.equal(batch.y, data.y[batch.n_id])
    assert torch.equal(batch.edge_attr, data.edge_attr[batch.e_id])


def test_a_graph_with_neither_warns_naming_both():
    g = to_dgl(own_pyg_data())
    g.ndata["h"] = g.ndata.pop("x")
    with pytest.warns(UserWarning, match=r"no node data 'feat' or 'x' \(it has \['h', 'train_mask', 'y'\]\)"
                                         r".*carry no x.*feat_key="):
        loader = _Task(g).node_dataloader(torch.arange(8), [2], 4)
    batch = next(iter(loader))
    assert batch.x is None and batch.y is not None


def test_a_pyg_data_as_the_graph_is_refused_naming_to_dgl_which_works():
    from torch_geometric.data import HeteroData

    data = own_pyg_data()
    with pytest.raises(TypeError, match=r"torch_geometric Data.*g = torch_geometric\.utils\.to_dgl\(data\)"):
        _Task(data).node_dataloader(torch.arange(8), [2], 4)
    hetero = HeteroData()
    hetero["paper"].x = torch.randn(3, 2)
    with pytest.raises(TypeError, match=r"HeteroData.*torch_geometric\.utils\.to_dgl\(data\).*num_nodes_dict"):
        _Task(hetero).node_dataloader(torch.arange(2), [2], 2, batch_format="dgl")
    batch = next(iter(_Task(to_dgl(data)).node_dataloader(torch.arange(8), [2], 4)))  # the fix named
    assert torch.equal(batch.x, data.x[batch.n_id])
