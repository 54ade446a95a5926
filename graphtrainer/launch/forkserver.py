"""``launcher="forkserver"``: ranks forked from a clean server that imported torch and dgl once.

The server is a fresh interpreter (exec'd, like a spawned rank) that never touched CUDA,
autograd's device threads or an OpenMP pool: forking from it is safe wherever spawn is, also
after the launching process used the GPU. It imports torch, dgl and graphtrainer once
(:mod:`graphtrainer.launch._forkserver_preload`) and freezes them for the collector; its ranks share
those pages (a spawned rank holds about 300 MB of its own imports). As with spawn, the task
is pickled to each rank and the graph comes through shared memory
(:func:`graphtrainer.launch.shared_graph.share_graph`).

graphtrainer starts Python's one fork server per process early in a launch (its imports
overlap the graph's preparation) and stops it when the launch ends, whatever happened.

If the launching process dies, the run must end. Python's server exits once every holder
of its "alive" pipe is gone, but it hands that pipe to each rank (whose die-with-parent
signal points at the server), so each rank closes its copy (:func:`bind_to_launcher`) and
watches the launching process itself.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time
from multiprocessing import forkserver as _mp_forkserver
from multiprocessing import resource_tracker
from typing import Any, Optional, Sequence

from ..errors import RankFailedError
from ..process import pids
from ..process.parent import die_with
from . import stop_flag
from .supervisor import WatchedService

#: The one module the server imports (it imports the rest); see its docstring.
PRELOAD = "graphtrainer.launch._forkserver_preload"
#: Seconds the server gets to exit once asked before it is killed.
STOP_GRACE_S = 5.0
#: Tells the preload module it runs in the server (read and removed there).
ENV_FLAG = "GRAPHTRAINER_FORKSERVER"
#: The launching process's pid, as the server and its ranks see it (see :func:`bind_to_launcher`).
LAUNCHER_ENV = "GRAPHTRAINER_FORKSERVER_LAUNCHER"
#: A rank's exit code as multiprocessing gives it when the server's pipe to the launcher closed
#: without the rank's status: the server is gone (or the rank really exited with 255).
NO_STATUS_EXIT = 255
#: Seconds the launcher waits for the exit status of a server whose pipes closed: it is exiting,
#: but the kernel reports its death a moment after its files are closed.
EXIT_NOTICE_S = 2.0


def context() -> mp.context.BaseContext:
    """The forkserver multiprocessing context, with graphtrainer's preload set."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload([PRELOAD])
    return ctx


def start_server() -> int:
    """Start the fork server now (no-op when it runs), importing in the background; its pid."""
    context()
    previous = {name: os.environ.get(name) for name in (ENV_FLAG, LAUNCHER_ENV)}
    os.environ[ENV_FLAG] = "1"
    os.environ[LAUNCHER_ENV] = str(os.getpid())
    try:
        # The server ends with its launcher (its "alive" pipe) or stop_server, never by a stop
        # signal: started with them blocked, it outlives a SIGTERM to the whole process group
        # (Slurm stops a job step so), which the ranks then take as a preemption, and the ranks
        # it forks start with them blocked, until they route them (see stop_flag). Starting the
        # resource tracker unblocks SIGTERM in this thread: it is started first.
        resource_tracker.ensure_running()
        with stop_flag.blocked():
            _mp_forkserver.ensure_running()
    finally:
        for name, value in previous.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    pid = server_pid()
    assert pid is not None
    return pid


def server_pid() -> Optional[int]:
    """The running fork server's pid, or None."""
    return getattr(_mp_forkserver._forkserver, "_forkserver_pid", None)


_exit_status: dict = {}  # pid -> wait status of a server found dead while its launch ran


def server_death(wait_s: float = 0.0) -> Optional[str]:
    """How the running fork server died ("killed by signal SIGKILL"), or None while it runs;
    waits up to ``wait_s`` for it to end (see :class:`ServerWatch`)."""
    pid = server_pid()
    if pid is None:
        return None
    if pid not in _exit_status:
        status = _exit_status_within(pid, wait_s)
        if status is None:
            return None
        _exit_status[pid] = status
    code = os.waitstatus_to_exitcode(_exit_status[pid])
    return f"killed by signal {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"


def _exit_status_within(pid: int, wait_s: float) -> Optional[int]:
    """Child ``pid``'s wait status once it has ended, waiting up to ``wait_s`` for that; None while it
    runs (or when it is not this process's child)."""
    found: list = []

    def ended() -> bool:
        try:
            done, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return True
        if done:
            found.append(status)
        return bool(done)

    pids.wait_ended(pid, ended, wait_s)
    return found[0] if found else None


def stop_server() -> None:
    """Stop the fork server, if one runs, and reap it: asked to exit (its 'alive' pipe is
    closed), killed after :data:`STOP_GRACE_S`. Ranks it forked die with it."""
    server = _mp_forkserver._forkserver
    try:
        with server._lock:
            pid = server._forkserver_pid
            if pid is None:
                return
            os.close(server._forkserver_alive_fd)
            server._forkserver_alive_fd = None
            _reap(pid, STOP_GRACE_S)
            server._forkserver_pid = None
            address = server._forkserver_address
            server._forkserver_address = None
            if address and not address.startswith("\0"):
                try:
                    os.unlink(address)
                except OSError:
                    pass
    except AttributeError:  # another Python's internals: its own stop (it waits without a limit)
        server._stop()


def _reap(pid: int, grace_s: float) -> None:
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return
        if done:
            return
        time.sleep(0.01)
    try:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except (ProcessLookupError, ChildProcessError):
        pass


def bind_to_launcher() -> None:
    """In a rank the server forked (else no-op): close this rank's copy of the server's "alive"
    pipe, and end this rank when the launching process is gone."""
    launcher = os.environ.get(LAUNCHER_ENV)
    server = _mp_forkserver._forkserver
    if launcher is None or server_pid() is not None:  # not forked by the server
        return
    fd = getattr(server, "_forkserver_alive_fd", None)
    if fd is not None:
        try:
            os.close(fd)
        except OSError:
            pass
        server._forkserver_alive_fd = None
    die_with(int(launcher))


class ServerWatch(WatchedService):
    """The server's death ends the run, named as such (not as ranks that could not start).

    The server closes its pipes, so the launcher sees its ranks end, a moment before the kernel
    reports its own death; a rank's error (its own, or a peer's lost connection) may have arrived
    first. Once a rank of ``procs`` has ended without a status, the server's death is waited for
    (up to :data:`EXIT_NOTICE_S`, once): the watch must not name the cause before it could see it.
    """

    def __init__(self, procs: Sequence[Any] = ()):
        self.procs = list(procs)
        self.waited = False

    def failure(self) -> Optional[RankFailedError]:
        wait_s = 0.0
        if not self.waited and any(p.exitcode == NO_STATUS_EXIT for p in self.procs):
            wait_s, self.waited = EXIT_NOTICE_S, True
        death = server_death(wait_s)
        if death is None:
            return None
        return RankFailedError(-1, "ForkServerDied", f"{death} while the ranks ran; the ranks it had forked died "
                               "with it", process=f"the fork server (pid {server_pid()})")
