"""Checkpoint format: what a checkpoint holds, and resuming from one.

A checkpoint is a dict of plain values and tensors, loadable with
``torch.load(path, map_location="cpu", weights_only=True)``:

====================== ==============================================================
``format_version``     :data:`FORMAT_VERSION`
``graphtrainer``       the library version that wrote it
``state_dict``         the plain model's state dict (no ``module.`` prefix)
``optimizer_states``   one per optimizer
``lr_scheduler_states`` one per scheduler
``epoch``              the epoch it was written in (0-based, as in its file name)
``epoch_finished``     True when written after that epoch's end: resuming starts at
                       ``epoch + 1``; else that epoch restarts
``global_step``        optimizer steps taken
``callbacks``          ``{callback.state_key: callback.state_dict()}``
``hyper_parameters``   ``task.hparams``
``world_size``         ranks that wrote it
``precision``          the Trainer's precision; ``grad_scaler``: the float16 scaler's state
``rng_states``         per rank: python, numpy and torch generator states
``loggers``            (optional) rank 0's loggers' ``state_dict()`` (an external run's id)
``weights_only``       only in a weights-only checkpoint (``ModelCheckpoint(save_weights_only=True)``,
                       ``trainer.save_checkpoint(path, weights_only=True)``): True; it holds
                       ``state_dict``, ``epoch``, ``epoch_finished``, ``global_step``,
                       ``hyper_parameters`` and the versions only, so it evaluates but never resumes
``batches_done_in_epoch`` only in a checkpoint written when a stop signal preempted the
                       fit (:mod:`graphtrainer.loop.preemption`), ``max_steps`` or an agreed stop
                       ended ``epoch`` early, after a mid-epoch validation, or at a step save
                       (``ModelCheckpoint(every_n_train_steps=N)``) between batches (then
                       ``epoch_finished`` is False): batches of it trained;
                       resuming skips them and restores ``rng_states``, so the resumed run
                       equals one never stopped
====================== ==============================================================

Resuming from an epoch end is exact (every epoch reseeds from ``(seed, rank, epoch)``); from
a ``trainer.save_checkpoint`` in a step hook it restarts that epoch with the saved weights.
Files are written atomically and verified by :mod:`graphtrainer.checkpoint.file`.
"""
from __future__ import annotations

import os
import random
import warnings
from typing import Any, Dict, List, Optional

import numpy as np
import torch
from torch import nn

from .. import comm as gdist
from .. import heartbeat
from .._version import __version__
from ..state import RunView, callback_states
from .file import CheckpointError, atomic_save, read_verified

#: 2: ``epoch`` is the epoch written in, with ``epoch_finished`` (1: epochs completed).
FORMAT_VERSION = 2

__all__ = ["CheckpointError", "FORMAT_VERSION", "atomic_save", "build_checkpoint", "check_resumable",
           "check_resumable_file", "load_checkpoint", "read_checkpoint", "restore_training_state", "save_checkpoint"]


def rng_state() -> Dict[str, Any]:
    """This process's generator states as weights-only-loadable values."""
    np_state = np.random.get_state()
    py_state = random.getstate()
    return {
        "python": [py_state[0], list(py_state[1]), py_state[2]],
        "numpy": [np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), int(np_state[2]),
                  int(np_state[3]), float(np_state[4])],
        "torch": torch.get_rng_state(),
    }


def set_rng_state(state: Dict[str, Any]) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])


