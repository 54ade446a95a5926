"""``edge_dataloader``: sharding, negatives, exact evaluation and ranking metrics, bad input.

Equivalence (2 ranks × batch b == 1 rank × batch 2b) holds for the same reasons as for
node ids (see test_engine_equivalence.py): the permutation depends on ``(seed, epoch)``
only, a full-neighbour sampler makes each edge's score independent of its batch, and
:class:`PerEdgeUniform` draws an edge's negatives from ``(seed, epoch, edge id)`` alone.
``exclude`` is off there: excluding a batch's edges from its blocks makes a score depend
on which other edges share the batch, so batch b and batch 2b differ by design.
"""
from __future__ import annotations

import json
import warnings

import pytest
import torch

from graphtrainer import GraphTask, RankFailedError, Trainer
from graphtrainer.data.edge_loader import EdgeLoader, PerEdgeUniform, check_reverse_eids
from graphtrainer.loop.metrics import infer_batch_size
from graphtrainer.evaluation.ranking import LinkScores, ranking_metrics
from graphtrainer.data.validation import check_loader
from graphtrainer.data.sharding import shard_ids

from conftest import rank_children
from link_tasks import LinkTask, _full, rand_link_graph
from tasks import ParamDump, assert_two_ranks_match_one, max_diff
from launch_env import launchers

EPOCHS = 3
B = 8


def _pairs(graph, n, seed=1):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randint(0, graph.num_nodes(), (n,), generator=gen),
            torch.randint(0, graph.num_nodes(), (n,), generator=gen))


# ---- in-process ----------------------------------------------------------------------
def test_batches_are_dgl_edge_batches_and_batch_size_is_seed_edges():
    g = rand_link_graph()
    loader = EdgeLoader(g, torch.arange(50), _full(2), 16, negatives=3, exclude="self")
    batches = list(loader)
    assert len(batches) == len(loader) == 4
    input_nodes, pos, neg, blocks = batches[0]
    assert pos.num_edges() == 16 and neg.num_edges() == 48 and len(blocks) == 2
    assert [infer_batch_size(b) for b in batches] == [16, 16, 16, 2]
    assert "feat" in blocks[0].srcdata  # prefetched by DGL's loader
    # Pairs (not edges of the graph) give the same structure, pairs in the given order.
    src, dst = _pairs(g, 5)
    _, pos, neg, _ = next(iter(EdgeLoader(g, (src, dst), _full(2), 8, negatives=2, shuffle=False)))
    import dgl
    s, d = pos.edges()
    assert torch.equal(pos.ndata[dgl.NID][s], src) and torch.equal(pos.ndata[dgl.NID][d], dst)
    assert neg.num_edges() == 10


def test_negatives_are_a_function_of_seed_epoch_and_edge():
    g = rand_link_graph()
    neg = PerEdgeUniform(4)
    eids = torch.tensor([3, 9, 27])
    a = neg(g, eids)
    b = neg(g, eids[[2, 0, 1]])  # another batch order: each edge keeps its negatives
    assert torch.equal(a[1].reshape(3, 4)[[2, 0, 1]], b[1].reshape(3, 4))
    assert torch.equal(a[0], g.find_edges(eids)[0].repeat_interleave(4))
    neg.epoch = 1
    assert not torch.equal(neg(g, eids)[1], a[1])
    neg.epoch, neg.seed = 0, 5
    assert not torch.equal(neg(g, eids)[1], a[1])
    many = PerEdgeUniform(50)(g, torch.arange(400))[1]
    assert int(many.min()) >= 0 and int(many.max()) < g.num_nodes()
    counts = torch.bincount(many, minlength=g.num_nodes()).float()
    assert counts.std() / counts.mean() < 0.15  # close to uniform (expected ~0.07)


