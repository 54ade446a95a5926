"""What a run leaves on disk while it runs, named after its owner, and removed by the next
run when the owner died without cleaning up (SIGKILL, a power cut).

Temporary folders are ``<tmp>/graphtrainer-<kind>-<owner pid>-<random>``; a run that
ends in any way Python sees (an exception, Ctrl-C, SIGTERM: see :func:`unwinds_on_sigterm`)
removes its own. At its start a run removes the folders whose owner no longer runs, and
what they stood for (a DistDGL run's shared memory), and says what it removed.
"""
from __future__ import annotations

import contextlib
import functools
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator, List, Optional, TypeVar

from .._moved import moved_name
from ..errors import PREEMPTED_EXIT_CODE, Preempted
from ..process import pids


def __getattr__(name: str) -> Any:
    """``die_with_parent`` moved to :mod:`graphtrainer.process.parent`; its old path still works."""
    return moved_name(__name__, name)


_OWNED = re.compile(r"^graphtrainer-(?P<kind>[a-z]+)-(?P<pid>\d+)-")
#: In a folder of kind "servers": the file that names the DistDGL graph its servers loaded.
GRAPH_NAME_FILE = "graph_name"
SHM_DIR = "/dev/shm"

F = TypeVar("F", bound=Callable[..., Any])


def owned_temp_dir(kind: str) -> str:
    """A fresh temporary folder whose name records this process as its owner."""
    return tempfile.mkdtemp(prefix=f"graphtrainer-{kind}-{os.getpid()}-")


def remove_dead_owners(kinds: tuple = ("stacks", "servers", "ipconfig")) -> List[str]:
    """Remove the temporary folders of ``kinds`` whose owner process is gone (with the shared
    memory a dead DistDGL run's servers left: call that kind only while holding the machine's
    DistDGL lock), print what was removed and return it."""
    removed: List[str] = []
    root = Path(tempfile.gettempdir())
    try:
        entries = list(root.iterdir())
    except OSError:
        return removed
    for path in entries:
        match = _OWNED.match(path.name)
        if not match or match["kind"] not in kinds or not path.is_dir():
            continue
        pid = int(match["pid"])
        if pid == os.getpid() or pids.alive(pid):
            continue
        if match["kind"] == "servers":
            removed += _remove_segments(path)
        shutil.rmtree(path, ignore_errors=True)
        removed.append(str(path))
    if removed:
        print(f"graphtrainer: removed what a run that no longer runs left behind: {', '.join(removed)}",
              file=sys.stderr)
    return removed


def _remove_segments(folder: Path) -> List[str]:
    """The shared memory of the dead run whose servers logged into ``folder``: DGL names it
    after the graph and the features (``node~<type>~<key>-kvdata-``)."""
    try:
        graph_name = (folder / GRAPH_NAME_FILE).read_text().strip()
    except OSError:
        return []
    removed = []
    try:
        names = os.listdir(SHM_DIR)
    except OSError:
        return []
    for name in names:
        if graph_name and name.startswith((graph_name, "node~", "edge~")):
            try:
                os.unlink(os.path.join(SHM_DIR, name))
                removed.append(os.path.join(SHM_DIR, name))
            except OSError:
                pass
    return removed


_forward_to: List[int] = []  # pids the stop signals are passed on to (this launch's ranks)
_forwarded: List[int] = []  # the stop signals passed on during this launch
_STOP = (signal.SIGTERM, signal.SIGUSR1)
#: [True] while a fit's launching process has no rank yet (:func:`preempts_before_ranks`).
_before_ranks: List[bool] = []
#: The stop signal that ended a fit before any rank existed, until the next such fit.
_preempted_by: List[int] = []
#: [True] inside :func:`stop_signals_held`; the stop signals that arrived there, in order.
_holding: List[bool] = []
_held: List[int] = []


def stop_forwarded() -> bool:
    """Whether this launch has passed a stop signal on to its ranks (they should stop soon)."""
    return bool(_forwarded)