def build_checkpoint(trainer: RunView, task: Any, extra: Optional[Dict[str, Any]] = None,
                     weights_only: bool = False) -> Optional[Dict[str, Any]]:
    """The checkpoint dict (with ``extra``) on rank 0, None elsewhere. Must be called on all processes
    (with the same ``weights_only``: a full checkpoint gathers every rank's RNG states)."""
    if weights_only:
        return _weights_only(trainer, task, extra) if trainer.rank == 0 else None
    state = trainer.state
    rngs = gdist.all_gather_object(state.rng_at_stop or rng_state())
    if trainer.rank != 0:
        return None
    if state.batches_done_in_epoch:  # written mid-epoch: resume at the next batch
        extra = {"batches_done_in_epoch": state.batches_done_in_epoch, **(extra or {})}
    ckpt: Dict[str, Any] = {
        **_model_part(trainer, task),
        "optimizer_states": [_to_cpu(opt.state_dict()) for opt in trainer.optimizers],
        "lr_scheduler_states": [cfg.scheduler.state_dict() for cfg in trainer.lr_schedulers],
        # Only callbacks with something to restore (a progress bar or summary has nothing).
        "callbacks": {key: value for key, value in callback_states(trainer.callbacks).items() if value},
        "world_size": trainer.world_size,
        "precision": trainer.state.precision.name if trainer.state.precision is not None else "32",
        "grad_scaler": trainer.state.precision.state_dict() if trainer.state.precision is not None else None,
        "rng_states": rngs,
        **(extra or {}),
    }
    if callable(getattr(trainer.logger, "state_dict", None)):  # a resumed fit continues the same run
        ckpt["loggers"] = trainer.logger.state_dict()
    for cb in trainer.callbacks:
        cb.on_save_checkpoint(trainer, task, ckpt)
    task.on_save_checkpoint(ckpt)
    return ckpt


def _model_part(trainer: RunView, task: Any) -> Dict[str, Any]:
    """What every checkpoint holds, a weights-only one included."""
    return {
        "format_version": FORMAT_VERSION,
        "graphtrainer": __version__,
        "state_dict": {k: v.detach().cpu() for k, v in task.module.state_dict().items()},
        "epoch": trainer.current_epoch,
        "epoch_finished": bool(trainer.state.epoch_finished),
        "global_step": trainer.global_step,
        "hyper_parameters": dict(getattr(task, "hparams", {})),
    }


