"""Smoke test of tutorials/05_pyg_style_sage.py: its --fast run, in a subprocess, checked
through the summary.json it writes (real metrics, the checkpoint on disk)."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tutorial_run import run_fast

# The tutorial as a user runs it, in a subprocess: seconds.
# Left out of the quick run, pytest -m "not slow".
pytestmark = pytest.mark.slow


@pytest.mark.timeout(200)
def test_tutorial_05_fast(tmp_path):
    summary = run_fast("05_pyg_style_sage.py", tmp_path / "t05", timeout=180)

    # The PyG example's model and sampler.
    assert summary["fanouts"] == [25, 10] and summary["hidden"] == 256 and summary["num_classes"] == 41
    assert summary["num_procs"] == 2 and summary["epochs"] == 3
    assert summary["train_loss_last"] < summary["train_loss_first"]
    # Every validation and test node scored exactly once across the ranks.
    assert summary["val_nodes_scored"] == summary["val_nodes"] > 0
    assert summary["test_nodes_scored"] == summary["test_nodes"] > 0
    chance = 1.0 / summary["num_classes"]
    assert summary["val_acc_last"] > 4 * chance          # measured: 0.34 (chance 0.024)
    assert summary["test_acc"] > 4 * chance              # measured: 0.36-0.37 (sampled evaluation)

    ckpt_path = Path(summary["checkpoint"])
    assert ckpt_path.is_file() and ckpt_path.parent.parent == Path(summary["log_dir"])
    ckpt = torch.load(ckpt_path, map_location="cpu", weights_only=True)
    assert ckpt["hyper_parameters"]["fanouts"] == [25, 10]
    assert any(k.startswith("layers.") for k in ckpt["state_dict"])
