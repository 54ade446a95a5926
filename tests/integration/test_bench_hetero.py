"""The sampling-worker and layer-wise benchmarks run end to end at a tiny size."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from launch_env import env_without_launch

ROOT = Path(__file__).resolve().parents[2]

# Each script builds a graph and runs 2-rank fits: about 10 s each.
# Left out of the quick run, pytest -m "not slow".
pytestmark = pytest.mark.slow


def _run(script, *args):
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), *args], capture_output=True,
                          text=True, timeout=170, cwd=ROOT, env=env_without_launch(DGLBACKEND="pytorch"))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return proc


@pytest.mark.timeout(180)
def test_workers_benchmark_tiny(tmp_path):
    _run("arms.py", "workers", "--nodes", "5000", "--batches", "2", "--batch-size", "256", "--workers", "0,1",
         "--root-dir", str(tmp_path / "runs"), "--out", str(tmp_path))
    data = json.loads((tmp_path / "workers.json").read_text())
    assert [r["workers"] for r in data["runs"]] == [0, 1]
    assert all(len(r["seeds_per_s"]) == 3 and min(r["seeds_per_s"]) > 0 for r in data["runs"])
    assert "| 1 |" in (tmp_path / "workers.md").read_text()


@pytest.mark.timeout(180)
def test_layerwise_benchmark_tiny(tmp_path):
    _run("evaluation.py", "layerwise", "--nodes", "5000", "--batch-sizes", "512", "--root-dir", str(tmp_path / "runs"),
         "--out", str(tmp_path))
    data = json.loads((tmp_path / "layerwise.json").read_text())
    (run,) = data["runs"]
    assert run["batch_size"] == 512 and run["seconds"] > 0 and len(run["uss_mb"]) == 2
