"""One training batch's optimisation, as the batch loop calls it."""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Optional, Tuple

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from .. import heartbeat
from .context import RankContext
from .hooks import PER_BATCH_HOOKS, call_hook, used_hooks
from .nonfinite import NonFiniteLosses
from .optim import step_schedulers
from .profiler import TorchTrace


class TrainingStep:
    """``training_step`` under the run's precision (and ``detect_anomaly``), its loss checked
    and back-propagated (``no_sync`` while gradients accumulate), then, every
    ``accumulate_grad_batches`` batches and at an epoch's last: unscale, clip, step and
    zero every optimizer, step the step-interval schedulers. Non-finite losses are noted
    without a host sync (:class:`~graphtrainer.loop.nonfinite.NonFiniteLosses`)."""

    def __init__(self, ctx: RankContext, module: nn.Module, ddp: Optional[DDP], trace: TorchTrace) -> None:
        self.ctx, self.ddp, self.trace = ctx, ddp, trace
        config = ctx.config
        self.accumulate = config.accumulate_grad_batches
        self.nonfinite = NonFiniteLosses(config.detect_anomaly)
        self.clip = _clipper(module, config.gradient_clip_val, config.gradient_clip_algorithm)
        self._micro = 0
        #: The per-batch hooks the task or a callback overrides (only those are called).
        self.hooks = used_hooks(ctx, PER_BATCH_HOOKS)

    def start_epoch(self) -> None:
        self._micro = 0

    def __call__(self, batch: Any, batch_idx: int, is_last: bool) -> Tuple[Any, bool]:
        """Train on ``batch``; returns what ``training_step`` returned and whether the
        optimizers stepped."""
        ctx, state, acc = self.ctx, self.ctx.state, self.accumulate
        precision, section = state.precision, ctx.section
        self._micro += 1
        stepping = self._micro % acc == 0 or is_last
        sync = self.ddp.no_sync() if (self.ddp is not None and not stepping) else contextlib.nullcontext()
        with sync, torch.autograd.set_detect_anomaly(ctx.config.detect_anomaly):
            heartbeat.beat("training_step", batch_idx)
            with section("forward"), precision.autocast():
                out = ctx.task.training_step(batch, batch_idx)
            loss = loss_of(ctx.task, out)
            self.nonfinite.check(loss, batch_idx, state)
            scaled = loss / acc if acc > 1 else loss
            self._call("on_before_backward", scaled)
            # Computing gradients is this rank's own work; it waits on its peers only once DDP
            # has launched its last bucket's all-reduce (marked by loop.ddp's comm hook).
            heartbeat.beat("backward", batch_idx)
            with section("backward"):
                precision.backward(scaled)
            self._call("on_after_backward")
        state.last_loss = loss.detach()
        if stepping:
            self._step(batch_idx)
        return out, stepping

    def _step(self, batch_idx: int) -> None:
        state = self.ctx.state
        heartbeat.beat("optimizer step", batch_idx)
        self._micro = 0
        with self.ctx.section("optimizer"):
            before = "on_before_optimizer_step" in self.hooks
            state.precision.step(state.optimizers, self.clip,
                                 (lambda opt: call_hook(self.ctx, "on_before_optimizer_step", opt)) if before else None)
            for opt in state.optimizers:
                self._call("on_before_zero_grad", opt)
                opt.zero_grad(set_to_none=True)
        state.global_step += 1
        step_schedulers(state.lr_schedulers, "step", state.global_step, {})
        self.trace.step()

    def _call(self, hook: str, *args: Any) -> None:
        if hook in self.hooks:
            call_hook(self.ctx, hook, *args)


def _clipper(module: nn.Module, value: Optional[float], algorithm: str) -> Optional[Callable[[], None]]:
    if not value:
        return None
    params = list(module.parameters())
    if algorithm == "value":
        return lambda: nn.utils.clip_grad_value_(params, value)
    return lambda: nn.utils.clip_grad_norm_(params, value)


def loss_of(task: Any, out: Any) -> torch.Tensor:
    """The loss in what ``training_step`` returned, checked: a scalar tensor that requires grad."""
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
