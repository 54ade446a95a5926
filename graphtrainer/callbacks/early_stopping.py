"""``EarlyStopping``: stop when a reduced metric stops improving, on every rank at once."""
from __future__ import annotations

import math
from typing import Any, Dict, Optional

from .. import comm as gdist
from ..state import RunView
from ..task import GraphTask
from .base import Callback, acts_at_epoch_end, acts_mid_epoch, monitored_now


class EarlyStopping(Callback):
    """Stop after ``patience`` checks without an improvement larger than ``min_delta``.

    With ``check_finite`` a non-finite value stops training at once. Rank 0 decides and
    broadcasts. A ``monitor`` never logged raises a ``KeyError`` as in
    :class:`~graphtrainer.callbacks.ModelCheckpoint` (old metric names too). When it checks follows
    Lightning's ``check_on_train_epoch_end`` (as ``ModelCheckpoint``'s ``save_on_train_epoch_end``):
    by default after each validation when ``val_check_interval`` validates mid-epoch, else at
    epoch ends. A stop decided after a mid-epoch validation ends that epoch there on every rank
    (once ``min_epochs`` are done), as ``max_steps`` does: the epoch's end still runs, without
    validating again at that step; each validation is one check (the epoch's end after such a stop is none).
    """

    after_reduction = True

    def __init__(self, monitor: str, mode: str = "min", patience: int = 3, min_delta: float = 0.0,
                 check_finite: bool = True, verbose: bool = True, check_on_train_epoch_end: Optional[bool] = None):
        if mode not in ("min", "max"):
            raise ValueError(f"mode={mode!r}: use 'min' or 'max'")
        if patience < 0:
            raise ValueError("patience must be >= 0")
        self.monitor, self.mode, self.patience = monitor, mode, patience
        self.min_delta, self.check_finite, self.verbose = abs(min_delta), check_finite, verbose
        self.check_on_train_epoch_end = check_on_train_epoch_end
        self.reset()

    def reset(self) -> None:
        self.wait_count = 0
        self.best_score: Optional[float] = None
        self.stopped_epoch: Optional[int] = None
        self.stop_reason: Optional[str] = None
        # The fit's own record, never in state_dict: the validation (its global step) last judged.
        self._judged_validation: Optional[int] = None

    @property
    def state_key(self) -> str:
        return f"EarlyStopping{{monitor={self.monitor},mode={self.mode}}}"

    def state_dict(self) -> Dict[str, Any]:
        return {"wait_count": self.wait_count, "best_score": self.best_score,
                "stopped_epoch": self.stopped_epoch, "stop_reason": self.stop_reason}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.wait_count = state.get("wait_count", 0)
        self.best_score = state.get("best_score")
        self.stopped_epoch = state.get("stopped_epoch")
        self.stop_reason = state.get("stop_reason")

    def on_train_epoch_end(self, trainer: RunView, task: GraphTask) -> None:
        if not acts_at_epoch_end(trainer, self.check_on_train_epoch_end):
            return
        after_validations = acts_mid_epoch(trainer, self.check_on_train_epoch_end)
        if after_validations and trainer.state.last_validation_step == self._judged_validation:
            return  # no validation since the last check (the epoch ended where a mid-epoch one ran)
        self._check(trainer)

    def on_mid_epoch_validation_end(self, trainer: RunView, task: GraphTask) -> None:
        if acts_mid_epoch(trainer, self.check_on_train_epoch_end):
            self._check(trainer)

    def _check(self, trainer: RunView) -> None:
        metrics = trainer.callback_metrics
        monitored = monitored_now(trainer, self.monitor, "EarlyStopping")
        if monitored is None:
            return  # not measured this epoch: not a check
        self._judged_validation = trainer.state.last_validation_step
        decision = gdist.broadcast_object(self._decide(metrics[monitored], trainer.current_epoch)
                                          if trainer.rank == 0 else None)
        self.load_state_dict(decision)
        if decision["stop_reason"] and decision["stopped_epoch"] == trainer.current_epoch:
            trainer.should_stop = True
            trainer.state.stop_agreed = True  # the same on every rank: may end an epoch mid-way
            if self.verbose and trainer.rank == 0:
                print(f"[graphtrainer] early stopping at epoch {trainer.current_epoch}: {decision['stop_reason']}",
                      flush=True)

    def _decide(self, value: float, epoch: int) -> Dict[str, Any]:
        state = self.state_dict()
        if self.check_finite and not math.isfinite(value):
            state.update(stopped_epoch=epoch, stop_reason=f"{self.monitor} = {value} is not finite")
            return state
        best = state["best_score"]
        improved = best is None or (value < best - self.min_delta if self.mode == "min"
                                    else value > best + self.min_delta)
        if improved:
            state.update(best_score=value, wait_count=0)
        else:
            state["wait_count"] += 1
            if state["wait_count"] >= max(1, self.patience):
                state.update(stopped_epoch=epoch, stop_reason=(
                    f"{self.monitor} did not improve by more than {self.min_delta} for "
                    f"{state['wait_count']} checks (best {best:.6g})"))
        return state
