"""Under torchrun no launcher of ours watches the ranks: an exception, a kill or a hang on
rank 1 is still attributed to rank 1, by torchrun's "Root Cause" and by rank 0's error.

torchrun watches its workers every ``--monitor-interval`` seconds and ends the others at the
first failure it sees. torch 2.2's default of 5 s leaves rank 0 time to name rank 1 itself;
since torch 2.3 the default is 0.1 s, and rank 0 is usually ended before it does, so the Root
Cause (rank 1's own report, or its exit by signal) is what names the failure there. Both
intervals are tested on every stack."""
from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from launch_env import env_without_launch

TESTS = Path(__file__).resolve().parents[1] / "helpers"  # the shared task modules and drivers
EXPECTED = {"raise": "RuntimeError: planned failure in training_step at step 3",
            "kill": "ProcessDied: its process (pid ",
            "sleep": "Hang: no progress for 5 s (Trainer(hang_timeout=...)): rank 1 in training_step"}
ROOT_CAUSE = {"raise": "RuntimeError: planned failure in training_step at step 3",
              "kill": "Signal 9 (SIGKILL) received by PID",
              "sleep": EXPECTED["sleep"]}


def _run(owner, tmp_path, how, *agent_args):
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", *agent_args,
            str(TESTS / "torchrun_fault_script.py"), how, str(tmp_path)]
    start = time.monotonic()
    done = owner.run(argv, env=env_without_launch(), timeout=200)
    took = time.monotonic() - start
    assert done.returncode != 0
    return done.stderr[done.stderr.rfind("Root Cause"):], took


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("how", ["raise", "kill", "sleep"])
def test_torchruns_root_cause_is_rank_1_with_its_failure(tmp_path, how, process_owner):
    root_cause, took = _run(process_owner, tmp_path, how)  # the agent's own default interval
    print(f"torchrun, rank 1 {how}: run over in {took:.1f} s")
    by_rank_1 = "rank      : 1 (local_rank: 1)" in root_cause and ROOT_CAUSE[how] in root_cause
    assert by_rank_1 or "rank 1 failed: " + EXPECTED[how] in root_cause, root_cause  # or rank 0's report naming it


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("how", ["raise", "kill", "sleep"])
def test_rank_0_names_rank_1_when_the_agent_lets_it(tmp_path, how, process_owner):
    # torch 2.2's interval on every stack: at 0.1 s the agent may end rank 0 before it reports
    root_cause, took = _run(process_owner, tmp_path, how, "--monitor-interval", "5")
    rank0 = json.loads((tmp_path / "rank0.json").read_text())
    print(f"torchrun --monitor-interval 5, rank 1 {how}: run over in {took:.1f} s; rank 0 raised "
          f"{rank0['text'][:160]!r}")
    assert rank0["type"] == "RankFailedError" and rank0["rank"] == 1, rank0
    assert rank0["text"].startswith("rank 1 failed: ") and EXPECTED[how] in rank0["text"]
    # the Root Cause is rank 1's failure, or rank 0's report naming it (a killed rank leaves no report)
    assert "rank      : 1 (local_rank: 1)" in root_cause or "rank 1 failed: " + EXPECTED[how] in root_cause, root_cause


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_sigterm_while_a_rank_hangs_ends_the_run_at_once_naming_the_hang(tmp_path):
    """A stop waits for a batch boundary that a hung rank never reaches: once SIGTERM came, a
    rank without progress is named after 2 s (twice the longest pause it had, if longer), long
    before hang_timeout (60 s here) and torchrun's 30 s grace with its silent SIGKILL."""
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
            str(TESTS / "torchrun_fault_script.py"), "sleep", str(tmp_path), "60"]
    agent = subprocess.Popen(argv, env=env_without_launch(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
    deadline = time.monotonic() + 150
    while not (tmp_path / "hung_at").exists():
        assert agent.poll() is None, agent.communicate()
        assert time.monotonic() < deadline, "rank 1 never reached its hang"
        time.sleep(0.05)
    time.sleep(2.0)  # hung: no progress for 2 s
    signalled = time.monotonic()
    agent.send_signal(signal.SIGTERM)  # as a scheduler stops the job
    _, err = agent.communicate(timeout=120)
    took = time.monotonic() - signalled
    rank0 = json.loads((tmp_path / "rank0.json").read_text())
    print(f"torchrun, rank 1 hung, SIGTERM to the agent: run over {took:.1f} s after it; rank 0 raised "
          f"{rank0['text'][:200]!r}")
    named = re.compile(r"^rank 1 failed: Hang: no progress for [0-9.]+ s after a stop signal \(SIGTERM/SIGUSR1\)")
    assert any(named.match(line) for line in err.splitlines()), err[-3000:]
    assert "rank 1 in training_step (epoch 0, batch 3)" in err
    assert rank0["rank"] == 1 and named.match(rank0["text"]), rank0
    assert took < 5
