"""Node classification trained with ``NeighborSampler(prob=...)`` sampled on the device (torch ops,
on a CPU rank here) is as accurate as with DGL's weighted sampler on the CPU, within seed noise."""
from __future__ import annotations

import statistics

import pytest
import torch

import graphtrainer  # noqa: F401
import dgl

from graphtrainer import ModelCheckpoint, Trainer
from graphtrainer.examples.node_classification import NodeClassification


class _Weighted(NodeClassification):
    def train_sampler(self):
        return dgl.dataloading.NeighborSampler(self.fanouts, prob="w", prefetch_node_feats=["feat"],
                                               prefetch_labels=["label"])


def _run(graph, sampling, seed, root_dir):
    task = _Weighted(graph, fanouts=[4, 4], hidden=128, dropout=0.5, lr=1e-2, weight_decay=5e-4, batch_size=32)
    ckpt = ModelCheckpoint(monitor="val_acc", mode="max")
    trainer = Trainer(max_epochs=20, seed=seed, sampling=sampling, progress_bar=False, logger=False,
                      enable_model_summary=False, default_root_dir=root_dir, callbacks=[ckpt],
                      check_val_every_n_epoch=2)
    trainer.fit(task)
    return trainer.test(task, ckpt_path="best")["test_acc"]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_weighted_node_classification_on_the_device_matches_dgls_weighted_sampling(root_dir):
    """Cora with a third of its edges weighted 0 and the rest by random weights: test accuracy
    over 3 seeds each way; the means within the larger of 0.02 and twice the summed standard
    deviations (the rule of test_device_sampling.py's uniform comparison)."""
    from graphtrainer import datasets

    graph = datasets.load("cora")
    w = torch.rand(graph.num_edges(), generator=torch.Generator().manual_seed(0))
    graph.edata["w"] = torch.where(w < 1 / 3, 0.0, w)
    runs = {m: [_run(graph, m, seed, root_dir) for seed in range(3)] for m in ("cpu", "device")}
    print("cora weighted", runs)
    gap = abs(statistics.mean(runs["cpu"]) - statistics.mean(runs["device"]))
    assert gap <= max(0.02, 2 * (statistics.stdev(runs["cpu"]) + statistics.stdev(runs["device"]))), runs
