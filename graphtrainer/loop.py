"""What each rank runs: process group, model and DDP, the fit and evaluation loops.

All control decisions that could differ between ranks (stop training, which checkpoint
is best) are reduced or broadcast, so every rank runs the same number of epochs and
reaches every collective.
"""
from __future__ import annotations

import contextlib
import math
import sys
import warnings
from typing import Any, Dict, Iterable, Iterator, List, Optional, Tuple

import torch
from torch import nn
from torch.utils.data import DataLoader, IterableDataset
from torch.distributed.algorithms.join import Join
from torch.nn.parallel import DistributedDataParallel as DDP

from . import distributed as gdist
from . import heartbeat
from .checkpoint import _to_cpu, load_checkpoint, restore_training_state
from .seeding import seed_all, seed_epoch, warn_if_dgl_stream_moved
from .threads import set_threads
from .metrics import infer_batch_size
from .optim import parse_optimizers, step_schedulers
from .ddp import wrap
from .sampling import ShardedLoader, check_loader

STAGES = ("fit", "validate", "test", "predict")


def run_rank(info: gdist.RankInfo, trainer: Any, task: Any, stage: str, ckpt_path: Optional[str]) -> Dict[str, Any]:
    """Entry point of one rank for ``stage``; returns what the caller needs (from rank 0)."""
    if info.source != "launcher" and trainer.threads_per_proc:
        set_threads(trainer.threads_per_proc)  # launched ranks get theirs from the launcher
    device, backend = trainer._device_and_backend(info)
    if device.type == "cuda":
        try:
            torch.cuda.set_device(device)  # before any other CUDA work, so nccl uses this GPU
        except RuntimeError as err:
            if "forked subprocess" not in str(err):
                raise
            raise RuntimeError("this rank was forked from a process that had already used CUDA, so it "
                               "cannot use the GPU: use launcher='spawn', or keep CUDA calls out of the "
                               "code before fit") from err
    gdist.init_process_group(info, backend, trainer.timeout)
    trainer._attach(info, device, task, stage)
    try:
        warn_if_dgl_stream_moved(info.rank)
        seed_all(trainer.seed)  # model build; evaluation's samplers (fit reseeds every epoch)
        if stage == "fit":
            out = _fit(trainer, task, ckpt_path)
        else:
            out = _evaluate(trainer, task, stage, ckpt_path)
    except BaseException as err:
        for cb in trainer.callbacks:
            cb.on_exception(trainer, task, err)
        if trainer.logger is not None:
            trainer.logger.finalize("failed")
        raise  # no teardown of the group: peers may be stuck in a collective
    if trainer.logger is not None:
        trainer.logger.finalize("success")
    # The group is not torn down: a launched rank exits right after reporting (closing its
    # sockets), and tearing down first can block in gloo once a peer has exited; under
    # torchrun the group stays up for the process's next fit/test call.
    return out


def _call(trainer: Any, task: Any, hook: str, *args: Any, monitoring: Optional[bool] = None) -> None:
    """Callbacks' hook, then the task's. ``monitoring`` selects a subset of callbacks and skips the task."""
    heartbeat.beat(hook)
    for cb in trainer.callbacks:
        if monitoring is None or cb.monitoring == monitoring:
            getattr(cb, hook)(trainer, task, *args)
    if monitoring is not True:
        getattr(task, hook)(*args)


def _build_model(trainer: Any, task: Any) -> nn.Module:
    module = task.module
    if module is None:
        module = task.configure_model()
        if not isinstance(module, nn.Module):
            raise TypeError(f"{type(task).__name__}.configure_model() returned "
                            f"{type(module).__name__}: return a torch.nn.Module")
    elif trainer._launched:
        # Parameters that travelled to a spawned rank live in shared memory, so every
        # rank's optimizer would step the same storage (one SGD step moved a weight by twice
        # the update): own a copy.
        for tensor in list(module.parameters()) + list(module.buffers()):
            tensor.data = tensor.data.clone()
    module.to(trainer.device)
    task.model = module
    return module