def test_bad_edge_input_is_a_clear_error_before_sampling():
    g = rand_link_graph()  # 120 nodes, 400 edges
    with pytest.raises(ValueError, match=r"edge ids: ids must lie in \[0, 400\).*max 400"):
        EdgeLoader(g, torch.tensor([0, 400]), _full(2), 4)
    with pytest.raises(ValueError, match=r"pairs \(dst\): ids must lie in \[0, 120\)"):
        EdgeLoader(g, (torch.tensor([0, 1]), torch.tensor([1, 120])), _full(2), 4)
    with pytest.raises(ValueError, match="exclude= takes edge ids of the graph, not node pairs.*graph.edge_ids"):
        EdgeLoader(g, _pairs(g, 4), _full(2), 4, exclude="self")
    with pytest.raises(ValueError, match="needs reverse_eids"):
        EdgeLoader(g, torch.arange(4), _full(2), 4, exclude="reverse_id")
    good = torch.cat([torch.arange(200, 400), torch.arange(200)])
    assert torch.equal(check_reverse_eids(g, good), good)
    with pytest.raises(ValueError, match="do not point at the reverse edge"):
        EdgeLoader(g, torch.arange(4), _full(2), 4, exclude="reverse_id", reverse_eids=torch.arange(400))
    with pytest.raises(ValueError, match=r"one entry per edge \(400\)"):
        EdgeLoader(g, torch.arange(4), _full(2), 4, exclude="reverse_id", reverse_eids=good[:10])


def test_check_loader_takes_dgl_edge_loaders_by_number_of_edges():
    import dgl

    g = rand_link_graph()
    sampler = dgl.dataloading.as_edge_prediction_sampler(
        _full(2), negative_sampler=dgl.dataloading.negative_sampler.Uniform(1))
    ok = dgl.dataloading.DataLoader(g, torch.arange(150, 400), sampler, batch_size=64)
    check_loader(ok, 2)  # edge ids above the number of nodes (120) are fine
    bad = dgl.dataloading.DataLoader(g, torch.tensor([5, 400]), sampler, batch_size=64)
    with pytest.raises(ValueError, match=r"DataLoader edge ids: ids must lie in \[0, 400\)"):
        check_loader(bad, 2)
    rev = dgl.dataloading.as_edge_prediction_sampler(_full(2), exclude="reverse_id", reverse_eids=torch.arange(400))
    with pytest.raises(ValueError, match="reverse edge"):
        check_loader(dgl.dataloading.DataLoader(g, torch.arange(10), rev, batch_size=4), 2)


def test_ranking_metrics_by_hand():
    pos = torch.tensor([3.0, 1.0])
    neg = torch.tensor([[0.0, 2.0], [1.0, 5.0]])
    m = ranking_metrics(pos, neg, hits=(1, 3))
    assert m["mrr"] == pytest.approx((1 / 1 + 1 / 2.5) / 2)  # ranks 1 and 1 + 1 + 0.5 (a tie)
    assert m["auc"] == pytest.approx((3 + 1.5) / 8)  # 3 beats 0, 2, 1; 1 beats 0 and ties 1
    assert m["pooled_hits@1"] == 0.0 and m["pooled_hits@3"] == 0.5  # thresholds 5 and 1
    assert m["per_edge_hits@1"] == 0.5 and m["per_edge_hits@3"] == 1.0  # ranks 1 and 2.5
    scores = LinkScores(2)
    with pytest.raises(ValueError, match="need 4 negative scores"):
        scores.add(pos, torch.zeros(3))


class OpaqueBatchTask(GraphTask):
    """Batches are plain Python objects: the trainer cannot tell their size."""

    def __init__(self):
        super().__init__()
        self.model = torch.nn.Linear(1, 1)

    def configure_optimizers(self):
        return torch.optim.SGD(self.model.parameters(), lr=0.1)

    def train_dataloader(self):
        return [object(), object(), object()]

    def training_step(self, batch, batch_idx):
        loss = self.model(torch.ones(1, 1)).sum() ** 2
        self.log("loss", loss)
        self.log("loss_weighted", loss, batch_size=2)  # weighted explicitly: no warning
        return loss


