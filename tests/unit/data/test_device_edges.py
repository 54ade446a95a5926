"""Link-prediction batches sampled on the device against what the CPU path (DGL's
``as_edge_prediction_sampler``) promises: pair graphs over the seed edges, the same negatives,
and the seed edges (and reverses) kept out of every block; homogeneous and heterograph."""
from __future__ import annotations

import pytest
import torch

import graphtrainer  # noqa: F401  (DGL's compatibility layer first)
import dgl

from graphtrainer.data.device import mode
from graphtrainer.data.edge_loader import EdgeLoader

from link_tasks import symmetric_graph

CPU = torch.device("cpu")


def _sorted_pairs(u, v):
    """Edges as sorted (u, v) keys: DGL orders a pair graph's edges its own way when it excludes."""
    return torch.sort(u * 100_000 + v).values


def _on_device(loader):
    assert mode.place(loader, CPU, "device", announce=False) == "device"
    return loader


def _graph_ids(pair, etype=None):
    u, v = pair.edges(etype=etype) if etype is not None else pair.edges()
    nodes = pair.srcdata["_ID"]
    if etype is not None:
        return nodes[etype[0]][u], nodes[etype[2]][v]
    return nodes[u], nodes[v]


@pytest.mark.parametrize("exclude", [None, "self", "reverse_id"])
def test_pairs_negatives_and_exclusion_on_a_homogeneous_graph(exclude):
    g, reverse = symmetric_graph()
    seeds = torch.arange(0, 600, 3)
    kwargs = dict(negatives=2, exclude=exclude, reverse_eids=reverse if exclude == "reverse_id" else None, seed=7)
    cpu = EdgeLoader(g, seeds, [4, 4], 32, **kwargs)
    dev = _on_device(EdgeLoader(g, seeds, [4, 4], 32, **kwargs))
    for (_, pos_c, neg_c, _), (inputs, pos, neg, blocks) in zip(cpu, dev):
        eids = pos.edata["_ID"]
        assert torch.equal(eids.sort().values, pos_c.edata["_ID"].sort().values)  # the same seed edges
        u, v = _graph_ids(pos)
        gu, gv = g.find_edges(eids)
        assert torch.equal(u, gu) and torch.equal(v, gv)
        cu, cv = neg_c.ndata["_ID"][neg_c.edges()[0]], neg_c.ndata["_ID"][neg_c.edges()[1]]
        assert torch.equal(_sorted_pairs(*_graph_ids(neg)), _sorted_pairs(cu, cv))  # the same negatives
        assert torch.equal(blocks[-1].dstdata["_ID"], pos.srcdata["_ID"])  # blocks end at the pair nodes
        assert torch.equal(blocks[0].srcdata["feat"], g.ndata["feat"][inputs])
        banned = set()
        if exclude is not None:
            banned = set(eids.tolist()) | (set(reverse[eids].tolist()) if exclude == "reverse_id" else set())
        for b in blocks:
            assert not banned & set(b.edata["_ID"].tolist())


def test_node_pairs_that_are_not_edges():
    g, _ = symmetric_graph()
    src, dst = torch.tensor([0, 5, 7, 59]), torch.tensor([1, 1, 40, 2])
    dev = _on_device(EdgeLoader(g, (src, dst), [3], 2, negatives=1, seed=3).for_evaluation())
    seen = [torch.stack(_graph_ids(pos)) for _, pos, _, _ in dev]
    assert torch.equal(torch.cat(seen, 1), torch.stack([src, dst]))


