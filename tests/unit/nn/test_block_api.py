"""Torch blocks read as DGL's blocks: the DGL API a training_step calls on a block, pair graph
or relation of a heterograph gives on a TorchBlock / TorchHeteroBlock what it gives on DGL's
(every test compares with DGL's own graph)."""
from __future__ import annotations

import graphtrainer  # noqa: F401  (first: its DGL compatibility layer must precede `import dgl`)
import dgl
import pytest
import torch

from graphtrainer.nn import to_torch_graph

from test_nn_layers import random_block
from test_nn_layers import _one_thread  # noqa: F401  (autouse fixture)

CLICKS = ("user", "clicks", "item")


def hetero_dgl_block() -> dgl.DGLGraph:
    """A block over users and items (three relations, one of them user -> user) with data on
    every source type, destination type and two relations."""
    gen = torch.Generator().manual_seed(0)

    def rel(n_src: int, n_dst: int, e: int):
        return torch.randint(0, n_src, (e,), generator=gen), torch.randint(0, n_dst, (e,), generator=gen)

    g = dgl.heterograph({CLICKS: rel(12, 9, 40), ("item", "clicked-by", "user"): rel(9, 12, 40),
                         ("user", "follows", "user"): rel(12, 12, 30)}, {"user": 12, "item": 9})
    seeds = {"user": torch.arange(4), "item": torch.arange(3)}
    block = dgl.to_block(dgl.in_subgraph(g, seeds), seeds)
    for nt in block.srctypes:
        block.srcnodes[nt].data["feat"] = torch.randn(block.num_src_nodes(nt), 3, generator=gen)
    block.dstnodes["item"].data["label"] = torch.arange(block.num_dst_nodes("item"))
    block.edges["clicks"].data["w"] = torch.rand(block.num_edges("clicks"), generator=gen)
    block.edges["follows"].data["w"] = torch.rand(block.num_edges("follows"), generator=gen)
    return block


def same_data(mine, dgls) -> None:
    assert sorted(mine.keys()) == sorted(dgls.keys())
    for key in dgls.keys():
        assert torch.equal(mine[key], dgls[key]), key


def test_a_relation_of_a_hetero_block_has_its_types_data_as_dgl():
    block = hetero_dgl_block()
    tb = to_torch_graph(block)
    for et in block.canonical_etypes:
        for key in (et, et[1]):
            ref, rel = block[key], tb[key]
            same_data(rel.srcdata, ref.srcdata)
            same_data(rel.dstdata, ref.dstdata)
            same_data(rel.edata, ref.edata)
            assert rel.canonical_etype == ref.canonical_etypes[0] and rel.is_block
            assert (rel.num_src_nodes(), rel.num_dst_nodes(), rel.num_edges()) == \
                (ref.num_src_nodes(), ref.num_dst_nodes(), ref.num_edges())
    rel = tb["clicks"]
    assert rel.srcdata["feat"] is tb.srcdata["feat"]["user"]  # the same tensors, no copies
    assert rel.edata[dgl.EID] is tb.edata[dgl.EID][CLICKS]
    # One view per relation, so what a layer's forward caches on it (dst_index) is kept;
    # a moved copy makes its own.
    assert tb[CLICKS] is rel and torch.equal(rel.dst_index(), tb["clicks"]._dst_index)
    assert tb.to("cpu")["clicks"] is not rel


def test_data_set_on_a_relation_is_set_on_the_hetero_block_as_in_dgl():
    block = hetero_dgl_block()
    tb = to_torch_graph(block)
    x = torch.ones(block.num_src_nodes("user"))
    block["clicks"].srcdata["x"] = x
    tb["clicks"].srcdata["x"] = x
    assert torch.equal(block.srcnodes["user"].data["x"], x) and tb.srcdata["x"] == {"user": x}
    tb["follows"].edata["s"] = s = torch.zeros(tb.num_edges("follows"))
    assert tb.edata["s"] == {("user", "follows", "user"): s}
    del tb["clicks"].srcdata["x"]
    assert "x" not in tb.srcdata and "x" not in tb["follows"].srcdata


