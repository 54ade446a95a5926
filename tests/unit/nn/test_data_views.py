"""DGL's single-type semantics of the data views on torch heterographs: ``srcdata``, ``dstdata``,
``ndata`` and ``edata`` give (and take) a tensor where the graph has one type on that side (one
relation for ``edata``), ``{type: tensor}`` where it has several, as DGL's views do; checked
against DGL's own blocks and graphs, converted and sampled on the device."""
from __future__ import annotations

import pickle

import graphtrainer  # noqa: F401  (first: its DGL compatibility layer must precede `import dgl`)
import dgl
import pytest
import torch

from graphtrainer.nn import TorchHeteroBlock, to_torch_graph

from test_block_api import hetero_dgl_block
from test_nn_layers import _one_thread  # noqa: F401  (autouse fixture)

CITES, LINKS = ("n", "cites", "n"), ("n", "links", "n")


def one_type_graph(n: int = 30, seed: int = 0) -> dgl.DGLGraph:
    """One node type, two relations, data on the nodes and on one relation."""
    gen = torch.Generator().manual_seed(seed)

    def rel(e: int):
        return torch.randint(0, n, (e,), generator=gen), torch.randint(0, n, (e,), generator=gen)

    g = dgl.heterograph({CITES: rel(90), LINKS: rel(60)}, {"n": n})
    g.ndata["feat"] = torch.randn(n, 3, generator=gen)
    g.ndata["label"] = torch.arange(n)
    g.edges["cites"].data["w"] = torch.rand(90, generator=gen)
    return g


def one_type_block() -> dgl.DGLGraph:
    g = one_type_graph()
    seeds = torch.tensor([0, 3, 7])
    return dgl.to_block(dgl.in_subgraph(g, seeds), seeds)


def one_relation_block() -> dgl.DGLGraph:
    """Two node types, one relation."""
    g = dgl.heterograph({("user", "buys", "item"): (torch.tensor([0, 1, 2, 2]), torch.tensor([0, 0, 1, 2]))})
    g.nodes["user"].data["feat"] = torch.randn(3, 2)
    g.edata["w"] = torch.rand(4)
    seeds = {"item": torch.tensor([0, 1])}
    return dgl.to_block(dgl.in_subgraph(g, seeds), seeds)


def same_view(mine, dgls) -> None:
    """Keys, ``in``, ``len``, iteration and every value (tensor, or dict per type) as DGL's."""
    assert sorted(mine.keys()) == sorted(dgls.keys()) and sorted(mine) == sorted(dgls)
    assert len(mine) == len(dgls)
    for key in dgls.keys():
        assert key in mine
        ref, got = dgls[key], mine[key]
        assert type(got) is type(ref), key
        if isinstance(ref, dict):
            assert got.keys() == ref.keys() and all(torch.equal(got[t], ref[t]) for t in ref), key
        else:
            assert torch.equal(got, ref), key
    assert dict(mine.items()).keys() == dict(dgls.items()).keys() and len(list(mine.values())) == len(dgls)
    assert "nosuch" not in mine


def test_one_node_type_and_several_relations_give_tensors_for_nodes_and_dicts_for_edges():
    block = one_type_block()
    tb = to_torch_graph(block)
    assert isinstance(tb, TorchHeteroBlock) and isinstance(block.srcdata["feat"], torch.Tensor)
    same_view(tb.srcdata, block.srcdata)
    same_view(tb.dstdata, block.dstdata)
    same_view(tb.edata, block.edata)
    assert isinstance(tb.edata["_ID"], dict) and tb.srcdata["feat"] is tb.srcnodes["n"].data["feat"]  # no copies


def test_several_node_types_and_one_relation_give_dicts_for_nodes_and_tensors_for_edges():
    block = one_relation_block()
    tb = to_torch_graph(block)
    assert isinstance(tb, TorchHeteroBlock)
    same_view(tb.srcdata, block.srcdata)
    same_view(tb.dstdata, block.dstdata)
    same_view(tb.edata, block.edata)
    assert isinstance(tb.edata["w"], torch.Tensor) and tb.srcdata["feat"].keys() == {"user"}


