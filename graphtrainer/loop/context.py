"""What the rank side works with: one :class:`RankContext` per rank and stage.

The Trainer builds it in the calling process (options, the run's state, the callbacks, the
task) and a launcher carries it to each rank; the runtime, the loops and hook dispatch read
and update it and never see the ``Trainer``. Tasks and callbacks receive it as their
``trainer``: it reads like the Trainer (:class:`~graphtrainer.state.RunView`). It owns what
``self.log`` writes into during the run (:class:`StepLog`).
"""
from __future__ import annotations

import contextlib
import os
import warnings
from typing import Any, Dict, List, Optional, Set, Union

import torch

from ..checkpoint.content import save_checkpoint
from ..state import RunState, RunView, TrainerConfig
from .lightning_names import check_log_call
from .metrics import MetricStore, infer_batch_size, is_metric


class StepLog:
    """Where ``GraphTask.log`` writes: the phase's metric sums, and the step running with
    its batch size (the weight of a ``self.log`` call that gives none)."""

    def __init__(self, owner: Any = None) -> None:
        #: The phase's sums and logged torchmetrics objects (``owner``: the task holding them).
        self.metrics = MetricStore(owner=owner)
        #: The running step's hook ("training_step", ...) and batch size; None between steps.
        self.hook: Optional[str] = None
        self.batch_size: Optional[int] = None
        self._warned: Set[str] = set()

    def begin_step(self, hook: str, batch: Any) -> None:
        """``hook`` runs on ``batch`` from now on (until :meth:`end_steps`): unweighted logs
        weigh its seeds."""
        self.hook, self.batch_size = hook, infer_batch_size(batch)

    def end_steps(self) -> None:
        """No step runs any more (a loop over batches ended)."""
        self.hook = self.batch_size = None

    def log(self, name: str, value: Union[torch.Tensor, float, Any], batch_size: Optional[int], prog_bar: bool,
            reduce_fx: str, who: str, rank: int, lightning: Optional[Dict[str, Any]] = None) -> None:
        """Record one ``self.log`` call of ``who`` (the task's class name) on ``rank``
        (``lightning``: Lightning's options, checked by :func:`check_log_call`)."""
        check_log_call(name, lightning or {})
        if is_metric(value):
            if reduce_fx != "mean":
                raise ValueError(f"self.log({name!r}, metric, reduce_fx={reduce_fx!r}): a torchmetrics object "
                                 "reduces itself; drop reduce_fx")
            self.metrics.add_metric(name, value, prog_bar=prog_bar)
            return
        if batch_size is None and self.batch_size is None and self.hook is not None and reduce_fx == "mean":
            self._warn_unknown_batch_size(name, who, rank)
        weight = batch_size if batch_size is not None else (self.batch_size or 1)
        self.metrics.add(name, value, float(weight), prog_bar=prog_bar, reduce_fx=reduce_fx)

    def _warn_unknown_batch_size(self, name: str, who: str, rank: int) -> None:
        # Once per hook (every later call of it has the same problem), from rank 0 only.
        hook = self.hook
        if hook is None or hook in self._warned or rank != 0:
            return
        self._warned.add(hook)
        warnings.warn(
            f"{who}.{hook}: the batch size of this batch could not be inferred, so "
            f"self.log({name!r}, ...) weighs each call equally and its epoch value is a mean of "
            f"per-batch means. Pass batch_size=... to self.log in {hook}.", UserWarning, stacklevel=4)


class RankContext(RunView):
    """One rank's run: the options, the run's state, the callbacks, the task, and the
    logging state. Precision, profiler and logger are the state's (they are made in the
    rank, see :mod:`graphtrainer.loop.runtime`).

    ``task`` is the user's ``GraphTask``; the loop calls its hooks by name, so it is typed
    loosely here (the task module sits above the loop and imports it).
    """

    def __init__(self, config: TrainerConfig, state: RunState, callbacks: List[Any], active_callbacks: List[Any],
                 task: Any) -> None:
        self.config = config
        self.state = state
        #: Every callback (their states go into checkpoints and results) and those that run.
        self.callbacks = callbacks
        self.active_callbacks = active_callbacks
        self.task = task
        #: What ``self.log`` writes into during this run.
        self.step_log = StepLog(owner=task)
        #: Whether the ranks learn ``fit``'s run folder from rank 0 (set by launchers whose
        #: launching process does not give it to every rank).
        self.run_dir_from_rank0 = False

    def save_checkpoint(self, path: Union[str, os.PathLike], weights_only: bool = False) -> None:
        """Write a checkpoint of the running task (``weights_only``: only the model's weights, as
        Lightning's; such a file evaluates but cannot resume a fit). Must be called on all processes."""
        save_checkpoint(self, self.task, path, weights_only=weights_only)

    # The rank's own pieces, made by the runtime once the device is known.
    @property
    def precision(self) -> Any:
        return self.state.precision

    @property
    def profiler(self) -> Any:
        return self.state.profiler

    def section(self, name: str) -> Any:
        """The profiler's timing block for ``name`` (a no-op before the runtime made one)."""
        return self.state.profiler.section(name) if self.state.profiler is not None else contextlib.nullcontext()
