"""The launcher seam: how one stage's ranks come to run.

``Trainer`` picks one :class:`Launcher` per call and hands it the rank entry point (the
runtime's ``run_rank``) with its arguments: ranks started here
(:class:`~graphtrainer.launch.local.LocalLauncher`, or :class:`InProcess` for one rank),
ranks that already exist (:class:`~graphtrainer.launch.environment.ExistingRanks`,
torchrun or Slurm), or one machine of a DistDGL run
(:class:`~graphtrainer.distdgl.launcher.DistDGLLauncher`).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Callable, Sequence

from ..comm import RankInfo
from . import leftovers, stop_flag

#: A rank's entry point: ``target(RankInfo, *args)``, returning what the rank hands back.
RankTarget = Callable[..., Any]


class Launcher(ABC):
    """Runs ``target(RankInfo, *args)`` on every rank of this process's share of the job
    and returns rank 0's result (this machine's first rank's, over several machines)."""

    #: Whether the launching process makes a ``fit``'s run folder before ranks start (else
    #: rank 0 makes it and tells the others).
    makes_run_dir: bool = True
    #: Whether the ranks learn the run folder from rank 0 (a collective in each rank) rather
    #: than from the launching process.
    run_dir_from_rank0: bool = False
    #: Whether the ranks run in other processes, whose result the caller must take in.
    in_other_processes: bool = True

    @abstractmethod
    def run(self, target: RankTarget, args: Sequence[Any]) -> Any:
        """Run the ranks; return rank 0's result, or raise the first rank's failure."""


class InProcess(Launcher):
    """One rank, in this process: nothing is started. In a fit, a stop signal from the rank's start on
    is kept for the fit (which stops at its first batch boundary and checkpoints), as a launched rank
    keeps it (:mod:`graphtrainer.launch.stop_flag`); before, it raises ``Preempted`` at once
    (:func:`graphtrainer.launch.leftovers.preempts_before_ranks`)."""

    in_other_processes = False

    def run(self, target: RankTarget, args: Sequence[Any]) -> Any:
        if not leftovers.awaiting_ranks():
            return target(RankInfo(), *args)
        with stop_flag.routed(keep=True):  # (the fit's own handlers first, then the rank is here)
            leftovers.rank_runs_here()
            return target(RankInfo(), *args)
