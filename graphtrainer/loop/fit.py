"""``fit`` on one rank: setup, then per epoch the training batches and the epoch's end.

The hooks run in the order written in :class:`~graphtrainer.GraphTask`'s docstring; the
loops, with what decides each turn::

    setup: DDP, optimizers (and the resumed state), loaders, on_fit_start, on_train_start
    while not stop.done():                      # max_epochs, or an agreed stop
        epoch start: seed, loader epoch, batch counts agreed (Join if they differ)
        for each batch:
            on_train_batch_start
            step(batch)                         # TrainingStep: forward, backward, optimizer
            on_train_batch_end, step log, mid-epoch validation (then on_mid_epoch_validation_end),
            step checkpoints (ModelCheckpoint(every_n_train_steps=N))
            stop.at_step()                      # max_steps; a signal agreed by the ranks; an agreed early stop
        epoch end: metrics reduced, validation (unless one just ran at this step), on_train_epoch_end,
                   schedulers, history
        stop.at_epoch_end()                     # one all-reduce: stop? next batch counts
    on_train_end, on_fit_end, teardown

Collectives per training epoch besides DDP's and the task's own: the metric reduction (one
all-reduce once the logged names are known) and :class:`~graphtrainer.loop.stopping.StopController`'s
agreement, plus a signal exchange every ``AGREE_EVERY_S`` of training in long epochs.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any, Dict, FrozenSet, Iterator, List, Optional, Tuple

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from .. import comm as gdist
from .. import heartbeat
from ..checkpoint.content import check_resumable, load_checkpoint, restore_training_state, rng_state
from ..launch.lean import trim_after_epoch
from ..state import RunResult, RunState
from . import preemption
from .batches import (batch_limit, batch_transfer, check_loaders, count_batches, exact_len, for_evaluation,
                      require_training_loader, set_epoch, with_last)
from .context import RankContext
from .ddp import wrap as wrap_in_ddp
from .evaluate import eval_epoch
from .hooks import (after_reduction, before_reduction, build_model, call_after_reduction, call_hook, may_log,
                    model_as, result)
from .join import UnevenInputs
from .optim import parse_optimizers, step_schedulers
from .profiler import TorchTrace
from .profiler import table as profile_table
from .seeding import seed_epoch
from .stages import VALIDATE
from .step import TrainingStep
from .stopping import AtStep, StopController


@dataclass
class _Fit:
    """What one rank's ``fit`` holds between epochs."""

    ctx: RankContext
    ddp: Optional[DDP]
    train_loader: Any
    val_loader: Any
    uneven: UnevenInputs
    step: TrainingStep
    stop: StopController
    #: Whether hooks before the after-reduction callbacks may log (then the epoch reduces twice).
    logs_at_epoch_end: bool
    #: Batch indices after which this epoch validates too (``val_check_interval``).
    val_points: FrozenSet[int] = frozenset()
    #: Callbacks that save every n optimizer steps (``step_save_due``/``save_at_step``).
    step_savers: List[Any] = field(default_factory=list)
    #: This epoch's fewest training batches over the ranks (None when a rank cannot tell).
    fewest: Optional[int] = None
    #: Where a mid-epoch resume starts (only in the first epoch after it).
    resume: Optional[preemption.MidEpochResume] = None
    #: Batches trained when the ranks agreed to stop for a signal, mid-epoch.
    stopped_after: Optional[int] = None

    @property
    def state(self) -> RunState:
        return self.ctx.state


def run_fit(ctx: RankContext, ckpt_path: Optional[str]) -> RunResult:
    state, config = ctx.state, ctx.config
    call_hook(ctx, "setup", "fit")
    module = build_model(ctx)
    checkpoint = load_checkpoint(ckpt_path, module) if ckpt_path else None
    if checkpoint is not None:
        check_resumable(checkpoint)  # a weights-only file: refused before DDP, optimizers and loaders
    ddp = None
    if gdist.is_distributed():
        ddp = wrap_in_ddp(module, state.device, config.ddp_kwargs)
        state.profiler.time_all_reduce(ddp)
    trace = TorchTrace(state.log_dir / "profile" if state.log_dir else None,
                       config.profiler == "pytorch" and state.rank == 0)
    try:
        with model_as(ctx.task, ddp if ddp is not None else module), preemption.stop_signals():
            fit = _setup(ctx, module, ddp, checkpoint, trace)
            state.profiler.start_fit()
            if checkpoint is not None and fit.stop.done() and state.rank == 0:
                print(f"[graphtrainer] {fit.stop.reached()}: {ckpt_path} already reached it, nothing to train",
                      flush=True)
            call_hook(ctx, "on_train_start")
            while not fit.stop.done():
                _train_epoch(fit)
                if fit.stopped_after is not None:
                    preemption.stop_run(ctx, fit.stopped_after)  # raises Preempted
                _end_epoch(fit)
                trim_after_epoch(config.allocator)  # allocator='lean' only
                if fit.stop.preempted:
                    preemption.stop_run(ctx, 0)
            with ctx.section("fit end"):
                call_hook(ctx, "on_train_end")
                call_hook(ctx, "on_fit_end")
                call_hook(ctx, "teardown", "fit")
    finally:
        trace.stop()
    _report_profile(state)
    gdist.barrier()
    return result(ctx, with_weights=True)


