"""``batch_format="pyg"``: PyG's ``NeighborLoader``/``LinkNeighborLoader`` batches made from
graphtrainer's blocks (graphtrainer/nn/pyg.py, graphtrainer/data/pyg_loader.py), checked on
random graphs against the graph itself and against PyG's own models; PyG layers on torch
blocks; the batch moved like any other; bad input refused before anything runs."""
from __future__ import annotations

import pickle
import subprocess
import sys

import graphtrainer  # noqa: F401  (first: its DGL compatibility layer must precede `import dgl`)
import dgl
import pytest
import torch
from torch_geometric.data import Data
from torch_geometric.nn import GraphSAGE, SAGEConv
from torch_geometric.utils import trim_to_layer

from graphtrainer.data.edge_loader import EdgeLoader
from graphtrainer.data.node_loader import NodeLoader, default_sampler
from graphtrainer.data.pyg_loader import PygLoader, with_batch_format
from graphtrainer.data.sharded_loader import ShardedLoader
from graphtrainer.loop.metrics import infer_batch_size
from graphtrainer.nn import TorchBlock, to_torch_graph
from graphtrainer.nn.pyg import to_pyg
from graphtrainer.nn.transfer import BatchTransfer, copy_to, device_tensors

from link_tasks import rand_link_graph
from pyg_graphs import random_graph


def raw_batches(g, fanouts, batch_size=16, seeds=64):
    return list(NodeLoader(g, torch.arange(seeds), default_sampler(g, fanouts), batch_size, seed=1))


def check_pyg_semantics(g, fanouts, batch, data):
    """Every property the issue lists for one batch (``batch``: DGL's, ``data``: the PyG one)."""
    input_nodes, seeds, blocks = batch
    depth, bs = len(fanouts), seeds.numel()
    assert isinstance(data, Data) and data.batch_size == bs
    assert torch.equal(data.n_id[:bs], seeds) and bool(torch.isin(data.n_id, input_nodes).all())  # seeds first
    assert data.n_id.unique().numel() == data.n_id.numel()
    assert torch.equal(data.x, g.ndata["feat"][data.n_id]) and torch.equal(data.y, g.ndata["label"][data.n_id])
    src, dst = data.edge_index
    # Every edge is an edge of the graph, found through n_id and e_id; none twice.
    gsrc, gdst = g.find_edges(data.e_id)
    assert torch.equal(data.n_id[src], gsrc) and torch.equal(data.n_id[dst], gdst)
    assert data.e_id.unique().numel() == data.e_id.numel()
    # Counts add up; hop h's edges come h-th and point at the nodes new at hop h - 1.
    nodes = torch.tensor(data.num_sampled_nodes).cumsum(0).tolist()
    assert len(nodes) == depth + 1 and nodes[-1] == data.num_nodes == data.x.shape[0]
    assert sum(data.num_sampled_edges) == data.edge_index.shape[1] and len(data.num_sampled_edges) == depth
    first = 0
    for hop, count in enumerate(data.num_sampled_edges, 1):
        lo = nodes[hop - 2] if hop > 1 else 0
        d = dst[first:first + count]
        assert bool(((d >= lo) & (d < nodes[hop - 1])).all()), hop
        assert bool((src[first:first + count] < nodes[hop]).all())
        first += count
    # Each node's in-edges: min(in-degree, its hop's fanout), fanouts in DGL's order
    # (input layer first); none for the nodes first reached at the last hop.
    got = torch.bincount(dst, minlength=data.num_nodes)
    degree = g.in_degrees(data.n_id)
    for v in range(data.num_nodes):
        new_at = next(k for k, n in enumerate(nodes) if v < n)  # 0: a seed
        want = 0 if new_at == depth else min(int(degree[v]), fanouts[depth - 1 - new_at])
        assert int(got[v]) == want, (v, new_at)


@pytest.mark.parametrize("fanouts", [[4, 3], [3, 2, 4]])
def test_pyg_batches_have_neighbor_loader_semantics(fanouts):
    g = random_graph(len(fanouts))
    batches = raw_batches(g, fanouts)
    assert len(batches) == 4
    for batch in batches:
        check_pyg_semantics(g, fanouts, batch, to_pyg(batch))


def test_torch_blocks_give_the_same_batch_as_dgl_blocks():
    g = random_graph(5)
    for batch in raw_batches(g, [3, 5]):
        torch_blocks = [to_torch_graph(b) for b in batch[2]]
        assert all(isinstance(b, TorchBlock) for b in torch_blocks)
        a, b = to_pyg(batch), to_pyg(torch_blocks)  # a bare list of blocks is read too
        assert sorted(a.keys()) == sorted(b.keys())
        for key in a.keys():
            va, vb = a[key], b[key]
            assert torch.equal(va, vb) if isinstance(va, torch.Tensor) else va == vb, key


