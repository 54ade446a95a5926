"""A PyG heterogeneous model (``to_hetero`` of a GraphSAGE) on ``HeteroData`` batches through real
ranks (2, gloo, fork) reaches the DGL-format task's accuracy (HeteroSAGE, HeteroGraphConv) on a
synthetic heterograph of papers and words; sampled on the CPU and on the device sampler.

"Within noise", the rule of this file (as tests/integration/test_pyg_tasks.py's): over seeds 0, 1,
2, the PyG model's mean test accuracy is at least the reference's mean minus ``max(0.02, 2 * se)``,
where ``se`` is the standard error of the difference of the two means (``sqrt(s_a**2 / 3 +
s_b**2 / 3)``, sample standard deviations). Doing better than the reference passes: the claim is
"no worse".
"""
from __future__ import annotations

import statistics

import pytest

from graphtrainer import ModelCheckpoint, Trainer
from graphtrainer.examples.hetero_classification import HeteroClassification

from pyg_hetero_tasks import PygHeteroClassification

# Twelve short training runs: about a minute on 2 cores. Left out of the quick run, pytest -m "not slow".
pytestmark = pytest.mark.slow

datasets = pytest.importorskip("graphtrainer.datasets")
SEEDS = (0, 1, 2)


def within_noise(got, reference):
    se = (statistics.variance(got) / len(got) + statistics.variance(reference) / len(reference)) ** 0.5
    return statistics.mean(got) >= statistics.mean(reference) - max(0.02, 2 * se)


def _test_acc(kind, graph, root_dir, seed, sampling):
    task = kind(graph, fanouts=[5, 5], hidden=32, embed_dim=16, dropout=0.3, lr=1e-2, batch_size=64,
                eval_batch_size=256, layerwise_eval=False)
    ckpt = ModelCheckpoint(monitor="val_acc", mode="max")
    trainer = Trainer(num_procs=2, launcher="fork", max_epochs=10, seed=seed, progress_bar=False, logger=False,
                      default_root_dir=root_dir, callbacks=[ckpt], enable_model_summary=False,
                      find_unused_parameters=True, sampling=sampling)
    trainer.fit(task)
    result = trainer.test(task, ckpt_path="best")
    assert result["test_nodes"] == int(graph.nodes["paper"].data["test_mask"].sum())  # each test node once
    return result["test_acc"]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("sampling", ["cpu", "device"])
def test_a_to_hetero_graphsage_reaches_the_dgl_format_heterosage(root_dir, sampling):
    graph = datasets.synthetic_hetero(3000, 400, avg_degree=2, words_per_paper=4, feat_dim=16, num_classes=4,
                                      seed=0, homophily=0.5)
    acc = {kind.__name__: [_test_acc(kind, graph, root_dir, s, sampling) for s in SEEDS]
           for kind in (HeteroClassification, PygHeteroClassification)}
    print(sampling, acc)
    assert within_noise(acc["PygHeteroClassification"], acc["HeteroClassification"]), acc
    assert min(acc["PygHeteroClassification"]) >= 0.6, acc  # chance is 0.25
    # Measured (torch 2.2.1, CPU sampling): DGL format 0.803, 0.827, 0.812; PyG 0.853, 0.848, 0.858.
