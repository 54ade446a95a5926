"""Launching: OpenMP state from the parent, torchrun across two "nodes", Slurm/torchrun
environment detection, threads per rank, loopback rendezvous, and what comes back from
rank 0 (history, run directory, callback state; output printed by rank 0 only)."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch

from graphtrainer import Callback, EarlyStopping, LaunchEnvironmentError, ProgressBar, Trainer
from graphtrainer.comm import RankInfo
from graphtrainer.launch import environment

from conftest import rank_children
from launch_env import env_without_launch
from tasks import RegressionTask, SageTask, make_graph

TESTS = Path(__file__).resolve().parents[2] / "helpers"  # the shared task modules


# ---- OpenMP ---------------------------------------------------------------------------------
@pytest.mark.timeout(120)
def test_fork_after_heavy_openmp_work_in_parent(root_dir):
    """A forked child that reused the parent's OpenMP pool would hang at its first parallel
    region. Two threads per rank, so the ranks' sampling and matmuls really go parallel."""
    import dgl

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        a = torch.randn(1500, 1500)
        assert torch.isfinite((a @ a).sum())
        graph = make_graph(num_nodes=200_000, avg_degree=10)
        assert dgl.to_simple(graph).num_edges() > 0
        assert dgl.sampling.sample_neighbors(graph, torch.arange(0, 200_000, 3), 5).num_edges() > 0
    finally:
        torch.set_num_threads(before)
    trainer = Trainer(num_procs=2, launcher="fork", max_epochs=1, threads_per_proc=2, progress_bar=False,
                      default_root_dir=root_dir, logger=False, limit_train_batches=2, limit_val_batches=1)
    trainer.fit(SageTask(graph, fanouts=(5, 5), batch_size=4096, eval_batch_size=4096))
    assert trainer.global_step == 2 and trainer.history[0]["val_loss"] > 0
    assert not rank_children()


# ---- torchrun --------------------------------------------------------------------------------
@pytest.mark.slow  # several seconds (subprocesses or spawned ranks)
@pytest.mark.timeout(180)
def test_torchrun_two_nodes_train_identical_parameters(root_dir, tmp_path):
    port = environment.free_port()
    env = env_without_launch()
    nodes = [subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(node),
         "--nproc-per-node", "1", "--master-addr", "127.0.0.1", "--master-port", str(port),
         str(TESTS / "torchrun_script.py"), str(tmp_path)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for node in (0, 1)]
    try:
        outputs = [p.communicate(timeout=150)[0] for p in nodes]
    finally:
        for p in nodes:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert [p.returncode for p in nodes] == [0, 0], "\n\n".join(outputs)
    params = [torch.load(tmp_path / f"params_rank{r}.pt", weights_only=True) for r in (0, 1)]
    for name in params[0]:
        assert torch.equal(params[0][name], params[1][name]), name
    results = [json.loads((tmp_path / f"result_rank{r}.json").read_text()) for r in (0, 1)]
    assert results[0]["world_size"] == results[1]["world_size"] == 2
    assert [r["threads"] for r in results] == [1, 1]  # threads_per_proc applies under torchrun too
    assert results[0]["history"] == results[1]["history"] and len(results[0]["history"]) == 3
    # Rank 0 numbered the run directory; the other rank learnt it.
    assert results[0]["log_dir"] == results[1]["log_dir"] == str(tmp_path / "runs" / "version_0")
    assert (tmp_path / "runs" / "version_0" / "metrics.csv").is_file()
    # The same job launched by the trainer itself trains the same weights.
    task = RegressionTask(scheduler=None)
    Trainer(num_procs=2, launcher="fork", max_epochs=3, seed=4, progress_bar=False,
            default_root_dir=root_dir).fit(task)
    for name, value in task.module.state_dict().items():
        torch.testing.assert_close(value, params[0][name], atol=1e-6, rtol=0)


