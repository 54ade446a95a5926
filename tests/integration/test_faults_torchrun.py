"""Under torchrun no launcher of ours watches the ranks: an exception, a kill or a hang on
rank 1 is still attributed to rank 1, by rank 0's error and by torchrun's "Root Cause"."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from launch_env import env_without_launch
from stack import torchrun_peer_report

TESTS = Path(__file__).resolve().parents[1] / "helpers"  # the shared task modules and drivers


def _run(tmp_path, how):
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
            str(TESTS / "torchrun_fault_script.py"), how, str(tmp_path)]
    start = time.monotonic()
    done = subprocess.run(argv, env=env_without_launch(), capture_output=True, text=True, timeout=200)
    took = time.monotonic() - start
    assert done.returncode != 0
    root_cause = done.stderr[done.stderr.rfind("Root Cause"):]
    return json.loads((tmp_path / "rank0.json").read_text()), root_cause, took


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("how", ["raise", pytest.param("kill", marks=torchrun_peer_report),
                                 pytest.param("sleep", marks=torchrun_peer_report)])
def test_a_failure_on_rank_1_is_attributed_to_rank_1(tmp_path, how):
    rank0, root_cause, took = _run(tmp_path, how)
    print(f"torchrun, rank 1 {how}: run over in {took:.1f} s; rank 0 raised {rank0['text'][:160]!r}")
    assert rank0["type"] == "RankFailedError" and rank0["rank"] == 1, rank0
    assert rank0["text"].startswith("rank 1 failed: ")
    expected = {"raise": "RuntimeError: planned failure in training_step at step 3",
                "kill": "ProcessDied: its process (pid ",
                "sleep": "Hang: no progress for 5 s (Trainer(hang_timeout=...)): rank 1 in training_step"}[how]
    assert expected in rank0["text"]
    # torchrun's "Root Cause" is rank 1's failure, or rank 0's report naming it (a killed rank leaves no report)
    assert "rank      : 1 (local_rank: 1)" in root_cause or "rank 1 failed: " + expected in root_cause, root_cause