def test_heterograph_typed_seeds_and_reverse_types():
    gen = torch.Generator().manual_seed(1)
    u, i = torch.randint(0, 30, (120,), generator=gen), torch.randint(0, 20, (120,), generator=gen)
    g = dgl.heterograph({("user", "buys", "item"): (u, i), ("item", "bought-by", "user"): (i, u),
                         ("user", "follows", "user"): (torch.randint(0, 30, (50,), generator=gen),
                                                       torch.randint(0, 30, (50,), generator=gen))})
    g.nodes["user"].data["feat"] = torch.randn(30, 3, generator=gen)
    g.nodes["item"].data["feat"] = torch.randn(20, 3, generator=gen)
    loader = _on_device(EdgeLoader(g, {"buys": torch.arange(120), "follows": torch.arange(50)}, [3, 3], 16,
                                   negatives=1, exclude="reverse_types",
                                   reverse_etypes={"buys": "bought-by", "bought-by": "buys"}, seed=2))
    cpu = EdgeLoader(g, {"buys": torch.arange(120), "follows": torch.arange(50)}, [3, 3], 16, negatives=1,
                     exclude="reverse_types", reverse_etypes={"buys": "bought-by", "bought-by": "buys"}, seed=2)
    buys = ("user", "buys", "item")
    for (_, pos_c, neg_c, _), (inputs, pos, neg, blocks) in zip(cpu, loader):
        assert set(pos.canonical_etypes) == set(g.canonical_etypes)
        for et in (buys, ("user", "follows", "user")):
            eids = pos.edata["_ID"][et]
            assert torch.equal(eids.sort().values, pos_c.edges[et].data["_ID"].sort().values)
            gu, gv = g.find_edges(eids, etype=et)
            assert torch.equal(torch.stack(_graph_ids(pos, et)), torch.stack([gu, gv]))
            nc_u, nc_v = neg_c.edges(etype=et)
            expected = torch.stack([neg_c.ndata["_ID"][et[0]][nc_u], neg_c.ndata["_ID"][et[2]][nc_v]])
            assert torch.equal(_sorted_pairs(*_graph_ids(neg, et)), _sorted_pairs(*expected))
        banned = set(pos.edata["_ID"][buys].tolist())
        for b in blocks:  # a bought edge and its reverse share an id
            assert not banned & set(b.edata["_ID"][buys].tolist())
            assert not banned & set(b.edata["_ID"][("item", "bought-by", "user")].tolist())
        for nt in g.ntypes:
            assert torch.equal(blocks[-1].dstdata["_ID"][nt], pos.srcdata["_ID"][nt])


def test_exclude_self_keeps_the_reverse_relation_as_dgl_does():
    """``exclude="self"`` with ``reverse_etypes`` given (for a later switch, say) leaves the
    reverse edges in the blocks, as DGL's sampler does; only "reverse_types" takes them out."""
    gen = torch.Generator().manual_seed(4)
    u, i = torch.randint(0, 12, (200,), generator=gen), torch.randint(0, 8, (200,), generator=gen)
    g = dgl.heterograph({("user", "buys", "item"): (u, i), ("item", "bought-by", "user"): (i, u)})
    kwargs = dict(negatives=None, exclude="self", reverse_etypes={"buys": "bought-by", "bought-by": "buys"}, seed=0)
    seeds = {"buys": torch.arange(200)}
    bought_by = ("item", "bought-by", "user")
    reverse_edges = {"cpu": 0, "device": 0}
    for where, loader in (("cpu", EdgeLoader(g, seeds, [-1], 200, **kwargs)),
                          ("device", _on_device(EdgeLoader(g, seeds, [-1], 200, **kwargs)))):
        for batch in loader:
            blocks = batch[-1]
            reverse_edges[where] += blocks[0].num_edges(bought_by) if where == "cpu" else \
                int(blocks[0].edata["_ID"][bought_by].numel())
            assert blocks[0].num_edges(("user", "buys", "item")) == 0  # the seed edges themselves: out
    assert reverse_edges["device"] == reverse_edges["cpu"] > 0


def test_an_edge_loader_counts_its_edge_id_index_in_the_budget():
    """Edge loaders over edge ids index the structure by edge id (8 bytes per edge): counted
    before the copy, and in the copy once built, so a fixed budget sees it."""
    from graphtrainer.data.device.graph import drop_copies, plan_copy, position_bytes

    g, reverse = symmetric_graph()
    drop_copies(g)
    node_plan = plan_copy(g, CPU, {"_N": ("feat",)}, {}, None)
    loader = EdgeLoader(g, torch.arange(0, 600, 3), [3], 32, negatives=1, exclude="self", seed=1)
    batches = mode.device_batches(loader, CPU)
    assert f"data {node_plan.structure + 8 * g.num_edges() + node_plan.data:,} bytes of" in batches.footprint
    copy = batches.graph
    before = copy.device_bytes()
    loader.use_device_sampling(batches)
    next(iter(loader))  # builds the index
    assert copy.device_bytes() == before + 8 * g.num_edges()
    assert position_bytes(g, CPU) == 0