# ---- environment detection (env only) --------------------------------------------------------
def test_detect_external_launch_slurm(monkeypatch):
    monkeypatch.setenv("SLURM_PROCID", "3")
    monkeypatch.setenv("SLURM_LOCALID", "1")
    monkeypatch.setenv("SLURM_NTASKS", "4")
    monkeypatch.setenv("SLURM_JOB_ID", "123456")
    monkeypatch.setenv("SLURM_STEP_NODELIST", "gpu-node[07-09,12],login1")
    monkeypatch.setenv("SLURM_NODELIST", "other[1-2]")
    info = environment.detect_external_launch()
    assert info == RankInfo(rank=3, local_rank=1, world_size=4, master_addr="gpu-node07",
                                  master_port=15000 + 123456 % 17000, source="slurm")
    monkeypatch.setenv("MASTER_ADDR", "10.0.0.5")
    monkeypatch.setenv("MASTER_PORT", "29400")
    info = environment.detect_external_launch()
    assert (info.master_addr, info.master_port) == ("10.0.0.5", 29400)
    monkeypatch.setenv("SLURM_NTASKS", "1")  # `python train.py` inside sbatch: the trainer launches
    assert environment.detect_external_launch() is None


@pytest.mark.parametrize("nodelist, first", [
    ("node001", "node001"), ("a1,b2", "a1"), ("node[03-05,09],gpu1", "node03"), ("n[7,9]", "n7"),
    ("rack-2-node[010-020]", "rack-2-node010"), ("x[5]", "x5"),
])
def test_first_slurm_host(nodelist, first):
    assert environment._first_slurm_host(nodelist) == first


def test_detect_external_launch_torchrun(monkeypatch):
    assert environment.detect_external_launch() is None
    for name, value in (("RANK", "1"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "2"),
                        ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29500"),
                        ("SLURM_PROCID", "0"), ("SLURM_NTASKS", "8")):  # torchrun's variables win
        monkeypatch.setenv(name, value)
    assert environment.detect_external_launch() == RankInfo(
        rank=1, local_rank=0, world_size=2, master_addr="127.0.0.1", master_port=29500, source="torchrun")
    monkeypatch.delenv("MASTER_PORT")
    with pytest.raises(LaunchEnvironmentError, match="but MASTER_PORT is not"):
        environment.detect_external_launch()
    monkeypatch.setenv("MASTER_PORT", "29500")
    monkeypatch.setenv("RANK", "one")
    with pytest.raises(LaunchEnvironmentError, match="RANK='one' is not an integer"):
        environment.detect_external_launch()


