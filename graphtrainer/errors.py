"""The error a failed rank, graph server or machine surfaces as in the launching process."""
from __future__ import annotations

from typing import Any, List, Optional


class RankFailedError(RuntimeError):
    """A rank raised, or died. ``rank``, ``error_type``, ``message`` and ``remote_traceback`` say how.

    On a run over several machines ``machine`` names the machine (its rank and address);
    a failed graph server (see :mod:`graphtrainer.distdgl.servers`) has ``rank`` -1 and
    ``process`` naming it.
    """

    def __init__(self, rank: int, error_type: str, message: str, remote_traceback: str = "",
                 ranks: Optional[List[int]] = None, machine: Optional[str] = None,
                 process: Optional[str] = None):
        self.rank = rank
        #: Every rank blamed (a hang can stop several); ``rank`` is the first of them.
        self.ranks = ranks if ranks is not None else [rank]
        self.error_type = error_type
        self.message = message
        self.remote_traceback = remote_traceback
        self.machine = machine
        #: True when another machine's launcher reported it (this machine's ranks were stopped).
        self.elsewhere = False
        #: What failed, in words: "rank 3 on machine 1 (10.0.0.2)", "graph server 0 ...".
        self.process = process or f"rank {rank}" + (f" on machine {machine}" if machine else "")
        text = f"{self.process} failed: {error_type}: {message}"
        if remote_traceback:
            text += f"\n\n--- traceback from {self.process} ---\n{remote_traceback.rstrip()}"
        super().__init__(text)

    def __reduce__(self) -> Any:
        return (_rebuild_failure, (self.rank, self.error_type, self.message, self.remote_traceback, self.ranks,
                                   self.machine, self.process))


def _rebuild_failure(*args: Any) -> "RankFailedError":
    return RankFailedError(*args)


class LaunchEnvironmentError(SystemExit):
    """The variables by which torchrun or Slurm make a process one rank of a job are set only in
    part (``RANK`` without ``MASTER_ADDR``, say) or hold values no launcher sets. A
    ``SystemExit``, as the fix is outside the script: uncaught, the process prints
    ``error: <message>`` alone, no traceback, and ends with status 1. ``message`` names what is
    wrong and the fix."""

    def __init__(self, message: str):
        super().__init__(f"error: {message}")  # what Python prints for an uncaught SystemExit
        self.message = message

    def __str__(self) -> str:
        return self.message


#: Exit status of a process whose fit was preempted (BSD's EX_TEMPFAIL, "try again"): requeue
#: the job and resume with ``fit(task, ckpt_path="last")``.
PREEMPTED_EXIT_CODE = 75


class Preempted(SystemExit):
    """A fit stopped by a signal (SIGTERM, SIGUSR1) at a batch boundary, its state written to
    ``checkpoint`` (see :mod:`graphtrainer.loop.preemption`), or before any rank existed (nothing
    trained: ``checkpoint`` and ``result`` are None). A ``SystemExit``: uncaught, the
    process ends with status :data:`PREEMPTED_EXIT_CODE`. ``result``: what the run reached
    (a ``RunResult``, for the ``Trainer`` that launched the ranks to take in)."""

    def __init__(self, message: str, checkpoint: Optional[str] = None, result: Any = None):
        super().__init__(PREEMPTED_EXIT_CODE)
        self.message, self.checkpoint, self.result = message, checkpoint, result

    def __str__(self) -> str:
        return self.message
