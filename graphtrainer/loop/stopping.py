"""When a fit stops: every reason in one place, and the ranks' agreement on it.

Reasons: ``max_epochs``, ``max_steps``, ``max_time``, ``min_epochs`` (which keeps a run going),
``trainer.should_stop`` set by a callback (``EarlyStopping``) or the task, and a stop signal
(SIGTERM, SIGUSR1: preemption, see :mod:`graphtrainer.loop.preemption`).

:class:`StopController` answers two questions, and holds the agreement between ranks:

- at a step boundary, :meth:`~StopController.at_step`: go on, end the epoch here
  (``max_steps``), or stop for a signal here (the ranks agree on signals every few steps
  without waiting: :class:`~graphtrainer.loop.preemption.StopAgreement`; never inside
  ``Join``, where only DDP's own collectives may run);
- at an epoch's end, :meth:`~StopController.at_epoch_end`: one all-reduce of a fixed-size
  header settles whether every rank stops, whether for a signal, the next epoch's batch
  counts (equal on all ranks, or ``Join``) and how often the ranks exchange signals next
  epoch.
"""
from __future__ import annotations

import enum
import time
from typing import List, Optional, Tuple

import torch

from .. import comm as gdist
from ..state import RunState, TrainerConfig
from . import preemption

#: Stands for a batch count a loader cannot tell (no exact ``len``): never equal to a real one.
_UNKNOWN = float(2**52)


class AtStep(enum.Enum):
    GO_ON = 0
    END_EPOCH = 1  # max_steps reached or a stop agreed mid-epoch: the epoch ends as usual, then the fit
    PREEMPTED = 2  # the ranks agreed to stop for a signal after this batch


class StopController:
    """Whether a fit goes on. Its answers are the same on every rank."""

    def __init__(self, config: TrainerConfig, state: RunState) -> None:
        self.config, self.state = config, state
        self.started = time.monotonic()
        self.signals = preemption.StopAgreement()
        #: This epoch in ``Join`` (its ranks' batch counts differ or are unknown).
        self.joining = False
        #: The agreed stop was for a signal: the fit writes ``last.ckpt`` and raises ``Preempted``.
        self.preempted = False
        #: A stop agreed before ``min_epochs``: kept, and honoured once ``min_epochs`` is reached (as Lightning).
        self._stop_requested = False
        #: (fewest, most) training batches of the next epoch over the ranks, once agreed.
        self._next_counts: Optional[Tuple[float, float]] = None

    def done(self) -> bool:
        """Whether no further epoch runs (``max_epochs`` or ``max_steps`` reached, or an agreed
        stop): checked before each epoch, so a resumed run that reached a limit trains nothing."""
        return bool(self.reached()) or self.state.should_stop

    def reached(self) -> str:
        """The limit the run has reached, in words ("" when none)."""
        state, config = self.state, self.config
        if -1 < config.max_steps <= state.global_step:
            return f"max_steps={config.max_steps} (step {state.global_step})"
        if state.current_epoch >= config.max_epochs:
            return f"max_epochs={config.max_epochs} (epoch {state.current_epoch} is next)"
        return ""

    def start_epoch(self, batches: Optional[int]) -> Optional[int]:
        """This epoch's batch counts over the ranks (``batches``: this rank's, None when the
        loader cannot tell); returns the fewest (None when a rank cannot tell). Agreed at the previous
        epoch's end, or here
        in the first epoch of a fit (one all-reduce). Must be called on all processes."""
        counts, self._next_counts = self._next_counts, None
        if counts is None:  # the same on every rank: the fit's first epoch
            counts = _fewest_most(gdist.all_reduce(torch.tensor(_header([], batches), dtype=torch.float64), "max"), 0)
        fewest, most = counts
        if most == 0:  # agreed, so every rank raises
            raise ValueError(f"no rank has a training batch in epoch {self.state.current_epoch} (the training "
                             f"loader's len() is 0 on every rank; limit_train_batches="
                             f"{self.config.limit_train_batches}): give every rank at least one batch (more ids, "
                             "a smaller batch_size, drop_last=False or fewer ranks)")
        self.joining = gdist.is_distributed() and (fewest != most or most == _UNKNOWN)
        self.signals.start_epoch()
        return None if fewest == _UNKNOWN else int(fewest)

    def at_step(self, stepped: bool, validated: bool = False) -> AtStep:
        """After a training batch (``stepped``: the optimizer stepped; ``validated``: a mid-epoch
        validation followed it). Must be called on all processes, at the same batches."""
        if -1 < self.config.max_steps <= self.state.global_step:
            return AtStep.END_EPOCH
        # An agreed stop (EarlyStopping's broadcast) ends the epoch once min_epochs are done.
        if validated and self.state.stop_agreed and self.state.current_epoch >= self.config.min_epochs:
            return AtStep.END_EPOCH
        if stepped and not self.joining and self.signals.at_boundary():
            return AtStep.PREEMPTED
        return AtStep.GO_ON

    def end_steps(self) -> None:
        """The batch loop ended: wait for the signal exchange still running (a signal it saw is
        still set, so the epoch's end sees it too). Must be called on all processes."""
        self.signals.collect()

    def at_epoch_end(self, next_batches: Optional[int]) -> None:
        """Agree on stopping after this epoch (``state.current_epoch`` already counts it), and
        on the next epoch's batch counts (``next_batches``: this rank's). Sets
        ``state.should_stop`` and :attr:`preempted` the same on every rank. One all-reduce.
        Must be called on all processes."""
        state, config = self.state, self.config
        max_steps_reached = -1 < config.max_steps <= state.global_step
        if max_steps_reached:
            state.should_stop = True
        if config.max_time is not None and time.monotonic() - self.started >= config.max_time:
            state.should_stop = True
        mine = [1.0 if state.should_stop else 0.0, *preemption.signal_flag(), -self.signals.proposal()]
        agreed = gdist.all_reduce(torch.tensor(_header(mine, next_batches), dtype=torch.float64), "max")
        self._stop_requested = self._stop_requested or bool(agreed[0] > 0)
        state.should_stop = self._stop_requested
        self.preempted = preemption.decode_signal(agreed[1:3])
        self.signals.agree_interval(-float(agreed[3]))
        self._next_counts = _fewest_most(agreed, 4)
        if state.current_epoch < config.min_epochs and not max_steps_reached:
            state.should_stop = False


def _count(batches: Optional[int]) -> float:
    return _UNKNOWN if batches is None else float(batches)


def _header(values: List[float], batches: Optional[int]) -> List[float]:
    """``values`` then ``(n, -n)``: under a max-reduce, the most and (negated) the fewest."""
    n = _count(batches)
    return [*values, n, -n if batches is not None else _UNKNOWN]


def _fewest_most(agreed: torch.Tensor, at: int) -> Tuple[float, float]:
    most, neg_fewest = float(agreed[at]), float(agreed[at + 1])
    return (_UNKNOWN if neg_fewest == _UNKNOWN else -neg_fewest), most
