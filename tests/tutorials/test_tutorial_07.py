"""Smoke test of tutorials/07_link_prediction.py: the script as a user runs it, ``--fast``."""
from __future__ import annotations

import pytest

from tutorial_run import run_fast
from tutorial_results import check_figures


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_fast_run_trains_tests_and_predicts_link_scores(tmp_path):
    s = run_fast("07_link_prediction.py", tmp_path / "out", "--root-dir", str(tmp_path / "runs"), timeout=120,
                 GRAPHTRAINER_CACHE=str(tmp_path / "cache"))
    assert s["num_procs"] == 2 and s["epochs"] == 4 and s["dataset"] == "cora"
    # The classic split of Cora's 5,278 undirected edges; every held-out edge scored once.
    assert (s["train_edges"], s["val_edges"], s["test_edges"]) == (4488, 263, 527)
    assert s["predict_rows"] == 527
    # Chance ROC-AUC is 0.5; 4 epochs reach about 0.82 on validation.
    assert s["best_val_auc"] > 0.7 and s["test_auc"] > 0.7, s
    # The ranks' exact metrics equal those recomputed from predict()'s rows in one process.
    assert s["predict_auc"] == pytest.approx(s["test_auc"], abs=1e-9)
    assert s["predict_mrr"] == pytest.approx(s["test_mrr"], abs=1e-9)
    # The figures that tutorials/results/07_link_prediction.json records, within its tolerances.
    check_figures("07_link_prediction", s)
