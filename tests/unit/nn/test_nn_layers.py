"""graphtrainer.nn layers against dgl.nn's: with the same weights, the same outputs and
gradients (1e-5, float32, CPU) on DGL blocks and on torch blocks converted from them, for
random graphs whose destinations include nodes without in-edges."""
from __future__ import annotations

import graphtrainer  # noqa: F401  (first: its DGL compatibility layer must precede `import dgl`)
import dgl
import dgl.function as dfn
import dgl.nn as dglnn
import pytest
import torch

import graphtrainer.nn as gnn
from graphtrainer.nn import to_torch_graph

TOL = dict(atol=1e-5, rtol=1e-5)


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny tensors: one intra-op thread (on a loaded machine, idle OpenMP threads spinning
    for a core cost more than these ops)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def random_block(seed: int, n: int = 60, e: int = 240, num_dst: int = 20, isolated: int = 3):
    """A block of ``num_dst`` seeds' full in-neighbourhoods; the first ``isolated`` seeds have none."""
    gen = torch.Generator().manual_seed(seed)
    src = torch.randint(0, n, (e,), generator=gen)
    dst = torch.randint(isolated, n, (e,), generator=gen)
    g = dgl.graph((src, dst), num_nodes=n)
    seeds = torch.arange(num_dst)
    return dgl.to_block(dgl.in_subgraph(g, seeds), seeds)


def random_graph(seed: int, n: int = 30, e: int = 90, isolated: int = 2):
    gen = torch.Generator().manual_seed(seed)
    return dgl.graph((torch.randint(0, n, (e,), generator=gen),
                      torch.randint(isolated, n, (e,), generator=gen)), num_nodes=n)


def run(layer, graph, x, *args, upstream_seed=7, **kwargs):
    """Output and gradients (input and parameters) of one forward and backward."""
    x = x.clone().requires_grad_(True)
    layer.zero_grad()
    out = layer(graph, x, *args, **kwargs)
    out = out[0] if isinstance(out, tuple) else out
    gen = torch.Generator().manual_seed(upstream_seed)
    (out * torch.randn(out.shape, generator=gen)).sum().backward()
    grads = {n: p.grad.clone() for n, p in layer.named_parameters() if p.grad is not None}
    return out.detach(), x.grad.clone(), grads


def assert_same(ref, got):
    out_r, xg_r, pg_r = ref
    out_g, xg_g, pg_g = got
    torch.testing.assert_close(out_g, out_r, **TOL)
    torch.testing.assert_close(xg_g, xg_r, **TOL)
    assert pg_g.keys() == pg_r.keys()
    for name in pg_r:
        torch.testing.assert_close(pg_g[name], pg_r[name], **TOL, msg=name)


def compare(make_dgl, make_ours, graph, x, *args, **kwargs):
    torch.manual_seed(0)
    ref_layer = make_dgl()
    torch.manual_seed(0)
    ours = make_ours()
    # Same parameter names and the same initial values for the same seed.
    assert ours.state_dict().keys() == ref_layer.state_dict().keys()
    for k, v in ref_layer.state_dict().items():
        assert torch.equal(ours.state_dict()[k], v), k
    ref = run(ref_layer, graph, x, *args, **kwargs)
    assert_same(ref, run(ours, graph, x, *args, **kwargs))
    assert_same(ref, run(ours, to_torch_graph(graph), x, *args, **kwargs))


@pytest.mark.parametrize("agg", ["mean", "gcn", "pool"])
@pytest.mark.parametrize("sizes", [(8, 5), (5, 8)])  # projection before / after aggregation
def test_sageconv_matches_dgl(agg, sizes):
    block = random_block(1)
    x = torch.randn(block.num_src_nodes(), sizes[0])
    compare(lambda: dglnn.SAGEConv(*sizes, agg), lambda: gnn.SAGEConv(*sizes, agg), block, x)
    w = torch.rand(block.num_edges())
    compare(lambda: dglnn.SAGEConv(*sizes, agg), lambda: gnn.SAGEConv(*sizes, agg), block, x, edge_weight=w)


