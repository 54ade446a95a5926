"""The flag the stop signals (SIGTERM, SIGUSR1) set while a fit trains; the fit loop reads it
at batch boundaries (:mod:`graphtrainer.loop.preemption`). Outside a fit they keep their usual
effect.

Python runs signal handlers in the main thread only, so a launched rank whose fit runs in a
fresh thread has its main thread route them (:func:`routed`) while the worker runs; a torchrun
or Slurm rank routes them for its whole run, so the agent's SIGTERM does not end a failed rank
before it has named the failure.

A launched rank routes them from its first line (``routed(keep=True)``; the launcher starts it with
them blocked, :func:`blocked`), so one that arrives while the rank starts up (a scheduler's stop
before the fit trains) is kept for the fit, which then stops at its first batch boundary and
checkpoints, instead of killing the rank; a stage other than fit gives it up (:func:`release`)."""
from __future__ import annotations

import contextlib
import os
import signal
import threading
from typing import Any, Dict, Iterator, Optional

from .. import heartbeat

#: Signals that ask a fit to stop at the next batch boundary.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)

_state: Dict[str, Any] = {"signal": None, "training": False, "failing": False, "keep": False, "previous": {}}


@contextlib.contextmanager
def blocked() -> Iterator[None]:
    """Block the stop signals in this thread for the block: a process started inside inherits the
    mask (through ``exec`` too), so a stop signal sent to it waits until it has routed them."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


@contextlib.contextmanager
def caught() -> Iterator[None]:
    """While inside (a fit's training), the stop signals set the flag: installed here in the main
    thread unless :func:`routed` did; other threads rely on a :func:`routed` main thread."""
    main = threading.current_thread() is threading.main_thread()
    if main and _installed():
        # Routed since the rank started; C code since then (DGL's RPC client) may have put its own
        # handler in, which Python's record does not show: install ours again.
        for sig in STOP_SIGNALS:
            signal.signal(sig, _note)
    with routed() if main and not _installed() else contextlib.nullcontext():
        _state.update(training=True)  # (a signal kept since the rank started stops the fit at once)
        try:
            yield
        except BaseException:
            hold()  # the rank is unwinding to report its failure
            raise
        finally:
            _state["training"] = False


@contextlib.contextmanager
def routed(keep: bool = False) -> Iterator[None]:
    """Main thread only (elsewhere nothing): install the handlers for the block, then unblock the
    stop signals (see :func:`blocked`). A stop signal sets the flag while a thread is inside
    :func:`caught` (with ``keep``, also before: until :func:`release`), is held once a fit failed
    there (so the rank can report it before torchrun's SIGTERM ends it), else has its previous
    effect."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _state.update(failing=False, signal=None, keep=keep)
    _state["previous"] = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    for sig in STOP_SIGNALS:
        signal.signal(sig, _note)
    mask = signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)  # one sent meanwhile is handled now
    try:
        yield
    finally:
        _state["keep"] = False
        for sig, handler in _state["previous"].items():
            signal.signal(sig, handler)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)


def release() -> None:
    """This rank runs no fit: stop keeping stop signals, and give one kept so far its previous
    effect (SIGTERM ends the rank)."""
    _state["keep"] = False
    kept, _state["signal"] = _state["signal"], None
    if kept is not None:
        os.kill(os.getpid(), kept)  # handled in the main thread, by _note, now without keeping


def hold() -> None:
    """The fit failed: from now on a routed stop signal is held (see :func:`routed`)."""
    _state["failing"] = True


def _installed() -> bool:
    return signal.getsignal(STOP_SIGNALS[0]) is _note


def _note(signum: int, frame: Any) -> None:
    if _state["training"] or _state["keep"]:
        _state["signal"] = _state["signal"] or signum
        heartbeat.stop_requested()  # a rank without progress now will not stop: see heartbeat
        return
    if _state["failing"]:
        return  # the rank ends by the error it is about to report
    previous = _state["previous"].get(signum)
    if callable(previous):
        previous(signum, frame)
    elif previous != signal.SIG_IGN:  # the default: end the process as the signal would
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


def requested() -> Optional[int]:
    """The stop signal this process received while training, or None."""
    return _state["signal"]
