"""PyG batches carry the graph's other node and edge data under their own names, as PyG's
``NeighborLoader`` slices every node attribute of a ``Data`` by ``n_id`` and every edge one by
``e_id`` (graphtrainer/nn/pyg_attrs.py): node and link batches, DGL's CPU sampling and the device
sampler (run on the CPU, and through ``Trainer(sampling="device")``), HeteroData per type; ``y``
is every node's; a name a batch cannot hold is refused; ``attrs=`` limits what is gathered."""
from __future__ import annotations

import graphtrainer  # noqa: F401  (first: its DGL compatibility layer must precede `import dgl`)
import dgl
import pytest
import torch

from graphtrainer import Trainer
from graphtrainer.nn.pyg import to_pyg

from link_tasks import rand_link_graph
from pyg_graphs import PygTask, placed, random_graph
from test_pyg_hetero import loader as hetero_loader, random_hetero
from test_pyg_lean import Counted

SAMPLING = ["cpu", "device"]
NODE_KEYS = ("train_mask", "val_mask", "year")


def with_masks(g, seed=0):
    gen = torch.Generator().manual_seed(seed)
    n = g.num_nodes()
    g.ndata["train_mask"] = torch.rand(n, generator=gen) < 0.5
    g.ndata["val_mask"] = ~g.ndata["train_mask"]
    g.ndata["year"] = torch.randint(2000, 2024, (n,), generator=gen)
    g.edata["feat"] = torch.randn(g.num_edges(), 2, generator=gen)  # read as edge_attr
    g.edata["weight"] = torch.rand(g.num_edges(), generator=gen)
    return g


def assert_carried(g, data, nodes=NODE_KEYS, edges=("weight",)):
    for key in nodes:
        assert torch.equal(data[key], g.ndata[key][data.n_id]), key
    for key in edges:
        assert torch.equal(data[key], g.edata[key][data.e_id]), key
    assert "feat" not in data and ("label" in nodes or "label" not in data)  # read as x, y, edge_attr: not twice


@pytest.mark.parametrize("sampling", SAMPLING)
def test_node_batches_carry_every_other_node_and_edge_key(sampling):
    g = with_masks(random_graph(0))
    loader = placed(PygTask(g).node_dataloader(torch.arange(96), [3, 4], 16), sampling)
    for data in loader:
        assert_carried(g, data)
        assert torch.equal(data.y, g.ndata["label"][data.n_id])  # every node's, as PyG's
        assert torch.equal(data.train_mask[:data.batch_size], g.ndata["train_mask"][data.n_id[:data.batch_size]])
        assert torch.equal(data.edge_attr, g.edata["feat"][data.e_id])


@pytest.mark.parametrize("sampling", SAMPLING)
def test_only_the_kept_rows_are_gathered_where_the_batch_is(sampling):
    g = with_masks(random_graph(1))
    g.ndata["year"] = g.ndata["year"].as_subclass(Counted)
    loader = placed(PygTask(g).node_dataloader(torch.arange(64), [4, 4], 16), sampling)
    Counted.rows.clear()
    for data in loader:  # one read of the batch's own nodes, none for the blocks
        assert Counted.rows == [data.num_nodes] and data.year.device == data.n_id.device
        Counted.rows.clear()


@pytest.mark.parametrize("sampling", SAMPLING)
def test_link_batches_carry_them_too(sampling):
    g = with_masks(rand_link_graph(seed=3))
    g.ndata["label"] = torch.randint(0, 2, (g.num_nodes(),))
    loader = placed(PygTask(g).edge_dataloader(torch.arange(100), [3, 3], 24, negatives=1), sampling)
    for data in loader:
        assert_carried(g, data, nodes=NODE_KEYS + ("label",))  # a link batch has no y: label is its own
        assert "y" not in data


def test_to_pyg_of_dgl_blocks_carries_them_as_the_loader_does():
    g = with_masks(random_graph(2))
    loader = PygTask(g).node_dataloader(torch.arange(48), [3, 3], 16, shuffle=False)
    for data, batch in zip(loader, loader.inner):
        made = to_pyg(batch)
        assert_carried(g, made)
        assert sorted(made.keys()) == sorted(data.keys())


