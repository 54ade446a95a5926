"""``Callback``: framework-side behaviour that hooks into the loops without touching the task."""
from __future__ import annotations

from typing import Any, Dict, Optional, Sequence

import torch

from .._moved import metric_key
from ..state import RunView
from ..task import GraphTask


def monitored_now(trainer: RunView, monitor: str, who: str) -> Optional[str]:
    """The metric name ``monitor`` reads when its value was produced this epoch (so a monitor
    acts on it), None when not (an epoch without validation: the value is an earlier one's, or
    none yet). Raises ``KeyError`` when it should exist by now (as Lightning)."""
    metrics = trainer.callback_metrics
    name = metric_key(monitor, metrics, f"{who}(monitor=...)")
    if name in trainer.state.epoch_metric_names:
        return name
    if name in metrics or (not trainer.state.validated_this_epoch and trainer.state.has_val_loader):
        return None
    raise KeyError(f"{who} monitors {monitor!r}, which was not logged by the end of epoch "
                   f"{trainer.current_epoch}; logged metrics: {sorted(metrics)}")


def per_step_only(who: str, **lightning: Any) -> None:
    """Refuse Lightning's options for acting every n seconds (``train_time_interval``): graphtrainer's
    checkpointing acts after validations, at epoch ends and every n optimizer steps, where the ranks agree
    without a collective and a checkpoint resumes exactly."""
    for name, value in lightning.items():
        if value is not None:
            raise ValueError(f"{who}({name}={value!r}): graphtrainer's {who} acts after validations, at epoch ends "
                             "or every n optimizer steps, not every n seconds (ranks would need a collective to "
                             f"agree on the time); leave {name} unset (use every_n_train_steps=N, or "
                             "Trainer(val_check_interval=N), see docs/lightning-habits.md)")


def acts_mid_epoch(trainer: RunView, on_train_epoch_end: Optional[bool]) -> bool:
    """Whether a monitor acts after ``val_check_interval``'s validations between training
    batches: Lightning's rule for ``save_on_train_epoch_end``/``check_on_train_epoch_end``
    (False: after each validation; True: at epoch ends only; None: after each validation when
    validation runs mid-epoch, else at epoch ends)."""
    if on_train_epoch_end is None:
        interval = trainer.config.val_check_interval
        return interval is not None and not (isinstance(interval, float) and interval == 1.0)
    return not on_train_epoch_end


def acts_at_epoch_end(trainer: RunView, on_train_epoch_end: Optional[bool]) -> bool:
    """Whether it acts at this epoch's end: when it acts at epoch ends, else only when the epoch's
    own validation ran (acting after a validation)."""
    return not acts_mid_epoch(trainer, on_train_epoch_end) or trainer.state.validated_this_epoch