def test_an_int32_graph_gets_int32_ids_as_from_dgl():
    """DGL hands out an int32 graph's ids in int32 (``g.find_edges`` refuses int64 ones there);
    the device path samples in int64 and hands them out in the graph's id type, same values."""
    from graphtrainer.data.node_loader import NodeLoader, default_sampler

    g64, _ = symmetric_graph()
    g32 = g64.int()
    batches = {}
    for g in (g64, g32):
        nodes = NodeLoader(g, torch.arange(0, 60, 2), default_sampler(g, [3, 3]), 8)
        assert mode.place(nodes, CPU, "device", announce=False) == "device"
        edges = _on_device(EdgeLoader(g, torch.arange(0, 600, 7), [3], 32, negatives=1, exclude="self", seed=1))
        batches[g.idtype] = (list(nodes), list(edges))
    for (nodes64, edges64), (nodes32, edges32) in [(batches[torch.int64], batches[torch.int32])]:
        for (i64, o64, b64), (i32, o32, b32) in zip(nodes64, nodes32):
            ids32 = [i32, o32] + [t for b in b32 for t in (b.srcdata["_ID"], b.dstdata["_ID"], b.edata["_ID"])]
            ids64 = [i64, o64] + [t for b in b64 for t in (b.srcdata["_ID"], b.dstdata["_ID"], b.edata["_ID"])]
            assert all(t.dtype == torch.int32 for t in ids32)
            assert all(torch.equal(a.long(), b) for a, b in zip(ids32, ids64))
            u, v = g32.find_edges(b32[0].edata["_ID"])  # refused for int64 ids on an int32 graph
            assert torch.equal(u, b32[0].srcdata["_ID"][b32[0].edges()[0]])
        for (i64, pos64, neg64, _), (i32, pos32, neg32, b32) in zip(edges64, edges32):
            for a, b in ((i32, i64), (pos32.ndata["_ID"], pos64.ndata["_ID"]), (pos32.edata["_ID"], pos64.edata["_ID"]),
                         (neg32.ndata["_ID"], neg64.ndata["_ID"])):
                assert a.dtype == torch.int32 and torch.equal(a.long(), b)
            assert torch.equal(torch.stack(g32.find_edges(pos32.edata["_ID"])).long(),
                               torch.stack(_graph_ids(pos64)))


def test_an_int32_graphs_device_blocks_and_pair_graphs_have_int32_structure_as_dgls():
    """DGL's blocks and pair graphs of an int32 graph are int32 graphs: ``idtype``, ``edges()``,
    ``nodes()``; the device path's were int64 (only their ``_ID`` data was int32)."""
    from graphtrainer.data.node_loader import NodeLoader, default_sampler

    g, reverse = symmetric_graph()
    g = g.int()
    hetero = dgl.heterograph({("a", "to", "b"): g.edges(), ("b", "back", "a"): g.edges()[::-1]},
                             num_nodes_dict={"a": 60, "b": 60}).int()
    for graph, seeds, eids in ((g, torch.arange(0, 60, 2), torch.arange(0, 600, 7)),
                               (hetero, {"b": torch.arange(0, 60, 2)}, {"to": torch.arange(0, 300, 7)})):
        nodes = NodeLoader(graph, seeds, default_sampler(graph, [3, 3]), 8)
        edges = EdgeLoader(graph, eids, [3], 32, negatives=1, exclude="self", seed=1)
        for loader in (nodes, edges):
            cpu = next(iter(loader))
            assert mode.place(loader, CPU, "device", announce=False) == "device"
            dev = next(iter(loader))
            for c, d in zip([*cpu[1:-1], *cpu[-1]], [*dev[1:-1], *dev[-1]]):
                if not isinstance(c, dgl.DGLGraph):
                    continue  # a node batch's seeds
                assert c.idtype == d.idtype == torch.int32
                for et in c.canonical_etypes:
                    u, v = d.edges(etype=et)
                    assert u.dtype == v.dtype == d.edges(form="eid", etype=et).dtype == torch.int32
            if loader is edges:
                assert dev[1].nodes(graph.ntypes[0]).dtype == torch.int32


@pytest.mark.parametrize("fanouts", [[4, 4], [4, 4, 4]])
@pytest.mark.parametrize("exclude,extra", [(None, 1), ("self", 2), ("reverse_id", 2)])
def test_a_link_batch_waits_once_per_layer_plus_once_for_its_pair_nodes_and_once_for_its_exclusion(
        fanouts, exclude, extra):
    """The node sampler's one wait per layer, and per batch one to number the pair graphs' nodes
    (``unique``) and one to sort out the excluded edges: on a GPU each is a synchronisation."""
    from graphtrainer.testing.op_count import OpCounter

    g, reverse = symmetric_graph()
    loader = EdgeLoader(g, torch.arange(600), fanouts, 32, negatives=2, exclude=exclude, seed=1,
                        reverse_eids=reverse if exclude == "reverse_id" else None)
    batches = iter(mode.device_batches(loader, CPU).iterate(torch.arange(600), 0, 0, 0))
    next(batches)  # constants made once
    with OpCounter() as counter:
        next(batches)
    assert counter.host_reads == len(fanouts) + extra, counter.by_op
