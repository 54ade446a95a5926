"""Heterographs: ``{ntype: ids}`` seeds split exactly (every id of every type once per
epoch, the same order on every rank), 2 ranks × b train like 1 rank × 2b (fork and
spawn), the DDP unused-parameter error names the option, bad input fails early."""
from __future__ import annotations

import json

import pytest
import torch

from graphtrainer import RankFailedError, Trainer
from graphtrainer.data.hetero import split_flat, type_spans, typed_share
from graphtrainer.loop.metrics import infer_batch_size
from graphtrainer.data.node_loader import NodeLoader, default_sampler

from conftest import rank_children
from hetero_tasks import HeteroTask, make_hetero
from tasks import ParamDump

IDS = {"paper": torch.arange(64), "word": torch.arange(32)}  # 96 seeds of two types


def _rank_shares(world, epoch, seed=3, ids=IDS):
    g = make_hetero()
    spans = type_spans(ids, g)
    return [split_flat(typed_share(ids, spans, seed, epoch, r, world, "pad"), spans) for r in range(world)]


def test_typed_split_sees_every_id_of_every_type_once_and_evenly():
    ids = {"paper": torch.arange(5, 80), "word": torch.arange(31)}  # 75 and 31: not multiples
    for world in (2, 3, 4):
        shares = _rank_shares(world, epoch=1, ids=ids)
        again = _rank_shares(world, epoch=1, ids=ids)
        assert all(torch.equal(a[nt], b[nt]) for a, b in zip(shares, again) for nt in ids)  # same on every rank
        for nt, want in ids.items():
            counts = [s[nt].numel() for s in shares]
            assert counts == [-(-want.numel() // world)] * world  # padded to an even split per type
            seen = torch.cat([s[nt] for s in shares])
            assert sorted(set(seen.tolist())) == want.tolist()  # every id, none twice on a rank
            assert all(s[nt].unique().numel() == s[nt].numel() for s in shares)
    # A new permutation each epoch; the same seeds per epoch with 1 and 2 ranks.
    one, other = _rank_shares(1, epoch=1)[0], _rank_shares(1, epoch=2)[0]
    assert not torch.equal(one["paper"], other["paper"])
    two = _rank_shares(2, epoch=1)
    for nt in IDS:
        assert sorted(torch.cat([two[0][nt], two[1][nt]]).tolist()) == sorted(one[nt].tolist())
    # Types are mixed through a rank's share in proportion (64 papers : 32 words).
    g = make_hetero()
    flat = typed_share(IDS, type_spans(IDS, g), 3, 1, 0, 2, "pad")
    first = split_flat(flat[:12], type_spans(IDS, g))
    assert first["paper"].numel() == 8 and first["word"].numel() == 4


def test_hetero_loader_batches_are_dicts_sized_by_all_seeds():
    g = make_hetero()
    loader = NodeLoader(g, IDS, default_sampler(g, [2, 2]), 10, seed=1).for_evaluation()
    batches = list(loader)
    assert len(batches) == len(loader) == 10
    got = {nt: torch.cat([b[1][nt] for b in batches]) for nt in IDS}
    assert all(torch.equal(got[nt], IDS[nt]) for nt in IDS)  # evaluation: every id once, in order
    assert [infer_batch_size(b) for b in batches] == [10] * 9 + [6]  # seeds of both types
    assert "feat" in batches[0][2][0].srcdata and "paper" in batches[0][2][0].srcdata["feat"]


@pytest.mark.parametrize("ids, message", [
    ({"author": torch.arange(3)}, "unknown node type 'author'; this graph has node types ['paper', 'word']"),
    ({"paper": torch.arange(3).float()}, "seed ids['paper']: dtype torch.float32 is not an integer id type"),
    ({"paper": torch.tensor([0, 80])}, "seed ids['paper']: ids must lie in [0, 80)"),
    (torch.arange(3), "this graph has node types ['paper', 'word']; pass a dict {ntype: ids}"),
    ({}, "the dict of ids is empty"),
])
def test_bad_hetero_ids_fail_early(ids, message):
    g = make_hetero()
    with pytest.raises(ValueError) as info:
        NodeLoader(g, ids, default_sampler(g, [2, 2]), 4)
    assert message in str(info.value)


def test_bad_trainer_ddp_options():
    with pytest.raises(ValueError, match="ddp_kwargs must be a dict"):
        Trainer(ddp_kwargs=[("static_graph", True)])
    with pytest.raises(ValueError, match="device_ids are set by the trainer"):
        Trainer(ddp_kwargs={"device_ids": [0]})
    with pytest.raises(ValueError, match="set it in one place"):
        Trainer(find_unused_parameters=True, ddp_kwargs={"find_unused_parameters": False})
    assert Trainer(ddp_kwargs={"static_graph": True}).config.ddp_kwargs == {"static_graph": True,
                                                                      "find_unused_parameters": False}


def _fit(root_dir, out, num_procs, batch_size, launcher="fork", **task_kwargs):
    out.mkdir()
    trainer = Trainer(num_procs=num_procs, launcher=launcher, max_epochs=2, seed=3, progress_bar=False,
                      default_root_dir=root_dir, callbacks=[ParamDump(str(out))], logger=False,
                      find_unused_parameters=True)
    task = HeteroTask(make_hetero(), IDS, batch_size, record_dir=str(out), **task_kwargs)
    trainer.fit(task)
    assert trainer.global_step == 2 * 96 // (batch_size * num_procs)
    return trainer


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("launcher", ["fork", "spawn"])
def test_hetero_two_ranks_batch_b_equal_one_rank_batch_2b(root_dir, tmp_path, launcher):
    # 64 papers : 32 words; batches of 12 (6 per rank) hold 8 : 4, even counts: exact.
    one = _fit(root_dir, tmp_path / "one", 1, 12)
    two = _fit(root_dir, tmp_path / "two", 2, 6, launcher=launcher)
    assert not rank_children()
    ref = torch.load(tmp_path / "one" / "e1_r0.pt", weights_only=True)
    start = torch.load(tmp_path / "one" / "start_r0.pt", weights_only=True)
    for rank in (0, 1):
        got = torch.load(tmp_path / "two" / f"e1_r{rank}.pt", weights_only=True)
        assert max(float((got[k] - ref[k]).abs().max()) for k in ref) < 1e-5
    assert max(float((ref[k] - start[k]).abs().max()) for k in ref) > 1e-2  # training moved them
    # Every seed of every type once per epoch across the two ranks, as with one rank.
    for epoch in (0, 1):
        seen = sum((json.load(open(tmp_path / "two" / f"seen_r{r}_e{epoch}.json")) for r in (0, 1)), [])
        ref_seen = json.load(open(tmp_path / "one" / f"seen_r0_e{epoch}.json"))
        assert sorted(map(tuple, seen)) == sorted(map(tuple, ref_seen))
        assert len(seen) == 96
    assert abs(one.callback_metrics["val_seeds"] - 96) < 1e-9 and abs(two.callback_metrics["val_seeds"] - 96) < 1e-9
    assert abs(one.callback_metrics["val_acc"] - two.callback_metrics["val_acc"]) < 1e-6  # exact metrics


@pytest.mark.timeout(120)
def test_unused_parameters_need_the_option(root_dir):
    # Paper seeds only: the last layer's paper->word relation gets no gradient.
    papers = {"paper": torch.arange(64)}
    trainer = Trainer(num_procs=2, max_epochs=1, progress_bar=False, default_root_dir=root_dir, logger=False)
    with pytest.raises(RankFailedError) as info:
        trainer.fit(HeteroTask(make_hetero(), papers, 8))
    assert "Trainer(find_unused_parameters=True)" in str(info.value)
    assert not rank_children()
    trainer = Trainer(num_procs=2, max_epochs=1, progress_bar=False, default_root_dir=root_dir, logger=False,
                      find_unused_parameters=True)
    trainer.fit(HeteroTask(make_hetero(), papers, 8))
    assert trainer.global_step == 4
    assert not rank_children()


@pytest.mark.slow  # 5 s or more on 2 cores
@pytest.mark.timeout(120)
@pytest.mark.parametrize("launcher", ["fork", "spawn"])
def test_every_type_is_prepared_and_shared(root_dir, launcher):
    from hetero_tasks import SharingProbe

    graph = make_hetero()
    trainer = Trainer(num_procs=2, launcher=launcher, progress_bar=False, default_root_dir=root_dir, logger=False)
    metrics = trainer.validate(SharingProbe(graph))
    # Every relation's formats were built before the ranks started: the ones in-neighbour
    # sampling reads (csc) besides the coo a graph keeps; csr is not built (issue 16). Summed
    # over 2 ranks.
    assert all(metrics[f"formats_{et}"] == 2 * 2 for et in ("cites", "has", "in")), metrics
    shared = {k: v for k, v in metrics.items() if k.startswith("shared_")}
    assert set(shared) == {"shared_paper_feat", "shared_paper_label", "shared_paper_train_mask",
                           "shared_paper_val_mask", "shared_paper_test_mask", "shared_word_label"}
    # Spawn: every type's features reach both ranks in shared memory (moved once, not
    # pickled); fork: they are the parent's pages, shared copy-on-write, not shm.
    assert all(v == (2.0 if launcher == "spawn" else 0.0) for v in shared.values()), shared
    assert not rank_children()


def test_hetero_edge_loader_splits_samples_and_excludes():
    import dgl

    from graphtrainer.data.edge_loader import EdgeLoader

    g = make_hetero()
    edges = {"cites": torch.arange(40), "has": torch.arange(20)}
    loader = EdgeLoader(g, edges, [-1], 12, negatives=2, exclude="reverse_types",
                        reverse_etypes={"has": "in", "in": "has"}, seed=2).for_evaluation()
    batches = list(loader)
    assert len(batches) == 5
    cites, has = ("paper", "cites", "paper"), ("paper", "has", "word")
    seen = {cites: [], has: []}
    for input_nodes, pos, neg, blocks in batches:
        assert infer_batch_size((input_nodes, pos, neg, blocks)) == pos.num_edges()
        for et in (cites, has):
            eids = pos.edges[et].data[dgl.EID]
            seen[et] += eids.tolist()
            # k=2 negatives per seed edge, their destinations among the destination type.
            nsrc, ndst = neg.edges(etype=et)
            assert nsrc.numel() == 2 * eids.numel()
            glob = neg.nodes[et[2]].data[dgl.NID][ndst]  # pair graphs are compacted
            assert glob.numel() == 0 or int(glob.max()) < g.num_nodes(et[2])
            # Seed edges and their reverses are not in the sampled block.
            used = blocks[0].edges[et].data[dgl.EID].tolist()
            assert not set(used) & set(eids.tolist())
        rev = blocks[0].edges[("word", "in", "paper")].data[dgl.EID].tolist()
        assert not set(rev) & set(pos.edges[has].data[dgl.EID].tolist())
    assert sorted(seen[cites]) == list(range(40)) and sorted(seen[has]) == list(range(20))
    # Training: every edge of every type once per epoch, with the same negatives again
    # only for the same epoch.
    train = EdgeLoader(g, edges, [2], 12, negatives=1, seed=2)
    train.set_epoch(3)
    got = sum((b[1].edges[cites].data[dgl.EID].tolist() for b in train), [])
    assert sorted(got) == list(range(40))


def test_bad_hetero_edges_fail_early():
    from graphtrainer.data.edge_loader import EdgeLoader

    g = make_hetero()
    with pytest.raises(ValueError, match="unknown edge type 'writes'"):
        EdgeLoader(g, {"writes": torch.arange(3)}, [2], 4)
    with pytest.raises(ValueError, match=r"edge_dataloader edge ids\['has'\]: ids must lie in \[0, 240\)"):
        EdgeLoader(g, {"has": torch.tensor([0, 240])}, [2], 4)
    with pytest.raises(ValueError, match='use exclude="reverse_types"'):
        EdgeLoader(g, {"has": torch.arange(3)}, [2], 4, exclude="reverse_id", reverse_eids=torch.arange(3))
    with pytest.raises(ValueError, match="pass a dict"):
        EdgeLoader(g, torch.arange(3), [2], 4)


@pytest.mark.timeout(120)
def test_hetero_link_prediction_trains_on_two_ranks(root_dir):
    from hetero_tasks import HeteroLinkTask

    graph = make_hetero()
    trainer = Trainer(num_procs=2, max_epochs=2, progress_bar=False, default_root_dir=root_dir, logger=False,
                      find_unused_parameters=True)
    trainer.fit(HeteroLinkTask(graph, 16))
    m = graph.num_edges("cites")
    # Each epoch every cites edge once (padded to an even split: at most one repeat per rank).
    assert all(m <= row["train_edges"] <= m + 1 for row in trainer.history), trainer.history
    assert trainer.history[-1]["train_loss"] < trainer.history[0]["train_loss"]
    assert not rank_children()


def test_hetero_datasets(tmp_path, monkeypatch):
    from graphtrainer import datasets

    monkeypatch.setenv(datasets.CACHE_ENV, str(tmp_path / "cache"))
    g = datasets.cora_hetero()
    assert {nt: g.num_nodes(nt) for nt in g.ntypes} == {"paper": 2708, "word": 1433}
    feat = g.nodes["paper"].data["feat"]
    p, w = g.edges(etype="has")
    assert g.num_edges("has") == int((feat > 0).sum()) == 49216
    assert bool((feat[p, w] > 0).all())  # has = the bag-of-words entries
    q, v = g.edges(etype="in")
    assert torch.equal(q, w) and torch.equal(v, p)  # in = has reversed, same order (reverse_types)
    assert g.num_edges("cites") == 10556 and "label" in g.nodes["paper"].data
    assert len(g.nodes["word"].data) == 0
    a = datasets.synthetic_hetero(500, 40, words_per_paper=3, seed=1)
    b = datasets.synthetic_hetero(500, 40, words_per_paper=3, seed=1)
    assert all(torch.equal(x, y) for et in a.canonical_etypes for x, y in zip(a.edges(etype=et), b.edges(etype=et)))
    assert a.num_edges("has") == 1500 and int(a.edges(etype="has")[1].max()) < 40
    # Words carry label signal: most of a paper's words come from its class's block.
    label = a.nodes["paper"].data["label"]
    pp, ww = a.edges(etype="has")
    assert float((ww // (40 // 8) == label[pp]).float().mean()) > 0.6
    with pytest.raises(ValueError, match="num_words must be an int >= 8"):
        datasets.synthetic_hetero(100, 4)
    with pytest.raises(ValueError, match="homophily must be in"):
        datasets.synthetic_hetero(100, 40, homophily=1.5)