def _report_profile(state: RunState) -> None:
    """Gather every rank's sections and print the table on rank 0. Collective."""
    if not state.profiler.enabled:
        return
    state.profile = gdist.all_gather_object(state.profiler.summary())
    if state.rank == 0:
        print(profile_table(state.profile), flush=True)


def _setup(ctx: RankContext, module: nn.Module, ddp: Optional[DDP], checkpoint: Optional[Dict[str, Any]],
           trace: TorchTrace) -> _Fit:
    """Optimizers, the resumed state, the loaders, ``on_fit_start``."""
    state, task = ctx.state, ctx.task
    heartbeat.beat("configure_optimizers")
    state.optimizers, state.lr_schedulers = parse_optimizers(task.configure_optimizers())
    if checkpoint is not None:
        restore_training_state(ctx, task, checkpoint)
    heartbeat.beat("train_dataloader")
    train_loader = task.train_dataloader()
    require_training_loader(train_loader, type(task).__name__)
    heartbeat.beat("val_dataloader")
    val_loader = for_evaluation(task.val_dataloader())
    check_loaders(state, training=train_loader, evaluation=val_loader, config=ctx.config)
    state.has_val_loader = val_loader is not None
    call_hook(ctx, "on_fit_start")
    return _Fit(ctx, ddp, train_loader, val_loader, UnevenInputs(ddp, state), TrainingStep(ctx, module, ddp, trace),
                StopController(ctx.config, state), may_log(ctx, "on_train_epoch_end"),
                step_savers=[cb for cb in after_reduction(ctx.active_callbacks)
                             if getattr(cb, "every_n_train_steps", 0) and callable(getattr(cb, "save_at_step", None))],
                resume=preemption.MidEpochResume.of(checkpoint, state.world_size))


def _train_epoch(fit: _Fit) -> None:
    state, config, section = fit.state, fit.ctx.config, fit.ctx.section
    epoch = state.current_epoch
    with section("epoch start"):
        state.epoch_finished = state.validated_this_epoch = False
        state.epoch_metric_names = set()
        heartbeat.set_epoch(epoch)
        seed_epoch(config.seed, state.rank, epoch)  # makes epoch-boundary resume exact
        state.num_training_batches, trusted = _loader_epoch(fit, epoch)
        fit.fewest = fit.stop.start_epoch(trusted)
        fit.val_points = _val_points(fit, fit.fewest)
        fit.step.start_epoch()
        call_hook(fit.ctx, "on_train_epoch_start")
    with fit.uneven.epoch(fit.stop.joining, section):
        _train_batches(fit)
        if fit.resume is not None:  # only the first epoch after a resume skips batches
            fit.resume = fit.resume.finish(state.rank)
    fit.step.nonfinite.report(state)


def _loader_epoch(fit: _Fit, epoch: int) -> Tuple[Optional[int], Optional[int]]:
    """Point the training loader at ``epoch`` (overfitting: the same batches each epoch); its
    batch count, and the count when the ranks can trust it (an exact ``len``), else None."""
    config = fit.ctx.config
    set_epoch(fit.train_loader, 0 if config.overfit_batches else epoch)
    count = count_batches(fit.train_loader, config.limit_train_batches)
    return count, count if exact_len(fit.train_loader) else None