@pytest.mark.parametrize("sampling", SAMPLING)
def test_heterodata_batches_carry_them_per_node_type_and_relation(sampling):
    g = random_hetero(5)
    gen = torch.Generator().manual_seed(5)
    g.nodes["a"].data["train_mask"] = torch.rand(g.num_nodes("a"), generator=gen) < 0.5
    g.nodes["c"].data["year"] = torch.randint(2000, 2024, (g.num_nodes("c"),), generator=gen)
    et = ("a", "r2", "b")
    g.edges[et].data["weight"] = torch.rand(g.num_edges(et), generator=gen)
    for data in hetero_loader(g, [3, 3], sampling):
        a, c, rel = data["a"], data["c"], data[et]
        assert torch.equal(a.train_mask, g.nodes["a"].data["train_mask"][a.n_id])
        assert torch.equal(a.y, g.nodes["a"].data["label"][a.n_id])
        assert torch.equal(c.year, g.nodes["c"].data["year"][c.n_id])
        assert torch.equal(rel.weight, g.edges[et].data["weight"][rel.e_id])
        assert "train_mask" not in data["b"] and "weight" not in data["b", "r6", "c"]


def test_attrs_limits_what_is_carried_and_gathered():
    g = with_masks(random_graph(4))
    g.ndata["val_mask"] = g.ndata["val_mask"].as_subclass(Counted)
    task = PygTask(g)
    Counted.rows.clear()
    for data in task.node_dataloader(torch.arange(64), [3, 3], 16, attrs=["train_mask", "weight"]):
        assert_carried(g, data, nodes=("train_mask",))
        assert "val_mask" not in data and "year" not in data
    for data in task.node_dataloader(torch.arange(64), [3, 3], 16, attrs=()):
        assert not {"train_mask", "val_mask", "year", "weight"} & set(data.keys())
        assert torch.equal(data.y, g.ndata["label"][data.n_id])
    assert Counted.rows == []  # val_mask was never read
    with pytest.raises(ValueError, match=r"attrs names 'mask'.*no such node or edge data.*train_mask"):
        task.node_dataloader(torch.arange(64), [3, 3], 16, attrs=["mask"])
    with pytest.raises(ValueError, match=r"attrs=.*batch_format='pyg'"):
        task.node_dataloader(torch.arange(64), [3, 3], 16, attrs=["train_mask"], batch_format="dgl")


@pytest.mark.parametrize("name, where", [("edge_index", "ndata"), ("n_id", "ndata"), ("batch_size", "edata"),
                                         ("keys", "ndata"), ("input_id", "edata"), ("size", "edata"),
                                         ("num_edges", "edata")])
def test_a_key_named_like_a_batch_field_is_refused_with_the_fix(name, where):
    g = random_graph(6)
    getattr(g, where)[name] = torch.zeros(g.num_nodes() if where == "ndata" else g.num_edges())
    with pytest.raises(ValueError, match=rf"data '{name}' would be carried under its own name.*Fix: rename it"):
        PygTask(g).node_dataloader(torch.arange(32), [3], 16)
    with pytest.raises(ValueError, match=rf"data '{name}' would be carried"):  # edge data too: one Data
        to_pyg(next(iter(PygTask(g).node_dataloader(torch.arange(32), [3], 16, batch_format="dgl"))))
    data = next(iter(PygTask(g).node_dataloader(torch.arange(32), [3], 16, attrs=())))  # the fix: leave it out
    assert data.batch_size == 16 and data.n_id.dtype == torch.int64 and data.edge_index.shape[0] == 2


def test_a_node_and_an_edge_key_of_one_name_are_refused():
    g = random_graph(7)
    g.ndata["w"], g.edata["w"] = torch.rand(g.num_nodes()), torch.rand(g.num_edges())
    with pytest.raises(ValueError, match=r"node and edge data named 'w'.*Fix: rename one, e\.g\. g\.edata\['my_w'\]"):
        PygTask(g).node_dataloader(torch.arange(32), [3], 16)
    with pytest.raises(ValueError, match=r"node and edge data named 'w'"):
        to_pyg(next(iter(PygTask(g).node_dataloader(torch.arange(32), [3], 16, batch_format="dgl"))))


def test_pyg_names_of_fields_read_from_another_key_are_left_out_or_refused_when_named():
    g = random_graph(8)
    g.ndata["x"] = -g.ndata["feat"]  # feat is read as x (feat first): x is the other candidate
    g.ndata["year"] = torch.arange(g.num_nodes())
    data = next(iter(PygTask(g).node_dataloader(torch.arange(32), [3], 16)))
    assert torch.equal(data.x, g.ndata["feat"][data.n_id]) and torch.equal(data.year, data.n_id)
    with pytest.raises(ValueError, match=r"node data 'x' would be carried.*the batch's x, read from 'feat'"):
        PygTask(g).node_dataloader(torch.arange(32), [3], 16, attrs=["x"])


