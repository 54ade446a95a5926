"""``graph_dataloader``: packed graphs, sharding, exact evaluation and predict order, Join,
bad input, and the TU text-format reader.

Equivalence (2 ranks × batch b == 1 rank × batch 2b): the permutation depends on
``(seed, epoch)`` only, a graph's logits do not depend on the other graphs of its batch
(``GraphConv`` and the readout work per graph of a ``dgl.batch``), each rank's loss is a
mean over its b graphs and DDP averages the two gradients; plain SGD adds no state.
"""
from __future__ import annotations

import json
import warnings

import pytest
import torch

from graphtrainer import RankFailedError, Trainer
from graphtrainer.datasets import read_tu
from graphtrainer.data.graph_loader import GraphLoader, PackedGraphs
from graphtrainer.loop.metrics import infer_batch_size
from graphtrainer.data.validation import check_loader
from graphtrainer.data.sharding import shard_ids

from conftest import rank_children
from link_tasks import GraphClsTask, numbered_minigc
from tasks import ParamDump, assert_two_ranks_match_one, max_diff
from launch_env import launchers

EPOCHS = 3
B = 8


def _graphs_with_edata(n=6):
    import dgl

    out = []
    for i in range(n):
        g = dgl.rand_graph(3 + i, 2 * i + 1)
        g.ndata["feat"] = torch.randn(g.num_nodes(), 2)
        g.edata["w"] = torch.rand(g.num_edges())
        out.append((g, torch.tensor(i % 3)))
    return out


# ---- in-process ----------------------------------------------------------------------
def test_a_packed_batch_is_dgl_batch_of_the_graphs_in_the_given_order():
    import dgl

    data = _graphs_with_edata()
    packed = PackedGraphs(data)
    order = [4, 0, 5, 2]
    graph, labels = packed.batch(torch.tensor(order))
    ref = dgl.batch([data[i][0] for i in order])
    assert torch.equal(torch.stack(graph.edges()), torch.stack(ref.edges()))
    assert torch.equal(graph.batch_num_nodes(), ref.batch_num_nodes())
    assert torch.equal(graph.batch_num_edges(), ref.batch_num_edges())
    assert torch.equal(graph.ndata["feat"], ref.ndata["feat"]) and torch.equal(graph.edata["w"], ref.edata["w"])
    assert labels.tolist() == [data[i][1].item() for i in order]
    assert infer_batch_size((graph, labels)) == 4
    single, label = packed[3]
    assert single.num_nodes() == 6 and single.num_edges() == 7 and int(label) == 0
    # A loader covers every graph once per epoch, in batches of batch_size graphs.
    loader = GraphLoader(packed, 4)
    assert [infer_batch_size(b) for b in loader] == [4, 2] == [4, 2][: len(loader)]


def test_int32_graphs_are_batched_as_int32_graphs_as_dgl_batch_does():
    """dgl.batch of int32 graphs is an int32 graph; the packed batch was always int64."""
    import dgl

    data = [(g.int(), label) for g, label in _graphs_with_edata()]
    ref = dgl.batch([g for g, _ in data[:3]])
    for graph, _ in (PackedGraphs(data).batch(torch.arange(3)), next(iter(GraphLoader(data, 3, shuffle=False)))):
        assert graph.idtype == ref.idtype == torch.int32
        assert graph.edges()[0].dtype == graph.batch_num_nodes().dtype == torch.int32
        assert torch.equal(torch.stack(graph.edges()), torch.stack(ref.edges()))
        assert torch.equal(graph.batch_num_nodes(), ref.batch_num_nodes())
    assert PackedGraphs(data)[1][0].idtype == torch.int32


def test_data_that_some_graphs_lack_or_shape_differently_is_named_not_silently_dropped():
    """dgl.batch refuses graphs whose data keys differ; packing dropped such a key from every
    batch without a word (the step then failed with KeyError: 'feat' in a rank)."""
    import dgl

    data = _graphs_with_edata()
    del data[2][0].ndata["feat"]
    with pytest.warns(UserWarning, match=r"node data 'feat' is missing from 1 of 6 graphs \(e.g. graph 2\)"):
        packed = PackedGraphs(data)
    assert "feat" not in packed.ndata and "w" in packed.edata
    data = _graphs_with_edata()
    data[4][0].edata["w"] = torch.rand(data[4][0].num_edges(), 3)
    with pytest.raises(ValueError, match=r"edge data 'w' has different shapes per row across the graphs: "
                                         r"\[\(\), \(3,\)\]"):
        PackedGraphs(data)


