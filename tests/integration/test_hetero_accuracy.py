"""HeteroSAGE on Cora as papers and words, 2 real ranks: test accuracy >= 0.70 with full
neighbourhoods (layer-wise inference), the sampled figure reported beside it."""
from __future__ import annotations

import pytest

from graphtrainer import ModelCheckpoint, Trainer
from graphtrainer.examples.hetero_classification import HeteroClassification

# A full training run on a real dataset: about 50 s.
# Left out of the quick run, pytest -m "not slow".
pytestmark = pytest.mark.slow

datasets = pytest.importorskip("graphtrainer.datasets")


@pytest.mark.timeout(240)
def test_cora_hetero_accuracy(root_dir, tmp_path, monkeypatch):
    monkeypatch.setenv(datasets.CACHE_ENV, str(tmp_path / "cache"))
    graph = datasets.cora_hetero()
    task = HeteroClassification(graph, fanouts=[10, 10], hidden=64, embed_dim=16, dropout=0.6, lr=1e-2,
                                batch_size=32)
    ckpt = ModelCheckpoint(monitor="val_acc_full", mode="max")
    trainer = Trainer(num_procs=2, max_epochs=60, seed=0, progress_bar=False, default_root_dir=root_dir,
                      callbacks=[ckpt], find_unused_parameters=True)
    trainer.fit(task)
    result = trainer.test(task, ckpt_path="best")
    assert result["test_nodes"] == 1000
    # The quick full-batch check of this model reached 0.72-0.76; chance is ~0.3.
    assert result["test_acc_full"] >= 0.70, result
    # Sampled neighbourhoods (10 per relation) score lower, but far above chance.
    assert result["test_acc"] >= 0.60, result