def test_sageconv_on_a_plain_graph_and_with_feature_pairs():
    g = random_graph(2)
    x = torch.randn(g.num_nodes(), 6)
    compare(lambda: dglnn.SAGEConv(6, 4, "mean"), lambda: gnn.SAGEConv(6, 4, "mean"), g, x)
    compare(lambda: dglnn.SAGEConv(6, 4, "gcn", bias=False), lambda: gnn.SAGEConv(6, 4, "gcn", bias=False), g, x)


@pytest.mark.parametrize("norm", ["both", "right", "none", "left"])
@pytest.mark.parametrize("sizes", [(8, 5), (5, 8)])
def test_graphconv_matches_dgl(norm, sizes):
    for graph in (random_block(3), random_graph(4)):
        x = torch.randn(graph.num_src_nodes(), sizes[0])
        compare(lambda: dglnn.GraphConv(*sizes, norm=norm, allow_zero_in_degree=True),
                lambda: gnn.GraphConv(*sizes, norm=norm, allow_zero_in_degree=True), graph, x)
    w = torch.rand(graph.num_edges())
    compare(lambda: dglnn.GraphConv(*sizes, norm=norm, allow_zero_in_degree=True),
            lambda: gnn.GraphConv(*sizes, norm=norm, allow_zero_in_degree=True), graph, x, edge_weight=w)


def test_zero_in_degree_is_refused_as_dgl_refuses_it_and_self_loops_fix_it():
    g = random_graph(5)
    x = torch.randn(g.num_nodes(), 4)
    for layer in (gnn.GraphConv(4, 3), gnn.GATConv(4, 3, 2)):
        with pytest.raises(dgl.DGLError):
            (dglnn.GraphConv(4, 3) if isinstance(layer, gnn.GraphConv) else dglnn.GATConv(4, 3, 2))(g, x)
        for graph in (g, to_torch_graph(g)):
            with pytest.raises(ValueError, match="0-in-degree.*dgl.add_self_loop.*allow_zero_in_degree=True"):
                layer(graph, x)
    looped = dgl.add_self_loop(g)
    compare(lambda: dglnn.GraphConv(4, 3), lambda: gnn.GraphConv(4, 3), looped, x)


@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("in_feats", [6, (6, 5)])
def test_gatconv_matches_dgl(residual, in_feats):
    block = random_block(6)
    src = torch.randn(block.num_src_nodes(), 6)
    x = src if isinstance(in_feats, int) else src
    kw = dict(negative_slope=0.1, residual=residual, allow_zero_in_degree=True)
    if isinstance(in_feats, tuple):
        dst = torch.randn(block.num_dst_nodes(), 5)
        ref, ours = dglnn.GATConv(in_feats, 4, 3, **kw), gnn.GATConv(in_feats, 4, 3, **kw)
        ours.load_state_dict(ref.state_dict())
        for graph in (block, to_torch_graph(block)):
            torch.testing.assert_close(ours(graph, (src, dst)), ref(block, (src, dst)), **TOL)
        return
    compare(lambda: dglnn.GATConv(in_feats, 4, 3, **kw), lambda: gnn.GATConv(in_feats, 4, 3, **kw), block, x)
    w = torch.rand(block.num_edges())
    compare(lambda: dglnn.GATConv(in_feats, 4, 3, **kw), lambda: gnn.GATConv(in_feats, 4, 3, **kw), block, x,
            edge_weight=w)