def _fit(trainer: Any, task: Any, ckpt_path: Optional[str]) -> Dict[str, Any]:
    _call(trainer, task, "setup", "fit")
    module = _build_model(trainer, task)
    checkpoint = load_checkpoint(ckpt_path, module) if ckpt_path else None

    ddp: Optional[DDP] = None
    if gdist.is_distributed():
        ddp = wrap(module, trainer.device, trainer.ddp_kwargs)
        task.model = ddp
    optimizers, schedulers = parse_optimizers(task.configure_optimizers())
    trainer.optimizers, trainer.lr_schedulers = optimizers, schedulers
    if checkpoint is not None:
        restore_training_state(trainer, task, checkpoint)

    train_loader = task.train_dataloader()
    val_loader = _for_evaluation(task.val_dataloader())
    check_loader(train_loader, trainer.world_size)
    check_loader(val_loader, trainer.world_size, evaluation=True)
    trainer._has_val_loader = val_loader is not None
    _call(trainer, task, "on_fit_start")
    while trainer.current_epoch < trainer.max_epochs and not trainer.should_stop:
        epoch = trainer.current_epoch
        trainer._epoch_finished = trainer._validated_this_epoch = False
        heartbeat.set_epoch(epoch)
        seed_epoch(trainer.seed, trainer.rank, epoch)  # makes epoch-boundary resume exact
        _set_epoch(train_loader, epoch)
        _count_training_batches(trainer, train_loader)  # known to on_train_epoch_start (progress bar)
        _call(trainer, task, "on_train_epoch_start")
        uneven = ddp is not None and not _same_batch_count(trainer, train_loader)
        with (Join([ddp]) if uneven else contextlib.nullcontext()):
            _train_batches(trainer, task, ddp, train_loader)
            if uneven:
                heartbeat.waiting_from_now("Join (uneven inputs)")  # leaving Join waits for the others
        if uneven:
            _sync_after_join(trainer)
        _report_nonfinite(trainer)
        metrics = task._metrics.reduce()
        if val_loader is not None and (epoch + 1) % trainer.check_val_every_n_epoch == 0:
            metrics.update(_eval_epoch(trainer, task, "validation", val_loader, trainer.limit_val_batches)[0])
            trainer._validated_this_epoch = True
        trainer.callback_metrics.update(metrics)
        _call(trainer, task, "on_train_epoch_end", monitoring=False)
        trainer.callback_metrics.update(task._metrics.reduce())
        # Before the checkpointing callbacks, so a checkpoint holds the scheduler state the
        # next epoch uses (an exact resume needs it).
        step_schedulers(schedulers, "epoch", epoch + 1, trainer.callback_metrics)
        trainer._epoch_finished = True  # checkpoints written now resume at the next epoch
        _call(trainer, task, "on_train_epoch_end", monitoring=True)
        row = {"epoch": epoch, "step": trainer.global_step, **{k: trainer.callback_metrics[k]
               for k in sorted(trainer.callback_metrics)}}
        trainer.history.append(row)
        if trainer.logger is not None and trainer.rank == 0:
            trainer.logger.log_metrics(row, step=trainer.global_step)
        trainer.current_epoch = epoch + 1
        trainer._epoch_finished = False
        if 0 < trainer.max_steps <= trainer.global_step:
            trainer.should_stop = True
        # One rank wanting to stop stops all, at the same epoch.
        flag = torch.tensor([1.0 if trainer.should_stop else 0.0])
        trainer.should_stop = bool(gdist.all_reduce(flag, "max")[0] > 0)
        if trainer._after_epoch is not None:
            trainer._after_epoch(trainer, task)
    _call(trainer, task, "on_fit_end")
    _call(trainer, task, "teardown", "fit")
    task.model = module
    gdist.barrier()
    return trainer._result(task, include_state=True)


