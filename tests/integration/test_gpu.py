"""The GPU path with a plain-torch task (no DGL): device placement, nccl with one rank
under torchrun, several ranks sharing one GPU over gloo (fork and spawn), two GPUs over
nccl, and checkpoints written on a GPU that load and resume on CPU.

Every GPU run happens in a child process (tests/helpers/gpu_script.py), so this process never
initialises CUDA. Skipped, saying why, where no CUDA device exists: the CPU suite covers
the same engine over gloo.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from graphtrainer import Trainer
from graphtrainer.loop.runtime import device_and_backend

from gpu_tasks import DeviceTask

SCRIPT = Path(__file__).resolve().parents[1] / "helpers" / "gpu_script.py"
ROOT = SCRIPT.parents[2]
NEEDS_CUDA = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="no CUDA device here; the GPU path runs on a GPU machine")


def _run(args, out, timeout=240, torchrun=False, ok=True):
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    prefix = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1"] \
        if torchrun else [sys.executable]
    proc = subprocess.run(prefix + [str(SCRIPT), "--out", str(out)] + args, env=env, capture_output=True,
                          text=True, timeout=timeout)
    assert (proc.returncode == 0) == ok, proc.stdout[-3000:] + proc.stderr[-5000:]
    return proc


def _ranks(out, world):
    rows = [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]
    assert [r["rank"] for r in rows] == list(range(world))
    return rows


@NEEDS_CUDA
@pytest.mark.timeout(300)
@pytest.mark.parametrize("launcher", ["fork", "forkserver", "spawn"])
def test_two_ranks_share_one_gpu_over_gloo(tmp_path, launcher):
    _run(["--gpus", "0,0", "--launcher", launcher], tmp_path)
    rows = _ranks(tmp_path, 2)
    for row in rows:
        assert row["backend"] == "gloo"  # nccl refuses two ranks on one device
        assert row["world_size"] == 2 and row["task_device"] == "cuda:0" and row["current_device"] == 0
        assert row["batch_devices"] == ["cuda:0"] and row["param_devices"] == ["cuda:0"]
    assert rows[0]["params"] == rows[1]["params"]  # DDP kept the replicas equal
    assert rows[0]["history"][-1]["train_loss"] < rows[0]["history"][0]["train_loss"]


@NEEDS_CUDA
@pytest.mark.timeout(300)
def test_cuda_used_before_fit_auto_launches_with_forkserver_instead_of_fork(tmp_path):
    proc = _run(["--gpus", "0,0", "--launcher", "auto", "--touch-cuda"], tmp_path)
    assert "launching with forkserver instead of fork" in proc.stderr
    rows = _ranks(tmp_path, 2)
    assert rows[0]["batch_devices"] == ["cuda:0"] and rows[0]["params"] == rows[1]["params"]


@NEEDS_CUDA
@pytest.mark.timeout(120)
def test_cuda_used_before_fit_explicit_fork_is_refused_before_launch(tmp_path):
    proc = _run(["--gpus", "0,0", "--launcher", "fork", "--touch-cuda"], tmp_path, ok=False)
    assert "launcher='fork': CUDA was already used in this process" in proc.stderr
    assert "launcher='forkserver'" in proc.stderr
    assert not list(tmp_path.glob("rank*.json"))  # no rank ran


@NEEDS_CUDA
@pytest.mark.timeout(300)
def test_backward_before_fit_on_a_gpu_machine_auto_launches_cpu_ranks_with_forkserver(tmp_path):
    proc = _run(["--num-procs", "2", "--launcher", "auto", "--backward-first"], tmp_path)
    assert "already ran a backward pass" in proc.stderr and "forkserver instead of fork" in proc.stderr
    rows = _ranks(tmp_path, 2)
    assert rows[0]["batch_devices"] == ["cpu"] and rows[0]["params"] == rows[1]["params"]


@NEEDS_CUDA
@pytest.mark.timeout(120)
def test_backward_before_fit_on_a_gpu_machine_explicit_fork_is_refused(tmp_path):
    proc = _run(["--num-procs", "2", "--launcher", "fork", "--backward-first"], tmp_path, ok=False)
    assert "launcher='fork': this process already ran a backward pass" in proc.stderr
    assert not list(tmp_path.glob("rank*.json"))


@NEEDS_CUDA
@pytest.mark.timeout(300)
def test_cuda_used_before_fit_does_not_stop_a_cpu_fork(tmp_path):
    proc = _run(["--num-procs", "2", "--launcher", "fork", "--touch-cuda"], tmp_path)
    assert "instead of fork" not in proc.stderr
    rows = _ranks(tmp_path, 2)
    assert rows[0]["batch_devices"] == ["cpu"] and rows[0]["params"] == rows[1]["params"]


@NEEDS_CUDA
@pytest.mark.timeout(300)
def test_nccl_with_one_rank_under_torchrun(tmp_path):
    _run(["--gpus", "1"], tmp_path, torchrun=True)
    (row,) = _ranks(tmp_path, 1)
    assert row["backend"] == "nccl" and row["world_size"] == 1
    assert row["task_device"] == "cuda:0" and row["batch_devices"] == ["cuda:0"]
    assert row["param_devices"] == ["cuda:0"]
    assert row["history"][-1]["train_loss"] < row["history"][0]["train_loss"]


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                    reason="needs two CUDA devices")
@pytest.mark.timeout(300)
def test_two_gpus_over_nccl(tmp_path):
    _run(["--gpus", "2", "--launcher", "spawn"], tmp_path)
    rows = _ranks(tmp_path, 2)
    assert [r["task_device"] for r in rows] == ["cuda:0", "cuda:1"]
    assert all(r["backend"] == "nccl" for r in rows)
    assert rows[0]["params"] == rows[1]["params"]


@NEEDS_CUDA
@pytest.mark.timeout(300)
def test_checkpoint_written_on_gpu_loads_and_resumes_on_cpu(tmp_path):
    _run(["--gpus", "1", "--checkpoint"], tmp_path)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["param_device"] == "cuda:0" and summary["cuda_initialised"]
    best = Path(summary["best_model_path"])
    ckpt = torch.load(best, map_location="cpu", weights_only=True)
    tensors = list(ckpt["state_dict"].values()) + [
        v for state in ckpt["optimizer_states"] for s in state["state"].values() for v in s.values()
        if isinstance(v, torch.Tensor)]
    assert tensors and all(t.device.type == "cpu" for t in tensors)

    # A CPU trainer evaluates the GPU-trained weights to the same loss...
    task = DeviceTask(str(tmp_path / "cpu"))
    (tmp_path / "cpu").mkdir()
    cpu = Trainer(max_epochs=1, progress_bar=False, default_root_dir=tmp_path / "runs_cpu")
    assert cpu.validate(task, ckpt_path=str(best))["val_loss"] == pytest.approx(summary["val_loss"], abs=1e-5)
    assert next(task.module.parameters()).device.type == "cpu"
    # ...and resumes training from the GPU run's last checkpoint on CPU.
    resumed = Trainer(max_epochs=5, progress_bar=False, default_root_dir=tmp_path / "runs_cpu")
    resumed.fit(DeviceTask(str(tmp_path / "cpu")), ckpt_path=str(best.with_name("last.ckpt")))
    assert [row["epoch"] for row in resumed.history] == [3, 4]
    assert not torch.cuda.is_initialized()  # the test process itself never touched CUDA


# ---- which GPU a rank started by torchrun or Slurm takes (device counts only, no CUDA) ----------
@pytest.mark.parametrize("visible, local_rank, gpus, index", [
    (4, 3, 4, 3),          # torchrun, 4 per node: the local rank's GPU
    (1, 3, 4, 0),          # Slurm --gpus-per-task=1: each task sees only its own GPU
    (4, 1, [2, 3], 3),     # an explicit list, indexed by local rank
])
def test_external_rank_gpu_choice(monkeypatch, visible, local_rank, gpus, index):
    from graphtrainer.comm import RankInfo

    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29500")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: visible)
    trainer = Trainer(gpus=gpus, progress_bar=False)
    info = RankInfo(rank=5, local_rank=local_rank, world_size=8, source="slurm")
    device, backend = device_and_backend(trainer.config, info)
    assert (device, backend) == (torch.device("cuda", index), "nccl")


def test_external_rank_without_a_gpu_says_how_to_fix(monkeypatch):
    from graphtrainer.comm import RankInfo

    for name, value in (("RANK", "0"), ("WORLD_SIZE", "4"), ("MASTER_ADDR", "h"), ("MASTER_PORT", "1")):
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    trainer = Trainer(gpus=1, progress_bar=False)
    with pytest.raises(RuntimeError, match=r"local rank 3, started by torchrun\) needs GPU 3 but sees 2"):
        device_and_backend(trainer.config, RankInfo(rank=3, local_rank=3, world_size=4, source="torchrun"))


# ---- torch-only blocks and graphtrainer.nn on a GPU (tests/helpers/nn_gpu_script.py; no DGL needed) -----
NN_SCRIPT = SCRIPT.with_name("nn_gpu_script.py")


def _run_nn(out, *args, timeout=300):
    env = dict(os.environ,
               PYTHONPATH=os.pathsep.join([str(ROOT), str(SCRIPT.parent), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, str(NN_SCRIPT), "--out", str(out), *args], env=env, capture_output=True,
                          text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return json.loads((out / "nn_gpu.json").read_text())


@NEEDS_CUDA
@pytest.mark.timeout(300)
def test_torch_block_layers_on_gpu_equal_cpu(tmp_path):
    result = _run_nn(tmp_path)
    assert set(result["layers"]) == {"sage_mean", "sage_gcn", "sage_pool", "graphconv", "gat", "readout_max"}
    for name, diff in result["layers"].items():
        assert diff < 1e-4, (name, diff)  # float32; GPU sums in another order


@NEEDS_CUDA
@pytest.mark.timeout(300)
def test_prefetching_transfer_on_gpu_returns_each_batch_whole_and_in_order(tmp_path):
    result = _run_nn(tmp_path)
    for prefetch, check in result["transfer"].items():
        assert check["prefetched"] == (prefetch == "True")
        rows = check["rows"]
        assert [r["ids"][0] for r in rows] == list(range(5))
        for row, expected in zip(rows, check["expected_sums"]):
            assert row["devices"] == ["cuda:0"] and row["type"] == "TorchBlock"
            assert row["feat_sum"] == pytest.approx(expected, rel=1e-5, abs=1e-4)  # the copy was complete


@NEEDS_CUDA
@pytest.mark.timeout(400)
def test_plain_torch_sampled_task_fits_on_one_gpu_with_torch_blocks(tmp_path):
    history = _run_nn(tmp_path, "--fit")["fit"]["history"]
    assert all(row["on_gpu"] == 1.0 and row["torch_blocks"] == 1.0 for row in history)
    assert history[-1]["train_loss"] < history[0]["train_loss"]


@NEEDS_CUDA
@pytest.mark.timeout(300)
def test_auto_block_type_gives_a_dgl_task_torch_blocks_on_a_gpu_without_dgl_cuda(tmp_path):
    pytest.importorskip("dgl", reason="DGL is not installed on this GPU machine")
    # In a child: the probe of DGL's build initialises CUDA, which this process must not.
    code = ("import sys, json, torch; sys.path[:0] = [{root!r}, {tests!r}];"
            "from graphtrainer.nn.transfer import dgl_runs_on;"
            "cuda_dgl = dgl_runs_on(torch.device('cuda', 0));"
            "from graphtrainer import Trainer; from tasks import SageTask, make_graph;"
            "t = Trainer(gpus=1, max_epochs=2, progress_bar=False, logger=False, default_root_dir={out!r});"
            "t.fit(SageTask(make_graph(), fanouts=(3, 3))) if not cuda_dgl else None;"
            "json.dump({{'cuda_dgl': cuda_dgl, 'history': t.history}}, open({out!r} + '/h.json', 'w'))").format(
        root=str(ROOT), tests=str(SCRIPT.parent), out=str(tmp_path))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stderr[-5000:]
    result = json.loads((tmp_path / "h.json").read_text())
    if result["cuda_dgl"]:
        pytest.skip("DGL here is a CUDA build: 'auto' keeps DGL's blocks")
    # DGL's CPU-only blocks cannot reach the GPU: the fit ran because batches became torch blocks.
    assert len(result["history"]) == 2
    assert all(math.isfinite(row["train_loss"]) for row in result["history"])


# ---- the four task shapes: DGL samples on the CPU, torch blocks train on the GPU ----------------
DGL_SCRIPT = SCRIPT.with_name("dgl_gpu_script.py")


def _dgl_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("dgl") is not None


NEEDS_DGL = pytest.mark.skipif(not _dgl_installed(), reason="DGL is not installed here")


def _fit_shape(tmp_path, name, case, where, *args, env=None):
    out = tmp_path / name
    out.mkdir()
    path = os.pathsep.join([str(ROOT), str(SCRIPT.parent), os.environ.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, str(DGL_SCRIPT), "--case", case, "--where", where, "--out", str(out), *args],
                          env=dict(os.environ, PYTHONPATH=path, **(env or {})), capture_output=True, text=True,
                          timeout=280)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return dict(json.loads((out / "fit.json").read_text()), stderr=proc.stderr)


def _assert_same_history(ref, got, label):
    """Per-epoch metrics equal within float32 tolerance (the GPU sums in another order)."""
    assert len(ref) == len(got) and ref, label
    worst = 0.0
    for a, b in zip(ref, got):
        assert a.keys() == b.keys(), label
        assert (a["epoch"], a["step"]) == (b["epoch"], b["step"]), label
        for k in a:
            if k not in ("epoch", "step"):
                assert b[k] == pytest.approx(a[k], rel=1e-3, abs=1e-4), (label, a["epoch"], k, a[k], b[k])
                worst = max(worst, abs(b[k] - a[k]))
    print(f"{label}: largest metric difference {worst:.2e} over {len(ref)} epochs")


@NEEDS_CUDA
@NEEDS_DGL
@pytest.mark.timeout(600)
@pytest.mark.parametrize("ranks", [1, 2])
@pytest.mark.parametrize("case", ["node", "link", "graph", "hetero"])
def test_task_shape_with_torch_blocks_on_gpu_equals_cpu(tmp_path, case, ranks):
    """``gpus=1`` against one CPU rank, ``gpus=[0, 0]`` (two ranks share the GPU over gloo)
    against two: same seeds and DGL samples, so the same per-epoch metrics."""
    from nn_fit_cases import CASES

    kinds = sorted(CASES[case][2])
    cpu = _fit_shape(tmp_path, "cpu", case, f"cpu{ranks}")
    gpu = _fit_shape(tmp_path, "gpu", case, f"gpu{ranks}")
    assert len(gpu["ranks"]) == len(cpu["ranks"]) == ranks
    for row in cpu["ranks"]:
        assert row == {"kinds": kinds, "devices": ["cpu"], "params": ["cpu"]}
    for row in gpu["ranks"]:
        assert row == {"kinds": kinds, "devices": ["cuda:0"], "params": ["cuda:0"]}
    _assert_same_history(cpu["history"], gpu["history"], f"{case}, {ranks} rank(s)")


@NEEDS_CUDA
@NEEDS_DGL
@pytest.mark.timeout(600)
def test_gnn_checkpoint_written_on_gpu_resumes_on_cpu_as_if_never_moved(tmp_path):
    """Two epochs on the GPU, the third resumed on CPU from its last.ckpt: the same history as
    three epochs on CPU."""
    cpu = _fit_shape(tmp_path, "cpu", "node", "cpu1", "--epochs", "3")
    gpu = _fit_shape(tmp_path, "gpu", "node", "gpu1", "--epochs", "2", "--checkpoint")
    assert gpu["ranks"][0]["devices"] == ["cuda:0"] and gpu["last"].endswith("last.ckpt")
    ckpt = torch.load(gpu["last"], map_location="cpu", weights_only=True)
    assert all(t.device.type == "cpu" for t in ckpt["state_dict"].values())
    resumed = _fit_shape(tmp_path, "resumed", "node", "cpu1", "--epochs", "3", "--resume", gpu["last"])
    assert [row["epoch"] for row in resumed["history"]] == [2]
    assert resumed["ranks"][0]["devices"] == ["cpu"]
    _assert_same_history(cpu["history"][:2], gpu["history"], "node, GPU epochs 0-1")
    _assert_same_history(cpu["history"][2:], resumed["history"], "node, epoch 2 resumed on CPU")


@pytest.mark.slow
@NEEDS_DGL
@pytest.mark.timeout(300)
def test_dgl_gpu_script_runs_on_cpu_too(tmp_path):
    """The GPU script's CPU arms and its checkpoint resume, here, so they are exercised without a GPU."""
    straight = _fit_shape(tmp_path, "straight", "node", "cpu1", "--epochs", "3")
    first = _fit_shape(tmp_path, "first", "node", "cpu1", "--epochs", "2", "--checkpoint")
    resumed = _fit_shape(tmp_path, "resumed", "node", "cpu1", "--epochs", "3", "--resume", first["last"])
    assert straight["ranks"] == [{"kinds": ["TorchBlock"], "devices": ["cpu"], "params": ["cpu"]}]
    _assert_same_history(straight["history"][:2], first["history"], "first")
    _assert_same_history(straight["history"][2:], resumed["history"], "resumed")
    fixed = [_fit_shape(tmp_path, f"fixed{i}", "link", "cpu1", "--sampling", "device", "--deterministic", "on")
             for i in range(2)]
    assert fixed[0]["history"] == fixed[1]["history"]  # the GPU test's arm, on the CPU
    two = _fit_shape(tmp_path, "two", "hetero", "cpu2")
    assert len(two["ranks"]) == 2 and all(r["kinds"] == ["TorchHeteroBlock"] for r in two["ranks"])


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_nn_gpu_script_runs_on_cpu_too(tmp_path):
    """The GPU script's checks, on CPU here, so its logic is exercised without a GPU."""
    result = _run_nn(tmp_path, "--device", "cpu", "--fit")
    assert all(diff == 0.0 for diff in result["layers"].values())
    for check in result["transfer"].values():
        assert not check["prefetched"]  # no CUDA streams on CPU
        assert [r["feat_sum"] for r in check["rows"]] == pytest.approx(check["expected_sums"])
    history = result["fit"]["history"]
    assert all(row["torch_blocks"] == 1.0 and row["on_gpu"] == 0.0 for row in history)
    assert history[-1]["train_loss"] < history[0]["train_loss"]