def test_bad_graph_input_is_a_clear_error():
    import dgl

    with pytest.raises(ValueError, match="the dataset has no graphs"):
        PackedGraphs([])
    with pytest.raises(ValueError, match=r"item 1 .* expected a \(DGLGraph, label\) pair"):
        PackedGraphs([(dgl.rand_graph(3, 2), 0), "not a graph"])
    packed = PackedGraphs(_graphs_with_edata())
    with pytest.raises(ValueError, match=r"indices: must lie in \[0, 6\)"):
        GraphLoader(packed, 2, torch.tensor([0, 6]))
    with pytest.raises(ValueError, match="index set is empty"):
        GraphLoader(packed, 2, torch.tensor([], dtype=torch.int64))
    with pytest.raises(ValueError, match="1 graphs cannot be split between 2 ranks"):
        check_loader(GraphLoader(packed, 2, torch.tensor([3])), 2)
    check_loader(GraphLoader(packed, 2, torch.tensor([3, 4])), 2)
    with pytest.raises(ValueError, match="GraphDataLoader: the dataset has no graphs"):
        check_loader(dgl.dataloading.GraphDataLoader([], batch_size=2), 2)


def _write_tu(folder, name, edges, indicator, labels, attrs=None):
    (folder / f"{name}_A.txt").write_text("".join(f"{u}, {v}\n" for u, v in edges))
    (folder / f"{name}_graph_indicator.txt").write_text("".join(f"{g}\n" for g in indicator))
    (folder / f"{name}_graph_labels.txt").write_text("".join(f"{y}\n" for y in labels))
    if attrs is not None:
        (folder / f"{name}_node_attributes.txt").write_text("".join(", ".join(map(str, a)) + "\n" for a in attrs))


def test_tu_reader_on_files_written_here(tmp_path):
    # 3 graphs: nodes 1-3 (triangle), 4-5 (one undirected edge), 6 (isolated); labels -1/1.
    edges = [(1, 2), (2, 1), (2, 3), (3, 2), (1, 3), (3, 1), (4, 5), (5, 4)]
    attrs = [[0.5, 1.0], [1.5, 2.0], [2.5, 3.0], [3.5, 4.0], [4.5, 5.0], [5.5, 6.0]]
    _write_tu(tmp_path, "TOY", edges, [1, 1, 1, 2, 2, 3], [1, -1, 1], attrs)
    data = read_tu(tmp_path, "TOY")
    assert [g.num_nodes() for g, _ in data] == [3, 2, 1]
    assert [g.num_edges() for g, _ in data] == [6, 2, 0]
    assert [int(y) for _, y in data] == [1, 0, 1]  # -1 -> 0, 1 -> 1
    assert data[1][0].ndata["feat"].tolist() == [[3.5, 4.0], [4.5, 5.0]]
    assert sorted(zip(*[t.tolist() for t in data[1][0].edges()])) == [(0, 1), (1, 0)]
    packed = PackedGraphs(data)
    assert len(packed) == 3 and packed.ndata["feat"].shape == (6, 2)
    # Without attributes, feat is the in-degree.
    (tmp_path / "TOY_node_attributes.txt").unlink()
    assert read_tu(tmp_path, "TOY")[0][0].ndata["feat"].squeeze(1).tolist() == [2.0, 2.0, 2.0]
    _write_tu(tmp_path, "BAD", [(1, 4)], [1, 1, 1, 2, 2, 3], [0, 1, 0])
    with pytest.raises(ValueError, match="joins two different graphs"):
        read_tu(tmp_path, "BAD")
    with pytest.raises(FileNotFoundError, match="NONE_A.txt is missing"):
        read_tu(tmp_path, "NONE")


# ---- real processes ------------------------------------------------------------------
def _fit_equiv(root_dir, out, num_procs, batch_size, launcher="fork"):
    out.mkdir()
    task = GraphClsTask(numbered_minigc(120), torch.arange(96), hidden=8, batch_size=batch_size,
                        optimizer="sgd", lr=0.05)
    trainer = Trainer(num_procs=num_procs, launcher=launcher, max_epochs=EPOCHS, seed=3, progress_bar=False,
                      default_root_dir=root_dir, callbacks=[ParamDump(str(out))], logger=False)
    trainer.fit(task)
    assert trainer.global_step == EPOCHS * 96 // (batch_size * num_procs)


@pytest.mark.timeout(150)
@pytest.mark.parametrize("launcher", launchers("fork", "spawn"))
def test_two_ranks_batch_b_equal_one_rank_batch_2b(root_dir, tmp_path, launcher):
    _fit_equiv(root_dir, tmp_path / "one", 1, 2 * B)
    _fit_equiv(root_dir, tmp_path / "two", 2, B, launcher)
    _fit_equiv(root_dir, tmp_path / "one_b", 1, B)
    final = assert_two_ranks_match_one(tmp_path / "one", tmp_path / "two", EPOCHS)
    assert max_diff(final, ParamDump.load(tmp_path / "one_b", f"e{EPOCHS - 1}", 0)) > 1e-3
    assert not rank_children()


