"""Smoke test of ``benchmarks/arms.py nn`` at --tiny size (a subprocess; 3 arms x 2-rank fits): it must
write JSON, Markdown and PNG with an epoch time, ratios to dgl.nn and accuracy per arm.
No timing is asserted: benchmarks measure, tests only check that they work."""
from __future__ import annotations

import math

import pytest

from test_benchmarks import outputs, run_bench

pytestmark = pytest.mark.slow


@pytest.mark.timeout(600)
def test_nn_benchmark_tiny(tmp_path):
    proc = run_bench("arms.py", "nn", "--tiny", "--out", str(tmp_path), timeout=540)
    data = outputs(tmp_path, "nn", proc)
    assert data["baseline"] == "dgl.nn" and "CPU vs dgl.nn" in (tmp_path / "nn.md").read_text()
    assert set(data["arms"]) == {"dgl.nn", "graphtrainer.nn", "torch blocks"}
    for arm in data["arms"].values():
        assert arm["epoch_s"] > 0 and arm["epoch_cpu_s"] > 0 and math.isfinite(arm["time_ratio"])
        assert math.isfinite(arm["cpu_ratio"])
        assert all(0.0 <= a <= 1.0 for a in arm["test_acc"])
    # One seed, one model and sampler seed for every arm: the trained models agree closely.
    accs = [arm["test_acc"][0] for arm in data["arms"].values()]
    assert max(accs) - min(accs) < 0.05
    assert data["arms"]["dgl.nn"]["time_ratio"] == 1.0