# ---- sampling on the GPU (Trainer(sampling="device"), the "auto" choice on a GPU rank) ----------
@NEEDS_CUDA
@NEEDS_DGL
@pytest.mark.timeout(600)
@pytest.mark.parametrize("case", ["node", "link", "hetero"])
def test_device_sampling_on_gpu_trains_each_shape_and_repeats(tmp_path, case):
    """Batches sampled on GPU 0 (torch blocks there from the first layer on); a second run with
    the same seed gives the same history (each batch has its own seeded CUDA generator; the
    layers' CUDA scatter-adds sum in any order, hence float32 tolerance)."""
    from nn_fit_cases import CASES

    first = _fit_shape(tmp_path, "first", case, "gpu1", "--sampling", "device")
    again = _fit_shape(tmp_path, "again", case, "gpu1", "--sampling", "device")
    assert first["ranks"][0] == {"kinds": sorted(CASES[case][2]), "devices": ["cuda:0"], "params": ["cuda:0"]}
    _assert_same_history(first["history"], again["history"], f"{case}, sampled on the GPU twice")
    assert all(math.isfinite(v) for row in first["history"] for v in row.values())


@NEEDS_CUDA
@NEEDS_DGL
@pytest.mark.timeout(600)
@pytest.mark.parametrize("case", ["node", "link", "hetero"])
def test_deterministic_device_sampling_on_gpu_repeats_bit_for_bit(tmp_path, case):
    """Trainer(deterministic=True) on GPU 0: no op of the device sampler or the layers raises
    under torch's deterministic algorithms, and two runs give exactly the same history."""
    first = _fit_shape(tmp_path, "first", case, "gpu1", "--sampling", "device", "--deterministic", "on")
    again = _fit_shape(tmp_path, "again", case, "gpu1", "--sampling", "device", "--deterministic", "on")
    assert first["ranks"][0]["devices"] == ["cuda:0"]
    assert first["history"] == again["history"] and all(math.isfinite(v) for r in first["history"] for v in r.values())


