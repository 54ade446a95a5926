"""``fit`` on one rank: setup, then per epoch the training batches and the epoch's end.

The order of hooks is the one written in :class:`~graphtrainer.GraphTask`'s docstring.
"""
from __future__ import annotations

import contextlib
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager, Dict, FrozenSet, Iterator, Optional

import torch
from torch import nn
from torch.distributed.algorithms.join import Join
from torch.nn.parallel import DistributedDataParallel as DDP

from .. import comm as gdist
from .. import heartbeat
from ..checkpoint.content import _to_cpu, load_checkpoint, restore_training_state
from ..state import RunResult, RunState
from . import preemption
from .batches import (batch_limit, batch_transfer, check_loaders, count_batches, exact_len, for_evaluation,
                      require_training_loader, set_epoch, with_last)
from .context import RankContext
from .ddp import wrap as wrap_in_ddp
from .evaluate import eval_epoch
from .hooks import before_reduction, build_model, call_after_reduction, call_hook, model_as, result
from ..launch.lean import trim_after_epoch
from .nonfinite import NonFiniteLosses
from .optim import parse_optimizers, step_schedulers
from .profiler import TorchTrace
from .profiler import table as profile_table
from .seeding import seed_epoch
from .stages import VALIDATE


@dataclass
class _Fit:
    """What one rank's ``fit`` holds between epochs."""

    ctx: RankContext
    module: nn.Module
    ddp: Optional[DDP]
    train_loader: Any
    val_loader: Any
    uneven: "UnevenInputs"
    nonfinite: "NonFiniteLosses"
    trace: TorchTrace
    started: float = 0.0
    #: Batch indices after which this epoch validates too (``val_check_interval``).
    val_points: FrozenSet[int] = frozenset()
    #: Preemption: where a mid-epoch resume starts; the agreement on stopping; this epoch in
    #: Join; batches trained when the ranks agreed to stop; a stop agreed as the epoch ended.
    resume: Optional[preemption.MidEpochResume] = None
    stop: preemption.StopAgreement = field(default_factory=preemption.StopAgreement)
    joining: bool = False
    stopped_after: Optional[int] = None
    stop_after_epoch: bool = False

    @property
    def state(self) -> RunState:
        return self.ctx.state

    @property
    def task(self) -> Any:
        return self.ctx.task


def run_fit(ctx: RankContext, ckpt_path: Optional[str]) -> RunResult:
    state, config = ctx.state, ctx.config
    call_hook(ctx, "setup", "fit")
    module = build_model(ctx)
    checkpoint = load_checkpoint(ckpt_path, module) if ckpt_path else None
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
            while state.current_epoch < config.max_epochs and not state.should_stop:
                _train_epoch(fit)
                if fit.stopped_after is not None:
                    preemption.stop_run(ctx, fit.stopped_after)  # raises Preempted
                _end_epoch(fit)
                trim_after_epoch(config.allocator)  # allocator='lean' only
                if fit.stop_after_epoch or (fit.joining and preemption.agreed_stop(False)):
                    preemption.stop_run(ctx, 0)  # (an epoch in Join stops at its end)
            with ctx.section("fit end"):
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
    return _Fit(ctx, module, ddp, train_loader, val_loader, UnevenInputs(ddp, state),
                NonFiniteLosses(ctx.config.detect_anomaly), trace, started=time.monotonic(),
                resume=preemption.MidEpochResume.of(checkpoint, state.world_size))


def _train_epoch(fit: _Fit) -> None:
    state, config, section = fit.state, fit.ctx.config, fit.ctx.section
    epoch = state.current_epoch
    with section("epoch start"):
        state.epoch_finished = state.validated_this_epoch = False
        heartbeat.set_epoch(epoch)
        seed_epoch(config.seed, state.rank, epoch)  # makes epoch-boundary resume exact
        set_epoch(fit.train_loader, 0 if config.overfit_batches else epoch)  # overfitting: the same batches
        state.num_training_batches = count_batches(fit.train_loader, config.limit_train_batches)
        fit.val_points = _val_points(fit)
        call_hook(fit.ctx, "on_train_epoch_start")
        joining = fit.joining = fit.uneven.needs_join(fit.train_loader)
        fit.stop.start_epoch()
    with fit.uneven.epoch(joining, section):
        _train_batches(fit)
        if fit.resume is not None:  # only the first epoch after a resume skips batches
            fit.resume = fit.resume.finish(state.rank)
    fit.nonfinite.report(state)


def _end_epoch(fit: _Fit) -> None:
    """Validation, the epoch's metrics, callbacks, schedulers, the history row and the
    agreement on stopping."""
    ctx, state, config = fit.ctx, fit.state, fit.ctx.config
    section = ctx.section
    epoch = state.current_epoch
    with section("epoch end"):
        metrics = ctx.step_log.metrics.reduce()
    if fit.val_loader is not None and (epoch + 1) % config.check_val_every_n_epoch == 0:
        with section("validation"):
            metrics.update(eval_epoch(ctx, VALIDATE, fit.val_loader)[0])
        state.validated_this_epoch = True
    with section("epoch end"):
        _finish_epoch(fit, metrics)


