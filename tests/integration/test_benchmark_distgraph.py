"""Smoke tests of ``benchmarks/distgraph.py``: ``--paper`` prints the 4/8/16-machine rows,
and ``--quick --skip-remote`` runs both arms (DistDGL with 1 partition, fork) and writes
the expected fields. No timing is asserted: benchmarks measure, tests check that they work."""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from launch_env import env_without_launch

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "distgraph.py"
QUICK_TIMEOUT_S = 420


def run(*args: str, timeout: float) -> subprocess.CompletedProcess:
    env = env_without_launch(DGLBACKEND="pytorch", PYTHONUNBUFFERED="1")
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)


def positive(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


def table_rows(text: str, marker: str) -> list:
    return [[c.strip() for c in line.strip().strip("|").split("|")] for line in text.splitlines()
            if line.startswith("|") and marker in line]


@pytest.mark.timeout(120)
@pytest.mark.slow  # 3 s or more on 2 cores: a fresh interpreter
def test_paper_prints_one_machine_and_4_8_16_machine_rows():
    proc = run("--paper", timeout=100)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "ogbn-papers100M" in proc.stdout and "111,059,956 nodes" in proc.stdout
    header = table_rows(proc.stdout, "inner nodes")[0]
    parts = table_rows(proc.stdout, "DistDGL, ")
    assert [int(r[0]) for r in parts] == [4, 8, 16]
    one = table_rows(proc.stdout, "in-memory DGLGraph")
    assert len(one) == 1 and one[0][0] == "1"
    total = header.index("total GB")
    share = header.index("x one machine")
    totals = [float(r[total]) for r in one + parts]
    assert totals == sorted(totals, reverse=True) and all(t > 0 for t in totals)  # more machines, less each
    assert float(one[0][share]) == 1.0 and all(0 < float(r[share]) < 1 for r in parts)
    for name in ("features GB", "CSC indptr+indices GB", "edge ids GB (CSC + _ID)", "halo nodes", "train nodes"):
        assert name in header


# About 21 s on the 2-core VM: a benchmark run, so `slow` (setup.cfg: 3 s or more).
@pytest.mark.slow
@pytest.mark.timeout(QUICK_TIMEOUT_S + 60)
def test_quick_run_measures_both_arms(tmp_path):
    proc = run("--quick", "--skip-remote", "--out", str(tmp_path), timeout=QUICK_TIMEOUT_S)
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    for ext in ("json", "md", "png"):
        assert (tmp_path / f"distgraph.{ext}").stat().st_size > 0
    data = json.loads((tmp_path / "distgraph.json").read_text())
    assert data["graph"]["num_nodes"] == 20_000 and data["order"] == ["distdgl", "fork"]
    arms = data["throughput"]["arms"]
    for name in ("distdgl", "fork"):
        arm = arms[name]
        for key in ("seeds_per_s", "batch_ms", "rank_uss_mb", "rank_pss_mb", "driver_pss_mb", "driver_rss_mb"):
            assert positive(arm[key]), (name, key, arm[key])
        assert arm["rank_uss_mb"] <= arm["rank_pss_mb"] + 1
        run_ = data["runs"][name][0]
        assert len(run_["rank_uss_mb"]) == len(run_["rank_pss_mb"]) == 2  # both trainer ranks report
        assert len(run_["epoch_s"]) == 1 and positive(run_["seeds_per_epoch"])
    assert positive(arms["distdgl"]["server_rss_mb"]) and positive(arms["distdgl"]["server_pss_mb"])
    assert arms["fork"]["server_rss_mb"] is None  # no graph server without DistDGL
    ratios = data["throughput"]["ratios"]
    assert {"seeds_per_s", "rank_uss_mb", "rank_pss_mb"} <= set(ratios) and all(positive(v) for v in ratios.values())
    assert data["remote"] is None
    assert [r["machines"] for r in data["paper"]] == [1, 4, 8, 16]
    md = (tmp_path / "distgraph.md").read_text()
    for heading in ("## 1. Seeds/s and memory per trainer", "## 2. Remote feature fetches", "## 3. papers100M"):
        assert heading in md and heading in proc.stdout
    assert "**DistDGL / fork**: seeds/s" in md and "Not run (--skip-remote)" in md
