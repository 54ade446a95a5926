"""Watching launched ranks until rank 0's result arrives or one fails.

The parent never blocks on a queue alone: it waits on every child's result pipe and
process sentinel together, so a rank that dies without a word (SIGKILL, a C++ abort)
is noticed at once. On the first failure the other ranks are ended (SIGTERM, then
SIGKILL) and one :class:`RankFailedError` names the failing rank and carries its
traceback; a rank that makes no progress (see :mod:`graphtrainer.heartbeat`) is named
with its stack.
"""
from __future__ import annotations

import linecache
import os
import pickle
import re
import signal
import time
from multiprocessing.connection import wait
from pathlib import Path
from typing import Any, Dict, List, Optional, Protocol, Sequence

from .. import heartbeat
from ..errors import RankFailedError
from .placement import Placement

#: Seconds a rank gets to exit after SIGTERM before it is killed.
TERMINATE_GRACE_S = 3.0
#: After the first failure, seconds to wait for other reports before naming the cause.
FAILURE_SETTLE_S = 1.0
#: Over several machines, how long a failure waits for another machine's report of its cause.
OTHER_MACHINE_SETTLE_S = 4.0
#: Ranks finish together (the run ends with a barrier): once one has reported its result,
#: a rank still silent after this many seconds is hung and is ended.
FINISH_SKEW_S = 60.0
#: A rank that has not reported progress yet (still importing, unpickling) gets at least this long.
STARTUP_TIMEOUT_S = 120.0
#: Seconds to wait for a stuck rank's stack dump.
STACK_DUMP_WAIT_S = 3.0


class FailureChannel(Protocol):
    """How launchers on several machines tell each other of a failure (see
    :class:`graphtrainer.distdgl.job_failures.JobFailures`)."""

    def report(self, rank: int, machine: Optional[str], error_type: str, message: str) -> None: ...

    def reported(self) -> Optional[dict]: ...

    def close(self) -> None: ...


class WatchedService:
    """A helper process the ranks depend on (a graph server): its death ends the run."""

    def failure(self) -> Optional[RankFailedError]:
        """The error to raise when the process has failed, else None."""
        raise NotImplementedError



