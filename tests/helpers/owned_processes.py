"""Processes the test suite starts, ended on every outcome, and a check that none outlives it.

Every process the suite starts carries :data:`OWNERS_VAR` in its environment: the pytest
session's token (set in ``os.environ`` by ``conftest.py``, so everything inherits it,
ranks, fork servers and graph servers included), and, for a process started through a
:class:`ProcessOwner`, the token of that test too. ``/proc/<pid>/environ`` is what a process
was started with, so the mark survives re-parenting (an orphan adopted by init) and
``setsid``, which a parent-child walk or a process group would miss.
"""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from typing import Dict, Iterable, List, Optional, Sequence

import psutil

#: Space-separated tokens of the sessions and tests that own a process.
OWNERS_VAR = "GRAPHTRAINER_TEST_OWNERS"
#: Helpers of multiprocessing that a process keeps for its whole life and that end with it.
_LIFELONG_HELPERS = ("multiprocessing.resource_tracker", "multiprocessing.forkserver")


def with_owner(env: Dict[str, str], token: str) -> Dict[str, str]:
    """``env`` with ``token`` added to its owners (and this process's own owners kept)."""
    tokens = os.environ.get(OWNERS_VAR, "").split() + env.get(OWNERS_VAR, "").split()
    env = dict(env)
    env[OWNERS_VAR] = " ".join(dict.fromkeys(tokens + [token]))
    return env


def mark_this_process(token: str) -> None:
    """From now on, every process started from here (with ``os.environ``) carries ``token``."""
    os.environ[OWNERS_VAR] = with_owner(dict(os.environ), token)[OWNERS_VAR]


def marked(token: str) -> List[psutil.Process]:
    """Live processes of this user started with ``token`` among their owners (not this one).
    Reads each process's environment: a few milliseconds for a few hundred processes."""
    found = []
    uid = os.getuid()
    for proc in psutil.process_iter(["uids"]):
        try:
            if proc.pid == os.getpid() or proc.info["uids"] is None or proc.info["uids"].real != uid:
                continue
            if token in proc.environ().get(OWNERS_VAR, "").split() and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except psutil.Error:  # gone meanwhile, or not ours to read
            continue
    return found


def describe(procs: Iterable[psutil.Process]) -> List[str]:
    """``pid N: command line`` for each process."""
    out = []
    for proc in procs:
        try:
            line = " ".join(proc.cmdline()).replace("\n", "\\n") or proc.name()
            out.append(f"pid {proc.pid}: {line if len(line) <= 300 else line[:300] + ' ...'}")
        except psutil.Error:
            out.append(f"pid {proc.pid}: (ended while being named)")
    return out


def kill_all(procs: Iterable[psutil.Process], wait_s: float = 10.0) -> None:
    """SIGKILL each of ``procs`` and wait up to ``wait_s`` for them to end (a zombie has:
    reaping an orphan is up to init, which may take its time)."""
    procs = list(procs)
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    deadline = time.monotonic() + wait_s
    while any(_running(p) for p in procs) and time.monotonic() < deadline:
        time.sleep(0.01)


def session_leftovers(token: str, grace_s: float = 0.5) -> List[psutil.Process]:
    """What the session ``token`` started that still runs: this process's descendants and
    every process marked with ``token``, except multiprocessing's lifelong helpers of this
    process. Those found get ``grace_s`` to finish exiting before they count."""
    me = psutil.Process()
    found = {p.pid: p for p in me.children(recursive=True)}
    found.update((p.pid, p) for p in marked(token))
    left = []
    for proc in found.values():
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            if proc.ppid() == me.pid and any(h in " ".join(proc.cmdline()) for h in _LIFELONG_HELPERS):
                continue
        except psutil.Error:
            continue
        left.append(proc)
    deadline = time.monotonic() + grace_s
    while any(_running(p) for p in left) and time.monotonic() < deadline:
        time.sleep(0.01)
    return [p for p in left if _running(p)]


class ProcessOwner:
    """Starts a test's processes, each in a session of its own and marked with the test's
    token, and ends everything they started when the test ends (:meth:`end_all`)."""

    def __init__(self, token: str):
        self.token = token
        self.procs: List[subprocess.Popen] = []

    def start(self, argv: Sequence[str], env: Optional[Dict[str, str]] = None, **popen_kwargs) -> subprocess.Popen:
        """``subprocess.Popen(argv, ...)`` in a new session (its own process group, so signals to
        the group reach the run and never pytest)."""
        env = with_owner(dict(os.environ) if env is None else env, self.token)
        proc = subprocess.Popen(list(argv), env=env, start_new_session=True, **popen_kwargs)
        self.procs.append(proc)
        return proc

    def run(self, argv: Sequence[str], timeout: float, env: Optional[Dict[str, str]] = None,
            **popen_kwargs) -> subprocess.CompletedProcess:
        """Like ``subprocess.run(argv, capture_output=True, text=True, timeout=...)``, but a
        timeout ends everything the command started, not only the command."""
        proc = self.start(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen_kwargs)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            left = self.end_all()
            raise AssertionError(f"{' '.join(map(str, argv))} still ran after {timeout} s; ended: {left}") from None
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)

    def end_all(self) -> List[str]:
        """SIGKILL whatever the started processes and their descendants left running (found
        by descent, by this test's mark, and by the process group of a started process not yet
        reaped); return what was."""
        left: Dict[int, psutil.Process] = {}
        for proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(psutil.Error):
                    parent = psutil.Process(proc.pid)
                    left.update((c.pid, c) for c in parent.children(recursive=True))
                    left[proc.pid] = parent
        left.update((p.pid, p) for p in marked(self.token))
        named = describe(p for p in left.values() if _running(p))
        for proc in self.procs:
            if proc.returncode is None:  # not reaped, so its pid (and group id) is still its own
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)  # its session's group: what the walk missed
        kill_all(left.values())
        for proc in self.procs:
            for stream in (proc.stdin, proc.stdout, proc.stderr):
                if stream is not None:
                    stream.close()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
        return named


def _running(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