def _same_batch_count(trainer: Any, loader: Any) -> bool:
    """True when every rank will run as many batches this epoch, so ``Join`` (two extra
    all-reduces per step) is not needed. Collective.

    Only loaders whose length is exact are trusted (graphtrainer's, DGL's and torch's
    map-style ones); with any other iterable a wrong ``len`` would hang a rank, so the
    answer is then False on every rank.
    """
    return gdist.same_on_all_ranks(trainer.num_training_batches if _exact_len(loader) else None)


def _exact_len(loader: Any) -> bool:
    if isinstance(loader, ShardedLoader):
        return True
    dgl = sys.modules.get("dgl")
    if dgl is not None and isinstance(loader, dgl.dataloading.DataLoader):
        return True
    return isinstance(loader, DataLoader) and not isinstance(loader.dataset, IterableDataset)


def _sync_after_join(trainer: Any) -> None:
    """Give ranks that ran out of batches early the optimizer and scheduler state, and the
    step count, of the ranks that stepped longest. Collective.

    DDP's join hook re-syncs only the parameters; without this, an early rank's stale
    momentum or learning rate makes its parameters drift from the next step on.
    """
    steps = gdist.all_gather_tensor(torch.tensor([trainer.global_step])).tolist()
    if len(set(steps)) == 1:
        return
    # The rank DDP took the final parameters from: the highest of those still running last.
    src = max(range(len(steps)), key=lambda r: (steps[r], r))
    state = None
    if trainer.rank == src:
        state = (_to_cpu([opt.state_dict() for opt in trainer.optimizers]),
                 [cfg.scheduler.state_dict() for cfg in trainer.lr_schedulers])
    opt_states, sched_states = gdist.broadcast_object(state, src=src)
    if trainer.rank != src:
        for opt, opt_state in zip(trainer.optimizers, opt_states):
            opt.load_state_dict(opt_state)
        for cfg, sched_state in zip(trainer.lr_schedulers, sched_states):
            cfg.scheduler.load_state_dict(sched_state)
    trainer.global_step = steps[src]


def _set_epoch(loader: Any, epoch: int) -> None:
    for obj in (loader, getattr(loader, "sampler", None), getattr(loader, "batch_sampler", None)):
        if obj is not None and hasattr(obj, "set_epoch"):
            obj.set_epoch(epoch)
            return


def _for_evaluation(loader: Any) -> Any:
    if loader is not None and hasattr(loader, "for_evaluation"):
        loader.for_evaluation()
    return loader


def _limit(loader: Any, limit: Optional[float]) -> Optional[int]:
    """Batches to run: ``limit`` as a count (int) or a fraction (float) of ``len(loader)``."""
    if limit is None:
        return None
    if isinstance(limit, float) and limit <= 1.0:
        try:
            return int(math.floor(len(loader) * limit))
        except TypeError:
            raise ValueError("a fractional batch limit needs a loader with len()") from None
    return int(limit)


def _with_last(iterable: Iterable[Any], limit: Optional[int], place: str) -> Iterator[Tuple[int, Any, bool]]:
    """``(index, item, is_last)`` so accumulation can step on the final batch. Fetching a
    batch counts as being in ``place`` (sampling can hang too)."""
    if limit is not None and limit <= 0:
        return
    heartbeat.beat(place, 0)
    it = iter(iterable)
    try:
        current = next(it)
    except StopIteration:
        return
    idx = 0
    while True:
        if limit is not None and idx + 1 >= limit:
            yield idx, current, True
            return
        try:
            heartbeat.beat(place, idx + 1)
            nxt = next(it)
        except StopIteration:
            yield idx, current, True
            return
        yield idx, current, False
        current, idx = nxt, idx + 1


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


def _count_training_batches(trainer: Any, loader: Any) -> None:
    """``trainer.num_training_batches`` for this epoch (None when the loader has no len)."""
    limit = _limit(loader, trainer.limit_train_batches)
    try:
        n = len(loader)
        trainer.num_training_batches = n if limit is None else min(n, limit)
    except TypeError:
        trainer.num_training_batches = limit


