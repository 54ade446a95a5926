"""Smoke test of tutorials/01_quickstart_cora.py: the script as a user runs it, ``--fast``."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tutorial_run import run_fast
from tutorial_results import check_figures

# The tutorial as a user runs it, in a subprocess: seconds.
# Left out of the quick run, pytest -m "not slow".
pytestmark = pytest.mark.slow


@pytest.mark.timeout(120)
def test_fast_run_trains_checkpoints_tests_and_predicts(tmp_path):
    s = run_fast("01_quickstart_cora.py", tmp_path / "out", "--root-dir", str(tmp_path / "runs"), timeout=100,
                 GRAPHTRAINER_CACHE=str(tmp_path / "cache"))

    assert s["num_procs"] == 2 and s["epochs"] == 8
    # Every validation/test node scored exactly once over the 2 ranks.
    assert s["val_nodes"] == 500 and s["test_nodes"] == 1000 and s["predict_rows"] == 1000
    # Chance on Cora is 1/7 (0.30 for the majority class); 8 epochs reach about 0.78.
    assert s["best_val_acc"] > 0.6 and s["test_acc"] > 0.6, s
    # trainer.test, trainer.predict and a fresh model loaded from the file agree.
    assert s["predict_acc"] == pytest.approx(s["test_acc"], abs=1e-6)
    assert s["fresh_model_acc"] == pytest.approx(s["test_acc"], abs=1e-6)
    assert s["fresh_model_agree"] == 1000
    # The figures that tutorials/results/01_quickstart_cora.json records, within its tolerances.
    check_figures("01_quickstart_cora", s)

    ckpt_path = Path(s["checkpoint"])
    assert ckpt_path.is_file() and ckpt_path.parent == Path(s["log_dir"]) / "checkpoints"
    ckpt = torch.load(ckpt_path, map_location="cpu", weights_only=True)
    assert not any(k.startswith("module.") for k in ckpt["state_dict"])
    assert ckpt["hyper_parameters"]["hidden"] == 128
    assert f"val_acc={s['best_val_acc']:.4f}" in ckpt_path.name
