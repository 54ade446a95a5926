"""Whether a process still runs, from its pid: the one check the launcher, the fork server and
checkpoint files use to tell a live owner from a dead one."""
from __future__ import annotations

import os
import select
import time
from typing import Callable


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (on this machine); one that exited but is not reaped yet
    (a zombie) does not."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return state(pid) not in ("Z", "X")


def state(pid: int) -> str:
    """The process state letter of ``/proc/<pid>/stat`` ("" where unknown)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


def wait_ended(pid: int, ended: Callable[[], bool], wait_s: float) -> bool:
    """Whether ``ended()`` (a check that reaps child ``pid``, such as ``Popen.poll() is not None``)
    holds within ``wait_s``: woken by the pid's pidfd once it exits where Linux has them, then
    checking every 10 ms."""
    deadline = time.monotonic() + wait_s
    try:
        pidfd = os.pidfd_open(pid)
    except (AttributeError, OSError):  # no pidfd here, or already reaped
        pidfd = None
    try:
        while not ended():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            if pidfd is not None:
                select.select([pidfd], [], [], left)  # readable once it has ended
                os.close(pidfd)
                pidfd = None
            else:
                time.sleep(min(0.01, left))
        return True
    finally:
        if pidfd is not None:
            os.close(pidfd)