def _train_batches(trainer: Any, task: Any, ddp: Optional[DDP], loader: Any) -> None:
    limit = _limit(loader, trainer.limit_train_batches)
    module = task.module
    acc = trainer.accumulate_grad_batches
    micro = 0
    for batch_idx, batch, is_last in _with_last(loader, limit, "the training loader"):
        batch = task.transfer_batch_to_device(batch, trainer.device)
        task._batch_size, task._step_hook = infer_batch_size(batch), "training_step"
        task._metrics.start_step()
        micro += 1
        stepping = micro % acc == 0 or is_last
        sync = ddp.no_sync() if (ddp is not None and not stepping) else contextlib.nullcontext()
        with sync, torch.autograd.set_detect_anomaly(trainer.detect_anomaly):
            heartbeat.beat("training_step", batch_idx)
            out = task.training_step(batch, batch_idx)
            loss = _loss_of(task, out)
            _check_finite(trainer, loss, batch_idx)
            # DDP all-reduces gradients during backward: a rank there waits on its peers.
            with heartbeat.waiting("backward") if ddp is not None and stepping else contextlib.nullcontext():
                (loss / acc if acc > 1 else loss).backward()
        if stepping:
            heartbeat.beat("optimizer step", batch_idx)
            micro = 0
            if trainer.gradient_clip_val:
                nn.utils.clip_grad_norm_(module.parameters(), trainer.gradient_clip_val)
            for opt in trainer.optimizers:
                opt.step()
            for opt in trainer.optimizers:
                opt.zero_grad(set_to_none=True)
            trainer.global_step += 1
            step_schedulers(trainer.lr_schedulers, "step", trainer.global_step, {})
        trainer.last_loss = loss.detach()
        _call(trainer, task, "on_train_batch_end", out, batch, batch_idx)
        if trainer.logger is not None and trainer.rank == 0 and stepping \
                and trainer.global_step % trainer.log_every_n_steps == 0:
            step_row = {f"{k}_step": float(v) for k, v in task._metrics.step_values.items()}
            step_row.update({"epoch": trainer.current_epoch, "step": trainer.global_step})
            trainer.logger.log_metrics(step_row, step=trainer.global_step)
        if 0 < trainer.max_steps <= trainer.global_step:
            break
    task._batch_size = task._step_hook = None


def _check_finite(trainer: Any, loss: torch.Tensor, batch_idx: int) -> None:
    """Stop at a non-finite loss with ``detect_anomaly``; otherwise note the first one on
    the device (no host sync per step) for :func:`_report_nonfinite`."""
    if trainer.detect_anomaly:
        if not bool(torch.isfinite(loss.detach())):
            raise FloatingPointError(
                f"rank {trainer.rank}: the training loss is {float(loss)} at epoch {trainer.current_epoch}, "
                f"batch {batch_idx}, step {trainer.global_step} (Trainer(detect_anomaly=True) stops at the first "
                "non-finite loss)")
        return
    if trainer._nonfinite_reported:
        return
    first = trainer._first_nonfinite
    if first is None:
        trainer._first_nonfinite = first = torch.full((3,), -1.0, dtype=torch.float64, device=loss.device)

    def scalar(value: float) -> torch.Tensor:  # a fill kernel, not a copy from the host
        return torch.full((), value, dtype=torch.float64, device=loss.device)

    value = loss.detach().double().reshape(())
    seen = torch.stack([scalar(trainer.global_step), value, scalar(batch_idx)])
    first.copy_(torch.where(~torch.isfinite(value) & (first[0] < 0), seen, first))