class Watch:
    """The launcher's view of its ranks until rank 0's result arrives or one fails."""

    def __init__(self, procs: List[Any], conns: Dict[int, Any], method: str, board: Any,
                 hang_timeout: Optional[float], stack_dir: str, placement: Optional[Placement] = None,
                 services: Sequence[WatchedService] = (), job: Optional[FailureChannel] = None):
        self.procs, self.method, self.board = procs, method, board
        self.placement, self.services = placement, list(services)
        self.job = job  # over several machines: failures the other machines report, and ours for them
        self.hang_timeout, self.stack_dir = hang_timeout, Path(stack_dir)
        self.open_conns = dict(conns)
        self.results: Dict[int, Any] = {}
        self.failures: List[tuple] = []  # (time, RankFailedError)

    def run(self) -> Any:
        try:
            return self._run()
        finally:
            if self.job is not None:
                self.job.close()

    def _run(self) -> Any:
        deadline = None  # once a rank fails, peers get a moment to report, then we pick the cause
        first_done: Optional[float] = None
        procs = self.procs
        while len(self.results) < len(procs):
            if deadline is not None and time.monotonic() >= deadline:
                break
            if self.results and first_done is None:
                first_done = time.monotonic()
            if first_done is not None and not self.failures and time.monotonic() - first_done > FINISH_SKEW_S:
                self._finish_skew()
                break
            waitables = list(self.open_conns.values()) + [p.sentinel for r, p in enumerate(procs)
                                                          if r not in self.results and p.exitcode is None]
            if not waitables:
                if deadline is None or self.job is None:
                    break
                time.sleep(0.1)  # nothing left here to wait on; another machine may still say why
            if self._check_other_machines() and deadline is not None:
                deadline = min(deadline, time.monotonic() + FAILURE_SETTLE_S)  # the cause is known
            for ready in wait(waitables, timeout=0.2 if deadline else 1.0):
                rank = next((r for r, c in self.open_conns.items() if c is ready), None)
                if rank is not None:
                    self._receive(rank)
            self._reap_dead()
            self._check_services()
            if not self.failures and self.hang_timeout is not None:
                self._check_hang()
            if self.failures and deadline is None:
                deadline = time.monotonic() + self._settle_s()
            self._report_cause()
        if self.failures:
            cause = self._placed(min(self.failures, key=_cause_order)[1])
            if self.job is not None and not cause.elsewhere:
                self.job.report(cause.rank, cause.machine, cause.error_type, cause.message)
            raise cause
        return self.results[0]

    def _report_cause(self) -> None:
        """Tell the other machines at once when a failure here is a cause (not a lost peer):
        their ranks may be stuck waiting on ours."""
        if self.job is None:
            return
        causes = [f for f in self.failures if _cause_order(f)[0] < 2 and not f[1].elsewhere]
        if causes:
            cause = self._placed(min(causes, key=_cause_order)[1])
            self.job.report(cause.rank, cause.machine, cause.error_type, cause.message)

    def _settle_s(self) -> float:
        """How long to wait for other reports once a failure is in: longer over several
        machines, where what failed here may follow from a failure elsewhere (a lost peer,
        a C++ abort in a collective) and that machine will say so."""
        if self.job is not None and not any(f[1].elsewhere for f in self.failures):
            return OTHER_MACHINE_SETTLE_S
        return FAILURE_SETTLE_S

    def _check_other_machines(self) -> bool:
        """True once another machine has reported a failure (added to ours)."""
        reported = self.job.reported() if self.job is not None else None
        if reported is None:
            return False
        if any(f[1].elsewhere for f in self.failures):
            return True
        err = RankFailedError(reported["rank"], reported["error_type"],
                              f"{reported['message']} (this machine's ranks were stopped)", machine=reported["machine"])
        err.elsewhere = True
        self.failures.append((time.monotonic(), err))
        return True

    def _check_services(self) -> None:
        for service in self.services:
            failure = service.failure()
            if failure is not None and all(f[1] is not failure for f in self.failures):
                self.failures.append((time.monotonic(), failure))
                self.services.remove(service)  # reported once

    def _placed(self, err: RankFailedError) -> RankFailedError:
        """``err`` with global rank numbers and the machine, on a job over several machines."""
        if self.placement is None or err.rank < 0 or err.elsewhere:
            return err
        offset = self.placement.first_rank  # (a hang's message counts this machine's ranks from 0)
        return RankFailedError(err.rank + offset, err.error_type, err.message, err.remote_traceback,
                               [r + offset for r in err.ranks], machine=self.placement.machine)

    def _failed(self, rank: int) -> bool:
        return any(f[1].rank == rank for f in self.failures)

    def _reap_dead(self) -> None:
        for rank, proc in enumerate(self.procs):
            if rank in self.results or proc.exitcode is None or self._failed(rank):
                continue
            # The process ended: read whatever it managed to send before concluding.
            while rank in self.open_conns and self.open_conns[rank].poll():
                self._receive(rank)
            if rank not in self.results and not self._failed(rank):
                self.failures.append((time.monotonic(), _died(rank, proc.exitcode, self.method)))

    def _receive(self, rank: int) -> None:
        try:
            kind, _, payload, stamp = pickle.loads(self.open_conns[rank].recv_bytes())
        except (EOFError, OSError):
            self.open_conns.pop(rank).close()
            return
        if kind == "ok":
            self.results[rank] = payload
        else:
            err_type, message, tb = payload
            self.failures.append((stamp, RankFailedError(rank, err_type, message, tb)))

    def _finish_skew(self) -> None:
        done = sorted(self.results)
        for rank in range(len(self.procs)):
            if rank not in self.results:
                self.failures.append((time.monotonic(), RankFailedError(
                    rank, "Hang", f"rank {rank} did not finish within {FINISH_SKEW_S:.0f} s after "
                    f"rank(s) {done} finished; it was stopped")))

    def _check_hang(self) -> None:
        assert self.hang_timeout is not None
        running = [r for r, p in enumerate(self.procs) if r not in self.results and p.exitcode is None]
        places = heartbeat.read_board(self.board, len(self.procs))
        stuck = heartbeat.find_stuck(places, self.hang_timeout, max(self.hang_timeout, STARTUP_TIMEOUT_S),
                                     running)
        if stuck is None:
            return
        blamed = [p.rank for p in stuck]
        stacks = self._dump_stacks(blamed)
        others = [p.describe() for p in places if p.rank in running and p.rank not in blamed]
        lines = [p.describe() for p in stuck]
        message = (f"no progress for {self.hang_timeout:g} s (Trainer(hang_timeout=...)): "
                   + "; ".join(lines) + "." + (f" Waiting for it: {'; '.join(others)}." if others else ""))
        if any(p.place == "graph servers" for p in stuck):
            message += (" DGL's clients wait for the graph servers of every machine of ip_config, and each "
                        "server for every machine's ranks: is the script running on every machine, with the "
                        "same ip_config, and are the ports of ip_config open between the machines?")
        self.failures.append((time.monotonic(), RankFailedError(blamed[0], "Hang", message, stacks, blamed)))

    def _dump_stacks(self, ranks: List[int]) -> str:
        """Every blamed rank's Python stack (faulthandler), with each frame's source line."""
        files = {r: self.stack_dir / f"rank{r}.stack" for r in ranks}
        for rank in ranks:
            try:
                os.kill(self.procs[rank].pid, signal.SIGUSR1)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + STACK_DUMP_WAIT_S
        sizes: Dict[int, int] = {}
        while time.monotonic() < deadline:
            now = {r: f.stat().st_size if f.exists() else 0 for r, f in files.items()}
            if all(now.values()) and now == sizes:
                break
            sizes = now
            time.sleep(0.1)
        parts = []
        for rank, path in files.items():
            text = path.read_text(errors="replace") if path.exists() else ""
            parts.append(f"rank {rank}:\n" + (_with_source(text) or "(no stack: the rank did not answer SIGUSR1)"))
        return "\n\n".join(parts)


