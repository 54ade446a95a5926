"""A stop signal (a scheduler's SIGTERM, Slurm's SIGUSR1) that reaches the launching process before any
rank exists (while ``fit`` checks the task, prepares the run folder, builds the graph's formats, starts
the fork server) ends the fit as a preemption: ``Preempted``, status 75, so a "requeue on 75" wrapper
requeues the job; nothing trained, so no checkpoint, and nothing left behind (run folder, temporary
folders, fork server). Before: the process died of the signal (status 143). In the world of one, a
signal while the rank starts up is kept for the fit, as a launched rank keeps it.

Each run is ``early_signal_driver.py`` in a process of its own, which waits on its stdin at the moment
under test: the test signals it there, then closes stdin (no sleeps)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from graphtrainer import PREEMPTED_EXIT_CODE

from launch_env import env_without_launch
from owned_processes import marked

TESTS = Path(__file__).resolve().parents[1] / "helpers"
DRIVER = TESTS / "early_signal_driver.py"


def _signalled(owner, tmp_path: Path, launcher: str, where: str, signals: tuple) -> tuple:
    """Run the driver, send ``signals`` once it waits at ``where``; its result, exit status and stderr."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = env_without_launch(TMPDIR=str(tmp), PYTHONPATH=os.pathsep.join([str(TESTS.parents[1]), str(TESTS)]))
    proc = owner.start([sys.executable, str(DRIVER), launcher, where, str(tmp_path / "run")], env=env,
                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    assert line.strip() == "WAITING", (line, proc.poll())
    for sig in signals:
        proc.send_signal(sig)
    out, err = proc.communicate(input="", timeout=120)  # (closes stdin: the wait in "setup" ends)
    results = [json.loads(x[len("RESULT "):]) for x in out.splitlines() if x.startswith("RESULT ")]
    assert results, (proc.returncode, out[-2000:], err[-4000:])
    assert not [p.name for p in tmp.iterdir() if p.name.startswith("graphtrainer-")], "a temporary folder was left"
    assert not marked(owner.token), "a process of the run outlived it"
    return results[-1], proc.returncode, err


@pytest.mark.timeout(150)
@pytest.mark.parametrize("launcher,where,signals", [
    ("fork", "formats", (signal.SIGTERM,)),
    pytest.param("spawn", "formats", (signal.SIGUSR1,), marks=pytest.mark.slow),
    pytest.param("forkserver", "formats", (signal.SIGTERM,), marks=pytest.mark.slow),
    pytest.param("fork", "formats", (signal.SIGTERM, signal.SIGTERM), marks=pytest.mark.slow),
    pytest.param("inprocess", "reset", (signal.SIGTERM,), marks=pytest.mark.slow),
])
def test_a_stop_signal_before_any_rank_exists_ends_the_fit_as_a_preemption(tmp_path, process_owner, launcher,
                                                                          where, signals):
    result, status, err = _signalled(process_owner, tmp_path, launcher, where, signals)
    assert status == PREEMPTED_EXIT_CODE and result["error"] == "Preempted", (status, result, err[-4000:])
    name = signal.Signals(signals[0]).name
    assert f"[graphtrainer] fit stopped by {name} before any rank started" in err, err[-4000:]
    # Nothing trained, nothing written; the run folder made for it is gone, and so is the fork server.
    assert result["checkpoint"] is None and result["run_dirs"] == [] and result["children"] == [], result


@pytest.mark.slow  # 3 s or more on 2 cores: a fresh interpreter
@pytest.mark.timeout(150)
def test_a_stop_signal_while_the_one_rank_of_this_process_starts_is_kept_for_the_fit(tmp_path, process_owner):
    """As a launched rank keeps it: the fit stops at its first batch boundary and checkpoints."""
    result, status, err = _signalled(process_owner, tmp_path, "inprocess", "setup", (signal.SIGTERM,))
    assert status == PREEMPTED_EXIT_CODE and result["error"] == "Preempted", (status, result, err[-4000:])
    assert "fit stopped by SIGTERM (received by rank 0) at epoch 0 after batch 0" in err, err[-4000:]
    assert result["checkpoint"] is not None, result


@pytest.mark.timeout(120)
def test_a_stop_signal_just_after_the_run_folder_is_made_still_removes_it(tmp_path, monkeypatch):
    """The signal lands the moment ``prepare_run_dir`` has made ``version_0``, before the fit records it:
    held until it is recorded, so the preempted fit removes it as any other."""
    from graphtrainer import Preempted, Trainer, trainer as trainer_module
    from graphtrainer.launch import leftovers

    from tasks import RegressionTask

    made = trainer_module.prepare_run_dir

    def made_then_signalled(root):
        path = made(root)
        # Only to the fit's own handler (never the default, which would end pytest).
        assert signal.getsignal(signal.SIGTERM) is leftovers._on_stop_signal
        os.kill(os.getpid(), signal.SIGTERM)
        return path

    monkeypatch.setattr(trainer_module, "prepare_run_dir", made_then_signalled)
    root = tmp_path / "runs"
    trainer = Trainer(num_procs=2, launcher="fork", max_epochs=1, progress_bar=False, logger=False,
                      enable_model_summary=False, default_root_dir=str(root))
    with pytest.raises(Preempted, match="before any rank started"):
        trainer.fit(RegressionTask(scheduler=None))
    assert list(root.glob("version_*")) == []
