"""A stop signal (a scheduler's SIGTERM to the launching process) that reaches the ranks while they
start up, before the fit trains: the fit still stops as a preemption (last.ckpt, status 75),
instead of a rank dying of SIGTERM and the run failing with status 1. Each run is
``startup_signal_driver.py`` in a process of its own (real ranks, gloo on CPU)."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from graphtrainer import PREEMPTED_EXIT_CODE

from launch_env import env_without_launch

TESTS = Path(__file__).resolve().parents[1] / "helpers"
DRIVER = TESTS / "startup_signal_driver.py"
STEPS_PER_EPOCH = 4  # RegressionTask: 64 rows, batches of 8, 2 ranks


def _run(owner, tmp_path: Path, launcher: str, when: str, stage: str = "fit") -> tuple:
    env = env_without_launch(PYTHONPATH=os.pathsep.join([str(TESTS.parents[1]), str(TESTS)]))
    done = owner.run([sys.executable, str(DRIVER), launcher, when, str(tmp_path / "run"), stage], timeout=150,
                     env=env)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, (done.returncode, done.stdout[-2000:], done.stderr[-4000:])
    return json.loads(lines[-1][len("RESULT "):]), done.stderr


@pytest.mark.slow
@pytest.mark.timeout(200)
@pytest.mark.parametrize("launcher", ["fork", "spawn", "forkserver"])
@pytest.mark.parametrize("when", ["setup", "start"])
def test_a_sigterm_while_the_ranks_start_stops_the_fit_as_a_preemption(tmp_path, process_owner, launcher, when):
    result, stderr = _run(process_owner, tmp_path, launcher, when)
    assert result["exit"] == PREEMPTED_EXIT_CODE, stderr[-4000:]
    assert "fit stopped by SIGTERM" in stderr and "epoch 0" in stderr
    # At the first batch boundary the ranks agree on, in the first epoch (its end: the task's loader
    # is uneven, so that epoch runs inside Join, which stops only at its end).
    assert result["checkpoint"] is not None and result["step"] <= STEPS_PER_EPOCH


@pytest.mark.timeout(200)
@pytest.mark.slow  # 3 s or more on 2 cores: a fresh interpreter
def test_a_sigterm_while_the_ranks_of_a_test_start_still_ends_them(tmp_path, process_owner):
    """Only a fit keeps the signal for a checkpoint: other stages end as the signal ends a process, and the
    error says the signal came through the launching process (the run was stopped, no rank failed)."""
    result, stderr = _run(process_owner, tmp_path, "fork", "setup", stage="test")
    assert result["exit"] != 0 and result["checkpoint"] is None
    assert "killed by signal SIGTERM, which this launching process" in stderr, stderr[-4000:]
