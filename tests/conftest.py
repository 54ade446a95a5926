"""Shared test helpers. Multi-process tests use real processes over gloo on CPU."""
from __future__ import annotations

import itertools
import os
import signal
import tempfile
from pathlib import Path

import psutil
import pytest

import owned_processes
from launch_env import LAUNCH_VARS

os.environ.setdefault("DGLBACKEND", "pytorch")
#: Marks every process this session starts (see owned_processes): the session-end check finds
#: them by it, re-parented or not.
SESSION_TOKEN = f"pytest-{os.getpid()}"
owned_processes.mark_this_process(SESSION_TOKEN)
_tests = itertools.count()
#: SIGINT's disposition as this session inherited it: SIG_IGN in a background job of a
#: non-interactive shell (``nohup pytest ... &`` from a script), where Ctrl-C reaches nothing.
_INHERITED_SIGINT = signal.getsignal(signal.SIGINT)
#: The session-end check's findings, for the terminal summary.
_LEFT_KEY = pytest.StashKey[list]()


def own_temp_folders() -> set:
    """The temporary folders this process made for a run (ip_config, servers' logs, stacks):
    ``graphtrainer-<kind>-<this pid>-*``."""
    return {p.name for p in Path(tempfile.gettempdir()).glob(f"graphtrainer-*-{os.getpid()}-*")}


def rank_children() -> list:
    """Live descendants of this process, except multiprocessing's resource tracker (a
    helper of the parent that lives as long as it does, by design)."""
    out = []
    for child in psutil.Process().children(recursive=True):
        try:
            if child.status() == psutil.STATUS_ZOMBIE:
                continue
            if any("resource_tracker" in part for part in child.cmdline()):
                continue
            out.append(child)
        except psutil.NoSuchProcess:
            continue
    return out


@pytest.fixture
def root_dir(tmp_path):
    """A fresh ``default_root_dir`` for one test."""
    path = tmp_path / "runs"
    path.mkdir()
    return path


@pytest.fixture(autouse=True)
def _no_external_launch_env(monkeypatch):
    """Tests start from a clean environment: a stray RANK/WORLD_SIZE would turn the
    trainer into an externally launched rank."""
    for name in LAUNCH_VARS:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def process_owner():
    """Starts the test's processes (:class:`owned_processes.ProcessOwner`) and SIGKILLs
    whatever they left running when the test ends, passed or failed."""
    owner = owned_processes.ProcessOwner(f"{SESSION_TOKEN}-test{next(_tests)}")
    yield owner
    ended = owner.end_all()
    if ended:
        print(f"ended what the test left running: {ended}")


@pytest.fixture
def terminal_sigint():
    """SIGINT raises KeyboardInterrupt here during the test, as in a terminal, whatever the
    session inherited: for tests that send SIGINT to a run. Processes started meanwhile take
    it as a terminal would too: a fork inherits the handler, and exec resets a handled
    signal to its default (only an ignored one stays ignored)."""
    previous = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    if previous is not None:
        signal.signal(signal.SIGINT, previous)


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session, exitstatus):
    """Fail the session if a process it started still runs after its last test; end those."""
    left = owned_processes.session_leftovers(SESSION_TOKEN)
    if left:
        session.config.stash[_LEFT_KEY] = owned_processes.describe(left)
        owned_processes.kill_all(left)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if _INHERITED_SIGINT == signal.SIG_IGN:
        terminalreporter.write_line("SIGINT is ignored (inherited, as in a background job of a non-interactive "
                                    "shell): the tests that send SIGINT to a run restored it for that run "
                                    "(fixture terminal_sigint)")
    left = config.stash.get(_LEFT_KEY, None)
    if left:
        terminalreporter.section("processes left running", sep="=", red=True, bold=True)
        terminalreporter.line(f"{len(left)} process(es) this session started still ran after its last test "
                              "(now ended with SIGKILL); the session fails:", red=True)
        for line in left:
            terminalreporter.line(f"  {line}")