def forward_stop_signals_to(pid: int) -> None:
    """From now on until the launch ends, pass SIGTERM and SIGUSR1 received here on to ``pid``
    (a rank exists: a stop signal no longer ends the fit here, see :func:`preempts_before_ranks`)."""
    _forward_to.append(pid)
    _before_ranks.clear()


def awaiting_ranks() -> bool:
    """Whether a fit's stop signals raise ``Preempted`` here, no rank having started yet."""
    return bool(_before_ranks)


def rank_runs_here() -> None:
    """This process becomes the fit's one rank (``InProcess``): a stop signal is its own from now on."""
    _before_ranks.clear()


def preempted_before_ranks() -> Optional[int]:
    """The stop signal that ended the last fit before any rank existed, or None."""
    return _preempted_by[0] if _preempted_by else None


@contextlib.contextmanager
def stop_signals_held() -> Iterator[None]:
    """A stop signal handled here (:func:`preempts_before_ranks`, :func:`unwinds_on_sigterm`) inside the
    block is acted on as the block ends: what the block makes and records (a run folder) is recorded
    before the unwinding that removes it. (Blocking the signal would not do: another thread of the
    process, one of torch's, may take it, and Python runs the handler in the main thread at once.)"""
    if _holding:
        yield
        return
    _holding.append(True)
    try:
        yield
    finally:
        _holding.clear()
        pending, _held[:] = list(_held), []
        for signum in pending:
            _on_stop_signal(signum, None)


def _on_stop_signal(signum: int, frame: Any) -> None:
    """SIGTERM or SIGUSR1 in a launching process: see :func:`unwinds_on_sigterm` and :func:`preempts_before_ranks`."""
    if _holding:
        _held.append(signum)
        return
    if _forward_to and not (signum == signal.SIGTERM and signal.SIGTERM in _forwarded):
        _forwarded.append(signum)
        for pid in _forward_to:
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass
        return
    if _before_ranks:
        _before_ranks.clear()
        _preempted_by[:] = [signum]
        for sig in _STOP:
            signal.signal(sig, signal.SIG_IGN)  # once: the unwinding itself is not cut short
        name = signal.Signals(signum).name
        raise Preempted(f"fit stopped by {name} before any rank started: nothing trained, no checkpoint "
                        "written. Resume with fit(task, ckpt_path='last') (command line: --ckpt_path last): it "
                        "continues from the previous checkpoint, or starts afresh without one; the process exits "
                        f"with status {PREEMPTED_EXIT_CODE}")
    if signum == signal.SIGTERM:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # once: the unwinding itself is not cut short
        raise SystemExit(128 + signum)


def _takes_stop_signals() -> bool:
    """Main thread, with SIGTERM and SIGUSR1 at their defaults: someone else's handlers are left alone."""
    return threading.current_thread() is threading.main_thread() and \
        all(signal.getsignal(sig) is signal.SIG_DFL for sig in _STOP)


@contextlib.contextmanager
def preempts_before_ranks(enabled: bool = True) -> Iterator[None]:
    """Around a fit whose ranks this process starts or runs: until the first rank exists
    (:func:`forward_stop_signals_to`, :func:`rank_runs_here`), a stop signal (SIGTERM, SIGUSR1)
    raises :class:`~graphtrainer.Preempted` at once in the main thread (nothing trained: a
    requeued ``fit(ckpt_path="last")`` resumes the previous checkpoint), so ``finally`` blocks
    remove the run folder and temporary folders and stop the fork server; later stop signals are
    ignored while it unwinds. Once ranks exist, as :func:`unwinds_on_sigterm`. Nothing where
    :func:`unwinds_on_sigterm` would do nothing."""
    if not enabled or not _takes_stop_signals():
        yield
        return
    _forward_to.clear()
    _forwarded.clear()
    _preempted_by.clear()
    _before_ranks[:] = [True]
    for sig in _STOP:
        signal.signal(sig, _on_stop_signal)
    try:
        yield
    finally:
        _before_ranks.clear()
        _forward_to.clear()
        _forwarded.clear()
        for sig in _STOP:
            signal.signal(sig, signal.SIG_DFL)


