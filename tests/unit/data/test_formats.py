"""Sparse formats: only those the samplers read are built before launch (checked on the
graph the ranks share), a task can ask for more, a sampler that needs another format still
works (with a warning), and spawn/forkserver leave the launching process one shared copy."""
from __future__ import annotations

import json
import os
from typing import Any

import pytest
import torch

from graphtrainer import Trainer
from graphtrainer.data.formats import formats_for
from graphtrainer.launch.preflight import prepare_graphs
from graphtrainer.launch.shared_graph import is_shared

from conftest import rank_children
from tasks import SageTask, make_graph

pytest.importorskip("dgl")


class FormatProbe(SageTask):
    """Records, in every rank, the graph's formats before any sampling and after the first
    epoch, and whether its structure and features are in shared memory. ``edge_dir="out"``
    samples out-edges with a sampler made inside the rank (invisible before launch)."""

    def __init__(self, graph: Any, out_dir: str, edge_dir: str = "in", graph_formats: Any = None):
        super().__init__(graph, fanouts=(3, 3), batch_size=16)
        self.out_dir, self.edge_dir = out_dir, edge_dir
        if graph_formats is not None:
            self.graph_formats = graph_formats

    def _record(self, tag: str) -> None:
        data = {"created": sorted(self.graph.formats()["created"]), "shared": is_shared(self.graph)}
        with open(os.path.join(self.out_dir, f"{tag}_r{self.rank}.json"), "w") as fh:
            json.dump(data, fh)

    def setup(self, stage: str) -> None:
        self._record("start")
        # The rank's warnings, to a file: a forked rank inherits pytest's warning recorder,
        # so nothing would reach stderr.
        import warnings

        path = os.path.join(self.out_dir, f"warnings_r{self.rank}.txt")

        def to_file(message: Any, category: Any, *args: Any, **kwargs: Any) -> None:
            with open(path, "a") as fh:
                fh.write(f"{category.__name__}: {message}\n")

        warnings.simplefilter("always")
        warnings.showwarning = to_file

    def train_dataloader(self) -> Any:
        import dgl

        sampler = dgl.dataloading.NeighborSampler([3, 3], edge_dir=self.edge_dir, prefetch_node_feats=["feat"],
                                                  prefetch_labels=["label"])
        return self.node_dataloader(self.split["train"], sampler, self.batch_size)

    def val_dataloader(self) -> Any:
        return None

    def configure_model(self) -> Any:
        # A linear model on the seeds: blocks sampled along out-edges are no input for
        # message passing, and what is tested here is the sampling itself.
        return torch.nn.Linear(self.graph.ndata["feat"].shape[1], int(self.graph.ndata["label"].max()) + 1)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        seeds = batch[1]
        logits = self.model(self.graph.ndata["feat"][seeds])
        return torch.nn.functional.cross_entropy(logits, self.graph.ndata["label"][seeds])

    def on_train_epoch_end(self) -> None:
        self._record("end")


def _read(path, tag, rank):
    return json.loads((path / f"{tag}_r{rank}.json").read_text())


# ---- before launch, in this process ---------------------------------------------------------
@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_only_csc_is_built_by_default(tmp_path, method):
    graph = make_graph()
    task = FormatProbe(graph, str(tmp_path))
    assert sorted(graph.formats()["created"]) == ["coo"]
    prepare_graphs(task, method)  # (forkserver prepares as spawn does: checked in the ranks below)
    assert task.graph is graph
    assert sorted(graph.formats()["created"]) == ["coo", "csc"]  # no CSR: nothing samples out-edges
    assert is_shared(graph) == (method == "spawn")


def test_task_asks_for_more_formats(tmp_path):
    task = FormatProbe(make_graph(), str(tmp_path), graph_formats=("csc", "csr"))
    assert formats_for(task, task.graph) == ("csr", "csc")
    prepare_graphs(task, "fork")
    assert sorted(task.graph.formats()["created"]) == ["coo", "csc", "csr"]
    task = FormatProbe(make_graph(), str(tmp_path), graph_formats="all")
    assert formats_for(task, task.graph) == ("coo", "csr", "csc")


