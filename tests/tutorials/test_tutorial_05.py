"""Smoke test of tutorials/05_pyg_style_sage.py: its --fast run, in a subprocess, checked
through the summary.json it writes (real metrics, the checkpoint on disk): PyG's own
GraphSAGE (and GCN) trained on batch_format="pyg" batches by 2 CPU ranks."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tutorial_run import run_fast
from tutorial_results import check_figures

# The tutorial as a user runs it, in a subprocess: seconds.
# Left out of the quick run, pytest -m "not slow".
pytestmark = pytest.mark.slow


def _check(summary, model_class):
    assert summary["model_class"] == model_class  # PyG's own model, not a port
    assert summary["fanouts"] == [10, 25] and summary["hidden"] == 256 and summary["num_classes"] == 41
    assert summary["num_procs"] == 2 and summary["epochs"] == 3
    assert summary["train_loss_last"] < summary["train_loss_first"]
    # Every validation and test node scored exactly once across the ranks.
    assert summary["val_nodes_scored"] == summary["val_nodes"] > 0
    assert summary["test_nodes_scored"] == summary["test_nodes"] > 0
    chance = 1.0 / summary["num_classes"]
    assert summary["val_acc_last"] > 4 * chance and summary["test_acc"] > 4 * chance
    ckpt_path = Path(summary["checkpoint"])
    assert ckpt_path.is_file() and ckpt_path.parent.parent == Path(summary["log_dir"])
    return torch.load(ckpt_path, map_location="cpu", weights_only=True)


@pytest.mark.timeout(300)
def test_tutorial_05_fast(tmp_path):
    summary = run_fast("05_pyg_style_sage.py", tmp_path / "t05", timeout=280)
    ckpt = _check(summary, "torch_geometric.nn.models.basic_gnn.GraphSAGE")
    assert ckpt["hyper_parameters"]["model"] == "graphsage"
    # The figures that tutorials/results/05_pyg_style_sage.json records, within its tolerances.
    check_figures("05_pyg_style_sage", summary)
    assert any(k.startswith("convs.") for k in ckpt["state_dict"])


@pytest.mark.timeout(300)
def test_tutorial_05_fast_gcn(tmp_path):
    summary = run_fast("05_pyg_style_sage.py", tmp_path / "t05", "--model", "gcn", timeout=280)
    _check(summary, "torch_geometric.nn.models.basic_gnn.GCN")
