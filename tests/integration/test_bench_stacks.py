"""Smoke test of ``benchmarks/arms.py stacks`` (newest vs pinned set): the driver alternates the two
interpreters and reports their epoch times side by side. Here both arms are this suite's own
interpreter, so the test checks the machinery, not a stack's speed."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from launch_env import env_without_launch

pytestmark = pytest.mark.slow  # four tiny training runs in fresh interpreters

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(600)
def test_stacks_benchmark_runs_both_interpreters_interleaved(tmp_path):
    out = tmp_path / "stacks"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "arms.py"), "stacks", "--tiny", "--rounds", "1",
         "--dropouts", "0.5", "0", "--out", str(out), "--pinned-python", sys.executable, "--newest-python", sys.executable],
        cwd=ROOT, env=env_without_launch(DGLBACKEND="pytorch"), capture_output=True, text=True, timeout=560)
    assert proc.returncode == 0, proc.stderr[-4000:]
    data = json.loads((out / "stacks.json").read_text())
    for stack in ("pinned", "newest"):
        runs = data["runs"][stack]
        assert [r["dropout"] for r in runs] == [0.5, 0.0] and all(len(r["epoch_times_s"]) == 2 for r in runs)
        assert all(t > 0 for r in runs for t in r["epoch_times_s"])
        assert all(ms > 0 for r in runs for ms in r["ops_ms"].values())
        assert set(runs[0]["ops_ms"]) == {"F.dropout", "bernoulli_", "rand_like", "graphtrainer.nn.Dropout"}
    summary = data["summary"]
    for dropout in ("0.5", "0.0"):
        med = summary["by_dropout"][dropout]["median_epoch_s"]
        assert summary["by_dropout"][dropout]["ratio_newest_over_pinned"] == pytest.approx(med["newest"] / med["pinned"])
    # The headline figure is the first arm's: the example's task, dropout 0.5.
    assert summary["ratio_newest_over_pinned"] == summary["by_dropout"]["0.5"]["ratio_newest_over_pinned"]
    md = (out / "stacks.md").read_text()
    assert "newest / pinned epoch time" in md and "| 0.0 |" in md and "bernoulli_" in md


def test_missing_interpreter_is_named_with_the_fix(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "arms.py"), "stacks", "--tiny", "--out", str(tmp_path),
         "--newest-python", str(tmp_path / "nope" / "python")],
        cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "GRAPHTRAINER_STACK=" in proc.stderr and "scripts/env.sh" in proc.stderr
