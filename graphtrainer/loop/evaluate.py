"""Running the model over a loader without training it: validation inside ``fit``, and the
``validate``/``test``/``predict`` entry points."""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import torch

from .. import comm as gdist
from .. import heartbeat
from .._moved import Metrics
from ..checkpoint.content import load_checkpoint
from ..state import RunResult
from .batches import batch_limit, batch_transfer, check_loaders, for_evaluation, with_last
from .context import RankContext
from .hooks import build_model, call_hook, model_as, result, used_hooks
from .precision import Precision
from .stages import Stage


def eval_epoch(ctx: RankContext, stage: Stage, loader: Any) -> Tuple[Dict[str, float], List[Any]]:
    """``stage``'s step over ``loader`` in eval mode under ``no_grad``; reduced metrics (and
    the outputs, for ``predict``). Collective.

    The plain model runs, never DDP: its forward may broadcast buffers, which ranks with
    uneven batch counts would hang on.
    """
    task, state, log = ctx.task, ctx.state, ctx.step_log
    module = task.module
    was_training = module.training
    module.eval()
    outputs: List[Any] = []
    step = stage.step(task)
    precision = state.precision or Precision("32", state.device)
    start, end = f"on_{stage.hook}_batch_start", f"on_{stage.hook}_batch_end"
    hooks = used_hooks(ctx, (start, end))
    try:
        with model_as(task, module):
            call_hook(ctx, f"on_{stage.hook}_epoch_start")
            with torch.no_grad():
                limit = batch_limit(loader, stage.limit(ctx.config))
                transfer = batch_transfer(task, state.device, ctx.config)
                for batch_idx, batch, _ in with_last(transfer.batches(loader), limit, f"the {stage.hook} loader"):
                    batch = transfer.to_device(batch)
                    log.begin_step(f"{stage.hook}_step", batch)
                    if start in hooks:
                        call_hook(ctx, start, batch, batch_idx)
                    heartbeat.beat(f"{stage.hook}_step", batch_idx)
                    with precision.autocast():
                        out = step(batch, batch_idx)
                    if end in hooks:
                        call_hook(ctx, end, out, batch, batch_idx)
                    if stage.keeps_outputs:
                        outputs.append(out)
            log.end_steps()
            call_hook(ctx, f"on_{stage.hook}_epoch_end")
            metrics = log.metrics.reduce(stage.hook)
    finally:
        module.train(was_training)
    return metrics, outputs


def run_evaluation(ctx: RankContext, stage: Stage, ckpt_path: Optional[str]) -> RunResult:
    """``Trainer.validate``/``test``/``predict`` on one rank."""
    task, state = ctx.task, ctx.state
    call_hook(ctx, "setup", stage.name)
    module = build_model(ctx)
    if ckpt_path:
        load_checkpoint(ckpt_path, module)
    heartbeat.beat(stage.loader_method)
    loader = for_evaluation(stage.loader(task))
    if loader is None:
        raise ValueError(f"Trainer.{stage.name} needs {type(task).__name__}.{stage.loader_method}() to "
                         "return a loader; it returned None")
    check_loaders(state, evaluation=loader, config=ctx.config)
    metrics, outputs = eval_epoch(ctx, stage, loader)
    state.callback_metrics.update(metrics)
    limited = stage.limit(ctx.config) is not None
    predictions = gather_predictions(loader, outputs, state.device, limited) if stage.keeps_outputs else None
    out = result(ctx, metrics=Metrics(metrics), predictions=predictions)  # old metric names still read
    call_hook(ctx, "teardown", stage.name)
    gdist.barrier()
    return out


def gather_predictions(loader: Any, outputs: List[Any], device: torch.device, limited: bool = False) -> torch.Tensor:
    """One row per id, in the order the loader was given the ids (with ``limited``, for the
    ids the limited batches covered, still in that order). Collective."""
    if outputs:
        bad = next((o for o in outputs if not isinstance(o, torch.Tensor)), None)
        if bad is not None:
            raise ValueError(f"predict_step must return a tensor with one row per seed (node, edge or graph), "
                             f"got {type(bad).__name__}: return one tensor (e.g. torch.cat of its parts)")
        local = torch.cat([o.detach() for o in outputs])
    else:
        local = None
    # Ranks with no batch still take part; they need the row shape, so share it first.
    shapes = gdist.all_gather_object(None if local is None else (tuple(local.shape[1:]), str(local.dtype)))
    known = next((s for s in shapes if s is not None), None)
    if known is None:
        return torch.empty(0)
    if local is None:
        local = torch.empty((0,) + known[0], dtype=getattr(torch, known[1].split(".")[-1]), device=device)
    gathered = gdist.all_gather_tensor(local).cpu()
    keys = loader.prediction_keys() if hasattr(loader, "prediction_keys") else None
    if keys is not None:  # the same on every rank: rows go in the order of their keys (node ids)
        return gathered[torch.argsort(gdist.all_gather_tensor(keys[: local.shape[0]]).cpu())]
    ids = getattr(loader, "ids", None)
    world = gdist.get_world_size()
    if ids is None or world == 1:
        return gathered
    n = ids.numel()
    counts = [int(c) for c in gdist.all_gather_tensor(torch.tensor([local.shape[0]]))]
    shares = [torch.arange(n)[r::world] for r in range(world)]
    if any(c > s.numel() for c, s in zip(counts, shares)) or (sum(counts) != n and not limited):
        raise ValueError(f"predict_step returned {gathered.shape[0]} rows for {n} ids: return one row per seed")
    # A ShardedLoader's evaluation split gives rank r the positions r, r + world, ...; with
    # limit_predict_batches each rank covered the start of its share.
    positions = torch.cat([s[:c] for s, c in zip(shares, counts)])
    return gathered[torch.argsort(positions)]
