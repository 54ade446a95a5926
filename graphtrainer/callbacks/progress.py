"""Progress bar on rank 0: epoch and step counts, loss, ``prog_bar`` metrics, steps/s."""
from __future__ import annotations

import sys
import time
from typing import Any, Dict, Optional

from ..state import RunView
from ..task import GraphTask
from .base import Callback


class ProgressBar(Callback):
    """A tqdm bar per training epoch on rank 0; silent on other ranks and when not a TTY.

    ``refresh_rate``: steps between updates (reading a value from the GPU syncs the host).
    ``force``: draw even when stderr is not a terminal.
    """

    logs_metrics = False

    def __init__(self, refresh_rate: int = 10, force: bool = False):
        self.refresh_rate = max(1, int(refresh_rate))
        self.force = force
        self._bar: Any = None
        self._start = 0.0
        self._steps = 0

    def _enabled(self, trainer: RunView) -> bool:
        return trainer.rank == 0 and (self.force or sys.stderr.isatty())

    def on_train_epoch_start(self, trainer: RunView, task: GraphTask) -> None:
        if not self._enabled(trainer):
            return
        from tqdm.auto import tqdm

        total = trainer.num_training_batches
        self._bar = tqdm(total=total, desc=f"epoch {trainer.current_epoch}", leave=True,
                         dynamic_ncols=True, file=sys.stderr)
        self._start, self._steps = time.perf_counter(), 0

    def on_train_batch_end(self, trainer: RunView, task: GraphTask, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self._bar is None:
            return
        self._steps += 1
        if self._steps % self.refresh_rate == 0:
            self._bar.update(self.refresh_rate)
            self._bar.set_postfix(self._postfix(trainer, task), refresh=False)

    def on_train_epoch_end(self, trainer: RunView, task: GraphTask) -> None:
        if self._bar is None:
            return
        self._bar.update(self._steps % self.refresh_rate)
        self._bar.set_postfix(self._postfix(trainer, task, epoch_end=True))
        self._bar.close()
        self._bar = None

    def _postfix(self, trainer: RunView, task: GraphTask, epoch_end: bool = False) -> Dict[str, str]:
        elapsed = max(time.perf_counter() - self._start, 1e-9)
        shown: Dict[str, str] = {"step": str(trainer.global_step), "it/s": f"{self._steps / elapsed:.1f}"}
        loss: Optional[Any] = trainer.last_loss
        if loss is not None:
            shown["loss"] = f"{float(loss):.4f}"
        for name in sorted(task.step_log.metrics.prog_bar):
            value = task.step_log.metrics.last.get(name)
            if value is not None:
                shown[name] = f"{float(value):.4f}"
        if epoch_end:
            for name, value in trainer.callback_metrics.items():
                if name in task.step_log.metrics.prog_bar:
                    shown[name] = f"{value:.4f}"
        return shown