@NEEDS_CUDA
@NEEDS_DGL
@pytest.mark.timeout(600)
def test_features_gathered_on_the_host_train_as_features_on_the_gpu(tmp_path):
    """A memory budget with room for the structure and labels only: the features stay on the host
    and each batch's rows come over from pinned memory. The batches are the same (each has its
    own seeded generator), so the history is the same within float32 tolerance."""
    from graphtrainer.data.device.graph import bytes_to_copy
    from graphtrainer.data.device.mode import BUDGET_ENV
    from tasks import make_graph  # the "node" case's graph

    room = bytes_to_copy(make_graph(), torch.device("cpu"), {"_N": ("label",)}, {})  # the labels, not the features
    on_gpu = _fit_shape(tmp_path, "gpu", "node", "gpu1", "--sampling", "device")
    on_host = _fit_shape(tmp_path, "host", "node", "gpu1", "--sampling", "device", env={BUDGET_ENV: str(room)})
    assert "gathered on the host per batch: 'feat'" in on_host["stderr"], on_host["stderr"][-3000:]
    assert "gathered on the host" not in on_gpu["stderr"]
    _assert_same_history(on_gpu["history"], on_host["history"], "features gathered on the host")


@NEEDS_CUDA
@pytest.mark.timeout(300)
def test_device_sampler_structure_and_distribution_on_gpu():
    """The sampler's unit tests (structure, exclusion, layout, chi-square against DGL, weighted and
    masked draws, graph data read on access) with every sampled tensor on GPU 0, in a child pytest
    (this process stays off CUDA)."""
    pytest.importorskip("dgl", reason="DGL is not installed on this GPU machine")
    unit = [str(ROOT / "tests" / "unit" / "data" / name)
            for name in ("test_device_sampler.py", "test_device_draws.py", "test_device_host_reads.py",
                         "test_device_weighted.py", "test_device_weighted_draws.py")]
    env = dict(os.environ, GRAPHTRAINER_SAMPLER_DEVICE="cuda",
               PYTHONPATH=os.pathsep.join([str(ROOT), str(SCRIPT.parent), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", *unit],
                          env=env, capture_output=True, text=True, timeout=280, cwd=str(ROOT))
    assert proc.returncode == 0 and " passed" in proc.stdout, proc.stdout[-4000:] + proc.stderr[-2000:]


@NEEDS_CUDA
@NEEDS_DGL
@pytest.mark.timeout(400)
def test_auto_sampling_picks_the_gpu_and_says_so(tmp_path):
    out = tmp_path / "auto"
    out.mkdir()
    path = os.pathsep.join([str(ROOT), str(SCRIPT.parent), os.environ.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, str(DGL_SCRIPT), "--case", "node", "--where", "gpu1", "--out", str(out),
                           "--sampling", "auto"], env=dict(os.environ, PYTHONPATH=path), capture_output=True,
                          text=True, timeout=280)
    assert proc.returncode == 0, proc.stderr[-5000:]
    assert "sampling='auto': NodeLoader samples on cuda:0" in proc.stderr, proc.stderr[-3000:]


@NEEDS_CUDA
@NEEDS_DGL
@pytest.mark.timeout(600)
def test_two_ranks_on_one_gpu_with_device_sampling_reach_cpu_accuracy(tmp_path):
    """``gpus=[0, 0]`` sampling on the GPU against 2 CPU ranks sampling with DGL, node
    classification on a small learnable graph: a GPU's random streams differ from the CPU's, so
    the batches differ; the final validation accuracy agrees within 0.1 (3 of its 32 nodes;
    chance is about 0.33)."""
    gpu = _fit_shape(tmp_path, "gpu", "node", "gpu2", "--sampling", "device", "--epochs", "6")
    cpu = _fit_shape(tmp_path, "cpu", "node", "cpu2", "--sampling", "cpu", "--epochs", "6")
    assert all(r["devices"] == ["cuda:0"] for r in gpu["ranks"]) and len(gpu["ranks"]) == 2
    assert abs(gpu["history"][-1]["val_acc"] - cpu["history"][-1]["val_acc"]) <= 0.1