_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>.+)$')


def _with_source(dump: str) -> str:
    """faulthandler's dump with the source text under each frame, as in a traceback."""
    out = []
    for line in dump.splitlines():
        out.append(line)
        match = _FRAME.match(line)
        if match:
            source = linecache.getline(match["file"], int(match["line"])).strip()
            if source:
                out.append(f"    {source}")
    return "\n".join(out)


def _cause_order(failure: tuple) -> tuple:
    """Which failure caused the others: a rank that died on its own (it cannot report, so
    its peers' connection errors arrive first), then a real exception, then peers' errors
    about the lost connection; earliest first within each."""
    stamp, err = failure
    if err.rank < 0 or err.elsewhere:  # a graph server or another machine: the
        kind = -1                                            # ranks' errors here follow from that
    elif err.error_type == "ProcessDied":
        kind = 0
    elif _is_peer_loss(err):
        kind = 2
    else:
        kind = 1
    return kind, stamp


def _is_peer_loss(err: RankFailedError) -> bool:
    text = f"{err.error_type} {err.message}".lower()
    return any(mark in text for mark in ("gloo", "nccl", "connection reset", "connection closed",
                                          "broken pipe", "distbackenderror", "timed out"))


def _died(rank: int, exitcode: int, method: str) -> RankFailedError:
    if exitcode < 0:
        how = f"killed by signal {signal.Signals(-exitcode).name}"
    else:
        how = f"exited with code {exitcode} before reporting a result"
    hint = ""
    if method in ("spawn", "forkserver") and exitcode > 0:
        hint = (f" With launcher='{method}' a rank that dies at start often could not import the "
                "script: check that it guards its entry point with `if __name__ == \"__main__\":`"
                " and that the task's class is importable.")
    return RankFailedError(rank, "ProcessDied", how + "." + hint)


def end_all(procs: List[Any], wait_s: float) -> None:
    """Give children ``wait_s`` to exit, terminate the rest, then reap all of them."""
    _join_all(procs, wait_s)
    for proc in procs:
        if proc.exitcode is None:
            proc.terminate()
    _join_all(procs, TERMINATE_GRACE_S)
    for proc in procs:
        if proc.exitcode is None:
            proc.kill()
            proc.join(timeout=5.0)


def _join_all(procs: List[Any], seconds: float) -> None:
    """Wait up to ``seconds`` in all for every process to exit."""
    deadline = time.monotonic() + seconds
    for proc in procs:
        proc.join(timeout=max(0.0, deadline - time.monotonic()))