def _train_batches(fit: _Fit) -> None:
    ctx, state, log = fit.ctx, fit.state, fit.ctx.step_log
    starts = "on_train_batch_start" in fit.step.hooks
    for batch_idx, batch, is_last in _batches(fit):
        log.begin_step("training_step", batch)
        log.metrics.start_step()
        if starts and _ends_epoch(call_hook(ctx, "on_train_batch_start", batch, batch_idx)):
            warnings.warn(f"{type(ctx.task).__name__}.on_train_batch_start returned -1, which ends the epoch in "
                          "Lightning; graphtrainer trains on (ranks stop together): set "
                          "self.trainer.should_stop = True to stop after this epoch", UserWarning)
        out, stepped = fit.step(batch, batch_idx, is_last)
        with ctx.section("on_train_batch_end"):
            call_hook(ctx, "on_train_batch_end", out, batch, batch_idx)
        if stepped:
            _log_step(fit)
        validated = batch_idx in fit.val_points
        if validated:
            with ctx.section("validation"):
                _validate_mid_epoch(fit, batch_idx)
        if stepped and fit.step_savers and _all_ranks_go_on(fit, batch_idx, is_last):
            _save_at_step(fit, batch_idx)
        verdict = fit.stop.at_step(stepped, validated)
        if verdict is AtStep.PREEMPTED:
            fit.stopped_after = batch_idx + 1
        elif verdict is AtStep.END_EPOCH and not is_last:  # max_steps or an agreed stop, batches left
            state.batches_done_in_epoch, state.rng_at_stop = batch_idx + 1, rng_state()
        if verdict is not AtStep.GO_ON:
            break
    log.end_steps()
    fit.stop.end_steps()


def _all_ranks_go_on(fit: _Fit, batch_idx: int, is_last: bool) -> bool:
    """Whether every rank has a batch after ``batch_idx`` (so all took the same steps and reach the same
    collectives): ranks with equal counts agree on ``is_last``; in ``Join`` only below the fewest."""
    if is_last:
        return False
    return not fit.stop.joining or (fit.fewest is not None and batch_idx < fit.fewest - 1)


def _save_at_step(fit: _Fit, batch_idx: int) -> None:
    """The step checkpoints due at this optimizer step (``every_n_train_steps``), resuming at the next batch.
    Each rank asks the same callbacks with the same step, so they agree without a collective."""
    ctx, state = fit.ctx, fit.state
    due = [cb for cb in fit.step_savers if cb.step_save_due(state.global_step)]
    if not due:
        return
    state.batches_done_in_epoch, state.rng_at_stop = batch_idx + 1, rng_state()
    try:
        call_hook(ctx, "save_at_step", callbacks=due, task_too=False)
    finally:
        state.batches_done_in_epoch, state.rng_at_stop = 0, None


def _ends_epoch(returned: Any) -> bool:
    return isinstance(returned, int) and returned == -1


def _batches(fit: _Fit) -> Iterator[Tuple[int, Any, bool]]:
    """``(batch_idx, batch on the device, is_last)``; after a mid-epoch resume, without the
    batches trained before the stop."""
    state, config, section = fit.state, fit.ctx.config, fit.ctx.section
    limit = batch_limit(fit.train_loader, config.limit_train_batches)
    transfer = batch_transfer(fit.ctx.task, state.device, config)
    for batch_idx, batch, is_last in with_last(transfer.batches(fit.train_loader), limit, "the training loader",
                                               section):
        if fit.resume is not None and fit.resume.skips(batch_idx, state.rank):
            continue
        with section("to device"):
            batch = transfer.to_device(batch)
        yield batch_idx, batch, is_last


def _log_step(fit: _Fit) -> None:
    """This rank's values of the step, every ``log_every_n_steps`` optimizer steps."""
    state, config = fit.state, fit.ctx.config
    if state.logger is None or state.global_step % config.log_every_n_steps:
        return
    row = {f"{k}_step": float(v) for k, v in fit.ctx.step_log.metrics.step_values.items()}
    row.update({"epoch": state.current_epoch, "step": state.global_step})
    state.logger.log_metrics(row, step=state.global_step)