def _weights_only(trainer: RunView, task: Any, extra: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    # As Lightning's: no optimizer, scheduler, callback or RNG state, and only the task's hook runs.
    ckpt = {**_model_part(trainer, task), "weights_only": True, **(extra or {})}
    task.on_save_checkpoint(ckpt)
    return ckpt


def _to_cpu(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, dict):
        return {k: _to_cpu(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_to_cpu(v) for v in value)
    return value


def save_checkpoint(trainer: RunView, task: Any, path: str | os.PathLike,
                    extra: Optional[Dict[str, Any]] = None, weights_only: bool = False) -> None:
    """Rank 0 writes ``path`` atomically, then all ranks wait. Must be called on all processes.
    ``weights_only``: only the model's weights and counters (see the module's table)."""
    heartbeat.beat("save_checkpoint")  # (a long save is no hang between batch boundaries)
    ckpt = build_checkpoint(trainer, task, extra, weights_only)
    if ckpt is not None:
        atomic_save(ckpt, path)
    gdist.barrier()


def read_checkpoint(path: str | os.PathLike) -> Dict[str, Any]:
    """Verify and load a checkpoint on CPU without running code from it."""
    ckpt = read_verified(path)
    if not isinstance(ckpt, dict) or "state_dict" not in ckpt:
        raise CheckpointError(f"checkpoint {path} has no 'state_dict': not a graphtrainer checkpoint")
    if ckpt.get("format_version", FORMAT_VERSION) > FORMAT_VERSION:
        raise CheckpointError(f"checkpoint {path} has format {ckpt['format_version']}, newer than this "
                              f"graphtrainer reads ({FORMAT_VERSION}): upgrade graphtrainer")
    ckpt["_path"] = str(path)
    return ckpt


def resume_epoch(ckpt: Dict[str, Any]) -> int:
    """The epoch a run resumed from ``ckpt`` starts at."""
    epoch = int(ckpt.get("epoch", 0))
    if ckpt.get("format_version", 1) < 2:  # format 1 stored epochs completed
        return epoch
    return epoch + (1 if ckpt.get("epoch_finished") else 0)


def load_checkpoint(path: str | os.PathLike, module: nn.Module) -> Dict[str, Any]:
    """Read ``path`` and load its weights into ``module`` (strict)."""
    ckpt = read_checkpoint(path)
    state = ckpt["state_dict"]
    if state and all(k.startswith("module.") for k in state):
        state = {k[len("module."):]: v for k, v in state.items()}
    own = module.state_dict()
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    if missing or unexpected:
        raise CheckpointError(f"checkpoint {path} does not fit {type(module).__name__}: "
                              f"missing keys {missing}, unexpected keys {unexpected}")
    bad = [k for k in own if tuple(own[k].shape) != tuple(state[k].shape)]
    if bad:
        shapes = ", ".join(f"{k}: checkpoint {tuple(state[k].shape)} vs model {tuple(own[k].shape)}" for k in bad)
        raise CheckpointError(f"checkpoint {path} does not fit {type(module).__name__}: shape mismatch: {shapes}")
    module.load_state_dict(state)
    return ckpt


def check_resumable(ckpt: Dict[str, Any]) -> None:
    """Refuse to resume training from a checkpoint that holds only the model's weights (as Lightning)."""
    if ckpt.get("weights_only") or "optimizer_states" not in ckpt:
        path = ckpt.get("_path", "the checkpoint")
        raise CheckpointError(
            f"checkpoint {path} holds only the model's weights (ModelCheckpoint(save_weights_only=True) writes "
            "such files), not the optimizer, scheduler, counter and callback states that resuming a fit needs. "
            "Pass it to validate/test/predict(ckpt_path=...); resume from a full checkpoint (one written without "
            "save_weights_only); or, to train on from these weights, load them into the task's model "
            "(torch.load(path, weights_only=True)['state_dict']) and call fit without ckpt_path")


def check_resumable_file(path: Optional[str | os.PathLike]) -> Optional[str | os.PathLike]:
    """``path`` (None: a fresh fit), once :func:`check_resumable` took it: called by ``fit`` in the calling
    process, so a weights-only file is refused before any rank starts (not as every rank's failure). Maps
    the file rather than reading it; one that does not load is left to the ranks' verified read, which
    names what is wrong with it."""
    if path is None:
        return None
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # noqa: BLE001 - damaged or foreign: read_verified says why, in the ranks
        return path
    if isinstance(ckpt, dict) and "state_dict" in ckpt:
        check_resumable({**ckpt, "_path": str(path)})
    return path


def restore_training_state(trainer: RunView, task: Any, ckpt: Dict[str, Any]) -> None:
    """Optimizers, schedulers, counters, callbacks and RNG from ``ckpt`` (on every rank)."""
    check_resumable(ckpt)
    path = ckpt.get("_path", "checkpoint")
    opt_states: List[Any] = ckpt.get("optimizer_states", [])
    if len(opt_states) != len(trainer.optimizers):
        raise CheckpointError(f"{path} holds {len(opt_states)} optimizer states but "
                              f"configure_optimizers() made {len(trainer.optimizers)}")
    for opt, state in zip(trainer.optimizers, opt_states):
        opt.load_state_dict(state)
    for cfg, state in zip(trainer.lr_schedulers, ckpt.get("lr_scheduler_states", [])):
        cfg.scheduler.load_state_dict(state)
    if trainer.state.precision is not None:
        trainer.state.precision.load_state_dict(ckpt.get("grad_scaler"))
    trainer.state.current_epoch = resume_epoch(ckpt)
    trainer.state.global_step = int(ckpt.get("global_step", 0))
    states = ckpt.get("callbacks", {})
    for cb in trainer.callbacks:
        if cb.state_key in states:
            cb.load_state_dict(states[cb.state_key])
    if ckpt.get("loggers") and callable(getattr(trainer.logger, "load_state_dict", None)):
        trainer.logger.load_state_dict(ckpt["loggers"])  # rank 0 only holds a logger
    saved_world = ckpt.get("world_size", trainer.world_size)
    rngs = ckpt.get("rng_states") or []
    if saved_world == trainer.world_size and len(rngs) == trainer.world_size:
        set_rng_state(rngs[trainer.rank])
    elif trainer.rank == 0:
        warnings.warn(f"{path} was written by {saved_world} ranks and is resumed on {trainer.world_size}: "
                      "per-rank RNG states cannot carry over (each epoch reseeds from the trainer's seed, "
                      "so epoch-boundary resumes are unaffected); model, optimizer, scheduler, counters "
                      "and callback states were restored", stacklevel=2)
    for cb in trainer.callbacks:
        cb.on_load_checkpoint(trainer, task, ckpt)
    task.on_load_checkpoint(ckpt)
