"""Smoke tests of tutorials/06_multinode.py: two torchrun "nodes" on 127.0.0.1, and the
sbatch file under a stand-in for Slurm's srun. Each process runs with a timeout; the
checks read what rank 0 wrote (summary.json, the checkpoint)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import List

import pytest
import torch

from graphtrainer.launch.environment import free_port
from launch_env import env_without_launch
from tutorial_results import check_figures

# Two torchrun "nodes" and a stand-in srun, each in subprocesses: 10 s and more.
# Left out of the quick run, pytest -m "not slow".
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tutorials" / "06_multinode.py"
SBATCH = ROOT / "tutorials" / "06_multinode.sbatch"
TIMEOUT = 150


def _env(**extra: str) -> dict:
    # No OMP_NUM_THREADS: the ranks' thread count must come from --threads-per-proc.
    return env_without_launch("OMP_NUM_THREADS", "SLURM_*", **{"DGLBACKEND": "pytorch", **extra})


def _finish(procs: List[subprocess.Popen], timeout: float) -> List[str]:
    """Wait for every process (whole process group) with a shared timeout; end stragglers."""
    outputs = []
    for proc in procs:
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for p in procs:
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
            out, _ = proc.communicate()
            pytest.fail(f"timed out after {timeout} s; output so far:\n{out[-3000:]}")
        outputs.append(out)
    return outputs


def _check_summary(out: Path, launched_by: str, threads: int) -> dict:
    summary = json.loads((out / "summary.json").read_text())
    assert summary["launched_by"] == launched_by
    assert summary["world_size"] == 2
    assert sorted(r["rank"] for r in summary["ranks"]) == [0, 1]
    assert sorted(r["node_rank"] for r in summary["ranks"]) == [0, 1]   # one rank per "node"
    # Trainer(threads_per_proc=...) applied in ranks that torchrun/srun started.
    assert [r["threads"] for r in summary["ranks"]] == [threads, threads]
    assert summary["epochs"] == 3
    assert summary["train_loss_last"] < summary["train_loss_first"]
    chance = 1.0 / summary["num_classes"]                                # Cora: 7 classes
    assert summary["test_acc"] > chance + 0.3                            # measured: 0.781
    ckpt_path = Path(summary["checkpoint"])
    assert ckpt_path.is_file() and str(ckpt_path).startswith(str(out))
    ckpt = torch.load(ckpt_path, map_location="cpu", weights_only=True)
    assert any(k.startswith("layers.") for k in ckpt["state_dict"])
    return summary


def test_two_torchrun_nodes(tmp_path, process_owner):
    out = tmp_path / "t06"
    port = free_port()
    procs = []
    for node in (0, 1):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(node),
               "--nproc-per-node", "1", "--master-addr", "127.0.0.1", "--master-port", str(port),
               str(SCRIPT), "--fast", "--threads-per-proc", "1", "--out", str(out)]
        procs.append(process_owner.start(cmd, cwd=ROOT, env=_env(), stdout=subprocess.PIPE,
                                         stderr=subprocess.STDOUT, text=True))
    outputs = _finish(procs, TIMEOUT)
    for node, (proc, text) in enumerate(zip(procs, outputs)):
        assert proc.returncode == 0, f"node {node} failed:\n{text[-3000:]}"
    summary = _check_summary(out, "torchrun", threads=1)
    assert "test_acc" in outputs[0] and "test_acc" not in outputs[1]   # rank 0 reports, alone
    assert summary["log_dir"].startswith(str(out))
    # The figures that tutorials/results/06_multinode.json records, within its tolerances.
    check_figures("06_multinode", summary)


FAKE_SRUN = """#!/bin/bash
# Stand-in for Slurm's srun: runs the command SLURM_NTASKS times on this machine, task i
# as if on node i, with the variables srun sets for each task.
while [[ $# -gt 0 && "$1" == -* ]]; do shift; done
pids=()
for ((i = 0; i < SLURM_NTASKS; i++)); do
    SLURM_PROCID=$i SLURM_LOCALID=0 SLURM_NODEID=$i SLURM_STEP_NODELIST="$SLURM_JOB_NODELIST" "$@" &
    pids+=($!)
done
rc=0
for pid in "${pids[@]}"; do wait "$pid" || rc=1; done
exit $rc
"""

FAKE_SCONTROL = """#!/bin/bash
# Stand-in for `scontrol show hostnames LIST`: one host per line.
echo "${3//,/$'\\n'}"
"""


def test_sbatch_under_stand_in_srun(tmp_path, process_owner):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for name, text in (("srun", FAKE_SRUN), ("scontrol", FAKE_SCONTROL)):
        (bindir / name).write_text(text)
        (bindir / name).chmod(0o755)
    out = tmp_path / "t06_slurm"
    env = _env(PATH=f"{bindir}:{os.environ['PATH']}", SLURM_JOB_ID="4242", SLURM_JOB_NODELIST="127.0.0.1",
               SLURM_NTASKS="2", SLURM_NNODES="2", SLURM_SUBMIT_DIR=str(ROOT), SLURM_CPUS_PER_TASK="1",
               MASTER_PORT=str(free_port()), GPUS_PER_NODE="0", OUT=str(out))
    proc = process_owner.start(["bash", str(SBATCH), "--fast"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    (text,) = _finish([proc], TIMEOUT)
    assert proc.returncode == 0, text[-3000:]
    assert "rendezvous 127.0.0.1:" in text
    _check_summary(out, "slurm", threads=1)   # the sbatch passes SLURM_CPUS_PER_TASK
