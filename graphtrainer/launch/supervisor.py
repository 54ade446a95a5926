"""Watching launched ranks until rank 0's result arrives or one fails.

The parent waits on every child's result pipe and process sentinel together, so a rank
that dies without a word (SIGKILL, a C++ abort) is noticed at once. On the first failure
the others are ended (SIGTERM, then SIGKILL) and one :class:`RankFailedError` names the
failing rank with its traceback, or its stack when it made no progress (:mod:`graphtrainer.heartbeat`).
"""
from __future__ import annotations

import contextlib
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
from ..errors import Preempted, RankFailedError
from . import leftovers, rank_stderr
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
#: After a hang is named, seconds the ranks get to exit on SIGINT before they are killed: a rank
#: blocked in a collective (C++) never runs Python's handler, and a hung one needs no longer.
HUNG_GRACE_S = 0.5
#: How often the watch reads the progress board while a hang timeout applies.
HANG_POLL_S = 0.25


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

    def watch_ranks(self, procs: Sequence[Any]) -> None:
        """The ranks that depend on it, given when the watch starts: their deaths may show the
        service's before the kernel reports it (see ``GraphServer.failure``)."""


class Watch:
    """The launcher's view of its ranks until rank 0's result arrives or one fails."""

    def __init__(self, procs: List[Any], conns: Dict[int, Any], method: str, board: Any,
                 hang_timeout: Optional[float], stack_dir: str, placement: Optional[Placement] = None,
                 services: Sequence[WatchedService] = (), job: Optional[FailureChannel] = None):
        self.procs, self.method, self.board = procs, method, board
        self.placement, self.services = placement, list(services)
        for service in self.services:
            service.watch_ranks(procs)
        self.job = job  # over several machines: failures the other machines report, and ours for them
        self.hang_timeout, self.stack_dir = hang_timeout, Path(stack_dir)
        self.open_conns = dict(conns)
        self.results: Dict[int, Any] = {}
        self.failures: List[tuple] = []  # (time, RankFailedError)
        #: The ranks' stderr, passed through the launcher (its tails explain C++ aborts).
        self.relay: Optional[rank_stderr.StderrRelay] = None
        #: Seconds the ranks get to exit on SIGINT when the watch ends (shorter after a hang).
        self.end_grace_s = TERMINATE_GRACE_S
        #: Rank 0's checkpoint and result when the ranks stopped on a signal (``Preempted``).
        self.preempted: tuple = (None, None)

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
            poll = 0.2 if deadline else (HANG_POLL_S if self.hang_timeout is not None else 1.0)
            for ready in wait(waitables, timeout=poll):
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
            if cause.error_type == "Preempted":  # every rank stopped on a signal, as agreed
                raise Preempted(cause.message, *self.preempted)
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
        """How long to wait for other reports once a failure is in (longer over several machines,
        where the cause may be elsewhere and that machine will say so)."""
        if self.job is not None and not any(f[1].elsewhere for f in self.failures):
            return OTHER_MACHINE_SETTLE_S
        if all(f[1].error_type == "Hang" for f in self.failures):
            return 0.0  # the board named the cause; no rank will report more before it is ended
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
                tail = self.relay.tail(rank) if self.relay is not None else ""
                self.failures.append((time.monotonic(), _died(rank, proc.exitcode, self.method, tail)))

    def _receive(self, rank: int) -> None:
        try:
            kind, _, payload, stamp = pickle.loads(self.open_conns[rank].recv_bytes())
        except (EOFError, OSError):
            self.open_conns.pop(rank).close()
            return
        if kind == "ok":
            self.results[rank] = payload
        else:
            err_type, message, tb, kept = payload
            if kept is not None:  # a preempted rank 0: its checkpoint and what the run reached
                self.preempted = kept
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
        stopped = [r for r in running if leftovers.is_stopped(self.procs[r].pid)]
        stop_asked = leftovers.stop_forwarded() or any(p.stop_s is not None for p in places if p.rank in running)
        stuck = heartbeat.find_stuck(places, self.hang_timeout, max(self.hang_timeout, STARTUP_TIMEOUT_S),
                                     running, stopped, stop_asked)
        if stuck is None:
            return
        blamed = [p.rank for p in stuck]
        stacks = self._dump_stacks(blamed)
        others = [p.describe() for p in places if p.rank in running and p.rank not in blamed]
        lines = [p.describe() + (" (its process is stopped: SIGSTOP, Ctrl-Z or a debugger)" if p.rank in stopped
                                 else "") for p in stuck]
        message = hang_preamble(self.hang_timeout, stuck, stop_asked) + ": " + "; ".join(lines) + "." \
            + (f" Waiting for it: {'; '.join(others)}." if others else "")
        if any(p.place == "graph servers" for p in stuck):
            message += (" DGL's clients wait for the graph servers of every machine of ip_config, and each "
                        "server for every machine's ranks: is the script running on every machine, with the "
                        "same ip_config, and are the ports of ip_config open between the machines?")
        self.failures.append((time.monotonic(), RankFailedError(blamed[0], "Hang", message, stacks, blamed)))
        self.end_grace_s = HUNG_GRACE_S

    def _dump_stacks(self, ranks: List[int]) -> str:
        """Every blamed rank's Python stack (faulthandler), with each frame's source line."""
        stopped = {r for r in ranks if leftovers.is_stopped(self.procs[r].pid)}  # they cannot answer
        files = {r: self.stack_dir / f"rank{r}.stack" for r in ranks if r not in stopped}
        for rank in files:
            try:
                os.kill(self.procs[rank].pid, signal.SIGUSR2)
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
        parts = [f"rank {r}:\n(no stack: rank {r} is stopped (SIGSTOP, Ctrl-Z or a debugger), so it cannot "
                 "run at all)" for r in sorted(stopped)]
        for rank, path in files.items():
            text = path.read_text(errors="replace") if path.exists() else ""
            parts.append(f"rank {rank}:\n" + (_with_source(text) or "(no stack: the rank did not answer SIGUSR2)"))
        return "\n\n".join(parts)