def hetero_pair_graph() -> dgl.DGLGraph:
    g = dgl.heterograph({CLICKS: (torch.tensor([0, 1, 2]), torch.tensor([0, 0, 1])),
                         ("user", "follows", "user"): (torch.tensor([0]), torch.tensor([2]))},
                        {"user": 4, "item": 2})
    g.ndata[dgl.NID] = {"user": torch.arange(4) + 10, "item": torch.arange(2) + 20}
    return g


def homogeneous_graphs():
    """A block, a pair graph, and a block of a graph with one node type and one relation of its own names."""
    pair = dgl.graph((torch.tensor([4, 0, 2]), torch.tensor([1, 3, 0])), num_nodes=5)
    named = dgl.heterograph({("n", "r", "n"): (torch.tensor([0, 1, 2, 2]), torch.tensor([1, 2, 0, 1]))})
    seeds = torch.tensor([0, 1])
    return [random_block(0), pair, dgl.to_block(dgl.in_subgraph(named, seeds), seeds)]


def test_num_nodes_counts_as_dgl_on_blocks_and_graphs():
    for graph in [*homogeneous_graphs(), hetero_dgl_block(), hetero_pair_graph()]:
        tg = to_torch_graph(graph)
        assert tg.num_nodes() == graph.num_nodes()
        types = dict.fromkeys([*graph.srctypes, *graph.dsttypes])
        names = [*types, *(f"{side}/{t}" for t in types for side in ("SRC", "DST"))] if graph.is_block else types
        for ntype in names:
            assert tg.num_nodes(ntype) == graph.num_nodes(ntype), ntype
        with pytest.raises(KeyError, match="nosuch"):
            tg.num_nodes("nosuch")
    block = to_torch_graph(hetero_dgl_block())
    assert block.num_nodes("user") == block.num_src_nodes("user") != block.num_dst_nodes("user")


def same(mine, dgls) -> None:
    if isinstance(dgls, tuple):
        assert len(mine) == len(dgls)
        for a, b in zip(mine, dgls):
            same(a, b)
    else:
        assert torch.equal(mine, dgls) and mine.dtype == dgls.dtype


def by_edge_id_among_parallel_edges(src, dst, eid):
    """DGL's srcdst order with parallel edges (same source and destination) in edge-id order: DGL's
    own order among them follows how its CSR was built."""
    perm = torch.argsort(eid, stable=True)
    perm = perm[torch.argsort(dst[perm], stable=True)]
    perm = perm[torch.argsort(src[perm], stable=True)]
    return src[perm], dst[perm], eid[perm]


def test_edges_takes_dgls_forms_and_orders():
    multi = dgl.graph((torch.tensor([0, 1, 2, 3, 2, 0, 1, 0]), torch.tensor([1, 2, 0, 0, 1, 1, 1, 1])), num_nodes=5)
    for graph in [*homogeneous_graphs(), multi, dgl.to_block(multi, torch.tensor([0, 1, 2])), hetero_pair_graph()]:
        tg = to_torch_graph(graph)
        etype = {"etype": "clicks"} if len(graph.canonical_etypes) > 1 else {}
        for form in ("uv", "eid", "all"):
            for order in (None, "eid"):
                same(tg.edges(form=form, order=order, **etype), graph.edges(form=form, order=order, **etype))
        ref = by_edge_id_among_parallel_edges(*graph.edges(form="all", order="srcdst", **etype))
        same(tg.edges(form="all", order="srcdst", **etype), ref)
        same(tg.edges(order="srcdst", **etype), ref[:2])
        same(tg.edges(form="eid", order="srcdst", **etype), ref[2])
        with pytest.raises(ValueError, match="'uv', 'eid', 'all'"):
            tg.edges(form="nosuch", **etype)
        with pytest.raises(ValueError, match="None, 'eid', 'srcdst'"):
            tg.edges(order="dst", **etype)
    ours = to_torch_graph(multi).edges(form="all", order="srcdst")
    assert ours[2].tolist() == [0, 5, 7, 6, 1, 2, 4, 3]  # 0 -> 1 three times: edge ids 0, 5, 7


