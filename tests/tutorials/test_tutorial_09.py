"""Smoke test of tutorials/09_heterograph.py: the script as a user runs it, ``--fast``."""
from __future__ import annotations

import pytest

from tutorial_run import run_fast
from tutorial_results import check_figures

# The tutorial as a user runs it, in a subprocess: about 40 s (six short 2-rank fits).
# Left out of the quick run, pytest -m "not slow".
pytestmark = pytest.mark.slow


@pytest.mark.timeout(180)
def test_fast_run_trains_a_heterograph_and_scores_it_layerwise(tmp_path):
    s = run_fast("09_heterograph.py", tmp_path / "out", "--root-dir", str(tmp_path / "runs"), timeout=170,
                 GRAPHTRAINER_CACHE=str(tmp_path / "cache"))
    assert s["num_procs"] == 2 and s["epochs"] == 8
    assert s["num_nodes"] == {"paper": 2708, "word": 1433}
    assert s["num_edges"] == {"cites": 10556, "has": 49216, "in": 49216}
    assert s["test_nodes"] == 1000 and s["predict_rows"] == 1000
    # predict() returns the layer-wise (full neighbourhood) probabilities of the test papers.
    assert s["predict_acc"] == pytest.approx(s["test_acc_full"], abs=1e-6)
    assert s["test_acc_full"] > 0.35, s  # 8 epochs; chance is ~0.3 (majority class)
    # The figures that tutorials/results/09_heterograph.json records, within its tolerances.
    check_figures("09_heterograph", s)
    cost = s["ddp_ms_per_step"]
    assert cost["hetero, no option"] == "fails, naming the option"
    assert isinstance(cost["hetero, find_unused_parameters"], float)
    assert isinstance(cost["sage, no option"], float) and isinstance(cost["sage, find_unused_parameters"], float)
    walk = s["walk_ms_per_step"]
    assert set(walk) == {f"{m}, find_unused_parameters={f}" for m in ("hetero", "sage") for f in (False, True)}
    assert all(v > 0 for v in walk.values())