def test_unknown_batch_size_warns_once_naming_the_hook(root_dir):
    trainer = Trainer(num_procs=1, max_epochs=2, progress_bar=False, default_root_dir=root_dir, logger=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(OpaqueBatchTask())
    ours = [w for w in caught if "could not be inferred" in str(w.message)]
    assert len(ours) == 1, [str(w.message) for w in caught]
    assert "OpaqueBatchTask.training_step" in str(ours[0].message) and "batch_size=" in str(ours[0].message)


# ---- real processes ------------------------------------------------------------------
def _fit_equiv(root_dir, out, num_procs, batch_size, launcher="fork"):
    out.mkdir()
    g = rand_link_graph()
    task = LinkTask(g, torch.arange(96), None, fanouts=[2, 2], hidden=8, batch_size=batch_size,
                    negatives=2, optimizer="sgd", lr=0.1, full_train_sampler=True)
    trainer = Trainer(num_procs=num_procs, launcher=launcher, max_epochs=EPOCHS, seed=3, progress_bar=False,
                      default_root_dir=root_dir, callbacks=[ParamDump(str(out))], logger=False)
    trainer.fit(task)
    assert trainer.global_step == EPOCHS * 96 // (batch_size * num_procs)


@pytest.mark.timeout(150)
@pytest.mark.parametrize("launcher", launchers("fork", "forkserver", "spawn"))
def test_two_ranks_batch_b_equal_one_rank_batch_2b(root_dir, tmp_path, launcher):
    _fit_equiv(root_dir, tmp_path / "one", 1, 2 * B)
    _fit_equiv(root_dir, tmp_path / "two", 2, B, launcher)
    _fit_equiv(root_dir, tmp_path / "one_b", 1, B)
    final = assert_two_ranks_match_one(tmp_path / "one", tmp_path / "two", EPOCHS)
    assert max_diff(final, ParamDump.load(tmp_path / "one_b", f"e{EPOCHS - 1}", 0)) > 1e-3  # b on 1 rank differs
    assert not rank_children()


@pytest.mark.timeout(150)
def test_evaluation_sees_each_edge_once_metrics_and_predict_are_exact(root_dir, tmp_path):
    g = rand_link_graph()
    val = _pairs(g, 37)  # odd: the ranks score 19 and 18 pairs
    results = {}
    for procs in (1, 2):
        rec = tmp_path / f"rec{procs}"
        rec.mkdir()
        task = LinkTask(g, torch.arange(96), val, val, fanouts=[2, 2], hidden=8, eval_batch_size=8,
                        eval_negatives=5, record_dir=str(rec))
        trainer = Trainer(num_procs=procs, seed=1, progress_bar=False, default_root_dir=root_dir, logger=False)
        metrics = trainer.test(task)  # the untrained model both times (same seed)
        preds = trainer.predict(task)
        seen = [json.loads((rec / f"test_seen_r{r}.json").read_text()) for r in range(procs)]
        results[procs] = (metrics, preds, seen)
    metrics, preds, seen = results[2]
    assert [len(s) for s in seen] == [19, 18]
    pairs = sorted(tuple(p) for s in seen for p in s)
    assert pairs == sorted(zip(val[0].tolist(), val[1].tolist()))  # each pair once over both ranks
    assert metrics["test_edges"] == 37
    for name in ("test_auc", "test_ap", "test_mrr", "test_pooled_hits@20"):
        assert metrics[name] == pytest.approx(results[1][0][name], abs=1e-9), name
    assert 0.0 < metrics["test_auc"] < 1.0
    # predict: one row per pair, in the order the pairs were given, same scores as 1 rank.
    assert preds.shape == (37, 3)
    assert torch.equal(preds[:, 0].long(), val[0]) and torch.equal(preds[:, 1].long(), val[1])
    torch.testing.assert_close(preds, results[1][1], atol=1e-6, rtol=0)
    assert not rank_children()


@pytest.mark.timeout(120)
def test_uneven_batch_counts_train_inside_join(root_dir, tmp_path):
    # 9 edges, batch 4, no padding: rank 0 has 5 edges (2 batches), rank 1 has 4 (1 batch).
    assert [len(shard_ids(torch.arange(9), r, 2, even="none")) for r in (0, 1)] == [5, 4]
    out = tmp_path / "p"
    out.mkdir()
    task = LinkTask(rand_link_graph(), torch.arange(9), None, fanouts=[2, 2], hidden=8, batch_size=4,
                    train_even="none", lr=0.05)
    trainer = Trainer(num_procs=2, max_epochs=2, progress_bar=False, default_root_dir=root_dir, logger=False,
                      callbacks=[ParamDump(str(out))])
    trainer.fit(task)
    assert trainer.global_step == 4  # the longer rank's 2 steps per epoch
    for epoch in range(2):
        r0, r1 = ParamDump.load(out, f"e{epoch}", 0), ParamDump.load(out, f"e{epoch}", 1)
        assert all(torch.equal(r0[k], r1[k]) for k in r0)
    assert max_diff(ParamDump.load(out, "e1", 0), ParamDump.load(out, "start", 0)) > 0
    assert not rank_children()


@pytest.mark.timeout(120)
def test_out_of_range_edge_ids_fail_every_rank_with_a_clear_error(root_dir):
    g = rand_link_graph()
    task = LinkTask(g, torch.tensor([0, 5, 10_000]), None, fanouts=[2, 2], hidden=8)
    trainer = Trainer(num_procs=2, max_epochs=1, progress_bar=False, default_root_dir=root_dir, logger=False)
    with pytest.raises(RankFailedError, match=r"edge ids: ids must lie in \[0, 400\)"):
        trainer.fit(task)
    assert not rank_children()


@pytest.mark.timeout(120)
def test_dgl_own_edge_loader_with_use_ddp_trains_weighted_by_seed_edges(root_dir):
    from link_tasks import DGLEdgeLoaderTask

    # 96 edge ids above the number of nodes (120): the old check compared them with it.
    task = DGLEdgeLoaderTask(rand_link_graph(), torch.arange(200, 296), None, fanouts=[2, 2], hidden=8,
                             batch_size=32)
    trainer = Trainer(num_procs=2, max_epochs=1, progress_bar=False, default_root_dir=root_dir, logger=False)
    trainer.fit(task)
    row = trainer.history[0]
    assert row["edges_seen"] == 96  # 48 per rank: batches of 32 and 16 on each
    # Weights = seed edges: (2 * (32 * 32 + 16 * 16)) / 96; one per batch would give 24.
    assert row["probe"] == pytest.approx(2 * (32 * 32 + 16 * 16) / 96)
    assert not rank_children()


def test_link_split_is_the_classic_split():
    import dgl

    from graphtrainer.datasets import link_split

    # Both directions of 300 random pairs, plus duplicates and self-loops to be dropped.
    gen = torch.Generator().manual_seed(0)
    u, v = torch.randint(0, 80, (300,), generator=gen), torch.randint(0, 80, (300,), generator=gen)
    g = dgl.graph((torch.cat([u, v, u[:20], torch.arange(5)]), torch.cat([v, u, v[:20], torch.arange(5)])),
                  num_nodes=80)
    g.ndata["feat"] = torch.randn(80, 3)
    undirected = {(min(a, b), max(a, b)) for a, b in zip(u.tolist(), v.tolist()) if a != b}
    s = link_split(g, seed=1)
    m, n_val, n_test = s.train_eids.numel(), s.val[0].numel(), s.test[0].numel()
    assert m + n_val + n_test == len(undirected)
    assert n_test == int(0.10 * len(undirected)) and n_val == int(0.05 * len(undirected))
    src, dst = s.graph.edges()
    assert s.graph.num_edges() == 2 * m and torch.equal(s.train_eids, torch.arange(m))
    check_reverse_eids(s.graph, s.reverse_eids)  # edge m + i is the reverse of edge i
    train = {(min(a, b), max(a, b)) for a, b in zip(src[:m].tolist(), dst[:m].tolist())}
    val = {(min(a, b), max(a, b)) for a, b in zip(*[t.tolist() for t in s.val])}
    test = {(min(a, b), max(a, b)) for a, b in zip(*[t.tolist() for t in s.test])}
    assert len(train) == m and len(val) == n_val and len(test) == n_test  # each edge once
    assert train | val | test == undirected and not (train & val or train & test or val & test)
    assert torch.equal(s.graph.ndata["feat"], g.ndata["feat"])
    again = link_split(g, seed=1)
    assert torch.equal(again.test[0], s.test[0]) and torch.equal(again.test[1], s.test[1])
    assert not torch.equal(link_split(g, seed=2).test[0], s.test[0])
