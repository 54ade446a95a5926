"""``batch_format="pyg"`` on a heterograph: PyG's ``HeteroData`` batches, as ``NeighborLoader``
yields them for a ``HeteroData`` with ``input_nodes=(ntype, ids)`` (graphtrainer/nn/pyg_hetero.py,
graphtrainer/data/pyg_hetero.py), checked on random heterographs against the graph and against
PyG's sampling rules read out of the blocks with plain Python; DGL's CPU sampling and the device
sampler (run on the CPU) alike; what does not fit refused, naming the fix."""
from __future__ import annotations

import graphtrainer  # noqa: F401  (first: its DGL compatibility layer must precede `import dgl`)
import dgl
import pytest
import torch
from torch_geometric.data import HeteroData

from graphtrainer.data.edge_loader import EdgeLoader
from graphtrainer.data.node_loader import NodeLoader, default_sampler
from graphtrainer.data.pyg_loader import PygLoader
from graphtrainer.loop.metrics import infer_batch_size
from graphtrainer.nn import TorchHeteroBlock, to_torch_graph

from pyg_graphs import PygTask, placed

SAMPLING = ["cpu", "device"]
RELATIONS = [("a", "r1", "a"), ("a", "r2", "b"), ("a", "r5", "b"), ("b", "r3", "a"), ("b", "r6", "c"),
             ("c", "r4", "a")]
SIZES = {"a": 90, "b": 50, "c": 30}


def random_hetero(seed: int, edges: int = 400):
    """Three node types (``c`` without features), two parallel relations a -> b, a self-relation;
    ``feat`` of two sizes, ``label`` on ``a``, edge ``feat`` on two relations only."""
    gen = torch.Generator().manual_seed(seed)
    g = dgl.heterograph({et: (torch.randint(0, SIZES[et[0]], (edges,), generator=gen),
                              torch.randint(0, SIZES[et[2]], (edges,), generator=gen)) for et in RELATIONS},
                        num_nodes_dict=SIZES)
    g.nodes["a"].data["feat"] = torch.randn(SIZES["a"], 5, generator=gen)
    g.nodes["b"].data["feat"] = torch.randn(SIZES["b"], 3, generator=gen)
    g.nodes["a"].data["label"] = torch.randint(0, 4, (SIZES["a"],), generator=gen)
    for et in (("a", "r2", "b"), ("b", "r3", "a")):
        g.edges[et].data["feat"] = torch.randn(edges, 2, generator=gen)
    return g


PER_RELATION = [{"r1": 2, "r2": 3, "r5": 0, "r3": -1, "r6": 2, "r4": 1},
                {"r1": 3, "r2": 1, "r5": 2, "r3": 2, "r6": 0, "r4": -1}]


def loader(g, fanouts, sampling, ids=None, batch_size=16, **kwargs):
    """A PygLoader placed for ``sampling``: ``loader.inner`` yields the DGL-format batches,
    ``loader.hetero(batch)`` makes one ``HeteroData`` (as iterating the loader does)."""
    ids = {"a": torch.arange(0, 90, 2)} if ids is None else ids
    sampler = dgl.dataloading.NeighborSampler(fanouts) if isinstance(fanouts[0], dict) else \
        default_sampler(g, fanouts)
    return placed(PygLoader(NodeLoader(g, ids, sampler, batch_size, seed=1), **kwargs), sampling)


def _csc(block, et):
    if isinstance(block, TorchHeteroBlock):
        rel = block.relations[et]
        return rel.indptr.tolist(), rel.indices.tolist()
    indptr, indices, _ = block.adj_tensors("csc", etype=et)
    return indptr.tolist(), indices.tolist()


