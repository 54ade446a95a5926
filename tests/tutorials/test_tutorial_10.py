"""Smoke test of tutorials/10_layerwise_inference.py: the script as a user runs it, ``--fast``."""
from __future__ import annotations

import pytest

from tutorial_run import run_fast
from tutorial_results import check_figures

# The tutorial as a user runs it, in a subprocess: about 20 s (two short 2-rank fits).
# Left out of the quick run, pytest -m "not slow".
pytestmark = pytest.mark.slow


@pytest.mark.timeout(150)
def test_fast_run_reports_sampled_and_layerwise_metrics(tmp_path):
    s = run_fast("10_layerwise_inference.py", tmp_path / "out", "--root-dir", str(tmp_path / "runs"), timeout=140,
                 GRAPHTRAINER_CACHE=str(tmp_path / "cache"))
    assert s["num_procs"] == 2
    for name, nodes in (("cora", 1000), ("tolokers", 2940)):
        r = s[name]
        assert r["epochs"] == 3 and r["test_nodes"] == nodes
        # Layer-wise inference over 2 ranks equals a one-process full-graph forward.
        assert r["max_diff_vs_full_forward"] < 1e-5
        assert 0.0 <= r["test_sampled"] <= 1.0 and 0.0 <= r["test_full"] <= 1.0
    assert s["cora"]["test_full"] > 0.4  # 3 epochs; chance ~0.3
    # The figures that tutorials/results/10_layerwise_inference.json records, within its tolerances.
    check_figures("10_layerwise_inference", s)
