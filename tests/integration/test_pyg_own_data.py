"""A PyG user's own graph, unchanged: ``to_dgl(data)`` keeps PyG's names (``x``, ``y``,
``edge_attr``), and PyG's GraphSAGE reading ``batch.x``/``batch.y`` trains on it through two
real ranks, sampling on the CPU (DGL) and on the device, no key named."""
from __future__ import annotations

import warnings

import pytest

from graphtrainer import Trainer

from pyg_tasks import OwnPygDataTask, own_pyg_data

pytest.importorskip("torch_geometric")


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("sampling", ["cpu", "device"])
def test_pyg_graphsage_trains_on_to_dgl_of_a_pyg_data(sampling, root_dir):
    from conftest import rank_children

    data = own_pyg_data()
    task = OwnPygDataTask(data)
    trainer = Trainer(num_procs=2, launcher="fork", max_epochs=4, seed=1, sampling=sampling, threads_per_proc=1,
                      progress_bar=False, logger=False, default_root_dir=root_dir, enable_model_summary=False)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*carry no x")
        trainer.fit(task)
    history = trainer.history
    assert len(history) == 4
    train = int(data.train_mask.sum())
    for epoch in history:
        assert epoch["wrong_rows"] == 0  # x is data.x[n_id], y is data.y[n_id]
        assert epoch["non_train_seeds"] == 0
        assert train <= epoch["seeds_seen"] <= train + 1  # each rank's share, padded by at most one
    assert history[-1]["train_loss"] < history[0]["train_loss"]  # y is learnable from x
    assert not rank_children()
