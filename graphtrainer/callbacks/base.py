"""``Callback``: framework-side behaviour that hooks into the loops without touching the task."""
from __future__ import annotations

from typing import Any, Dict

from ..state import RunView
from ..task import GraphTask


class Callback:
    """Same hook names as :class:`~graphtrainer.GraphTask`, each taking ``(trainer, task, ...)``.

    Runs on every rank. A callback's hook runs before the task's hook of the same name,
    except for callbacks with ``after_reduction = True``: their ``on_train_epoch_end``
    runs after the task's and after that epoch's metrics are reduced, so they see its
    final ``trainer.callback_metrics``. In each rank ``trainer`` is that rank's view of the
    run (:class:`~graphtrainer.state.RunView`: the Trainer's properties, ``trainer.state``,
    ``trainer.config``, ``trainer.save_checkpoint``). State returned by :meth:`state_dict` is saved in
    checkpoints under :attr:`state_key` and restored with :meth:`load_state_dict`.
    """

    #: True for callbacks whose ``on_train_epoch_end`` acts on the epoch's reduced metrics
    #: (checkpointing, early stopping, printing them): it then runs after the task's.
    after_reduction: bool = False
    #: False for a callback whose ``on_train_epoch_end`` never calls ``task.log``: when no
    #: hook that runs before the reduction may log, the epoch's metrics are reduced once.
    logs_metrics: bool = True

    @property
    def state_key(self) -> str:
        """Key of this callback's state in a checkpoint; unique per configuration."""
        return type(self).__name__

    def state_dict(self) -> Dict[str, Any]:
        return {}

    def load_state_dict(self, state: Dict[str, Any]) -> None: ...

    def reset(self) -> None:
        """Forget what an earlier run left (best scores, counters): each ``fit`` is a run of
        its own. Called at the start of every ``fit``, in the process that calls it."""

    def setup(self, trainer: RunView, task: GraphTask, stage: str) -> None: ...
    def teardown(self, trainer: RunView, task: GraphTask, stage: str) -> None: ...
    def on_fit_start(self, trainer: RunView, task: GraphTask) -> None: ...
    def on_fit_end(self, trainer: RunView, task: GraphTask) -> None: ...
    def on_train_epoch_start(self, trainer: RunView, task: GraphTask) -> None: ...
    def on_train_epoch_end(self, trainer: RunView, task: GraphTask) -> None: ...
    def on_train_batch_end(self, trainer: RunView, task: GraphTask, outputs: Any, batch: Any, batch_idx: int) -> None: ...
    def on_validation_epoch_start(self, trainer: RunView, task: GraphTask) -> None: ...
    def on_validation_epoch_end(self, trainer: RunView, task: GraphTask) -> None: ...
    def on_test_epoch_start(self, trainer: RunView, task: GraphTask) -> None: ...
    def on_test_epoch_end(self, trainer: RunView, task: GraphTask) -> None: ...
    def on_predict_epoch_start(self, trainer: RunView, task: GraphTask) -> None: ...
    def on_predict_epoch_end(self, trainer: RunView, task: GraphTask) -> None: ...
    def on_save_checkpoint(self, trainer: RunView, task: GraphTask, checkpoint: Dict[str, Any]) -> None: ...
    def on_load_checkpoint(self, trainer: RunView, task: GraphTask, checkpoint: Dict[str, Any]) -> None: ...
    def on_exception(self, trainer: RunView, task: GraphTask, error: BaseException) -> None: ...