class Callback:
    """Same hook names as :class:`~graphtrainer.GraphTask`, each taking ``(trainer, task, ...)``.

    Runs on every rank. A callback's hook runs before the task's hook of the same name,
    except for callbacks with ``after_reduction = True``: their ``on_train_epoch_end``
    runs after the task's and after that epoch's metrics are reduced, so they see its
    final ``trainer.callback_metrics``; those with ``saves_checkpoints = True`` run theirs
    last of all. The same callbacks, in that order, get :meth:`on_mid_epoch_validation_end`.
    In each rank ``trainer`` is that rank's view of the
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
    #: True for callbacks that write checkpoints at the epoch's end (``ModelCheckpoint``): their
    #: ``on_train_epoch_end`` runs after every other callback's (as Lightning's), so a checkpoint
    #: holds every other callback's state after that epoch's update and resumes exactly.
    saves_checkpoints: bool = False

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
    def on_train_start(self, trainer: RunView, task: GraphTask) -> None: ...
    def on_train_end(self, trainer: RunView, task: GraphTask) -> None: ...
    def on_train_epoch_start(self, trainer: RunView, task: GraphTask) -> None: ...
    def on_train_epoch_end(self, trainer: RunView, task: GraphTask) -> None: ...
    def on_train_batch_start(self, trainer: RunView, task: GraphTask, batch: Any, batch_idx: int) -> None: ...
    def on_train_batch_end(self, trainer: RunView, task: GraphTask, outputs: Any, batch: Any,
                           batch_idx: int) -> None: ...
    def on_before_backward(self, trainer: RunView, task: GraphTask, loss: torch.Tensor) -> None: ...
    def on_after_backward(self, trainer: RunView, task: GraphTask) -> None: ...
    def on_before_optimizer_step(self, trainer: RunView, task: GraphTask, optimizer: torch.optim.Optimizer) -> None: ...
    def on_before_zero_grad(self, trainer: RunView, task: GraphTask, optimizer: torch.optim.Optimizer) -> None: ...
    def on_validation_epoch_start(self, trainer: RunView, task: GraphTask) -> None: ...

    def on_mid_epoch_validation_end(self, trainer: RunView, task: GraphTask) -> None:
        """After a validation between training batches (``val_check_interval``), at an optimizer
        step boundary; ``after_reduction`` callbacks only (Lightning's ``on_validation_end`` there).
        A checkpoint written now resumes at the next batch. Collective when it saves."""

    def on_validation_epoch_end(self, trainer: RunView, task: GraphTask) -> None: ...
    def on_validation_batch_start(self, trainer: RunView, task: GraphTask, batch: Any, batch_idx: int) -> None: ...
    def on_validation_batch_end(self, trainer: RunView, task: GraphTask, outputs: Any, batch: Any,
                                batch_idx: int) -> None: ...
    def on_test_epoch_start(self, trainer: RunView, task: GraphTask) -> None: ...
    def on_test_epoch_end(self, trainer: RunView, task: GraphTask) -> None: ...
    def on_test_batch_start(self, trainer: RunView, task: GraphTask, batch: Any, batch_idx: int) -> None: ...
    def on_test_batch_end(self, trainer: RunView, task: GraphTask, outputs: Any, batch: Any,
                          batch_idx: int) -> None: ...
    def on_predict_epoch_start(self, trainer: RunView, task: GraphTask) -> None: ...
    def on_predict_epoch_end(self, trainer: RunView, task: GraphTask) -> None: ...
    def on_predict_batch_start(self, trainer: RunView, task: GraphTask, batch: Any, batch_idx: int) -> None: ...
    def on_predict_batch_end(self, trainer: RunView, task: GraphTask, outputs: Any, batch: Any,
                             batch_idx: int) -> None: ...
    def on_save_checkpoint(self, trainer: RunView, task: GraphTask, checkpoint: Dict[str, Any]) -> None: ...
    def on_load_checkpoint(self, trainer: RunView, task: GraphTask, checkpoint: Dict[str, Any]) -> None: ...
    def on_exception(self, trainer: RunView, task: GraphTask, error: BaseException) -> None: ...


def check_callbacks(callbacks: Sequence[Any]) -> None:
    """Refuse what is not a graphtrainer :class:`Callback`, and shared state keys (:func:`check_state_keys`)."""
    for cb in callbacks:
        if not isinstance(cb, Callback):
            raise TypeError(f"callbacks: {type(cb).__module__}.{type(cb).__name__} is not a "
                            "graphtrainer.callbacks.Callback; subclass that (its hooks take (trainer, task, ...)), "
                            "or use graphtrainer's own (ModelCheckpoint, EarlyStopping, LearningRateMonitor)")
    check_state_keys(callbacks)


def check_state_keys(callbacks: Sequence["Callback"]) -> None:
    """Refuse two callbacks with state under one :attr:`Callback.state_key` (as Lightning): in a checkpoint
    one's state would replace the other's, and a resumed fit would give both the same best file and top-k."""
    seen: Dict[str, Callback] = {}
    for cb in callbacks:
        key = cb.state_key
        if key in seen and cb.state_dict():
            raise ValueError(f"callbacks: two {type(cb).__name__} callbacks have the same state key {key!r}, so "
                             "checkpoints would hold one's state for both (a resumed fit would rank or delete the "
                             "other's files): give them different monitor, mode, every_n_epochs or "
                             "every_n_train_steps, or keep one")
        seen[key] = cb