def test_trim_to_layer_runs_and_keeps_the_seed_outputs():
    g = random_graph(7)
    data = to_pyg(raw_batches(g, [3, 2, 4])[0])
    torch.manual_seed(0)
    model = GraphSAGE(5, 8, num_layers=3, out_channels=3).eval()
    full = model(data.x, data.edge_index)[:data.batch_size]
    trimmed = model(data.x, data.edge_index, num_sampled_nodes_per_hop=data.num_sampled_nodes,
                    num_sampled_edges_per_hop=data.num_sampled_edges)[:data.batch_size]
    assert trimmed.shape[0] == data.batch_size and torch.allclose(full, trimmed, atol=1e-6)
    x, edge_index, _ = trim_to_layer(1, data.num_sampled_nodes, data.num_sampled_edges, data.x, data.edge_index)
    assert x.shape[0] == data.num_nodes - data.num_sampled_nodes[-1]
    assert edge_index.shape[1] == sum(data.num_sampled_edges[:-1])


def _sage_by_hand(conv, h, src, dst, targets):
    """PyG's SAGEConv (mean) for ``targets``, one node at a time over the given edges."""
    rows = []
    for i in targets:
        nb = src[dst == i]
        mean = h[nb].mean(0) if nb.numel() else torch.zeros(h.shape[1])
        rows.append(conv.lin_l(mean) + conv.lin_r(h[i]))
    return torch.stack(rows)


def test_pyg_graphsage_on_the_batch_equals_the_same_weights_hop_by_hop():
    g = random_graph(11)
    data = to_pyg(raw_batches(g, [4, 3])[1])
    torch.manual_seed(0)
    model = GraphSAGE(5, 8, num_layers=2, out_channels=3).eval()
    out = model(data.x, data.edge_index)[:data.batch_size]
    src, dst = data.edge_index
    within_one_hop = range(sum(data.num_sampled_nodes[:2]))
    with torch.no_grad():
        h = torch.relu(_sage_by_hand(model.convs[0], data.x, src, dst, within_one_hop))
        want = _sage_by_hand(model.convs[1], h, src, dst, range(data.batch_size))
    assert torch.allclose(out, want, atol=1e-5), float((out - want).abs().max())


def test_pyg_layers_run_on_torch_blocks_layer_by_layer():
    g = random_graph(13)
    _, _, blocks = raw_batches(g, [4, 3])[0]
    blocks = [to_torch_graph(b) for b in blocks]
    for block in blocks:
        s, d = block.edges()
        assert torch.equal(block.edge_index, torch.stack([s, d]).long()) and block.size == (block.num_src, block.num_dst)
    torch.manual_seed(0)
    convs = [SAGEConv(5, 8), SAGEConv(8, 3)]
    h = blocks[0].srcdata["feat"]
    with torch.no_grad():
        for i, (conv, block) in enumerate(zip(convs, blocks)):
            out = conv((h, h[:block.num_dst]), block.edge_index)
            s, d = block.edge_index
            assert torch.allclose(out, _sage_by_hand(conv, h, s, d, range(block.num_dst)), atol=1e-5)
            h = out.relu() if i == 0 else out
    assert h.shape == (blocks[-1].num_dst, 3)


def test_link_batches_are_link_neighbor_loader_batches():
    g = rand_link_graph(num_nodes=150, num_edges=400)
    inner = EdgeLoader(g, torch.arange(100), [3, 4], 16, negatives=2, exclude="self", seed=3)
    loader = PygLoader(EdgeLoader(g, torch.arange(100), [3, 4], 16, negatives=2, exclude="self", seed=3))
    raw, pyg = list(inner), list(loader)
    assert len(pyg) == len(loader) == len(raw) == 7
    for (input_nodes, pos, neg, blocks), data, seeds in zip(raw, pyg, inner.local_batches()):
        p = pos.num_edges()
        assert data.batch_size == p == infer_batch_size(data) and data.edge_label_index.shape == (2, 3 * p)
        assert torch.equal(data.edge_label, torch.cat([torch.ones(p), torch.zeros(2 * p)]))
        # the pairs' endpoints come first, and are all the seeds
        assert data.edge_label_index.unique().tolist() == list(range(data.num_sampled_nodes[0]))
        ends = data.n_id[data.edge_label_index]
        s, d = (pos.ndata[dgl.NID][e] for e in pos.edges())  # the pairs as the DGL format gives them
        assert torch.equal(ends[0, :p], s) and torch.equal(ends[1, :p], d) and bool(g.has_edges_between(s, d).all())
        # PerEdgeUniform's destinations; binary negatives draw their sources too (test_pyg_parity.py)
        assert torch.equal(ends[1, p:], neg.ndata[dgl.NID][neg.edges()[1]])
        gsrc, gdst = g.find_edges(data.e_id)
        assert torch.equal(data.n_id[data.edge_index[0]], gsrc) and torch.equal(data.n_id[data.edge_index[1]], gdst)
        assert not set(data.e_id.tolist()) & set(seeds.tolist())  # exclude="self" kept