def _finish_epoch(fit: _Fit, metrics: Dict[str, float]) -> None:
    ctx, state, config = fit.ctx, fit.state, fit.ctx.config
    epoch = state.current_epoch
    state.callback_metrics.update(metrics)
    call_hook(ctx, "on_train_epoch_end", callbacks=before_reduction(ctx.active_callbacks))
    state.callback_metrics.update(ctx.step_log.metrics.reduce())
    # Before the checkpointing callbacks, so a checkpoint holds the scheduler state the
    # next epoch uses (an exact resume needs it).
    step_schedulers(state.lr_schedulers, "epoch", epoch + 1, state.callback_metrics)
    state.epoch_finished = True  # checkpoints written now resume at the next epoch
    call_after_reduction(ctx, "on_train_epoch_end")
    row = {"epoch": epoch, "step": state.global_step,
           **{k: state.callback_metrics[k] for k in sorted(state.callback_metrics)}}
    state.history.append(row)
    if state.logger is not None:
        state.logger.log_metrics(row, step=state.global_step)
    state.current_epoch = epoch + 1
    state.epoch_finished = False
    if 0 < config.max_steps <= state.global_step:
        state.should_stop = True
    if config.max_time is not None and time.monotonic() - fit.started >= config.max_time:
        state.should_stop = True
    # One rank wanting to stop stops all, at the same epoch; the same all-reduce settles how
    # often the ranks exchange stop flags next epoch (the smallest interval proposed).
    flag = torch.tensor([1.0 if state.should_stop else 0.0, -fit.stop.proposal()], dtype=torch.float64)
    agreed = gdist.all_reduce(flag, "max")
    state.should_stop = bool(agreed[0] > 0)
    fit.stop.agree_interval(-float(agreed[1]))
    if state.current_epoch < config.min_epochs and not 0 < config.max_steps <= state.global_step:
        state.should_stop = False


def _train_batches(fit: _Fit) -> None:
    ctx, task, state, config, ddp = fit.ctx, fit.task, fit.state, fit.ctx.config, fit.ddp
    precision, section, log = state.precision, ctx.section, ctx.step_log
    limit = batch_limit(fit.train_loader, config.limit_train_batches)
    acc = config.accumulate_grad_batches
    micro = 0
    transfer = batch_transfer(task, state.device, config)
    for batch_idx, batch, is_last in with_last(transfer.batches(fit.train_loader), limit, "the training loader",
                                               section):
        if fit.resume is not None and fit.resume.skips(batch_idx, state.rank):
            continue
        with section("to device"):
            batch = transfer.to_device(batch)
        log.begin_step("training_step", batch)
        log.metrics.start_step()
        micro += 1
        stepping = micro % acc == 0 or is_last
        sync = ddp.no_sync() if (ddp is not None and not stepping) else contextlib.nullcontext()
        with sync, torch.autograd.set_detect_anomaly(config.detect_anomaly):
            heartbeat.beat("training_step", batch_idx)
            with section("forward"), precision.autocast():
                out = task.training_step(batch, batch_idx)
            loss = _loss_of(task, out)
            fit.nonfinite.check(loss, batch_idx, state)
            # Computing gradients is this rank's own work; it waits on its peers only once DDP
            # has launched its last bucket's all-reduce (marked by loop.ddp's comm hook).
            heartbeat.beat("backward", batch_idx)
            with section("backward"):
                precision.backward(loss / acc if acc > 1 else loss)
        if stepping:
            heartbeat.beat("optimizer step", batch_idx)
            micro = 0
            with section("optimizer"):
                precision.step(state.optimizers, _clipper(fit))
                for opt in state.optimizers:
                    opt.zero_grad(set_to_none=True)
            state.global_step += 1
            step_schedulers(state.lr_schedulers, "step", state.global_step, {})
            fit.trace.step()
        state.last_loss = loss.detach()
        with section("on_train_batch_end"):
            call_hook(ctx, "on_train_batch_end", out, batch, batch_idx)
        if state.logger is not None and stepping and state.global_step % config.log_every_n_steps == 0:
            step_row = {f"{k}_step": float(v) for k, v in log.metrics.step_values.items()}
            step_row.update({"epoch": state.current_epoch, "step": state.global_step})
            state.logger.log_metrics(step_row, step=state.global_step)
        if batch_idx in fit.val_points:
            with section("validation"):
                _validate_mid_epoch(fit)
        if 0 < config.max_steps <= state.global_step:
            break
        if stepping and not fit.joining and fit.stop.at_boundary(last=is_last):
            fit.stopped_after = batch_idx + 1
            break
    log.end_steps()
    fit.stop_after_epoch = fit.stop.collect()


def _clipper(fit: _Fit) -> Optional[Callable[[], None]]:
    config = fit.ctx.config
    if not config.gradient_clip_val:
        return None
    params, value = fit.module.parameters(), config.gradient_clip_val
    if config.gradient_clip_algorithm == "value":
        return lambda: nn.utils.clip_grad_value_(params, value)
    return lambda: nn.utils.clip_grad_norm_(params, value)