@pytest.mark.timeout(150)
def test_evaluation_sees_each_graph_once_and_predict_keeps_dataset_order(root_dir, tmp_path):
    data = numbered_minigc(80)
    test_idx = torch.randperm(80, generator=torch.Generator().manual_seed(2))[:51]  # odd: 26 + 25
    results = {}
    for procs in (1, 2):
        rec = tmp_path / f"rec{procs}"
        rec.mkdir()
        task = GraphClsTask(data, torch.arange(80), None, test_idx, hidden=8, eval_batch_size=8,
                            num_classes=8, record_dir=str(rec))
        trainer = Trainer(num_procs=procs, seed=1, progress_bar=False, default_root_dir=root_dir, logger=False)
        metrics = trainer.test(task)
        preds = trainer.predict(task)
        seen = [json.loads((rec / f"test_seen_r{r}.json").read_text()) for r in range(procs)]
        results[procs] = (metrics, preds, seen)
    metrics, preds, seen = results[2]
    assert [len(s) for s in seen] == [26, 25]
    assert sorted(seen[0] + seen[1]) == sorted(test_idx.tolist())  # each graph once
    assert metrics["test_graphs"] == 51
    assert metrics["test_acc"] == pytest.approx(results[1][0]["test_acc"], abs=1e-9)
    assert metrics["test_loss"] == pytest.approx(results[1][0]["test_loss"], abs=1e-6)
    assert preds.shape == (51, 9)
    assert preds[:, 0].long().tolist() == test_idx.tolist()  # rows in the order of the indices
    torch.testing.assert_close(preds, results[1][1], atol=1e-6, rtol=0)
    assert not rank_children()


@pytest.mark.timeout(120)
def test_uneven_batch_counts_train_inside_join(root_dir, tmp_path):
    assert [len(shard_ids(torch.arange(9), r, 2, even="none")) for r in (0, 1)] == [5, 4]  # 2 and 1 batches
    out = tmp_path / "p"
    out.mkdir()
    task = GraphClsTask(numbered_minigc(20), torch.arange(9), hidden=8, batch_size=4, train_even="none")
    trainer = Trainer(num_procs=2, max_epochs=2, progress_bar=False, default_root_dir=root_dir, logger=False,
                      callbacks=[ParamDump(str(out))])
    trainer.fit(task)
    assert trainer.global_step == 4
    for epoch in range(2):
        r0, r1 = ParamDump.load(out, f"e{epoch}", 0), ParamDump.load(out, f"e{epoch}", 1)
        assert all(torch.equal(r0[k], r1[k]) for k in r0)
    assert not rank_children()


@pytest.mark.timeout(120)
def test_fewer_graphs_than_ranks_fails_with_a_clear_error(root_dir):
    task = GraphClsTask(numbered_minigc(5), torch.tensor([2]), hidden=8, batch_size=4)
    trainer = Trainer(num_procs=2, max_epochs=1, progress_bar=False, default_root_dir=root_dir, logger=False)
    with pytest.raises(RankFailedError, match="1 graphs cannot be split between 2 ranks"):
        trainer.fit(task)
    assert not rank_children()


def test_dgl_padded_evaluation_loaders_are_flagged(tmp_path):
    # DGL's use_ddp loaders need a process group to be built; one rank is enough, the check
    # is told the world size.
    import dgl
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        data = numbered_minigc(51)
        loader = dgl.dataloading.GraphDataLoader(data, batch_size=8, use_ddp=True)
        with pytest.warns(UserWarning, match=r"pads 51 evaluation ids to 52 for 2 ranks: 1 of them are scored twice"):
            check_loader(loader, 2, evaluation=True)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            check_loader(loader, 2)  # training: padding is harmless there
            check_loader(dgl.dataloading.GraphDataLoader(data[:50], batch_size=8, use_ddp=True), 2, evaluation=True)
    finally:
        dist.destroy_process_group()


def test_spawn_warns_about_a_long_list_of_graphs_on_the_task():
    from graphtrainer.launch.preflight import MANY_GRAPHS, prepare_graphs

    data = _graphs_with_edata(2) * (MANY_GRAPHS // 2 + 1)  # one list entry per graph object
    data = [(g.clone(), y) for g, y in data]
    task = GraphClsTask(data[:4], hidden=4)
    task.raw = data
    with pytest.warns(UserWarning, match=rf"holds {len(data)} DGL graphs.*PackedGraphs"):
        prepare_graphs(task, "spawn")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        prepare_graphs(task, "fork")  # fork shares them copy-on-write: nothing to say
        del task.raw
        prepare_graphs(task, "spawn")  # packed graphs hold no DGLGraph objects