def test_several_node_types_and_relations_give_dicts_as_before():
    block = hetero_dgl_block()
    tb = to_torch_graph(block)
    for mine, dgls in ((tb.srcdata, block.srcdata), (tb.dstdata, block.dstdata), (tb.edata, block.edata)):
        same_view(mine, dgls)
    # Each read is a new dict, as DGL's: changing it leaves the graph as it is.
    tb.srcdata["feat"].pop("user")
    assert tb.srcdata["feat"].keys() == {"user", "item"}


def test_pair_graphs_ndata_as_dgl():
    one = dgl.heterograph({CITES: (torch.tensor([0, 1]), torch.tensor([1, 2])),
                           LINKS: (torch.tensor([2]), torch.tensor([0]))}, {"n": 3})
    one.ndata[dgl.NID] = torch.tensor([10, 11, 12])
    one.edata[dgl.EID] = {CITES: torch.tensor([5, 6]), LINKS: torch.tensor([7])}
    two = dgl.heterograph({("user", "buys", "item"): (torch.tensor([0, 1]), torch.tensor([1, 0]))})
    two.ndata[dgl.NID] = {"user": torch.tensor([3, 4]), "item": torch.tensor([8, 9])}
    two.edata[dgl.EID] = torch.tensor([1, 2])
    for graph in (one, two):
        tg = to_torch_graph(graph)
        assert isinstance(tg, TorchHeteroBlock) and not tg.is_block
        # (DGL splits a graph whose relations all run from some types to others, as ``two``'s, into
        # source and destination types; a torch graph's srcdata and dstdata are its ndata.)
        for view in ("ndata", "edata") if graph.is_unibipartite else ("ndata", "srcdata", "dstdata", "edata"):
            same_view(getattr(tg, view), getattr(graph, view))


def test_setting_and_deleting_take_what_dgl_takes():
    block, rel = one_type_block(), one_relation_block()
    tb, tr = to_torch_graph(block), to_torch_graph(rel)
    h = torch.zeros(block.num_src_nodes())
    block.srcdata["h"] = h
    tb.srcdata["h"] = h
    same_view(tb.srcdata, block.srcdata)
    assert tb.srcnodes["n"].data["h"] is h
    with pytest.raises(AssertionError):
        block.srcdata["x"] = {"n": h}
    with pytest.raises(TypeError, match="one type"):
        tb.srcdata["x"] = {"n": h}
    del tb.srcdata["h"]
    assert "h" not in tb.srcdata and "h" not in tb.srcnodes["n"].data
    w = torch.ones(rel.num_edges())
    rel.edata["w2"] = w
    tr.edata["w2"] = w
    same_view(tr.edata, rel.edata)
    # several types: a dict, merged per type as DGL; a tensor is refused
    g = torch.ones(block.num_edges("links"))
    for graph in (block, tb):
        graph.edata["s"] = {"cites": torch.zeros(block.num_edges("cites"))}
        graph.edata["s"] = {LINKS: g}
    same_view(tb.edata, block.edata)
    with pytest.raises(TypeError, match="several types"):
        tb.edata["t"] = g
    with pytest.raises(KeyError):
        tb.edata["t"] = {"nosuch": g}
    with pytest.raises(TypeError, match="several types"):
        tr.srcdata["x"] = torch.zeros(3)