def _end_epoch(fit: _Fit) -> None:
    """The epoch's metrics, validation, ``on_train_epoch_end``, schedulers, the history row,
    then the agreement on stopping."""
    ctx, state, config = fit.ctx, fit.state, fit.ctx.config
    epoch = state.current_epoch
    with ctx.section("epoch end"):
        metrics = ctx.step_log.metrics.reduce("fit")
    if fit.val_loader is not None and (epoch + 1) % config.check_val_every_n_epoch == 0:
        # A stop right after a mid-epoch validation (early stop, max_steps) ends the epoch at the
        # step it measured: the same weights, so its values, already in the epoch's, stand (Lightning).
        if state.last_validation_step != state.global_step:
            with ctx.section("validation"):
                metrics.update(_validate(fit))
        state.validated_this_epoch = True
    with ctx.section("epoch end"):
        state.add_epoch_metrics(metrics)
        call_hook(ctx, "on_train_epoch_end", callbacks=before_reduction(ctx.active_callbacks))
        if fit.logs_at_epoch_end:
            state.add_epoch_metrics(ctx.step_log.metrics.reduce("fit epoch end"))
        # Unless max_steps ended the epoch early (its checkpoints resume at the next batch):
        # the epoch is finished, and its schedulers step before the checkpointing callbacks, so
        # a checkpoint holds the scheduler state the next epoch uses (an exact resume needs it).
        finished = not state.batches_done_in_epoch
        if finished:
            step_schedulers(state.lr_schedulers, "epoch", epoch + 1, state.callback_metrics)
        state.epoch_finished = finished
        call_after_reduction(ctx, "on_train_epoch_end")
        _record_epoch(state)
        state.current_epoch, state.epoch_finished = epoch + finished, False
        ahead = None if state.current_epoch >= config.max_epochs else _loader_epoch(fit, state.current_epoch)[1]
        fit.stop.at_epoch_end(ahead)


def _record_epoch(state: RunState) -> None:
    measured = state.epoch_metrics()  # an epoch without validation carries no validation values
    row = {"epoch": state.current_epoch, "step": state.global_step, **{k: measured[k] for k in sorted(measured)}}
    state.history.append(row)
    if state.logger is not None:
        state.logger.log_metrics(row, step=state.global_step)


def _val_points(fit: _Fit, fewest: Optional[int]) -> FrozenSet[int]:
    """The batch indices after which to validate this epoch (``val_check_interval``; none in an
    epoch ``check_val_every_n_epoch`` skips, as Lightning): the same on every rank, and only where
    every rank still has batches (``fewest``: the agreed smallest count, None when a loader cannot
    tell). Collective."""
    interval, state = fit.ctx.config.val_check_interval, fit.state
    if interval is None or fit.val_loader is None:
        return frozenset()
    mine = state.num_training_batches
    if mine is None:
        raise ValueError("val_check_interval needs a training loader with a length (len())")
    if fewest is None:
        fewest = -int(gdist.all_reduce(torch.tensor([-float(mine)]), "max")[0])
    every = interval if isinstance(interval, int) else max(1, int(interval * fewest))
    if every > fewest:
        raise ValueError(f"val_check_interval={interval} is larger than the epoch: the rank with the fewest "
                         f"training batches has {fewest}. Use at most {fewest}, or a fraction of the epoch")
    if (state.current_epoch + 1) % fit.ctx.config.check_val_every_n_epoch:
        return frozenset()  # checked above all the same: a bad interval fails in the first epoch
    # The last batch is left to the epoch's own validation.
    return frozenset(k * every - 1 for k in range(1, fewest // every + 1) if k * every < fewest)


def _validate_mid_epoch(fit: _Fit, batch_idx: int) -> None:
    """Validation between training batches (the epoch's training sums kept aside), then the
    after-reduction callbacks' ``on_mid_epoch_validation_end``, at optimizer-step boundaries
    only. Collective (every rank reaches the same batch index: see :func:`_val_points`)."""
    ctx, state = fit.ctx, fit.state
    training_sums = ctx.step_log.metrics.stash()
    metrics = _validate(fit)
    ctx.step_log.metrics.restore(training_sums)
    state.add_epoch_metrics(metrics)
    if state.logger is not None:
        state.logger.log_metrics({"epoch": state.current_epoch, "step": state.global_step, **metrics},
                                 step=state.global_step)
    if (batch_idx + 1) % ctx.config.accumulate_grad_batches:
        return  # mid-accumulation: a checkpoint would lose the gradients accumulated so far
    # A checkpoint written now resumes at the next batch (as a max_steps stop's); the epoch goes on.
    state.batches_done_in_epoch, state.rng_at_stop = batch_idx + 1, rng_state()
    try:
        call_after_reduction(ctx, "on_mid_epoch_validation_end")
    finally:
        state.batches_done_in_epoch, state.rng_at_stop = 0, None


def _validate(fit: _Fit) -> Dict[str, float]:
    """The validation loop's reduced metrics; notes the step it measured. Collective."""
    metrics, _ = eval_epoch(fit.ctx, VALIDATE, fit.val_loader)
    fit.state.last_validation_step = fit.state.global_step
    return metrics