# ---- inside the launched ranks ----------------------------------------------------------------
class RankFacts(Callback):
    """Each rank's thread count (in a step hook, where training runs) and listening sockets."""

    def __init__(self, out: str):
        self.out = out

    def on_train_batch_end(self, trainer: Any, task: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if batch_idx:
            return
        listening = sorted({c.laddr.ip for c in psutil.Process().net_connections(kind="inet")
                            if c.status == psutil.CONN_LISTEN})
        facts = {"threads": torch.get_num_threads(), "listening": listening, "pid": os.getpid()}
        (Path(self.out) / f"facts_r{trainer.rank}.json").write_text(json.dumps(facts))


@pytest.mark.timeout(90)
@pytest.mark.parametrize("world, threads", [(2, None), (3, None), (2, 2)])
def test_threads_per_rank_and_loopback_rendezvous(root_dir, tmp_path, world, threads):
    Trainer(num_procs=world, launcher="fork", max_epochs=1, threads_per_proc=threads, progress_bar=False,
            default_root_dir=root_dir, logger=False, callbacks=[RankFacts(str(tmp_path))]).fit(RegressionTask())
    expected = threads or max(1, len(os.sched_getaffinity(0)) // world)
    facts = [json.loads((tmp_path / f"facts_r{r}.json").read_text()) for r in range(world)]
    assert len({f["pid"] for f in facts} | {os.getpid()}) == world + 1  # real, separate processes
    for rank, f in enumerate(facts):
        assert f["threads"] == expected, rank
        # The store (rank 0) and gloo's own sockets listen on loopback only.
        assert f["listening"] == ["127.0.0.1"], (rank, f["listening"])


@pytest.mark.timeout(90)
def test_rank0_results_come_back_and_only_rank0_prints(root_dir, capfd):
    # A falling score with mode="max": no improvement at epoch 1, so it stops there and says so.
    stopper = EarlyStopping(monitor="score", mode="max", patience=1)
    trainer = Trainer(num_procs=2, launcher="fork", max_epochs=5, progress_bar=False, default_root_dir=root_dir,
                      callbacks=[ProgressBar(refresh_rate=1, force=True), stopper])
    task = RegressionTask(script={"score": [0.5, 0.4, 0.3, 0.2, 0.1]})
    trainer.fit(task)
    out, err = capfd.readouterr()
    assert out.count("[graphtrainer] early stopping at epoch 1") == 1
    bars = [line.split("\r")[-1] for line in err.split("\n") if "epoch " in line]
    assert [bar.split(":")[0] for bar in bars] == ["epoch 0", "epoch 1"], err
    # What rank 0 knew is now here.
    assert [row["epoch"] for row in trainer.history] == [0, 1]
    assert trainer.current_epoch == 2 and trainer.global_step == 8
    assert trainer.log_dir == root_dir / "version_0" and (trainer.log_dir / "metrics.csv").is_file()
    assert stopper.stopped_epoch == 1 and stopper.best_score == 0.5
    assert trainer.callback_metrics["val_loss"] == trainer.history[1]["val_loss"]
    assert task.module is not None and not isinstance(task.model, torch.nn.parallel.DistributedDataParallel)


# ---- no DGL ----------------------------------------------------------------------------------
PLAIN_TORCH_SCRIPT = r"""
import importlib.abc
import sys

class BlockDGL(importlib.abc.MetaPathFinder):  # as if DGL were not installed
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] == "dgl":
            raise ImportError("No module named 'dgl' (blocked by the test)")

sys.meta_path.insert(0, BlockDGL())
sys.path.insert(0, sys.argv[1])
import torch
from graphtrainer import Callback, Trainer
from tasks import RegressionTask

class NoDGL(Callback):
    def on_train_epoch_end(self, trainer, task):
        assert "dgl" not in sys.modules, "a rank imported dgl"
        assert isinstance(task.model, torch.nn.Module)

if __name__ == "__main__":
    for launcher in ("fork", "spawn"):
        trainer = Trainer(num_procs=2, launcher=launcher, max_epochs=2, progress_bar=False, enable_model_summary=False,
                          default_root_dir=sys.argv[2], callbacks=[NoDGL()])
        task = RegressionTask()
        trainer.fit(task)
        assert trainer.history[-1]["train_loss"] < trainer.history[0]["train_loss"]
        assert "dgl" not in sys.modules
        print(launcher, "ok", trainer.global_step, flush=True)
"""


@pytest.mark.slow  # several seconds (subprocesses or spawned ranks)
@pytest.mark.timeout(120)
def test_plain_torch_task_trains_without_dgl(tmp_path):
    script = tmp_path / "plain.py"
    script.write_text(PLAIN_TORCH_SCRIPT)
    done = subprocess.run([sys.executable, str(script), str(TESTS), str(tmp_path / "runs")],
                          capture_output=True, text=True, timeout=110)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines() == ["fork ok 8", "spawn ok 8"]


def test_free_port_is_below_the_ephemeral_range():
    # Ports there are never another connection's source port: a server told to use one can
    # always bind it (the two-node torchrun test failed once when it could not).
    start = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
    for _ in range(20):
        port = environment.free_port()
        assert 1024 <= port < start
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))