def test_the_wrapper_is_its_loader_for_the_trainer():
    g = random_graph(17)
    inner = NodeLoader(g, torch.arange(50), default_sampler(g, [2, 2]), 8, seed=4)
    loader = with_batch_format(inner, "pyg")
    assert isinstance(loader, ShardedLoader) and with_batch_format(inner, "dgl") is inner
    assert len(loader) == len(inner) == 7 and loader.graph is g and loader.ids is inner.ids
    loader.set_epoch(3)
    assert inner.epoch == 3 and loader.epoch == 3
    assert loader.for_evaluation() is loader and inner.shuffle is False
    assert [int(b.batch_size) for b in loader] == [8] * 6 + [2]
    clone = pickle.loads(pickle.dumps(loader))  # loaders built in __init__ travel to spawned ranks
    assert isinstance(clone, PygLoader) and len(clone) == 7
    with pytest.raises(ValueError, match="batch_format='torch'.*'dgl'.*'pyg'"):
        with_batch_format(inner, "torch")


def test_pyg_batches_are_moved_and_prefetched_like_torch_blocks():
    g = random_graph(19)
    data = to_pyg(raw_batches(g, [2, 2])[0])
    tensors = list(device_tensors(data))
    assert len(tensors) == 5 and any(t is data.edge_index for t in tensors)  # x, y, edge_index, n_id, e_id
    assert copy_to(data, torch.device("cpu")) is data  # Data.to: in place, every tensor
    assert infer_batch_size(data) == data.batch_size
    transfer = BatchTransfer(torch.device("cpu"), "dgl", lambda b, d: b)
    assert transfer.mode(data) == "torch"  # pinned, copied and prefetched by the trainer, not by the hook


def test_typed_ids_of_one_type_and_a_missing_torch_geometric_are_refused_naming_the_fix(monkeypatch):
    """A heterograph's batches are HeteroData (test_pyg_hetero.py); {ntype: ids} on a graph of one
    node and one edge type is refused, its batches being Data."""
    from torch_geometric.data import HeteroData

    hetero = dgl.heterograph({("a", "r", "b"): (torch.tensor([0, 1]), torch.tensor([1, 0])),
                              ("b", "s", "a"): (torch.tensor([0]), torch.tensor([1]))})
    loader = PygLoader(NodeLoader(hetero, {"a": torch.tensor([0, 1])}, dgl.dataloading.NeighborSampler([2]), 2))
    assert isinstance(next(iter(loader)), HeteroData)
    g = random_graph(23)
    with pytest.raises(ValueError, match=r"\{ntype: ids\} on a graph with one node type.*pass the ids as a tensor"):
        PygLoader(NodeLoader(g, {"_N": torch.arange(4)}, default_sampler(g, [2]), 2))
    for name in ("torch_geometric", "torch_geometric.data"):
        monkeypatch.setitem(sys.modules, name, None)  # as if torch-geometric were not installed
    with pytest.raises(ImportError, match=r"needs torch-geometric.*pip install 'graphtrainer\[pyg\]'"):
        PygLoader(NodeLoader(g, torch.arange(10), default_sampler(g, [2]), 4))


def test_the_engine_does_not_import_torch_geometric():
    code = ("import sys, graphtrainer, graphtrainer.task, graphtrainer.data.pyg_loader, graphtrainer.nn.transfer; "
            "assert 'torch_geometric' not in sys.modules, 'imported'")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


class _PygTask(graphtrainer.GraphTask):
    batch_format = "pyg"

    def __init__(self, graph):
        super().__init__()
        self.graph, self.model = graph, torch.nn.Linear(1, 1)

    def train_dataloader(self):
        return self.node_dataloader(torch.arange(2), [2], 2)

    def training_step(self, batch, batch_idx):
        return self.model.weight.sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.model.parameters(), lr=0.1)


def test_fit_refuses_pyg_batches_before_any_rank_starts(monkeypatch, root_dir):
    from conftest import rank_children

    trainer = graphtrainer.Trainer(num_procs=2, max_epochs=1, progress_bar=False, default_root_dir=root_dir)
    for name in ("torch_geometric", "torch_geometric.data"):
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(ImportError, match=r"pip install 'graphtrainer\[pyg\]'"):
        trainer.fit(_PygTask(random_graph(29)))
    assert not rank_children() and not any(root_dir.iterdir())  # nothing launched, no run folder


