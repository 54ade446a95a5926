"""Layer-wise full-graph inference equals a full-graph forward, in one process and across
ranks with uneven node counts per rank, and fails clearly on models and inputs it cannot use."""
from __future__ import annotations

import pytest
import torch

from graphtrainer import Trainer
from graphtrainer.data.inference import layerwise, node_range
from graphtrainer.models import SAGE
from graphtrainer.loop.seeding import seed_all

from conftest import rank_children
from hetero_tasks import LayerwiseTask, hetero_model, make_hetero
from tasks import make_graph


def test_node_ranges_cover_every_node_once():
    for n, world in [(161, 3), (5, 4), (2, 3)]:
        ranges = [node_range(n, r, world) for r in range(world)]
        assert ranges[0][0] == 0 and ranges[-1][1] == n
        assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
        sizes = [e - s for s, e in ranges]
        assert max(sizes) - min(sizes) <= 1


@pytest.mark.parametrize("batch_size", [4, 7, 1000])
def test_layerwise_equals_full_forward_homogeneous(batch_size):
    torch.manual_seed(0)
    g = make_graph(num_nodes=161)
    model = SAGE(g.ndata["feat"].shape[1], 8, 4, num_layers=3, dropout=0.5)  # dropout: eval mode matters
    model.train()
    out = layerwise(model, g, batch_size=batch_size)
    assert model.training  # mode restored
    model.eval()
    with torch.no_grad():
        full = model([g] * 3, g.ndata["feat"])
    assert out.shape == full.shape
    assert float((out - full).abs().max()) < 1e-5


def test_layerwise_equals_full_forward_heterograph():
    torch.manual_seed(0)
    g = make_hetero()
    model = hetero_model(g).eval()
    x = model.input_features(g)
    out = layerwise(model, g, x, batch_size=9)
    with torch.no_grad():
        full = model([g, g], x)
    assert set(out) == set(full) == {"paper", "word"}
    assert max(float((out[nt] - full[nt]).abs().max()) for nt in full) < 1e-5


@pytest.mark.parametrize("hetero", [False, True])
def test_layerwise_on_an_int32_graph_equals_the_int64_graphs(hetero):
    """``g.int()``: DGL refuses int64 seeds there, so every call failed in its first batch."""
    torch.manual_seed(0)
    g = make_hetero() if hetero else make_graph(num_nodes=161)
    model = (hetero_model(g) if hetero else SAGE(g.ndata["feat"].shape[1], 8, 4, num_layers=2)).eval()
    x = model.input_features(g) if hetero else g.ndata["feat"]
    want = layerwise(model, g, x, batch_size=16)
    got = layerwise(model, g.int(), x, batch_size=16)
    if not hetero:
        want, got = {"_N": want}, {"_N": got}
    assert set(got) == set(want) and all(torch.allclose(got[nt], want[nt], atol=1e-6) for nt in want)


def test_layerwise_on_a_graph_whose_one_node_type_has_its_own_name():
    import dgl

    torch.manual_seed(0)
    g = make_graph(num_nodes=60)
    u, v = g.edges()
    named = dgl.heterograph({("user", "follows", "user"): (u, v)}, num_nodes_dict={"user": 60})
    named.ndata["feat"] = g.ndata["feat"]
    model = SAGE(g.ndata["feat"].shape[1], 8, 4, num_layers=2).eval()
    out = layerwise(model, named, batch_size=16)
    with torch.no_grad():
        full = model([g, g], g.ndata["feat"])
    assert float((out - full).abs().max()) < 1e-5


def test_layerwise_bad_input():
    g = make_graph(num_nodes=20)
    with pytest.raises(TypeError, match="needs per-layer access, which Sequential does not give"):
        layerwise(torch.nn.Sequential(torch.nn.Linear(3, 3)), g)
    model = SAGE(g.ndata["feat"].shape[1], 8, 4)
    with pytest.raises(ValueError, match="features of '_N' have 3 rows, the graph has 20"):
        layerwise(model, g, torch.zeros(3, g.ndata["feat"].shape[1]))
    with pytest.raises(ValueError, match="batch_size must be positive"):
        layerwise(model, g, batch_size=0)
    hg = make_hetero()
    with pytest.raises(ValueError, match="unknown node type 'author'"):
        layerwise(hetero_model(hg), hg, {"author": torch.zeros(2, 8)})
    with pytest.raises(ValueError, match=r"pass features as \{ntype: tensor\}"):
        layerwise(hetero_model(hg), hg, torch.zeros(80, 8))


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("launcher, hetero", [("fork", False), ("fork", True), ("spawn", False)])
def test_layerwise_in_ranks_equals_full_forward(root_dir, launcher, hetero):
    # 3 ranks over 161 nodes (53, 54, 54) and batches of 7: uneven everywhere.
    graph = make_hetero(num_papers=161, num_words=37) if hetero else make_graph(num_nodes=161)
    trainer = Trainer(num_procs=3, launcher=launcher, progress_bar=False, default_root_dir=root_dir, logger=False)
    metrics = trainer.validate(LayerwiseTask(graph, hetero, batch_size=7))
    assert metrics["lw_ranks"] == 3
    assert metrics["lw_diff"] < 3e-5  # sum over 3 ranks of each one's largest difference
    # Every rank read the whole result (all ranks' rows of the shared tensor), equal to
    # one process's: 3 × its checksum. The ranks built the model after seed_all(seed=0).
    seed_all(0)
    model = LayerwiseTask(graph, hetero, batch_size=7).configure_model().eval()
    x = model.input_features(graph) if hetero else graph.ndata["feat"]
    out = layerwise(model, graph, x, batch_size=50)
    total = float(sum(v.double().sum() for v in out.values())) if hetero else float(out.double().sum())
    assert abs(metrics["lw_checksum"] - 3 * total) < 1e-6 * max(1.0, abs(total)) + 1e-4
    assert not rank_children()
