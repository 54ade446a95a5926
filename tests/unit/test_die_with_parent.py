"""``die_with_parent`` in real processes: a child whose parent is gone before the call ends
at once, one whose parent dies after it is killed by the kernel, and a fork server's child,
whose starter lives but is not its parent, runs on."""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

import psutil
import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "helpers" / "parent_death_script.py"
ROOT = Path(__file__).resolve().parents[2]
#: Seconds a child gets to end once its parent is gone: it should be milliseconds.
PROMPT_S = 10.0


def _gone(pid: int, within: float, unless: Optional[Path] = None) -> bool:
    """Whether process ``pid`` ends within ``within`` seconds (False at once if ``unless`` appears)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline and not (unless is not None and unless.exists()):
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.01)
    return False


def _wait_for(path: Path, within: float, writer: int) -> None:
    deadline = time.monotonic() + within
    while not path.exists():
        assert psutil.pid_exists(writer), f"process {writer} ended before writing {path.name}"
        assert time.monotonic() < deadline, f"{path.name} not written after {within} s"
        time.sleep(0.01)


def _start_parent(process_owner, tmp_path: Path, start: str, when: str):
    proc = process_owner.start([sys.executable, str(SCRIPT), "parent", str(tmp_path), start, when],
                               stdout=subprocess.PIPE, text=True, cwd=ROOT)
    child = int(proc.stdout.readline())  # printed once the child runs
    return proc, child


@pytest.mark.timeout(120)
@pytest.mark.parametrize("start", ["fork", pytest.param("popen", marks=pytest.mark.slow)])
def test_a_child_whose_parent_is_gone_before_the_call_ends_at_once(process_owner, tmp_path, start):
    proc, child = _start_parent(process_owner, tmp_path, start, "before")
    assert proc.wait(timeout=60) == 0  # the parent exits once the child is ready
    # The child calls die_with_parent as soon as it sees its new parent, and must end in it.
    gone = _gone(child, PROMPT_S, unless=tmp_path / "survived")
    assert not (tmp_path / "survived").exists(), "the child lived on past die_with_parent"
    assert gone, f"the child still runs {PROMPT_S} s after its parent exited"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("start", ["fork", pytest.param("popen", marks=pytest.mark.slow)])
def test_a_child_dies_with_a_parent_killed_after_the_call(process_owner, tmp_path, start):
    proc, child = _start_parent(process_owner, tmp_path, start, "after")
    _wait_for(tmp_path / "armed", 60, child)
    proc.kill()
    proc.wait(timeout=10)
    assert _gone(child, PROMPT_S), f"the child still runs {PROMPT_S} s after its parent was killed"


@pytest.mark.timeout(120)
@pytest.mark.slow  # 3 s or more on 2 cores: a fresh interpreter
def test_a_fork_server_child_runs_on_while_its_starter_lives(process_owner, tmp_path):
    """Its parent is the server, which the starter started: not a parent gone."""
    _, child = _start_parent(process_owner, tmp_path, "forkserver", "after")
    _wait_for(tmp_path / "armed", 60, child)
    assert not _gone(child, 1.0), "die_with_parent ended a fork server's child whose starter runs"