def test_gatconv_dropout_and_attention_match_dgl_for_the_same_seed():
    block = random_block(7)
    x = torch.randn(block.num_src_nodes(), 6)
    kw = dict(feat_drop=0.3, attn_drop=0.4, allow_zero_in_degree=True)
    torch.manual_seed(0)
    ref = dglnn.GATConv(6, 4, 2, **kw)
    ours = gnn.GATConv(6, 4, 2, **kw)
    ours.load_state_dict(ref.state_dict())
    torch.manual_seed(11)
    ref_out, ref_att = ref(block, x, get_attention=True)
    for graph in (block, to_torch_graph(block)):
        torch.manual_seed(11)
        out, att = ours(graph, x, get_attention=True)
        torch.testing.assert_close(out, ref_out, **TOL)
        torch.testing.assert_close(att, ref_att, **TOL)


def hetero_block():
    from graphtrainer.datasets import synthetic_hetero

    g = synthetic_hetero(40, 16, avg_degree=3, words_per_paper=2, feat_dim=5, num_classes=3, seed=0)
    sampler = dgl.dataloading.MultiLayerFullNeighborSampler(1)
    _, _, (block,) = sampler.sample_blocks(g, {"paper": torch.arange(6), "word": torch.arange(4)})
    return g, block


@pytest.mark.parametrize("aggregate", ["sum", "mean", "max"])
def test_heterographconv_matches_dgl(aggregate):
    g, block = hetero_block()
    feats = {nt: torch.randn(block.num_src_nodes(nt), 5) for nt in block.srctypes}
    torch.manual_seed(0)
    ref = dglnn.HeteroGraphConv({et: dglnn.SAGEConv(5, 3, "mean") for _, et, _ in g.canonical_etypes}, aggregate)
    torch.manual_seed(0)
    ours = gnn.HeteroGraphConv({et: gnn.SAGEConv(5, 3, "mean") for _, et, _ in g.canonical_etypes}, aggregate)
    assert ours.state_dict().keys() == ref.state_dict().keys()

    def go(layer, graph):
        xs = {nt: v.clone().requires_grad_(True) for nt, v in feats.items()}
        layer.zero_grad()
        out = layer(graph, xs)
        sum(v.pow(2).sum() * (i + 1) for i, v in enumerate(out[nt] for nt in sorted(out))).backward()
        return out, {nt: v.grad for nt, v in xs.items()}, {n: p.grad for n, p in layer.named_parameters()}

    r_out, r_xg, r_pg = go(ref, block)
    for graph in (block, to_torch_graph(block)):
        out, xg, pg = go(ours, graph)
        assert out.keys() == r_out.keys()
        for nt in out:
            torch.testing.assert_close(out[nt], r_out[nt], **TOL)
        for nt in xg:
            torch.testing.assert_close(xg[nt], r_xg[nt], **TOL)
        for n in r_pg:
            if r_pg[n] is None:
                assert pg[n] is None
            else:
                torch.testing.assert_close(pg[n], r_pg[n], **TOL)


def test_heterographconv_on_a_whole_heterograph():
    g, _ = hetero_block()
    feats = {nt: torch.randn(g.num_nodes(nt), 5) for nt in g.ntypes}
    torch.manual_seed(0)
    ref = dglnn.HeteroGraphConv({et: dglnn.GraphConv(5, 3) for et in g.etypes}, "sum")
    ours = gnn.HeteroGraphConv({et: gnn.GraphConv(5, 3) for et in g.etypes}, "sum")
    ours.load_state_dict(ref.state_dict())
    expected, got = ref(g, feats), ours(g, feats)
    for nt in expected:
        torch.testing.assert_close(got[nt], expected[nt], **TOL)


@pytest.mark.parametrize("op, ref", [("sum", dglnn.SumPooling), ("mean", dglnn.AvgPooling),
                                     ("max", dglnn.MaxPooling)])
def test_readouts_match_dgl(op, ref):
    graphs = [random_graph(s, n=5 + s, e=10 + 2 * s) for s in range(4)]
    batched = dgl.batch(graphs)
    x = torch.randn(batched.num_nodes(), 3)
    ours = {"sum": gnn.SumPooling, "mean": gnn.AvgPooling, "max": gnn.MaxPooling}[op]()
    for graph in (batched, to_torch_graph(batched)):
        xa, xb = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
        expected, got = ref()(batched, xa), ours(graph, xb)
        torch.testing.assert_close(got, expected, **TOL)
        (expected * torch.arange(1.0, 4.0)).sum().backward()
        (got * torch.arange(1.0, 4.0)).sum().backward()
        torch.testing.assert_close(xb.grad, xa.grad, **TOL)