def test_dgl_bookkeeping_keys_are_not_carried():
    """dgl.to_homogeneous gives node and edge data _ID and _TYPE: n_id/e_id hold the one, the other is DGL's."""
    src, dst = random_graph(9).edges()
    g = dgl.to_homogeneous(dgl.heterograph({("u", "e", "v"): (src % 100, dst % 50)}, {"u": 100, "v": 50}))
    g.ndata["feat"], g.ndata["year"] = torch.randn(g.num_nodes(), 3), torch.arange(g.num_nodes())
    data = next(iter(PygTask(g).node_dataloader(torch.arange(100, 150), [3], 16)))
    assert "_TYPE" not in data and "_ID" not in data and torch.equal(data.year, data.n_id)
    with pytest.raises(ValueError, match=r"attrs names '_ID'.*n_id and e_id hold it"):
        PygTask(g).node_dataloader(torch.arange(100, 150), [3], 16, attrs=["_ID"])
    with pytest.raises(ValueError, match=r"attrs names '_TYPE'.*DGL's bookkeeping.*g.ndata\['node_type'\]"):
        PygTask(g).node_dataloader(torch.arange(100, 150), [3], 16, attrs=["_TYPE"])


@pytest.mark.parametrize("sampling", SAMPLING)
def test_edge_data_named_like_a_node_key_read_as_x_or_y_is_carried_and_the_reverse(sampling):
    g = random_graph(10)  # node feat -> x, label -> y
    gen = torch.Generator().manual_seed(10)
    g.edata["label"] = torch.randint(0, 5, (g.num_edges(),), generator=gen)  # a rating per edge
    g.edata["feat"] = torch.rand(g.num_edges(), 3, generator=gen)  # not read: edge_key="w"
    g.edata["w"] = torch.rand(g.num_edges(), 2, generator=gen)
    g.ndata["w"] = torch.rand(g.num_nodes(), generator=gen)  # named like the edge key read as edge_attr
    loader = placed(PygTask(g).node_dataloader(torch.arange(32), [3], 16, edge_key="w"), sampling)
    assert loader.attrs == ("w", "feat", "label")
    for data in loader:
        assert torch.equal(data.x, g.ndata["feat"][data.n_id]) and torch.equal(data.y, g.ndata["label"][data.n_id])
        assert torch.equal(data.edge_attr, g.edata["w"][data.e_id]) and torch.equal(data.w, g.ndata["w"][data.n_id])
        assert torch.equal(data.label, g.edata["label"][data.e_id])
        assert torch.equal(data.feat, g.edata["feat"][data.e_id])
    named = placed(PygTask(g).node_dataloader(torch.arange(32), [3], 16, edge_key="w", attrs=["label"]), sampling)
    data = next(iter(named))  # node label is y, so the name means the edge data
    assert named.attrs == ("label",) and torch.equal(data.label, g.edata["label"][data.e_id]) and "w" not in data


def test_the_clash_message_names_a_rename_that_works():
    g = random_graph(11)
    g.ndata["target"] = g.ndata.pop("label")
    g.ndata["label"], g.edata["label"] = torch.zeros(g.num_nodes()), torch.ones(g.num_edges())
    with pytest.raises(ValueError, match=r"node and edge data named 'label'") as refused:
        PygTask(g).node_dataloader(torch.arange(32), [3], 16, label_key="target")
    rename = str(refused.value).split("e.g. ")[1].split(",")[0]
    assert rename == "g.edata['my_label'] = g.edata.pop('label')"
    g.edata["my_label"] = g.edata.pop("label")
    data = next(iter(PygTask(g).node_dataloader(torch.arange(32), [3], 16, label_key="target")))
    assert torch.equal(data.my_label, g.edata["my_label"][data.e_id])