def pyg_walk(blocks, seed_type):
    """PyG's hetero sampler read out of DGL's blocks in plain Python: hop by hop, relation by
    relation in order, each destination node new at the previous hop (in order) takes its
    in-edges from that hop's block; a source not met before is new at this hop, numbered in order."""
    etypes = list(blocks[0].canonical_etypes)
    ids = {nt: blocks[0].srcnodes[nt].data["_ID"].tolist() for nt in SIZES}
    frontier = {nt: [] for nt in SIZES}
    frontier[seed_type] = list(range(blocks[-1].num_dst_nodes(seed_type)))
    order = {nt: list(f) for nt, f in frontier.items()}
    seen = {nt: set(f) for nt, f in frontier.items()}
    counts = {nt: [len(f)] for nt, f in frontier.items()}
    for block in reversed(blocks):
        fresh = {nt: [] for nt in SIZES}
        for et in etypes:
            indptr, indices = _csc(block, et)
            for v in frontier[et[2]]:
                for u in indices[indptr[v]:indptr[v + 1]]:
                    if u not in seen[et[0]]:
                        seen[et[0]].add(u)
                        fresh[et[0]].append(u)
        for nt in SIZES:
            order[nt] += fresh[nt]
            counts[nt].append(len(fresh[nt]))
        frontier = fresh
    return {nt: [ids[nt][i] for i in o] for nt, o in order.items()}, counts


def _fanout(fanouts, layer, et):
    f = fanouts[layer]
    return f[et[1]] if isinstance(f, dict) else f


def check_hetero_semantics(g, fanouts, batch, data, ids):
    """Every property of one ``HeteroData`` batch (``batch``: the DGL-format batch it was made from)."""
    _, output_nodes, blocks = batch
    depth, seeds = len(fanouts), output_nodes["a"]
    bs = seeds.numel()
    assert isinstance(data, HeteroData) and set(data.node_types) == set(SIZES)
    assert set(data.edge_types) == set(RELATIONS)
    store = data["a"]
    assert store.batch_size == bs == infer_batch_size(data) and torch.equal(store.n_id[:bs], seeds)
    assert torch.equal(ids[store.input_id], seeds) and torch.equal(store.y, g.nodes["a"].data["label"][store.n_id])
    assert "batch_size" not in data["b"] and "y" not in data["b"]
    want_order, want_counts = pyg_walk(blocks, "a")
    starts = {}
    for nt in SIZES:
        n_id = data[nt].n_id
        assert n_id.tolist() == want_order[nt] and data[nt].num_sampled_nodes == want_counts[nt], nt
        assert len(data[nt].num_sampled_nodes) == depth + 1 and sum(data[nt].num_sampled_nodes) == n_id.numel()
        if "feat" in g.nodes[nt].data:
            assert torch.equal(data[nt].x, g.nodes[nt].data["feat"][n_id])
        else:
            assert "x" not in data[nt]
        starts[nt] = torch.tensor([0] + data[nt].num_sampled_nodes).cumsum(0).tolist()
    got_in = {}
    for et in RELATIONS:
        s, _, d = et
        rel = data[et]
        row, col = rel.edge_index
        assert bool((row < data[s].n_id.numel()).all()) and bool((col < data[d].n_id.numel()).all())
        gsrc, gdst = g.find_edges(rel.e_id, etype=et)  # every edge is the graph's, through n_id and e_id
        assert torch.equal(data[s].n_id[row], gsrc) and torch.equal(data[d].n_id[col], gdst)
        assert rel.e_id.unique().numel() == rel.e_id.numel()
        if "feat" in g.edges[et].data:
            assert torch.equal(rel.edge_attr, g.edges[et].data["feat"][rel.e_id])
        else:
            assert "edge_attr" not in rel
        assert len(rel.num_sampled_edges) == depth and sum(rel.num_sampled_edges) == row.numel()
        first = 0
        for hop, count in enumerate(rel.num_sampled_edges, 1):  # hop h: into the nodes new at h - 1
            c, r = col[first:first + count], row[first:first + count]
            assert bool(((c >= starts[d][hop - 1]) & (c < starts[d][hop])).all()), (et, hop)
            assert bool((r < starts[s][hop + 1]).all()) and bool((c.diff() >= 0).all())
            first += count
        got_in[et] = torch.bincount(col, minlength=data[d].n_id.numel())
    # Each node's in-edges per relation: min(in-degree, its hop's fanout for it); none at the last hop.
    for et in RELATIONS:
        d = et[2]
        degree = g.in_degrees(data[d].n_id, etype=et)
        for v in range(data[d].n_id.numel()):
            new_at = next(k for k in range(depth + 1) if v < starts[d][k + 1])
            k = 0 if new_at == depth else _fanout(fanouts, depth - 1 - new_at, et)
            want = int(degree[v]) if k == -1 else min(int(degree[v]), k)
            assert int(got_in[et][v]) == want, (et, v, new_at)


