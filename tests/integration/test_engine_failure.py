"""Failure: a rank that raises or is SIGKILLed in ``training_step`` makes ``fit`` raise
``RankFailedError`` naming it, within 30 s, and leaves no process behind."""
from __future__ import annotations

import time

import pytest

from graphtrainer import RankFailedError, Trainer
from graphtrainer.launch import forkserver

from conftest import rank_children
from launch_env import launchers
from tasks import FailingTask


def _fit_failing(root_dir, launcher, how):
    trainer = Trainer(num_procs=2, launcher=launcher, max_epochs=5, progress_bar=False,
                      default_root_dir=root_dir)
    start = time.monotonic()
    with pytest.raises(RankFailedError) as info:
        trainer.fit(FailingTask(how=how, at_step=3, fail_rank=1))
    elapsed = time.monotonic() - start
    assert elapsed < 30, f"fit took {elapsed:.1f} s to report the failure"
    assert not rank_children()  # ranks, and the fork server of launcher="forkserver"
    assert forkserver.server_pid() is None
    return info.value


LAUNCHERS = launchers("fork", "forkserver", "spawn")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_exception_in_training_step_names_rank_and_message(root_dir, launcher):
    err = _fit_failing(root_dir, launcher, "raise")
    assert err.rank == 1
    assert err.error_type == "RuntimeError"
    assert err.message == "planned failure in training_step at step 3"
    assert str(err).startswith("rank 1 failed: RuntimeError: planned failure in training_step at step 3")
    assert "in training_step" in err.remote_traceback  # the rank's own traceback comes along


@pytest.mark.timeout(60)
@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_sigkill_in_training_step_names_rank(root_dir, launcher):
    err = _fit_failing(root_dir, launcher, "kill")
    assert err.rank == 1
    assert err.error_type == "ProcessDied"
    assert "killed by signal SIGKILL" in str(err)
    assert str(err).startswith("rank 1 failed")