def _val_points(fit: _Fit) -> FrozenSet[int]:
    """The batch indices after which to validate this epoch (``val_check_interval``): the
    same on every rank, and only where every rank still has batches. Collective."""
    interval, state = fit.ctx.config.val_check_interval, fit.state
    if interval is None or fit.val_loader is None:
        return frozenset()
    mine = state.num_training_batches
    if mine is None:
        raise ValueError("val_check_interval needs a training loader with a length (len())")
    fewest = -int(gdist.all_reduce(torch.tensor([-float(mine)]), "max")[0])
    every = interval if isinstance(interval, int) else max(1, int(interval * fewest))
    if every > fewest:
        raise ValueError(f"val_check_interval={interval} is larger than the epoch: the rank with the fewest "
                         f"training batches has {fewest}. Use at most {fewest}, or a fraction of the epoch")
    # The last batch is left to the epoch's own validation.
    return frozenset(k * every - 1 for k in range(1, fewest // every + 1) if k * every < fewest)


def _validate_mid_epoch(fit: _Fit) -> None:
    """Validation between training batches; the epoch's training sums are kept aside.
    Collective (every rank reaches the same batch index: see :func:`_val_points`)."""
    ctx, state = fit.ctx, fit.state
    training_sums = ctx.step_log.metrics.stash()
    metrics, _ = eval_epoch(ctx, VALIDATE, fit.val_loader)
    ctx.step_log.metrics.restore(training_sums)
    state.callback_metrics.update(metrics)
    if state.logger is not None:
        state.logger.log_metrics({"epoch": state.current_epoch, "step": state.global_step, **metrics},
                                 step=state.global_step)


def _loss_of(task: Any, out: Any) -> torch.Tensor:
    loss = out.get("loss") if isinstance(out, dict) else out
    name = f"{type(task).__name__}.training_step"
    if loss is None:
        raise ValueError(f"{name} returned {'a dict without a loss' if isinstance(out, dict) else 'None'}: "
                         "return the loss tensor, or a dict with key 'loss'")
    if not isinstance(loss, torch.Tensor):
        raise ValueError(f"{name} must return a scalar loss tensor, got {type(loss).__name__}")
    if loss.numel() != 1:
        raise ValueError(f"{name} must return a scalar loss tensor, got one of shape {tuple(loss.shape)}: "
                         "reduce it, e.g. with .mean() or .sum()")
    if not loss.requires_grad:
        raise ValueError(f"{name} returned a loss that does not require grad (computed under no_grad, "
                         "or detached?)")
    return loss


class UnevenInputs:
    """Ranks with different batch counts in an epoch: ``Join`` while they train, then the
    state of the rank that stepped longest for the others.

    ``Join`` costs two extra all-reduces per step, so it is entered only when the ranks'
    batch counts differ or cannot be trusted (one small all-reduce per epoch decides).
    Only DDP's own all-reduce may run inside it: metrics are reduced after it.
    """

    def __init__(self, ddp: Optional[DDP], state: RunState):
        self.ddp, self.state = ddp, state

    def needs_join(self, loader: Any) -> bool:
        """Whether this epoch's batch counts may differ between ranks. Collective."""
        if self.ddp is None:
            return False
        return not gdist.same_on_all_ranks(self.state.num_training_batches if exact_len(loader) else None)

    @contextlib.contextmanager
    def epoch(self, joining: bool, section: Callable[[str], ContextManager[Any]]) -> Iterator[None]:
        """The epoch's training, inside ``Join`` when ``joining``; leaving it waits for the
        ranks with more batches (timed as ``section("join")``). Collective."""
        if not joining:
            yield
            return
        join = Join([self.ddp])
        join.__enter__()
        try:
            yield
        except BaseException:
            join.__exit__(*sys.exc_info())  # Join re-raises without waiting for the others
            raise
        heartbeat.waiting_from_now("Join (uneven inputs)")
        with section("join"):
            join.__exit__(None, None, None)
            self._sync_after_join()

    def _sync_after_join(self) -> None:
        """Give ranks that ran out of batches early the optimizer and scheduler state, and the
        step count, of the ranks that stepped longest. Collective.

        DDP's join hook re-syncs only the parameters; without this, an early rank's stale
        momentum or learning rate makes its parameters drift from the next step on.
        """
        state = self.state
        steps = gdist.all_gather_tensor(torch.tensor([state.global_step])).tolist()
        if len(set(steps)) == 1:
            return
        # The rank DDP took the final parameters from: the highest of those still running last.
        src = max(range(len(steps)), key=lambda r: (steps[r], r))
        payload = None
        if state.rank == src:
            payload = (_to_cpu([opt.state_dict() for opt in state.optimizers]),
                       [cfg.scheduler.state_dict() for cfg in state.lr_schedulers])
        opt_states, sched_states = gdist.broadcast_object(payload, src=src)
        if state.rank != src:
            for opt, opt_state in zip(state.optimizers, opt_states):
                opt.load_state_dict(opt_state)
            for cfg, sched_state in zip(state.lr_schedulers, sched_states):
                cfg.scheduler.load_state_dict(sched_state)
        state.global_step = steps[src]
