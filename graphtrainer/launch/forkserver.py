"""``launcher="forkserver"``: ranks forked from a clean server that imported torch and dgl once.

The server is a fresh interpreter (started by exec, like a spawned rank), so it never
touched CUDA, autograd's device threads or an OpenMP pool: forking ranks from it is safe
wherever spawn is, including after the launching process used the GPU. It imports
torch, dgl and graphtrainer once (:mod:`graphtrainer._forkserver_preload`) and freezes
those objects for the collector, and every rank forked from it shares those pages
instead of importing them again (a spawned rank holds about 300 MB of its own imports).
Like spawn, the task is pickled to each rank and the graph reaches it through shared
memory (:func:`graphtrainer.launch.shared_graph.share_graph` in the launching process).

Python keeps one fork server per process (``multiprocessing.forkserver``). graphtrainer
starts it for a launch (early, so its imports overlap the graph's preparation) and stops
it when the launch ends, whatever happened, so no server outlives a ``fit``: its ranks
were ended before, and any left would get SIGKILL as their parent exits.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time
from multiprocessing import forkserver as _mp_forkserver
from typing import Optional

#: The one module the server imports (it imports the rest); see its docstring.
PRELOAD = "graphtrainer._forkserver_preload"
#: Seconds the server gets to exit once asked before it is killed.
STOP_GRACE_S = 5.0
#: Tells the preload module it runs in the server (read and removed there).
ENV_FLAG = "GRAPHTRAINER_FORKSERVER"


def context() -> mp.context.BaseContext:
    """The forkserver multiprocessing context, with graphtrainer's preload set."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload([PRELOAD])
    return ctx


def start_server() -> int:
    """Start the fork server now (no-op when it runs) and return its pid. It imports in the
    background; the first rank start waits for it."""
    context()
    previous = os.environ.get(ENV_FLAG)
    os.environ[ENV_FLAG] = "1"
    try:
        _mp_forkserver.ensure_running()
    finally:
        if previous is None:
            os.environ.pop(ENV_FLAG, None)
        else:
            os.environ[ENV_FLAG] = previous
    pid = server_pid()
    assert pid is not None
    return pid


def server_pid() -> Optional[int]:
    """The running fork server's pid, or None."""
    return getattr(_mp_forkserver._forkserver, "_forkserver_pid", None)


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
