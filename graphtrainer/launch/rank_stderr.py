"""Each launched rank's stderr, passed through the launching process, whose last lines are
kept so that a rank that dies without a Python exception (a C++ abort such as gloo's
``op.preamble.length <= op.nbytes``, a segfault) is reported with its reason.

A rank's fd 2 is a pipe the launcher reads; one thread copies what arrives to the launcher's
stderr at once, and what a dead process wrote is still read afterwards.
"""
from __future__ import annotations

import os
import select
import threading
from typing import Any, Dict, List, Optional

#: Bytes of each rank's stderr kept for its failure message (room for faulthandler's dump).
TAIL_BYTES = 1 << 16
#: Lines of that tail quoted in a failure message.
TAIL_LINES = 12


def redirect_to(conn: Any) -> None:
    """In a rank: make ``conn`` (the write end the launcher made) this process's stderr."""
    os.dup2(conn.fileno(), 2)
    conn.close()


class StderrRelay:
    """Copies the ranks' stderr pipes to this process's stderr; keeps each one's tail."""

    def __init__(self, conns: Dict[int, Any]):
        self._fds = {conn.fileno(): rank for rank, conn in conns.items()}
        self._conns = conns  # kept open as long as the relay reads them
        self._tails: Dict[int, bytes] = {rank: b"" for rank in conns}
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="graphtrainer-stderr-relay", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            with self._lock:
                fds = list(self._fds)
            if not fds:
                return
            ready, _, _ = select.select(fds, [], [], 0.5)
            for fd in ready:
                self._read(fd)

    def _read(self, fd: int) -> None:
        with self._lock:
            if fd not in self._fds:
                return
            try:
                data = os.read(fd, 65536)
            except OSError:
                data = b""
            rank = self._fds[fd]
            if not data:
                del self._fds[fd]
                return
            self._tails[rank] = (self._tails[rank] + data)[-TAIL_BYTES:]
        try:
            os.write(2, data)
        except OSError:
            pass

    def tail(self, rank: int) -> str:
        """The last lines rank ``rank`` wrote to stderr (after reading what is left in its pipe)."""
        fd = next((f for f, r in list(self._fds.items()) if r == rank), None)
        while fd is not None and fd in self._fds and select.select([fd], [], [], 0)[0]:
            self._read(fd)
        with self._lock:
            lines = self._tails.get(rank, b"").decode(errors="replace").splitlines()
        dump = _dump_start(lines)
        stacks = [line for line in lines[dump:] if not line.startswith("Extension modules:")]
        return "\n".join(lines[max(0, dump - TAIL_LINES):dump] + stacks)

    def close(self, wait_s: float = 2.0) -> None:
        """Wait up to ``wait_s`` for every rank's pipe to end (its processes gone), then stop."""
        self._thread.join(wait_s)
        with self._lock:
            self._fds.clear()
        self._thread.join(1.0)
        for conn in self._conns.values():
            conn.close()


#: Words of a line that says why a process aborted (C++ exceptions, failed checks).
_REASON_MARKS = ("what():", "error", "fail", "abort", "exception", "assert", "fatal")
#: LIBXSMM's report at exit (DGL loads it): its command line may hold any of those words.
_EXIT_REPORTS = ("LIBXSMM_", "Registry and code:", "Command:", "Uptime:")


def last_words(tail: str) -> Optional[str]:
    """The line of ``tail`` most likely to say why a process aborted: the last one before
    Python's own fatal-error dump (faulthandler's stacks) that names an error, skipping
    reports printed at exit (LIBXSMM's "Command: ... Uptime: ..."); else the last line."""
    lines: List[str] = [line.strip() for line in tail.splitlines()
                        if line.strip() and not line.startswith(_EXIT_REPORTS)]
    lines = lines[:_dump_start(lines)] or lines
    reasons = [line for line in lines if any(mark in line.lower() for mark in _REASON_MARKS)]
    return (reasons or lines or [None])[-1]


def _dump_start(lines: List[str]) -> int:
    """Where faulthandler's fatal-error dump starts in ``lines`` (their length if nowhere)."""
    return next((i for i, line in enumerate(lines) if line.startswith("Fatal Python error:")), len(lines))
