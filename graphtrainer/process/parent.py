"""Ending a process with the process it serves, so that no rank, sampling worker or graph server
runs on as an orphan when its launcher or rank is killed (SIGKILL leaves it no chance to clean up).

Linux's ``PR_SET_PDEATHSIG`` (through ``ctypes``) makes the kernel send SIGKILL when the parent
exits. It only covers a parent alive when it is set: one that exited just before left this
process to a reaper (init or a subreaper), and no signal will ever come. So, after setting it,
:func:`die_with_parent` checks that the process this one started under is still its parent
(or its parent's parent: a fork server's child), and ends at once otherwise.
"""
from __future__ import annotations

import ctypes
import multiprocessing
import os
import select
import signal
import sys
import threading
from typing import Optional

from . import pids

_PR_SET_PDEATHSIG = 1


def die_with_parent(parent: Optional[int] = None) -> None:
    """SIGKILL this process when its parent exits, and now if its parent is gone already.

    ``parent``: the pid of the process that started this one, as known before the start.
    ``None``: the starting process of a ``multiprocessing`` child (a launched rank, a sampling
    worker); for other processes (torchrun's workers) the parent seen on entry, which catches
    a parent that exits during the call but not one gone before it. Where the signal cannot be
    set (not Linux, no ``libc.so.6``), a thread watches the parent instead, where Linux pidfds
    exist; elsewhere only the check on entry is made.
    """
    before = os.getppid()
    requested = _request_kill_on_parent_exit()
    now = os.getppid()
    if parent is None:
        started_by = multiprocessing.parent_process()
        parent = started_by.pid if started_by is not None else None
    if now != before or (parent is not None and not _still_served_by(parent, now)):
        os.kill(os.getpid(), signal.SIGKILL)
    if not requested:
        die_with(now)


def _still_served_by(starter: int, parent: int) -> bool:
    """Whether ``starter`` is still this process's parent, or its parent's parent (a fork
    server's child: the server was started by the same process). A starter gone, or exiting
    right now (its children already handed on, it not yet a zombie), is neither."""
    if starter == parent:
        return True
    grandparent = _parent_of(parent)
    return starter == grandparent if grandparent is not None else pids.alive(starter)


def _parent_of(pid: int) -> Optional[int]:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            return int(fh.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):  # no /proc here
        return None


def _request_kill_on_parent_exit() -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        return libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL) == 0
    except (OSError, AttributeError):  # no glibc (musl), or no prctl in it
        return False


def die_with(pid: int) -> None:
    """SIGKILL this process as soon as process ``pid`` exits (any process, not only the parent):
    a daemon thread waits on a pidfd, without polling. No-op where pidfds do not exist
    (Linux < 5.3, other systems), except that a ``pid`` already gone ends this process now."""
    try:
        pidfd = os.pidfd_open(pid)
    except (AttributeError, OSError):  # gone already, or no pidfd here
        if not pids.alive(pid):
            os.kill(os.getpid(), signal.SIGKILL)
        return

    def wait_for_exit() -> None:
        select.select([pidfd], [], [])
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=wait_for_exit, name=f"graphtrainer-die-with-{pid}", daemon=True).start()