@pytest.mark.parametrize("sampling", SAMPLING)
@pytest.mark.parametrize("fanouts", [[3, 2], PER_RELATION, [2, 0, 3]])
def test_hetero_batches_have_neighbor_loader_semantics(sampling, fanouts):
    g = random_hetero(len(fanouts) + 3)
    pyg = loader(g, fanouts, sampling)
    raw = list(pyg.inner)  # DGL's CPU sampling of several relations is not the same twice in one process
    assert len(raw) == len(list(pyg)) == len(pyg) == 3
    for batch in raw:
        check_hetero_semantics(g, fanouts, batch, pyg.hetero(batch), pyg.typed["a"])


def _equal(a, b):
    assert [s._key for s in a.stores] == [s._key for s in b.stores]
    for sa, sb in zip(a.stores, b.stores):
        assert sorted(sa.keys()) == sorted(sb.keys()), sa._key
        for key in sa.keys():
            va, vb = sa[key], sb[key]
            assert (torch.equal(va, vb) and va.dtype == vb.dtype) if isinstance(va, torch.Tensor) else va == vb, key


def test_torch_blocks_give_the_same_batch_as_dgl_blocks():
    from graphtrainer.nn.pyg_hetero import to_hetero_pyg

    g = random_hetero(11)
    for batch in loader(g, PER_RELATION, "cpu").inner:
        torch_blocks = [to_torch_graph(b) for b in batch[2]]
        assert all(isinstance(b, TorchHeteroBlock) for b in torch_blocks)
        _equal(to_hetero_pyg(batch), to_hetero_pyg(torch_blocks))  # a bare list of blocks is read too


def _by_hop(sizes, values):
    return [sorted(part.tolist()) for part in torch.split(values, sizes)]


def test_full_neighbourhoods_give_the_same_batches_on_the_cpu_and_the_device():
    """With every in-edge taken, both paths sample the same subgraph: the same fields and dtypes,
    seeds, counts, labels and input_id, and per hop the same nodes and edges (within a node, DGL
    and the device list in-edges in their own order, so a hop's order may differ)."""
    g = random_hetero(13)
    cpu, device = (list(loader(g, [-1, -1], sampling, batch_size=24)) for sampling in SAMPLING)
    assert len(cpu) == len(device) == 2
    for a, b in zip(cpu, device):
        assert [sorted(s.keys()) for s in a.stores] == [sorted(s.keys()) for s in b.stores]
        for key in ("batch_size", "input_id"):
            assert torch.equal(torch.as_tensor(a["a"][key]), torch.as_tensor(b["a"][key]))
        bs = a["a"].batch_size  # y is every node's, in n_id's order (which may differ within a hop)
        assert torch.equal(a["a"].y[:bs], b["a"].y[:bs])
        for batch in (a, b):
            assert torch.equal(batch["a"].y, g.nodes["a"].data["label"][batch["a"].n_id])
        for nt in SIZES:
            assert a[nt].num_sampled_nodes == b[nt].num_sampled_nodes and a[nt].n_id.dtype == b[nt].n_id.dtype
            assert _by_hop(a[nt].num_sampled_nodes, a[nt].n_id) == _by_hop(b[nt].num_sampled_nodes, b[nt].n_id)
        for et in RELATIONS:
            assert a[et].num_sampled_edges == b[et].num_sampled_edges
            assert _by_hop(a[et].num_sampled_edges, a[et].e_id) == _by_hop(b[et].num_sampled_edges, b[et].e_id)