@pytest.mark.parametrize("sampling", SAMPLING)
def test_label_key_empty_gives_no_y_even_from_node_data_y(sampling):
    """label_key="": no y, also where the graph has node data y (to_dgl's); a link batch's y stays its own."""
    g = random_graph(12)
    g.ndata["y"] = torch.arange(g.num_nodes())
    loader = placed(PygTask(g).node_dataloader(torch.arange(32), [3], 16, label_key=""), sampling)
    for data in loader:
        assert "y" not in data and torch.equal(data.label, g.ndata["label"][data.n_id])  # label: an ordinary key
    with pytest.raises(ValueError, match=r"node data 'y' would be carried.*the batch's y, which label_key='' leaves"):
        PygTask(g).node_dataloader(torch.arange(32), [3], 16, label_key="", attrs=["y"])
    link = placed(PygTask(g).edge_dataloader(torch.arange(40), [3], 8, negatives=1), sampling)
    assert all(torch.equal(data.y, data.n_id) and torch.equal(data.label, g.ndata["label"][data.n_id])
               for data in link)


def test_feat_key_or_edge_key_empty_switches_x_or_edge_attr_off_alike():
    g = random_graph(14)
    g.ndata["x"], g.edata["edge_attr"] = torch.zeros(g.num_nodes(), 2), torch.rand(g.num_edges())
    with pytest.warns(UserWarning, match="carry no x"):
        data = next(iter(PygTask(g).node_dataloader(torch.arange(32), [3], 16, feat_key="")))
    assert "x" not in data and torch.equal(data.feat, g.ndata["feat"][data.n_id])
    data = next(iter(PygTask(g).node_dataloader(torch.arange(32), [3], 16, edge_key="")))
    assert "edge_attr" not in data and "x" in data and torch.equal(data.x, g.ndata["feat"][data.n_id])


@pytest.mark.parametrize("sampling", SAMPLING)
def test_heterodata_fields_are_each_types_own(sampling):
    """Type a reads feat as x and also has node data x; type b has only x, carried as its x: a.x is feat."""
    gen = torch.Generator().manual_seed(13)
    g = dgl.heterograph({("a", "r", "a"): (torch.randint(0, 50, (300,), generator=gen),
                                           torch.randint(0, 50, (300,), generator=gen)),
                         ("b", "s", "a"): (torch.randint(0, 40, (300,), generator=gen),
                                           torch.randint(0, 50, (300,), generator=gen))}, {"a": 50, "b": 40})
    g.nodes["a"].data["feat"], g.nodes["a"].data["x"] = torch.randn(50, 4, generator=gen), torch.full((50, 4), 7.0)
    g.nodes["a"].data["label"] = torch.randint(0, 3, (50,), generator=gen)
    g.nodes["b"].data["x"], g.nodes["b"].data["y"] = torch.randn(40, 4, generator=gen), torch.arange(40)
    for data in placed(PygTask(g).node_dataloader({"a": torch.arange(20)}, [3, 3], 10), sampling):
        a, b = data["a"], data["b"]
        assert torch.equal(a.x, g.nodes["a"].data["feat"][a.n_id]) and torch.equal(b.x, g.nodes["b"].data["x"][b.n_id])
        assert torch.equal(a.y, g.nodes["a"].data["label"][a.n_id]) and torch.equal(b.y, b.n_id)
    with pytest.raises(ValueError, match=r"node type 'a'.*node data 'x'.*the batch's x, read from 'feat'"):
        PygTask(g).node_dataloader({"a": torch.arange(20)}, [3, 3], 10, attrs=["x"])


def test_to_pyg_of_a_heterographs_blocks_names_to_hetero_pyg_whatever_their_data():
    g = random_hetero(5)
    g.nodes["c"].data["w"] = torch.rand(g.num_nodes("c"))  # a node type and a relation may share a name
    g.edges[("a", "r2", "b")].data["w"] = torch.rand(g.num_edges(("a", "r2", "b")))
    batch = next(iter(PygTask(g).node_dataloader({"a": torch.arange(16)}, [2], 8, batch_format="dgl")))
    with pytest.raises(ValueError, match=r"blocks of a homogeneous graph.*to_hetero_pyg"):
        to_pyg(batch)


@pytest.mark.timeout(300)
def test_a_pyg_step_reads_them_under_trainer_device_sampling(root_dir):
    from conftest import rank_children
    from pyg_tasks import MaskedPygDataTask, masked_pyg_data

    trainer = Trainer(num_procs=2, launcher="fork", max_epochs=1, seed=1, sampling="device", threads_per_proc=1,
                      progress_bar=False, logger=False, default_root_dir=root_dir, enable_model_summary=False)
    trainer.fit(MaskedPygDataTask(masked_pyg_data()))
    epoch = trainer.history[-1]
    assert epoch["wrong_attr_rows"] == 0 and epoch["unmasked_seeds"] == 0 and epoch["wrong_rows"] == 0
    assert not rank_children()