def test_samplers_on_the_task_decide(tmp_path):
    import dgl

    from graphtrainer.data.edge_loader import EdgeLoader

    task = FormatProbe(make_graph(), str(tmp_path))
    task.out_sampler = dgl.dataloading.NeighborSampler([2], edge_dir="out")
    assert formats_for(task, task.graph) == ("csr", "csc")
    task = FormatProbe(make_graph(), str(tmp_path))
    coo_only = make_graph().formats(["coo", "csc"])
    task.graph = coo_only
    task.links = EdgeLoader(coo_only, torch.arange(10), [2], batch_size=4)
    assert formats_for(task, coo_only) == ("coo", "csc")


def test_bad_format_names_are_refused(tmp_path):
    task = FormatProbe(make_graph(), str(tmp_path), graph_formats=("csc", "csx"))
    with pytest.raises(ValueError, match=r"graph_formats=\('csc', 'csx'\): \['csx'\] not among"):
        prepare_graphs(task, "fork")


def test_graph_restricted_to_other_formats_is_refused_with_the_fix(tmp_path):
    task = FormatProbe(make_graph().formats(["coo"]), str(tmp_path), graph_formats=("csc",))
    with pytest.raises(ValueError, match=r"restricted to the sparse formats \['coo'\].*read \['CSC'\].*"
                                         r"graph\.formats\(\['coo', 'csc'\]\)"):
        prepare_graphs(task, "fork")


def test_spawn_preparation_leaves_one_shared_copy(tmp_path):
    graph = make_graph()
    src, dst = (t.clone() for t in graph.edges())
    feat = graph.ndata["feat"].clone()
    task = FormatProbe(graph, str(tmp_path))
    prepare_graphs(task, "spawn")
    # The graph object the task (and the caller) holds now reads the shared arrays: its CSC
    # is one of the tensors DGL pickles to the ranks, so no private copy is left behind.
    shared_ptrs = {a.data_ptr() for a in graph._graph._forking_pk_state[2]}
    assert all(t.data_ptr() in shared_ptrs for t in graph.adj_tensors("csc")[:2])
    assert graph.ndata["feat"].is_shared()
    assert torch.equal(graph.edges()[0], src) and torch.equal(graph.edges()[1], dst)
    assert torch.equal(graph.ndata["feat"], feat)
    prepare_graphs(task, "spawn")  # a second fit: nothing moves again
    assert {a.data_ptr() for a in graph._graph._forking_pk_state[2]} == shared_ptrs


# ---- in the ranks ----------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("launcher", ["fork", "forkserver", "spawn"])
def test_ranks_share_exactly_the_formats_asked_for(root_dir, tmp_path, launcher):
    trainer = Trainer(num_procs=2, launcher=launcher, max_epochs=1, progress_bar=False,
                      default_root_dir=root_dir, logger=False)
    trainer.fit(FormatProbe(make_graph(), str(tmp_path)))
    assert not rank_children()
    for rank in range(2):
        start = _read(tmp_path, "start", rank)
        assert start["created"] == ["coo", "csc"], rank
        assert start["shared"] == (launcher != "fork"), rank
        assert _read(tmp_path, "end", rank)["created"] == ["coo", "csc"]  # sampling needed nothing else


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("launcher", ["fork", "forkserver"])
def test_sampler_needing_another_format_builds_it_and_says_so(root_dir, tmp_path, launcher):
    trainer = Trainer(num_procs=2, launcher=launcher, max_epochs=1, progress_bar=False,
                      default_root_dir=root_dir, logger=False)
    trainer.fit(FormatProbe(make_graph(), str(tmp_path), edge_dir="out"))
    assert not rank_children()
    assert trainer.global_step > 0
    for rank in range(2):
        assert _read(tmp_path, "start", rank)["created"] == ["coo", "csc"]
        assert "csr" in _read(tmp_path, "end", rank)["created"]  # built in the rank, on first use
    said = (tmp_path / "warnings_r0.txt").read_text()  # rank 0 speaks for all
    assert "UserWarning: NodeLoader reads the graph's CSR format, which was not built before the ranks started" in said
    assert "Set graph_formats = ('coo', 'csc', 'csr') on the task" in said
    other = tmp_path / "warnings_r1.txt"
    assert not other.exists() or "CSR format" not in other.read_text()
