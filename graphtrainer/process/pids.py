"""Whether a process still runs, from its pid: the one check the launcher, the fork server and
checkpoint files use to tell a live owner from a dead one."""
from __future__ import annotations

import os


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
