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


