"""PyG's models in a GraphTask on ``batch_format="pyg"`` batches, through real ranks: the
accuracy of graphtrainer's own GraphSAGE on DGL's blocks, fork and spawn alike, exact
evaluation, exact resume, and link prediction at the DGL format's figure.

"Within noise", the rule of this file: over seeds 0, 1, 2, a PyG model's mean test metric is at
least the reference's mean minus ``max(0.02, 2 * se)``, where ``se`` is the standard error of the
difference of the two means (``sqrt(s_a**2 / 3 + s_b**2 / 3)``, sample standard deviations).
Doing better than the reference passes: the claim is "no worse".
"""
from __future__ import annotations

import statistics

import pytest
import torch

from graphtrainer import ModelCheckpoint, Trainer
from graphtrainer.examples.node_classification import NodeClassification

from link_tasks import LinkTask
from pyg_tasks import PygLinkTask, PygNodeClassification

# Full training runs, several per test: minutes. Left out of the quick run, pytest -m "not slow".
pytestmark = pytest.mark.slow

datasets = pytest.importorskip("graphtrainer.datasets")
SEEDS = (0, 1, 2)


def within_noise(got, reference):
    se = (statistics.variance(got) / len(got) + statistics.variance(reference) / len(reference)) ** 0.5
    return statistics.mean(got) >= statistics.mean(reference) - max(0.02, 2 * se)


def _cora_test_acc(task, root_dir, seed):
    ckpt = ModelCheckpoint(monitor="val_acc", mode="max")
    trainer = Trainer(num_procs=2, launcher="fork", max_epochs=40, seed=seed, progress_bar=False,
                      default_root_dir=root_dir, callbacks=[ckpt], logger=False, enable_model_summary=False)
    trainer.fit(task)
    result = trainer.test(task, ckpt_path="best")
    assert result["test_nodes"] == int(task.graph.ndata["test_mask"].sum())  # each test node once
    return result["test_acc"]


@pytest.mark.timeout(900)
def test_pyg_graphsage_and_gcn_reach_graphtrainers_sage_on_cora(root_dir, tmp_path, monkeypatch):
    monkeypatch.setenv(datasets.CACHE_ENV, str(tmp_path / "cache"))
    graph = datasets.load("cora")
    hp = dict(fanouts=[10, 10], hidden=128, dropout=0.5, lr=1e-2, weight_decay=5e-4, batch_size=32)
    acc = {"sage": [_cora_test_acc(NodeClassification(graph, **hp), root_dir, s) for s in SEEDS]}
    for model in ("graphsage", "gcn"):
        acc[model] = [_cora_test_acc(PygNodeClassification(graph, model=model, **hp), root_dir, s) for s in SEEDS]
    # Measured (torch 2.2.1): sage 0.801 (seed 0), PyG GraphSAGE 0.790, PyG GCN 0.830.
    for model in ("graphsage", "gcn"):
        assert within_noise(acc[model], acc["sage"]), acc
        assert min(acc[model]) >= 0.74, acc  # chance (majority class) is ~0.3


@pytest.mark.timeout(900)
def test_pyg_graphsage_reaches_graphtrainers_sage_on_tolokers(root_dir):
    """GraphSAGE only: PyG's GCN on sampled Tolokers subgraphs reached ROC-AUC 0.58-0.61 against
    SAGE's 0.76-0.78 after 5 epochs (GCN's normalisation on a heterophilous graph), a model
    difference, not a batch-format one; GCN is compared on Cora."""
    from graphtrainer.examples.node_classification import standardize_features

    graph = datasets.load("tolokers")
    standardize_features(graph)
    hp = dict(fanouts=[10, 10], hidden=64, dropout=0.2, lr=3e-3, batch_size=512, metric="roc_auc")

    def auc(task, seed):
        trainer = Trainer(num_procs=2, launcher="fork", max_epochs=10, seed=seed, progress_bar=False, logger=False,
                          default_root_dir=root_dir, enable_model_summary=False, check_val_every_n_epoch=10)
        trainer.fit(task)
        return trainer.test(task)["test_auc"]

    aucs = {"sage": [auc(NodeClassification(graph, **hp), s) for s in SEEDS],
            "graphsage": [auc(PygNodeClassification(graph, model="graphsage", **hp), s) for s in SEEDS]}
    print("tolokers", aucs)
    assert within_noise(aucs["graphsage"], aucs["sage"]), aucs
    assert min(aucs["graphsage"]) >= 0.7, aucs  # chance is 0.5