def test_a_pyg_data_graph_and_a_falsy_batch_format_are_refused_naming_the_fix(root_dir):
    from conftest import rank_children

    g = random_graph(31)
    data = Data(x=g.ndata["feat"], y=g.ndata["label"], edge_index=torch.stack(g.edges()), num_nodes=g.num_nodes())
    trainer = graphtrainer.Trainer(num_procs=2, max_epochs=1, progress_bar=False, default_root_dir=root_dir)
    with pytest.raises(TypeError, match=r"torch_geometric Data.*g = torch_geometric\.utils\.to_dgl\(data\)"):
        trainer.fit(_PygTask(data))
    assert not rank_children() and not any(root_dir.iterdir())  # before any rank started
    task = _PygTask(g)
    with pytest.raises(TypeError, match="torch_geometric Data"):  # the loader helpers too, in any format
        task.node_dataloader(torch.arange(4), [2], 2, graph=data, batch_format="dgl")
    for falsy in ("", 0, False):  # not read as "use the task's format"
        with pytest.raises(ValueError, match=f"batch_format={falsy!r}"):
            task.node_dataloader(torch.arange(4), [2], 2, batch_format=falsy)


def test_a_graph_with_neither_feat_nor_x_warns_that_batches_carry_no_x():
    g = random_graph(37)
    g.ndata["h"] = g.ndata.pop("feat")
    with pytest.warns(UserWarning, match=r"no node data 'feat' or 'x' \(it has \['h', 'label'\]\).*no x.*feat_key="):
        loader = PygLoader(NodeLoader(g, torch.arange(8), default_sampler(g, [2]), 4))
    assert next(iter(loader)).x is None  # what the warning says


def _edge_featured(seed=41):
    g = random_graph(seed)
    g.edata["feat"] = torch.randn(g.num_edges(), 2, generator=torch.Generator().manual_seed(seed))
    return g


@pytest.mark.parametrize("sampling", ["cpu", "device"])
def test_edge_attr_and_y_reach_pyg_batches_whatever_the_sampler_names(sampling):
    """As NeighborLoader's: ``edge_attr`` in edge_index's order; ``y`` also when the sampler names
    features only (DGL's CPU blocks read it on access; the device path gathers it for PyG)."""
    from graphtrainer.data.device import mode

    g = _edge_featured()
    only_feat = dgl.dataloading.NeighborSampler([3, 2], prefetch_node_feats=["feat"])
    node = PygLoader(NodeLoader(g, torch.arange(40), only_feat, 16, seed=1))
    link = PygLoader(EdgeLoader(g, torch.arange(60), [3], 16, negatives=1, exclude="self", seed=1))
    for loader in (node, link):
        assert mode.place(loader, torch.device("cpu"), sampling, announce=False) == sampling
    for data in node:
        assert torch.equal(data.edge_attr, g.edata["feat"][data.e_id])
        assert torch.equal(data.y, g.ndata["label"][data.n_id])
    for data in link:
        assert torch.equal(data.edge_attr, g.edata["feat"][data.e_id])
        p = data.batch_size
        u, v = g.find_edges(data.input_id)  # the positive pairs' edge ids: their data is g.edata[k][input_id]
        assert torch.equal(data.n_id[data.edge_label_index[:, :p]], torch.stack([u, v]))


def test_pyg_names_where_graphtrainer_has_its_own_are_refused_naming_it():
    from torch_geometric.data import HeteroData

    g = random_graph(43)
    hetero = HeteroData()
    hetero["paper"].x = torch.randn(3, 2)
    task = _PygTask(g)
    with pytest.raises(TypeError, match=r"HeteroData.*HeteroData batches from a DGL heterograph.*to_dgl\(data\).*num_nodes_dict"):
        task.node_dataloader(torch.arange(2), [2], 2, graph=hetero)
    with pytest.raises(ValueError, match=r"neg_sampling_ratio= is PyG's loader argument; here: negatives=k"):
        task.edge_dataloader(torch.arange(4), [2], 2, neg_sampling_ratio=2.0)
    with pytest.raises(ValueError, match=r"num_neighbors= is PyG's.*\[25, 10\] is \[10, 25\]"):
        task.node_dataloader(torch.arange(4), [2], 2, num_neighbors=[25, 10])
    with pytest.raises(ValueError, match=r"sampler must be a DGL block sampler .* got dict"):
        task.node_dataloader(torch.arange(4), {"_E": 3}, 2)