def test_degrees_take_dgls_node_ids_and_etype():
    for graph in [*homogeneous_graphs(), hetero_dgl_block(), hetero_pair_graph()]:
        tg = to_torch_graph(graph)
        for et in graph.canonical_etypes:
            etype = {"etype": et[1]} if len(graph.canonical_etypes) > 1 else {}
            for fn in ("in_degrees", "out_degrees"):
                mine, dgls = getattr(tg, fn), getattr(graph, fn)
                same(mine(**etype), dgls(**etype))
                same(mine(torch.tensor([1, 0, 1]), **etype), dgls(torch.tensor([1, 0, 1]), **etype))
                same(mine([0, 1], **etype), dgls([0, 1], **etype))
                assert mine(1, **etype) == dgls(1, **etype) and isinstance(mine(1, **etype), int)
                if etype:
                    same(mine(torch.tensor([0]), et[1]), dgls(torch.tensor([0]), et[1]))  # positional v, etype
                    same(mine(dgl.ALL, et), dgls(dgl.ALL, et))
                with pytest.raises(ValueError, match="node ids run from 0"):
                    mine(10 ** 6, **etype)
    with pytest.raises(ValueError, match="pass etype="):
        to_torch_graph(hetero_dgl_block()).out_degrees()


def test_dgl_names_types_and_views_match_dgl():
    for graph in [*homogeneous_graphs(), hetero_dgl_block(), hetero_pair_graph()]:
        tg = to_torch_graph(graph)
        for name in ("ntypes", "srctypes", "dsttypes", "etypes", "canonical_etypes", "is_block", "idtype"):
            assert getattr(tg, name) == getattr(graph, name), name
        assert tg.number_of_nodes() == graph.number_of_nodes() and tg.number_of_edges() == graph.number_of_edges()
        for nt in graph.srctypes:
            same(tg.srcnodes(nt), graph.srcnodes(nt))
            same_data(tg.srcnodes[nt].data, graph.srcnodes[nt].data)
            same_data(tg.nodes[nt].data, graph.nodes[nt].data)
            assert tg.number_of_nodes(nt) == graph.number_of_nodes(nt)
        for nt in graph.dsttypes:
            same(tg.dstnodes(nt), graph.dstnodes(nt))
            same_data(tg.dstnodes[nt].data, graph.dstnodes[nt].data)
        for et in graph.canonical_etypes:
            for key in (et, et[1]):
                same_data(tg.edges[key].data, graph.edges[key].data)
            assert tg.number_of_edges(et) == graph.number_of_edges(et)
        if len(graph.srctypes) == 1:
            same(tg.srcnodes(), graph.srcnodes())
        with pytest.raises(KeyError, match="nosuch"):
            tg.srcnodes["nosuch"]
    tb = to_torch_graph(hetero_dgl_block())
    tb.srcnodes["user"].data["x"] = x = torch.zeros(tb.num_src_nodes("user"))
    tb.edges["clicks"].data["s"] = s = torch.zeros(tb.num_edges("clicks"))
    assert tb.srcdata["x"] == {"user": x} and tb.edata["s"] == {CLICKS: s}  # written through, as in DGL


def test_local_scope_undoes_data_set_inside_as_dgl():
    for graph in [random_block(0), hetero_pair_graph(), hetero_dgl_block()]:
        tg = to_torch_graph(graph)
        for g in (graph, tg):
            nt, et = g.srctypes[-1], g.canonical_etypes[0]
            before = dict(g.srcnodes[nt].data)
            with g.local_scope():
                g.srcnodes[nt].data["tmp"] = torch.ones(g.num_src_nodes(nt))
                g.srcnodes[nt].data[dgl.NID] = g.srcnodes[nt].data[dgl.NID] + 1  # replaced inside
                g.edges[et].data["w2"] = torch.ones(g.num_edges(et))
                assert "tmp" in g.srcnodes[nt].data
            after = dict(g.srcnodes[nt].data)
            assert "w2" not in g.edges[et].data and after.keys() == before.keys()
            assert all(after[k] is before[k] for k in after), type(g)


def test_missing_dgl_api_names_what_a_torch_block_has():
    tb = to_torch_graph(random_block(1))
    with pytest.raises(AttributeError, match="has no 'has_edges_between'.*data views.*not DGL's message passing"):
        tb.has_edges_between(0, 1)
    with pytest.raises(AttributeError, match="has no 'apply_edges'.*graphtrainer.nn layers.*block_type='dgl'"):
        tb.apply_edges(dgl.function.u_dot_v("h", "h", "s"))
