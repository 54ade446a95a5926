"""What both loops of a rank use: hook dispatch, the model, and the result handed back."""
from __future__ import annotations

import contextlib
from typing import Any, FrozenSet, Iterable, Iterator, List, Optional

from torch import nn

from .. import heartbeat
from ..state import RunResult, callback_states
from .context import RankContext


def call_hook(ctx: RankContext, hook: str, *args: Any, callbacks: Optional[Iterable[Any]] = None,
              task_too: bool = True) -> Any:
    """``hook`` of ``callbacks`` (all active ones by default), in order, then the task's, whose
    return value it returns. Callbacks get ``(ctx, task, *args)``: the context is their ``trainer``."""
    heartbeat.beat(hook)
    with ctx.section(f"hook {hook}"):
        for cb in ctx.active_callbacks if callbacks is None else callbacks:
            getattr(cb, hook)(ctx, ctx.task, *args)
        return getattr(ctx.task, hook)(*args) if task_too else None


#: Hooks called per batch or per optimizer step, during ``fit`` or an evaluation.
PER_BATCH_HOOKS = ("on_train_batch_start", "on_before_backward", "on_after_backward", "on_before_optimizer_step",
                   "on_before_zero_grad", *(f"on_{s}_batch_{e}" for s in ("validation", "test", "predict")
                                            for e in ("start", "end")))


def used_hooks(ctx: RankContext, hooks: Iterable[str]) -> FrozenSet[str]:
    """Those of ``hooks`` that the task or an active callback overrides. The loops call their
    per-batch hooks only then, so a run without them pays nothing per batch."""
    return frozenset(h for h in hooks if _overrides(ctx.task, h, "GraphTask")
                     or any(_overrides(cb, h, "Callback") for cb in ctx.active_callbacks))


def call_after_reduction(ctx: RankContext, hook: str) -> None:
    """``hook`` of the callbacks that act on the epoch's reduced metrics
    (:attr:`Callback.after_reduction`), after the task's; the task's is not called. Those that
    save checkpoints (:attr:`Callback.saves_checkpoints`) run last, so their files hold every
    other callback's state after this epoch's update."""
    call_hook(ctx, hook, callbacks=after_reduction(ctx.active_callbacks), task_too=False)


def may_log(ctx: RankContext, hook: str) -> bool:
    """Whether ``hook`` may call ``self.log`` before the epoch's reduction: the task overrides
    it, or a callback that runs before the reduction does (and does not declare
    ``logs_metrics = False``). Looks at classes and the whole callback list, so it is the same
    on every rank."""
    if _overrides(ctx.task, hook, "GraphTask"):
        return True
    return any(getattr(cb, "logs_metrics", True) and _overrides(cb, hook, "Callback")
               for cb in before_reduction(ctx.callbacks))


def _overrides(obj: Any, hook: str, base: str) -> bool:
    found = getattr(obj, hook)
    return getattr(getattr(found, "__func__", found), "__qualname__", "") != f"{base}.{hook}"


def before_reduction(callbacks: List[Any]) -> List[Any]:
    return [cb for cb in callbacks if not cb.after_reduction and not _saves(cb)]


def after_reduction(callbacks: List[Any]) -> List[Any]:
    """The callbacks :func:`call_after_reduction` runs, in its order."""
    return ([cb for cb in callbacks if cb.after_reduction and not _saves(cb)]
            + [cb for cb in callbacks if _saves(cb)])


def _saves(cb: Any) -> bool:
    return bool(getattr(cb, "saves_checkpoints", False))


def build_model(ctx: RankContext) -> nn.Module:
    """The task's plain model on this rank's device (built here unless assigned in ``__init__``)."""
    task = ctx.task
    module = task.module
    if module is None:
        heartbeat.beat("configure_model")
        module = task.configure_model()
        if not isinstance(module, nn.Module):
            raise TypeError(f"{type(task).__name__}.configure_model() returned "
                            f"{type(module).__name__}: return a torch.nn.Module")
    elif ctx.state.launched:
        # Parameters that travelled to a spawned rank live in shared memory, so every
        # rank's optimizer would step the same storage (one SGD step moved a weight by twice
        # the update): own a copy.
        for tensor in list(module.parameters()) + list(module.buffers()):
            tensor.data = tensor.data.clone()
    module.to(ctx.state.device)
    task.model = module
    return module


@contextlib.contextmanager
def model_as(task: Any, model: nn.Module) -> Iterator[None]:
    """``task.model`` is ``model`` inside the block: the DDP wrapper during ``fit``, the
    plain model while evaluating (DDP's forward may broadcast buffers, which ranks with
    uneven batch counts would hang on)."""
    before = task.model
    task.model = model
    try:
        yield
    finally:
        task.model = before


def result(ctx: RankContext, with_weights: bool = False, **fields: Any) -> RunResult:
    """What this rank hands back (the caller keeps rank 0's)."""
    state = ctx.state
    weights = None
    if with_weights and state.launched:
        weights = {k: v.detach().cpu() for k, v in ctx.task.module.state_dict().items()}
    keep = getattr(state.logger, "state_dict", None)
    return RunResult(state=state.for_caller(), callback_states=callback_states(ctx.callbacks),
                     state_dict=weights, logger_states=keep() if callable(keep) else None, **fields)
