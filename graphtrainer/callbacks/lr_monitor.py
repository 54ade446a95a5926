"""``LearningRateMonitor``: the learning rate of every param group, logged each epoch or step."""
from __future__ import annotations

from typing import Any, Dict

from ..state import RunView
from ..task import GraphTask
from .base import Callback


class LearningRateMonitor(Callback):
    """Logs ``lr-<Optimizer>[-<i>]/pg<j>`` for each optimizer ``i`` and param group ``j``:
    ``logging_interval="epoch"`` as an epoch metric, ``"step"`` as a step row on rank 0."""

    def __init__(self, logging_interval: str = "epoch"):
        if logging_interval not in ("epoch", "step"):
            raise ValueError("logging_interval must be 'epoch' or 'step'")
        self.logging_interval = logging_interval

    def _rates(self, trainer: RunView) -> Dict[str, float]:
        out: Dict[str, float] = {}
        many = len(trainer.optimizers) > 1
        for i, opt in enumerate(trainer.optimizers):
            name = f"lr-{type(opt).__name__}" + (f"-{i}" if many else "")
            for j, group in enumerate(opt.param_groups):
                out[f"{name}/pg{j}" if len(opt.param_groups) > 1 else name] = float(group["lr"])
        return out

    def on_train_epoch_start(self, trainer: RunView, task: GraphTask) -> None:
        if self.logging_interval == "epoch":
            for name, lr in self._rates(trainer).items():
                task.log(name, lr, batch_size=1)

    def on_train_batch_end(self, trainer: RunView, task: GraphTask, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.logging_interval == "step" and trainer.logger is not None:
            trainer.logger.log_metrics({**self._rates(trainer), "step": trainer.global_step}, trainer.global_step)