def test_edge_scores_match_dgl_on_pair_graphs():
    pair = dgl.graph((torch.tensor([0, 3, 2, 5]), torch.tensor([1, 1, 4, 0])), num_nodes=6)
    h = torch.randn(6, 4)
    with pair.local_scope():
        pair.ndata["h"] = h
        pair.apply_edges(dfn.u_dot_v("h", "h", "s"))
        expected = pair.edata["s"].squeeze(-1)
    torch.manual_seed(0)
    mlp = gnn.EdgeScorer("mlp", 4)
    for graph in (pair, to_torch_graph(pair)):
        torch.testing.assert_close(gnn.EdgeScorer("dot")(graph, h), expected, **TOL)
        src, dst = pair.edges()
        torch.testing.assert_close(mlp(graph, h), mlp.mlp(h[src] * h[dst]).squeeze(-1))


def test_unsupported_inputs_fail_clearly_before_computing():
    with pytest.raises(ValueError, match="aggregator_type='lstm'.*choose one of"):
        gnn.SAGEConv(4, 4, "lstm")
    with pytest.raises(ValueError, match="norm='sym'"):
        gnn.GraphConv(4, 4, norm="sym")
    with pytest.raises(ValueError, match="aggregate='prod'"):
        gnn.HeteroGraphConv({}, "prod")
    with pytest.raises(ValueError, match="op='cos'"):
        gnn.EdgeScorer("cos")
    g, block = hetero_block()
    with pytest.raises(ValueError, match="SAGEConv got a graph with relations.*HeteroGraphConv"):
        gnn.SAGEConv(5, 3, "mean")(to_torch_graph(block), torch.randn(3, 5))
    coo_only = random_block(8).formats("coo")
    for graph in (coo_only,):
        with pytest.raises(ValueError, match=r"SAGEConv: cannot read the graph's in-edges in CSC.*'csc' allowed"):
            gnn.SAGEConv(4, 3, "mean")(graph, torch.randn(graph.num_src_nodes(), 4))
        with pytest.raises(ValueError, match="CSC"):
            to_torch_graph(graph)


def test_int32_graphs_match_dgl():
    block = random_block(9).int()
    x = torch.randn(block.num_src_nodes(), 6)
    w = torch.rand(block.num_edges())
    compare(lambda: dglnn.SAGEConv(6, 4, "pool"), lambda: gnn.SAGEConv(6, 4, "pool"), block, x, edge_weight=w)
    compare(lambda: dglnn.GATConv(6, 4, 2, allow_zero_in_degree=True),
            lambda: gnn.GATConv(6, 4, 2, allow_zero_in_degree=True), block, x, edge_weight=w)
    src, dst = to_torch_graph(block).edges()
    assert torch.equal(src, block.edges()[0]) and torch.equal(dst, block.edges()[1])


def test_layers_run_under_bf16_autocast_close_to_float32():
    """Trainer(precision="bf16-mixed") runs the steps under CPU autocast: sparse kernels have no
    bfloat16, so aggregation keeps its input's precision; results stay near float32's."""
    block = random_block(10)
    x = torch.randn(block.num_src_nodes(), 6)
    for make in (lambda: gnn.SAGEConv(6, 4, "mean"), lambda: gnn.GraphConv(6, 4, allow_zero_in_degree=True),
                 lambda: gnn.GATConv(6, 4, 2, allow_zero_in_degree=True)):
        layer = make()
        expected = layer(block, x)
        for graph in (block, to_torch_graph(block)):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                got = layer(graph, x)
            got.float().sum().backward()
            torch.testing.assert_close(got.float(), expected, atol=0.05, rtol=0.05)