def test_views_survive_moves_scopes_and_pickling():
    tb = to_torch_graph(one_type_block())
    feat = tb.srcdata["feat"]
    for other in (tb.to("cpu"), pickle.loads(pickle.dumps(tb))):
        assert torch.equal(other.srcdata["feat"], feat) and isinstance(other.edata["w"], dict)
        other.srcdata["x"] = feat
        assert "x" not in tb.srcdata
    with tb.local_scope():
        tb.srcdata["feat"] = torch.zeros_like(feat)
        tb.dstdata["y"] = torch.ones(tb.num_dst_nodes())
    assert tb.srcdata["feat"] is feat and "y" not in tb.dstdata
    assert tb.tensors()["srcdata.feat.n"] is feat


def test_device_sampled_blocks_of_one_node_type_read_as_the_cpu_paths_dgl_blocks():
    from graphtrainer.data.device import mode
    from graphtrainer.data.edge_loader import EdgeLoader
    from graphtrainer.data.node_loader import NodeLoader, default_sampler

    g = one_type_graph()
    cpu_dev = torch.device("cpu")
    batches = []
    for device in (False, True):
        loader = NodeLoader(g, torch.arange(0, 30, 2), default_sampler(g, [-1, -1]), 8)
        assert not device or mode.place(loader, cpu_dev, "device", announce=False) == "device"
        batches.append(next(iter(loader)))
    (inputs_c, seeds_c, dgls), (inputs, seeds, blocks) = batches
    assert isinstance(blocks[0], TorchHeteroBlock) and isinstance(blocks[0].srcdata["feat"], torch.Tensor)
    assert torch.equal(seeds, seeds_c) and torch.equal(blocks[-1].dstdata["label"], dgls[-1].dstdata["label"])
    # The same input nodes (DGL orders them its own way with several relations): the same rows.
    mine, ref = blocks[0].srcdata, dgls[0].srcdata
    order, order_c = torch.argsort(mine["_ID"]), torch.argsort(ref["_ID"])
    assert torch.equal(mine["_ID"][order], ref["_ID"][order_c]) and torch.equal(inputs, blocks[0].srcdata["_ID"])
    assert torch.equal(mine["feat"][order], ref["feat"][order_c])
    assert sorted(blocks[0].edata["_ID"]) == sorted(dgls[0].edata["_ID"]) == [CITES, LINKS]
    kwargs = dict(negatives=1, exclude="self", seed=1)
    cpu = EdgeLoader(g, {"cites": torch.arange(90)}, [3], 16, **kwargs)
    dev = EdgeLoader(g, {"cites": torch.arange(90)}, [3], 16, **kwargs)
    assert mode.place(dev, cpu_dev, "device", announce=False) == "device"
    (inputs_c, pos_c, _, _), (inputs, pos, neg, blocks) = next(iter(cpu)), next(iter(dev))
    assert isinstance(inputs, torch.Tensor) and isinstance(inputs_c, torch.Tensor)
    assert torch.equal(pos.ndata["_ID"].sort().values, pos_c.ndata["_ID"].sort().values)
    assert torch.equal(pos.ndata["feat"], g.ndata["feat"][pos.ndata["_ID"]])
    assert isinstance(neg.ndata["_ID"], torch.Tensor) and isinstance(pos.edata["_ID"], dict)


def test_the_old_store_names_still_build_a_block_with_a_deprecation_warning():
    from graphtrainer.nn import TorchBlock, TorchHeteroBlock

    rel = TorchBlock(torch.tensor([0, 1]), torch.tensor([0]), torch.tensor([0]), 1, 1)
    et = ("a", "r", "b")
    x = torch.ones(1, 2)
    with pytest.warns(DeprecationWarning, match=r"TorchHeteroBlock\(srcdata=\.\.\.\) is now src_store="):
        block = TorchHeteroBlock({et: rel}, {"a": 1}, {"b": 1}, srcdata={"x": {"a": x}})
    assert block.srcdata["x"] is x and block.src_store == {"x": {"a": x}}
    with pytest.raises(TypeError, match="unexpected keyword argument 'nodedata'"):
        TorchHeteroBlock({et: rel}, {"a": 1}, {"b": 1}, nodedata={})
