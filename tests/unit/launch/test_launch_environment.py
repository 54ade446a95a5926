"""A launch environment set only in part (``RANK``/``WORLD_SIZE`` exported by hand, a cluster's
environment half set up) or holding values no launcher sets: one line naming what is wrong and
the fix, status 1 and no traceback, from a script's ``Trainer.fit`` and from the command line."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from graphtrainer import LaunchEnvironmentError, Trainer
from graphtrainer.launch import environment

from launch_env import env_without_launch
from tasks import RegressionTask

ROOT = Path(__file__).resolve().parents[3]
HELPERS = ROOT / "tests" / "helpers"
FULL = {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}


def _set(monkeypatch, **values: str) -> None:
    for name, value in values.items():
        monkeypatch.setenv(name, value)


@pytest.mark.parametrize("given, missing, unset", [
    (("RANK", "WORLD_SIZE"), "but MASTER_ADDR and MASTER_PORT are not", "unset RANK and WORLD_SIZE "),
    (("RANK",), "but WORLD_SIZE, MASTER_ADDR and MASTER_PORT are not", "unset RANK "),
    (("WORLD_SIZE",), "but RANK, MASTER_ADDR and MASTER_PORT are not", "unset WORLD_SIZE "),
    (("RANK", "WORLD_SIZE", "MASTER_ADDR"), "but MASTER_PORT is not", "unset RANK and WORLD_SIZE "),
    (("RANK", "WORLD_SIZE", "MASTER_PORT"), "but MASTER_ADDR is not", "unset RANK and WORLD_SIZE "),
    (("RANK", "MASTER_ADDR", "MASTER_PORT"), "but WORLD_SIZE is not", "unset RANK "),
])
def test_a_half_set_torchrun_environment_names_what_is_missing_and_the_fix(monkeypatch, given, missing, unset):
    _set(monkeypatch, **{name: FULL[name] for name in given})
    with pytest.raises(LaunchEnvironmentError) as info:
        environment.detect_external_launch()
    message = str(info.value)
    assert missing in message and unset in message and "torchrun" in message, message
    assert info.value.code == f"error: {message}"  # what Python prints for it, uncaught
    # MASTER_ADDR/MASTER_PORT set alone make no launch (and no refusal).
    _set(monkeypatch, MASTER_ADDR="127.0.0.1", MASTER_PORT="29500")
    for name in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    assert environment.detect_external_launch() is None


@pytest.mark.parametrize("values, expected", [
    ({"MASTER_PORT": "29x"}, "MASTER_PORT='29x' is not an integer"),
    ({"MASTER_PORT": "70000"}, "MASTER_PORT='70000': give a number from 1 to 65535"),
    ({"RANK": "2"}, "RANK=2 with WORLD_SIZE=2: ranks are numbered 0 to WORLD_SIZE-1 (0 to 1)"),
    ({"RANK": "-1"}, "RANK='-1': give a number 0 or more"),
    ({"WORLD_SIZE": "0", "RANK": "0"}, "WORLD_SIZE='0': give a number 1 or more"),
    ({"LOCAL_RANK": "first"}, "LOCAL_RANK='first' is not an integer"),
])
def test_values_no_launcher_sets_are_refused_by_name(monkeypatch, values, expected):
    _set(monkeypatch, **{**FULL, **values})
    with pytest.raises(LaunchEnvironmentError, match=expected.replace("(", r"\(").replace(")", r"\)")):
        environment.detect_external_launch()


def test_a_slurm_jobs_master_port_is_checked_too(monkeypatch):
    _set(monkeypatch, SLURM_PROCID="0", SLURM_NTASKS="2", MASTER_PORT="port")
    with pytest.raises(LaunchEnvironmentError, match="MASTER_PORT='port' is not an integer"):
        environment.detect_external_launch()


def test_fit_in_a_script_refuses_before_starting_anything(monkeypatch, root_dir):
    _set(monkeypatch, RANK="0", WORLD_SIZE="2")
    with pytest.raises(LaunchEnvironmentError, match="MASTER_ADDR and MASTER_PORT are not"):
        Trainer(num_procs=2, max_epochs=1, progress_bar=False, default_root_dir=root_dir).fit(RegressionTask())
    assert list(root_dir.iterdir()) == []


_SCRIPT = ("from graphtrainer import Trainer\nfrom tasks import RegressionTask\n"
           "if __name__ == '__main__':\n"
           "    trainer = Trainer(num_procs=2, max_epochs=1, progress_bar=False, default_root_dir={root!r})\n"
           "    trainer.fit(RegressionTask())\n")


@pytest.mark.slow  # fresh interpreters importing torch and dgl
@pytest.mark.timeout(300)
@pytest.mark.parametrize("how", ["script", "command line"])
def test_what_a_user_sees_is_one_line_and_status_1(tmp_path, how):
    runs = tmp_path / "runs"
    if how == "script":
        script = tmp_path / "train.py"
        script.write_text(_SCRIPT.format(root=str(runs)))
        argv = [sys.executable, str(script)]
    else:
        config = tmp_path / "run.yaml"
        config.write_text(f"trainer:\n  num_procs: 2\n  max_epochs: 1\n  default_root_dir: {runs}\n"
                          "task:\n  class_path: tasks.RegressionTask\n")
        argv = [sys.executable, "-m", "graphtrainer", "fit", "--config", str(config)]
    env = env_without_launch(RANK="0", WORLD_SIZE="2", DGLBACKEND="pytorch",
                             PYTHONPATH=os.pathsep.join([str(ROOT), str(HELPERS)]))
    out = subprocess.run(argv, capture_output=True, text=True, timeout=200, cwd=tmp_path, env=env)
    assert out.returncode == 1, out.stderr[-3000:]
    assert out.stderr.strip().splitlines() == [
        "error: RANK and WORLD_SIZE are set in the environment but MASTER_ADDR and MASTER_PORT are not: start the "
        "script with torchrun (python -m torch.distributed.run), export all of RANK, WORLD_SIZE, MASTER_ADDR and "
        "MASTER_PORT on every rank, or unset RANK and WORLD_SIZE to let the trainer start its own ranks"
    ], out.stderr[-3000:]
    assert not runs.exists()
