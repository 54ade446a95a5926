"""Smoke tests of the benchmarks: each one runs at --tiny size in a subprocess and must
write JSON, Markdown and PNG with sane values; bad input is refused with a clear message.

No timing is asserted here: benchmarks measure, tests only check that they work.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from launch_env import env_without_launch

# Each benchmark runs in a subprocess (tiny sizes: 15-25 s each; bad input: ~1.5 s each).
# Left out of the quick run, pytest -m "not slow".
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"
TINY_TIMEOUT_S = 420


def run_bench(script: str, *args: str, timeout: float = TINY_TIMEOUT_S) -> subprocess.CompletedProcess:
    env = env_without_launch(DGLBACKEND="pytorch", PYTHONUNBUFFERED="1")
    return subprocess.run([sys.executable, str(BENCH / script), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def outputs(out: Path, name: str, proc: subprocess.CompletedProcess) -> dict:
    assert proc.returncode == 0, f"{name} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    for ext in ("json", "md", "png"):
        path = out / f"{name}.{ext}"
        assert path.is_file() and path.stat().st_size > 0, f"{path} missing or empty"
    assert (out / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = (out / f"{name}.md").read_text()
    assert md.count("|") > 10, "no Markdown table"
    data = json.loads((out / f"{name}.json").read_text())
    assert data["machine"]["cpus"] >= 1 and data["versions"]["torch"]
    return data


def positive(x: float) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


@pytest.mark.timeout(TINY_TIMEOUT_S + 60)
def test_fork_vs_spawn_tiny(tmp_path):
    proc = run_bench("fork_vs_spawn.py", "--tiny", "--out", str(tmp_path))
    data = outputs(tmp_path, "fork_vs_spawn", proc)
    seen = {(r["launcher"], r["world"]) for r in data["runs"]}
    assert seen == {("single", 1), ("gt-fork", 2), ("gt-forkserver", 2), ("gt-spawn", 2), ("naive-spawn", 2)}
    for run in data["runs"]:
        res = run["result"]
        world = run["world"]
        assert positive(res["startup_s"]) and positive(res["throughput_seeds_per_s"]), run["label"]
        assert len(res["first_step_s"]) == len(res["ready_s"]) == world
        assert all(0 <= r <= f + 1e-3 for r, f in zip(res["ready_s"], res["first_step_s"])), run["label"]
        procs = res["processes"]
        # PSS accounting: the total is the sum over the tree, USS <= PSS <= RSS per process.
        assert positive(res["total_pss_mb"])
        assert abs(res["total_pss_mb"] - sum(p["pss_mb"] for p in procs)) <= 0.1 * len(procs) + 0.1
        for p in procs:
            assert 0 <= p["uss_mb"] <= p["pss_mb"] + 0.1 <= p["rss_mb"] + 0.2, p
        ranks = [p for p in procs if p["role"].startswith("rank")]
        if world == 1:
            assert procs[0]["role"] == "parent" and not ranks
        else:
            assert len(res["rank_uss_mb"]) == len(ranks) == world, run["label"]
            assert all(positive(u) for u in res["rank_uss_mb"])
            assert res["total_pss_mb"] > res["parent_pss_mb"]
        assert res["peak_total_pss_mb"] >= res["total_pss_mb"]
    rows = {(r["launcher"], r["world"]): r for r in data["summary"]}
    assert rows[("single", 1)]["pss_ratio"] == pytest.approx(1.0)
    assert all(positive(r["pss_ratio"]) for r in data["summary"])
    assert any("start-up" in t["what"] for t in data["targets"])
    # scaling's question, asked last (the README reads the first two): gt-fork x2 over the 1-process run
    speedup = data["targets"][-1]
    assert speedup["what"].startswith("throughput, gt-fork 2 ranks") and positive(speedup["measured"])
    assert speedup["measured"] == pytest.approx(rows[("gt-fork", 2)]["throughput_seeds_per_s"]
                                                / rows[("single", 1)]["throughput_seeds_per_s"])
    assert speedup["met"] == (speedup["measured"] >= 1.7)
    assert all("PSS" in t["what"] for t in data["targets"][:2])
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    assert rows[("single", 1)]["threads"] == cores and rows[("gt-fork", 2)]["threads"] == max(1, cores // 2)


@pytest.mark.timeout(TINY_TIMEOUT_S + 60)
def test_precision_tiny(tmp_path):
    proc = run_bench("arms.py", "precision", "--tiny", "--out", str(tmp_path))
    data = outputs(tmp_path, "precision", proc)
    (res,) = data["results"]
    for precision in ("32", "bf16-mixed"):
        assert positive(res[precision]["epoch_s"]) and 0.0 <= res[precision]["test_acc"] <= 1.0
    assert positive(res["time_ratio"])


@pytest.mark.timeout(TINY_TIMEOUT_S + 60)
def test_overhead_tiny(tmp_path):
    proc = run_bench("overhead.py", "--tiny", "--thread-arm", "--stop-arm", "--out", str(tmp_path))
    data = outputs(tmp_path, "overhead", proc)
    (res,) = data["results"]
    arms = ["handwritten", "handwritten_thread", "graphtrainer", "graphtrainer_no_stop"]
    assert res["order"] == arms
    for arm in arms:
        (run,) = res["runs"][arm]
        assert len(run["epoch_times_s"]) == 2 and all(positive(t) for t in run["epoch_times_s"])
        assert 0.0 <= run["test_acc"] <= 1.0
        assert positive(res["median_epoch_s"][arm])
    assert positive(res["ratio"]) and res["steps_per_epoch_per_rank"] >= 1
    assert res["metric"] == "test_acc" and len(res["scores"]["graphtrainer"]) == 1
    assert {"step_ms", "epoch_fixed_ms"} <= set(res["costs"]["graphtrainer"])
    assert all(math.isfinite(v) for v in res["costs"]["handwritten"].values())
    assert res["stop_ratio"] == pytest.approx(res["ratio"] / res["ratios"]["graphtrainer_no_stop"])
    assert res["ratio"] == pytest.approx(res["median_epoch_s"]["graphtrainer"] / res["median_epoch_s"]["handwritten"])
    assert data["targets"][0]["graph"] == res["graph"] and data["targets"][0]["measured"] == res["ratio"]


@pytest.mark.timeout(TINY_TIMEOUT_S + 60)
def test_pyg_vs_blocks_tiny(tmp_path):
    proc = run_bench("arms.py", "pyg_vs_blocks", "--tiny", "--trim-arm", "--out", str(tmp_path))
    data = outputs(tmp_path, "pyg_vs_blocks", proc)
    assert data["versions"]["torch_geometric"] and set(data["runs"]) == {"blocks", "pyg", "pyg_trim"}
    for arm, (run,) in data["runs"].items():
        assert len(run["epoch_times_s"]) == 2 and all(positive(t) for t in run["epoch_times_s"])
        assert 0.0 <= run["test_acc"] <= 1.0 and positive(data["ratios"][arm])
    assert data["ratios"]["blocks"] == 1.0


@pytest.mark.timeout(TINY_TIMEOUT_S + 60)
def test_pyg_gather_tiny(tmp_path):
    proc = run_bench("pyg_gather.py", "--tiny", "--out", str(tmp_path))
    data = outputs(tmp_path, "pyg_gather", proc)
    assert [(r["graph"], r["sampling"]) for r in data["rows"]] == [("cora", "cpu"), ("cora", "device")]
    for row in data["rows"]:  # the batches are the same; the kept rows are fewer than those gathered before
        assert row["same_batches"] and all(positive(row[k][a]) for k in ("ms", "cpu_ms") for a in ("before", "after"))
        assert 0 < row["rows"]["x_after"] < row["rows"]["x_before"] and row["rows"]["e_before"] == 0


@pytest.mark.timeout(TINY_TIMEOUT_S + 60)
def test_pyg_gather_tiny_attrs_arm(tmp_path):
    proc = run_bench("pyg_gather.py", "--tiny", "--attrs-arm", "--out", str(tmp_path))
    data = outputs(tmp_path, "pyg_attrs", proc)
    assert [(r["graph"], r["sampling"]) for r in data["rows"]] == [("cora", "cpu"), ("cora", "device")]
    for row in data["rows"]:  # Cora's masks carried in one arm, none in the other
        assert row["carried"] == ["test_mask", "train_mask", "val_mask"]
        assert positive(row["ratio"]) and positive(row["step_ratio"])


@pytest.mark.timeout(TINY_TIMEOUT_S + 60)
def test_device_sampling_tiny_with_its_training_arms_on_cpu_ranks(tmp_path):
    """The per-batch part and (``--cpu-arms``) every training arm the GPU run has, on CPU ranks:
    the script a GPU session runs first must not fail there for anything but the GPU."""
    proc = run_bench("device_sampling.py", "--tiny", "--gpu", "--cpu-arms", "--out", str(tmp_path))
    data = outputs(tmp_path, "device_sampling", proc)
    (row,) = data["per_batch"].values()
    assert positive(row["ms"]["dgl"]) and positive(row["ms"]["floyd"]) and positive(row["edges_per_batch"])
    assert row["torch_ops"] > 0
    # The weighted arms (on by default, with --gpu too on a small graph): both samplers timed, and sane.
    weighted = row["weighted"]
    assert list(weighted) == ["prob", "mask"], weighted
    for draw, w in weighted.items():
        assert positive(w["ms"]["dgl"]) and positive(w["ms"]["torch"]) and w["torch_ops"] > 0, (draw, w)
        assert positive(w["vs_uniform"]["dgl"]) and positive(w["vs_uniform"]["torch"]), (draw, w)
        # the same draw's distribution: about the same number of edges from either sampler
        assert abs(w["torch_edges_per_batch"] - w["edges_per_batch"]) <= 0.1 * w["edges_per_batch"], (draw, w)
    assert weighted["mask"]["masked_out_drawn"] == {"dgl": 0, "torch": 0}
    assert weighted["mask"]["edges_per_batch"] < weighted["prob"]["edges_per_batch"]  # a mask keeps 4 edges in 5
    md = (tmp_path / "device_sampling.md").read_text()
    assert "| tiny on cpu | prob='w' |" in md and "| tiny on cpu | mask='m' |" in md
    arms = data["training"]["tiny"]
    assert len(arms) == 5 and all(positive(arm["seeds_per_s"]) for arm in arms.values()), arms
    assert [(arm["mode"], arm["host_data"]) for arm in arms.values()] == [
        ("cpu", False), ("device", False), ("cpu", False), ("device", True), ("cpu", False)]


@pytest.mark.timeout(TINY_TIMEOUT_S + 60)
def test_tutorial_vs_task_tiny(tmp_path):
    proc = run_bench("tutorial_vs_task.py", "--tiny", "--out", str(tmp_path))
    data = outputs(tmp_path, "tutorial_vs_task", proc)
    rows = {r["world"]: r for r in data["results"]}
    assert set(rows) == {1, 2}
    for world, row in rows.items():
        for arm in ("tutorial", "graphtrainer"):
            (run,) = data["runs"]["20kx5"][arm][str(world)]
            # 2 epochs timed; the mean leaves out the first.
            assert len(run["epoch_s"]) == 2 and all(positive(t) for t in run["epoch_s"])
            assert run["mean_epoch_s"] == pytest.approx(run["epoch_s"][1])
            assert positive(run["peak_total_pss_mb"])
        # 4,096 training nodes in batches of 1,024, split between the ranks.
        assert row["steps_per_epoch_rank0"] == 4 // world
        assert row["epoch_ratio"] == pytest.approx(row["mean_epoch_s"]["graphtrainer"] / row["mean_epoch_s"]["tutorial"])
        assert positive(row["pss_ratio"]) and row["epoch_target"] == (0.90 if world == 1 else 0.95)


# ---- bad input: refused before anything is built ------------------------------------
@pytest.mark.parametrize("script,args,choices", [
    ("fork_vs_spawn.py", ["--launchers", "gt-fork", "bogus"], ["gt-fork", "gt-forkserver", "gt-spawn", "naive-spawn"]),
    ("fork_vs_spawn.py", ["--datasets", "cora"], ["synthetic", "tolokers"]),
    ("overhead.py", ["--datasets", "bogus"], ["synthetic", "tolokers"]),
    ("arms.py", ["bogus"], ["precision", "pyg_vs_blocks", "workers", "nn", "stacks"]),
])
@pytest.mark.timeout(120)
def test_unknown_choice_lists_the_choices(script, args, choices):
    proc = run_bench(script, *args, timeout=100)
    assert proc.returncode == 2
    assert "invalid choice" in proc.stderr
    for choice in choices:
        assert choice in proc.stderr


@pytest.mark.parametrize("script,args", [
    ("fork_vs_spawn.py", ["--sizes", "2000Mx20", "--world-sizes", "1"]),
    ("overhead.py", ["--size", "2000Mx20", "--datasets", "synthetic"]),
])
@pytest.mark.timeout(120)
def test_too_big_graph_is_refused_with_the_estimate(script, args, tmp_path):
    proc = run_bench(script, *args, "--out", str(tmp_path), timeout=100)
    assert proc.returncode != 0
    assert "refusing" in proc.stderr and "GiB" in proc.stderr
    assert "estimated" in proc.stderr
    assert not any(tmp_path.iterdir()), "nothing may be written when refusing"


@pytest.mark.timeout(TINY_TIMEOUT_S + 60)
def test_skip_too_big_runs_what_fits_and_names_the_rest(tmp_path):
    proc = run_bench("fork_vs_spawn.py", "--tiny", "--sizes", "20kx5", "2000Mx20", "--world-sizes", "1",
                     "--skip-too-big", "--threads", "1", "--out", str(tmp_path))
    data = outputs(tmp_path, "fork_vs_spawn", proc)
    assert [r["label"] for r in data["runs"]] == ["20kx5 single x1"]
    assert [r["threads"] for r in data["summary"]] == [1]  # --threads: scaling's 1 process x 1 thread
    assert "skipping 2000Mx20 single x1: estimated" in proc.stdout
    assert "1 planned run(s) left out by the memory estimate guard" in (tmp_path / "fork_vs_spawn.md").read_text()


@pytest.mark.timeout(60)
def test_bad_size_syntax():
    proc = run_bench("fork_vs_spawn.py", "--sizes", "lots", timeout=50)
    assert proc.returncode == 2 and "NODESxDEGREE" in proc.stderr