def _small_fit(graph, root_dir, launcher, epochs, ckpt=None, ckpt_path=None):
    task = PygNodeClassification(graph, fanouts=[5, 5], hidden=16, dropout=0.5, batch_size=64, eval_batch_size=128)
    trainer = Trainer(num_procs=2, launcher=launcher, max_epochs=epochs, seed=3, progress_bar=False, logger=False,
                      default_root_dir=root_dir, enable_model_summary=False, callbacks=[ckpt] if ckpt else [])
    trainer.fit(task, ckpt_path=ckpt_path)
    return trainer, task


@pytest.mark.timeout(300)
def test_fork_and_spawn_give_identical_histories_exact_evaluation_and_exact_resume(root_dir, tmp_path):
    graph = datasets.synthetic(600, 8, 12, 4, seed=0)
    runs = {launcher: _small_fit(graph, root_dir, launcher, 3) for launcher in ("fork", "spawn")}
    assert runs["fork"][0].history == runs["spawn"][0].history
    n_val = int(graph.ndata["val_mask"].sum())
    assert all(row["val_nodes"] == n_val for row in runs["fork"][0].history)  # every id scored once
    # Two epochs, then two more from the checkpoint, equal four in one go.
    ckpt = ModelCheckpoint(dirpath=tmp_path / "ck", save_top_k=0, save_last=True)
    _small_fit(graph, root_dir, "fork", 2, ckpt=ckpt)
    full_trainer, full = _small_fit(graph, root_dir, "fork", 4)
    resumed_trainer, resumed = _small_fit(graph, root_dir, "fork", 4, ckpt_path=str(tmp_path / "ck" / "last.ckpt"))
    assert resumed_trainer.history[-2:] == full_trainer.history[-2:]
    for name, value in full.module.state_dict().items():
        assert torch.equal(value, resumed.module.state_dict()[name]), name


def _cora_link_auc(kind, root_dir, seed):
    graph = datasets.load("cora")
    split = datasets.link_split(graph, seed=0)
    task = kind(split.graph, split.train_eids, split.val, split.test, reverse_eids=split.reverse_eids,
                exclude="reverse_id", fanouts=[10, 10], hidden=128, batch_size=512, lr=5e-3,
                negatives=1, eval_negatives=20)
    ckpt = ModelCheckpoint(monitor="val_auc", mode="max")
    trainer = Trainer(num_procs=2, launcher="fork", max_epochs=20, seed=seed, progress_bar=False, logger=False,
                      default_root_dir=root_dir, callbacks=[ckpt], enable_model_summary=False)
    trainer.fit(task)
    result = trainer.test(task, ckpt_path="best")
    assert result["test_edges"] == split.test[0].numel()  # every test edge scored once
    return result["test_auc"]


@pytest.mark.timeout(900)
def test_link_prediction_on_pyg_batches_reaches_the_dgl_format_figure(root_dir, tmp_path, monkeypatch):
    monkeypatch.setenv(datasets.CACHE_ENV, str(tmp_path / "cache"))
    auc = {kind.__name__: [_cora_link_auc(kind, root_dir, s) for s in SEEDS] for kind in (LinkTask, PygLinkTask)}
    assert within_noise(auc["PygLinkTask"], auc["LinkTask"]), auc
    assert min(auc["PygLinkTask"]) >= 0.88, auc  # the DGL format's floor (GAE: 91.0)
    # Measured (torch 2.2.1): DGL format 0.910, 0.912, 0.915; PyG format 0.909 (seed 0).