def unwinds_on_sigterm(fn: F) -> F:
    """Run ``fn`` (a launch) with SIGTERM and SIGUSR1 passed on to the ranks, which stop at
    their next batch boundary and write a checkpoint (:mod:`graphtrainer.loop.preemption`). In a
    fit, a stop signal before any rank started raises ``Preempted`` (see
    :func:`preempts_before_ranks`); elsewhere a SIGTERM before any rank started, and in any stage
    a second one, raises ``SystemExit(143)`` in the main thread, as Ctrl-C raises
    ``KeyboardInterrupt``, so ``fn``'s ``finally`` blocks end the ranks and remove temporary
    files. Handlers someone else set are left alone."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        warn_if_sigint_ignored()
        if signal.getsignal(signal.SIGTERM) is _on_stop_signal:  # a fit's (or an outer launch's) already
            try:
                return fn(*args, **kwargs)
            finally:
                _forward_to.clear()
        if not _takes_stop_signals():
            return fn(*args, **kwargs)
        _forwarded.clear()
        for sig in _STOP:
            signal.signal(sig, _on_stop_signal)
        try:
            return fn(*args, **kwargs)
        finally:
            _forward_to.clear()
            _forwarded.clear()
            for sig in _STOP:
                signal.signal(sig, signal.SIG_DFL)

    return wrapper  # type: ignore[return-value]


_sigint_warned: List[bool] = []


def warn_if_sigint_ignored() -> None:
    """Once per process: if SIGINT is ignored here, say that Ctrl-C cannot stop the run.

    A command that a non-interactive shell starts with ``&`` (a script, ``bash -c``, a CI
    step, ``nohup ... &`` inside them) inherits SIGINT ignored; Python and every rank keep
    that, as POSIX asks, so the launch does not change it, but says so, with what still
    stops the run."""
    if _sigint_warned or signal.getsignal(signal.SIGINT) != signal.SIG_IGN:
        return
    _sigint_warned.append(True)
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    frame, level = sys._getframe(1), 2  # shown at the first caller outside graphtrainer: the fit
    while frame.f_back is not None and frame.f_code.co_filename.startswith(package):
        frame, level = frame.f_back, level + 1
    warnings.warn("SIGINT is ignored in this process (as a background job of a non-interactive shell inherits it), "
                  "and the ranks inherit that, so Ctrl-C (SIGINT) will not stop this run. SIGTERM stops it "
                  f"(kill {os.getpid()}: the ranks stop at their next batch and checkpoint); to take Ctrl-C, "
                  "call signal.signal(signal.SIGINT, signal.default_int_handler) before fit",
                  RuntimeWarning, stacklevel=level)


@contextlib.contextmanager
def cleanup_first() -> Iterator[None]:
    """Inside (a launcher's cleanup: ending ranks, removing its folders), SIGINT and SIGTERM
    are held and take effect when the block ends, so a second Ctrl-C (or a second signal from
    ``timeout`` or a scheduler) does not cut the cleanup short and leave files behind. Main
    thread only; elsewhere signals do not interrupt anyway."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: List[int] = []
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    previous = {sig: handler for sig, handler in previous.items() if handler is not None}  # (None: set in C)
    for sig in previous:
        signal.signal(sig, lambda signum, frame: held.append(signum))
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for sig in dict.fromkeys(held):
            signal.raise_signal(sig)  # now, with the handler it would have met


def is_stopped(pid: int) -> bool:
    """Whether process ``pid`` is stopped (SIGSTOP, Ctrl-Z, a debugger): state T or t."""
    return pids.state(pid) in ("T", "t")


def resume(pid: int) -> None:
    """SIGCONT ``pid``, so a signal sent to it while stopped takes effect now."""
    try:
        os.kill(pid, signal.SIGCONT)
    except ProcessLookupError:
        pass