def _report_nonfinite(trainer: Any) -> None:
    """Warn once per run, from the rank concerned, about its first non-finite loss."""
    first = trainer._first_nonfinite
    if first is None or trainer._nonfinite_reported:
        return
    step, value, batch_idx = first.tolist()
    if step < 0:
        return
    trainer._nonfinite_reported = True
    warnings.warn(f"rank {trainer.rank}: the training loss was {value} at epoch {trainer.current_epoch}, batch "
                  f"{int(batch_idx)}, step {int(step)}; training went on (reported once). "
                  "Trainer(detect_anomaly=True) stops there instead, and EarlyStopping(check_finite=True) stops "
                  "on a non-finite monitored value.", RuntimeWarning, stacklevel=2)


def _eval_epoch(trainer: Any, task: Any, stage: str, loader: Iterable[Any],
                limit: Optional[float]) -> Tuple[Dict[str, float], List[Any]]:
    """Run ``{stage}_step`` over ``loader`` on the plain model; reduce exactly. Collective."""
    hook = {"validation": "validation", "test": "test", "predict": "predict"}[stage]
    module = task.module
    was_training = module.training
    wrapped = task.model
    task.model = module  # no DDP: its forward may broadcast buffers, which uneven ranks would hang on
    module.eval()
    outputs: List[Any] = []
    try:
        _call(trainer, task, f"on_{hook}_epoch_start")
        step = getattr(task, f"{hook}_step")
        with torch.no_grad():
            for batch_idx, batch, _ in _with_last(loader, _limit(loader, limit), f"the {hook} loader"):
                batch = task.transfer_batch_to_device(batch, trainer.device)
                task._batch_size, task._step_hook = infer_batch_size(batch), f"{hook}_step"
                heartbeat.beat(f"{hook}_step", batch_idx)
                out = step(batch, batch_idx)
                if stage == "predict":
                    outputs.append(out)
        task._batch_size = task._step_hook = None
        _call(trainer, task, f"on_{hook}_epoch_end")
        metrics = task._metrics.reduce()
    finally:
        task.model = wrapped
        module.train(was_training)
    return metrics, outputs


def _evaluate(trainer: Any, task: Any, stage: str, ckpt_path: Optional[str]) -> Dict[str, Any]:
    _call(trainer, task, "setup", stage)
    module = _build_model(trainer, task)
    if ckpt_path:
        load_checkpoint(ckpt_path, module)
    getter = {"validate": task.val_dataloader, "test": task.test_dataloader, "predict": task.predict_dataloader}[stage]
    loader = _for_evaluation(getter())
    check_loader(loader, trainer.world_size, evaluation=True)
    if loader is None:
        raise ValueError(f"Trainer.{stage} needs {type(task).__name__}."
                         f"{getter.__name__}() to return a loader; it returned None")
    hook = {"validate": "validation", "test": "test", "predict": "predict"}[stage]
    limit = {"validate": trainer.limit_val_batches, "test": trainer.limit_test_batches,
             "predict": None}[stage]
    metrics, outputs = _eval_epoch(trainer, task, hook, loader, limit)
    trainer.callback_metrics.update(metrics)
    result = trainer._result(task, include_state=False)
    result["metrics"] = metrics
    if stage == "predict":
        result["predictions"] = _gather_predictions(loader, outputs, trainer.device)
    _call(trainer, task, "teardown", stage)
    gdist.barrier()
    return result


def _gather_predictions(loader: Any, outputs: List[Any], device: torch.device) -> torch.Tensor:
    """One row per id, in the order the loader was given the ids. Collective."""
    if outputs:
        if not all(isinstance(o, torch.Tensor) for o in outputs):
            raise ValueError("predict_step must return a tensor with one row per seed (node, edge or graph)")
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
    ids = getattr(loader, "ids", None)
    world = gdist.get_world_size()
    if ids is None or world == 1:
        return gathered
    n = ids.numel()
    if gathered.shape[0] != n:
        raise ValueError(f"predict_step returned {gathered.shape[0]} rows for {n} ids: return one row per seed")
    # A ShardedLoader's evaluation split gives rank r the positions r, r + world, ...
    positions = torch.cat([torch.arange(n)[r::world] for r in range(world)])
    ordered = torch.empty_like(gathered)
    ordered[positions] = gathered
    return ordered