def hang_preamble(hang_timeout: float, stuck: List[heartbeat.RankPlace], stop_asked: bool) -> str:
    """How a hang message starts: the timeout that applied, and why when a stop shortened it."""
    if not stop_asked or all(p.idle_s >= hang_timeout for p in stuck):
        return f"no progress for {hang_timeout:g} s (Trainer(hang_timeout=...))"
    shortest = min(heartbeat.timeout_after_stop(p, hang_timeout) for p in stuck)
    return (f"no progress for {shortest:g} s after a stop signal (SIGTERM/SIGUSR1), which waits for a batch "
            "boundary that a rank without progress never reaches")


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
    """Which failure caused the others: a rank that died silently (its peers' errors arrive
    first), then a real exception, then lost-connection errors; earliest first within each."""
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


def _died(rank: int, exitcode: int, method: str, stderr_tail: str = "") -> RankFailedError:
    if exitcode < 0:
        how = f"killed by signal {signal.Signals(-exitcode).name}"
        if exitcode == -signal.SIGTERM and leftovers.stop_forwarded():
            how += f", which this launching process (pid {os.getpid()}) received and passed on: stopped from outside"
    else:
        how = f"exited with code {exitcode} before reporting a result"
    if exitcode in (-signal.SIGKILL, -signal.SIGTERM, -signal.SIGINT):
        stderr_tail = ""  # ended from outside: what it wrote last is no reason
    last = rank_stderr.last_words(stderr_tail)
    if last:
        how += f" (its last line on stderr: {last})"
    hint = ""
    if method in ("spawn", "forkserver") and exitcode > 0:
        hint = (f" With launcher='{method}' a rank that dies at start often could not import the "
                "script: check that it guards its entry point with `if __name__ == \"__main__\":`"
                " and that the task's class is importable.")
    tail = f"the last lines rank {rank} wrote to stderr:\n{stderr_tail}" if stderr_tail else ""
    return RankFailedError(rank, "ProcessDied", how + "." + hint, tail)


def end_all(procs: List[Any], wait_s: float, grace_s: float = TERMINATE_GRACE_S) -> None:
    """Give children ``wait_s`` to exit, SIGINT the rest for ``grace_s``, kill, then reap all."""
    _join_all(procs, wait_s)
    for proc in procs:
        if proc.exitcode is None:
            # SIGINT, not SIGTERM: in a fit, SIGTERM asks a rank to stop at its next batch (preemption).
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGINT)
            leftovers.resume(proc.pid)  # a stopped rank would hold the signal pending until killed
    _join_all(procs, grace_s)
    for proc in procs:
        if proc.exitcode is None:
            proc.kill()
            proc.join(timeout=5.0)


def _join_all(procs: List[Any], seconds: float) -> None:
    """Wait up to ``seconds`` in all for every process to exit."""
    deadline = time.monotonic() + seconds
    for proc in procs:
        proc.join(timeout=max(0.0, deadline - time.monotonic()))