def test_pyg_hetero_models_and_trim_to_layer_run_on_the_batch():
    from torch_geometric.nn import SAGEConv, to_hetero
    from torch_geometric.utils import trim_to_layer

    g = random_hetero(17)
    data = next(iter(loader(g, [3, 2], "cpu")))
    x, edge_index = data.x_dict, data.edge_index_dict
    x["c"] = torch.zeros(data["c"].n_id.numel(), 4)  # a featureless type: an embedding, by n_id, in a model

    class Two(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.one, self.two = SAGEConv((-1, -1), 8), SAGEConv((-1, -1), 3)

        def forward(self, x, edge_index):
            return self.two(self.one(x, edge_index).relu(), edge_index)

    torch.manual_seed(0)
    model = to_hetero(Two(), data.metadata(), aggr="sum")
    out = model(x, edge_index)["a"][:data["a"].batch_size]
    assert out.shape == (data["a"].batch_size, 3)
    nodes = {nt: data[nt].num_sampled_nodes for nt in data.node_types}
    edges = {et: data[et].num_sampled_edges for et in data.edge_types}
    x1, e1, _ = trim_to_layer(1, nodes, edges, x, edge_index)  # PyG's per-type, per-hop counts
    for nt in data.node_types:
        assert x1[nt].shape[0] == data[nt].n_id.numel() - nodes[nt][-1]
    for et in data.edge_types:
        assert e1[et].shape[1] == sum(edges[et][:-1])


def test_several_seed_types_and_link_batches_are_refused_naming_the_fix():
    g = random_hetero(19)
    sampler = default_sampler(g, [2])
    with pytest.raises(ValueError, match=r"one node type, as PyG's NeighborLoader \(input_nodes=\(ntype, ids\)\); "
                                         r"got \['a', 'b'\].*one loader per type.*batch_format='dgl'"):
        PygLoader(NodeLoader(g, {"a": torch.arange(4), "b": torch.arange(4)}, sampler, 4))
    task = PygTask(g)
    with pytest.raises(ValueError, match=r"node batches only.*LinkNeighborLoader on a HeteroData.*batch_format='dgl'"):
        task.edge_dataloader({"r1": torch.arange(10)}, [2], 4)
    with pytest.raises(ValueError, match=r"neg_sampling= and edge_label= shape link batches"):
        PygLoader(NodeLoader(g, {"a": torch.arange(4)}, sampler, 4), neg_sampling="binary")
    with pytest.raises(ValueError, match=r"per relation, num_neighbors=\{et: \[25, 10\]\} is \[\{et: 10\}, "):
        task.node_dataloader({"a": torch.arange(4)}, [2], 2, num_neighbors={("a", "r1", "a"): [2]})
    assert isinstance(EdgeLoader(g, {"r1": torch.arange(10)}, [2], 4), EdgeLoader)  # DGL's batches stay


def test_the_task_helper_gives_hetero_batches_and_keys_are_per_type():
    g = random_hetero(23)
    g.nodes["c"].data["h"] = torch.randn(SIZES["c"], 2)
    task = PygTask(g)
    sizes = []
    for data in task.node_dataloader({"a": torch.arange(20)}, [2, 2], 8, feat_key="h", label_key="", edge_key="feat"):
        assert "x" not in data["a"] and torch.equal(data["c"].x, g.nodes["c"].data["h"][data["c"].n_id])
        assert "y" not in data["a"]
        sizes.append(data["a"].batch_size)
        assert torch.equal(data["a", "r2", "b"].edge_attr, g.edges["r2"].data["feat"][data["a", "r2", "b"].e_id])
    assert sizes == [8, 8, 4]
    with pytest.raises(ValueError, match=r"feat_key='nope': the graph has no node data 'nope'"):
        task.node_dataloader({"a": torch.arange(20)}, [2, 2], 8, feat_key="nope")


def _own_hetero_data(trailing: bool) -> HeteroData:
    gen = torch.Generator().manual_seed(5)
    data = HeteroData()
    data["paper"].x, data["paper"].y = torch.randn(40, 4, generator=gen), torch.randint(0, 3, (40,), generator=gen)
    data["author"].x = torch.randn(12 if trailing else 10, 2, generator=gen)
    data["author", "writes", "paper"].edge_index = torch.stack([torch.arange(60) % 10,
                                                                 torch.randint(0, 40, (60,), generator=gen)])
    data["author", "writes", "paper"].edge_attr = torch.randn(60, 3, generator=gen)
    data["paper", "cites", "paper"].edge_index = torch.randint(0, 40, (2, 100), generator=gen)
    return data


@pytest.mark.parametrize("trailing", [False, True])
def test_a_heterodata_graph_is_refused_and_the_lines_it_names_convert_it(trailing, root_dir):
    """The refusal comes before any rank starts; its to_dgl line converts a HeteroData whose types
    are all reached by edges, its by-hand line one with nodes past the last edge (to_dgl fails there)."""
    from conftest import rank_children
    from torch_geometric.utils import to_dgl

    from graphtrainer.data.pyg_hetero import HETERODATA_REFUSAL

    data = _own_hetero_data(trailing)

    class Task(PygTask):
        def train_dataloader(self):
            return self.node_dataloader({"paper": torch.arange(8)}, [2], 4)

        def training_step(self, batch, batch_idx):
            return self.model.weight.sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.model.parameters(), lr=0.1)

    task = Task(data)
    task.model = torch.nn.Linear(1, 1)
    trainer = graphtrainer.Trainer(num_procs=2, max_epochs=1, progress_bar=False, default_root_dir=root_dir)
    with pytest.raises(TypeError, match=r"HeteroData.*HeteroData batches.*to_dgl\(data\).*num_nodes_dict"):
        trainer.fit(task)
    assert not rank_children() and not any(root_dir.iterdir())
    if not trailing:
        assert "g = torch_geometric.utils.to_dgl(data)" in HETERODATA_REFUSAL
        g = to_dgl(data)
    else:
        with pytest.raises(Exception):
            to_dgl(data)  # why the refusal names the line below
        line = ("g = dgl.heterograph({et: tuple(data[et].edge_index) for et in data.edge_types}, num_nodes_dict={t: "
                "data[t].num_nodes for t in data.node_types}), then copy the data, g.nodes[t].data['x'] = data[t].x "
                "and g.edges[et].data['edge_attr'] = data[et].edge_attr")
        assert line in HETERODATA_REFUSAL
        g = dgl.heterograph({et: tuple(data[et].edge_index) for et in data.edge_types},
                            num_nodes_dict={t: data[t].num_nodes for t in data.node_types})
        for t in data.node_types:
            g.nodes[t].data["x"] = data[t].x
        g.nodes["paper"].data["y"] = data["paper"].y
        g.edges["writes"].data["edge_attr"] = data["author", "writes", "paper"].edge_attr
    assert g.num_nodes("author") == data["author"].num_nodes
    for batch in PygTask(g).node_dataloader({"paper": torch.arange(40)}, [3, 3], 16):  # PyG's names, read as such
        for nt in ("paper", "author"):
            assert torch.equal(batch[nt].x, data[nt].x[batch[nt].n_id])
        seeds = batch["paper"].n_id[:batch["paper"].batch_size]
        assert torch.equal(batch["paper"].y, data["paper"].y[batch["paper"].n_id])
        writes = batch["author", "writes", "paper"]
        assert torch.equal(writes.edge_attr, data["author", "writes", "paper"].edge_attr[writes.e_id])
