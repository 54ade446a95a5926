"""Lightning hooks and attributes that graphtrainer never calls or reads. A task or callback
ported from Lightning that defines one would otherwise be ignored without a word; the trainer
warns about each, naming graphtrainer's way (:func:`check_lightning_names`)."""
from __future__ import annotations

import warnings
from typing import Any, Dict, List, Optional, Sequence

_OUTPUTS = "it takes no outputs: keep what you need in {step} or on_{stage}_batch_end"
_NO_LOOP = ("graphtrainer steps the optimizers itself: use on_before_optimizer_step / on_before_zero_grad, "
            "Trainer(gradient_clip_val=..., accumulate_grad_batches=...), and configure_optimizers' "
            "lr_scheduler dict (interval, frequency, monitor)")
_ONE_EPOCH = "on_{stage}_epoch_{end}(): graphtrainer runs one evaluation epoch per {stage} run, so they coincide"

#: name -> graphtrainer's way. Hooks graphtrainer has (on_train_start, on_after_backward, ...) are not here.
NOT_CALLED: Dict[str, str] = {
    "training_epoch_end": "on_train_epoch_end(); " + _OUTPUTS.format(step="training_step", stage="train"),
    "validation_epoch_end": "on_validation_epoch_end(); " + _OUTPUTS.format(step="validation_step",
                                                                            stage="validation"),
    "test_epoch_end": "on_test_epoch_end(); " + _OUTPUTS.format(step="test_step", stage="test"),
    "on_epoch_start": "on_train_epoch_start() or on_validation_epoch_start()",
    "on_epoch_end": "on_train_epoch_end() or on_validation_epoch_end()",
    "on_batch_start": "on_train_batch_start(batch, batch_idx)",
    "on_batch_end": "on_train_batch_end(outputs, batch, batch_idx)",
    **{f"on_{stage}_{end}": _ONE_EPOCH.format(stage=stage, end=end)
       for stage in ("validation", "test", "predict") for end in ("start", "end")},
    "on_sanity_check_start": "nothing: graphtrainer runs no sanity-check validation before training",
    "on_sanity_check_end": "nothing: graphtrainer runs no sanity-check validation before training",
    "on_before_batch_transfer": "transfer_batch_to_device(batch, device): override it and call super()",
    "on_after_batch_transfer": "transfer_batch_to_device(batch, device): override it and call super()",
    "optimizer_step": _NO_LOOP,
    "optimizer_zero_grad": _NO_LOOP,
    "backward": _NO_LOOP,
    "lr_scheduler_step": _NO_LOOP,
    "configure_gradient_clipping": _NO_LOOP,
    "configure_callbacks": "Trainer(callbacks=[...])",
    **{f"on_{stage}_model_{mode}": "nothing: evaluation puts the model in eval mode and back itself"
       for stage in ("validation", "test", "predict") for mode in ("eval", "train")},
    "on_init_start": "__init__ or setup(stage)",
    "on_init_end": "__init__ or setup(stage)",
    "on_pretrain_routine_start": "setup('fit') or on_fit_start()",
    "on_pretrain_routine_end": "on_fit_start() or on_train_start()",
}


def lightning_only(obj: Any) -> List[str]:
    """The names of :data:`NOT_CALLED` that ``obj``'s class defines as methods."""
    return [name for name in NOT_CALLED if callable(getattr(type(obj), name, None))]


def check_lightning_names(task: Any, callbacks: Sequence[Any], warn: bool = True) -> None:
    """Refuse manual optimization; warn (``warn``: on rank 0 only) about each Lightning hook of
    ``task`` and ``callbacks`` that graphtrainer never calls, with graphtrainer's way."""
    if getattr(task, "automatic_optimization", True) is False:
        raise ValueError(f"{type(task).__name__}.automatic_optimization is False, but graphtrainer has no manual "
                         "optimization: return the loss from training_step and the trainer runs backward and "
                         "steps the optimizers (hooks: on_before_backward, on_after_backward, "
                         "on_before_optimizer_step)")
    if not warn:
        return
    for obj in (task, *callbacks):
        for name in lightning_only(obj):
            warnings.warn(f"{type(obj).__name__}.{name} is a Lightning hook that graphtrainer never calls; "
                          f"use {NOT_CALLED[name]}", UserWarning, stacklevel=4)


#: Names ``self.log`` refuses: the history's and metrics.csv's own columns, and checkpoint names' fields.
RESERVED_LOG_NAMES = ("epoch", "step")
_EXACT = "every logged value is reduced exactly over all ranks at each epoch's end"
#: Lightning's ``self.log`` options graphtrainer does not take, with its way.
_LOG_OPTIONS: Dict[str, str] = {
    "on_step": "training values are logged per step (as name_step, every log_every_n_steps) and per epoch; "
               "drop on_step",
    "on_epoch": "every logged value has an epoch value; drop on_epoch",
    "rank_zero_only": f"{_EXACT}, so every rank must log the name; drop rank_zero_only",
    "sync_dist_group": f"{_EXACT} (the whole job); drop sync_dist_group",
    "logger": "every logged value goes to the logger and the history; drop logger",
    "add_dataloader_idx": "evaluation has one loader per stage; drop add_dataloader_idx",
    "enable_graph": "logged tensors are detached; drop enable_graph",
    "metric_attribute": "a torchmetrics object is found by itself; drop metric_attribute",
}


def check_log_call(name: str, options: Dict[str, Any]) -> None:
    """Refuse a reserved ``name`` and the Lightning ``self.log`` options graphtrainer does not
    take, naming its way. ``sync_dist`` (any) and ``on_epoch=True`` are accepted and change
    nothing: the reduction over ranks is always exact, and every value has an epoch value."""
    if name in RESERVED_LOG_NAMES:
        raise ValueError(f"self.log({name!r}, ...): {name!r} is reserved for the trainer's own count (the history's "
                         f"and metrics.csv's {name!r} column, checkpoint names): log it as e.g. 'my_{name}'")
    for option, value in options.items():
        if option == "sync_dist" or (option == "on_epoch" and value is True):
            continue
        way = _LOG_OPTIONS.get(option)
        if way is None:
            raise TypeError(f"self.log() got an unexpected keyword argument {option!r}; it takes name, value, "
                            "batch_size, prog_bar, reduce_fx (and Lightning's sync_dist, which changes nothing)")
        raise TypeError(f"self.log({name!r}, ..., {option}={value!r}) is Lightning's; graphtrainer: {way}")


#: Lightning's ``Trainer`` arguments graphtrainer does not take, with its way.
_TRAINER_OPTIONS: Dict[str, str] = {
    "accelerator": "gpus=N (one rank per GPU) or num_procs=N (CPU ranks)",
    "devices": "gpus=N or gpus=[0, 1] (GPUs), or num_procs=N (CPU ranks)",
    "strategy": "every run is DDP; launcher='fork', 'spawn' or 'forkserver' chooses how ranks start",
    "num_nodes": "start one job per machine with torchrun or Slurm (docs/launching-and-multi-node.md)",
    "enable_checkpointing": "checkpoints are written by ModelCheckpoint callbacks only (none by default): "
                            "callbacks=[ModelCheckpoint(...)]",
    "enable_progress_bar": "progress_bar=False",
    "num_sanity_val_steps": "nothing: graphtrainer runs no sanity-check validation before training",
    "sync_batchnorm": "torch.nn.SyncBatchNorm.convert_sync_batchnorm(model) in configure_model()",
    "benchmark": "torch.backends.cudnn.benchmark = True in setup()",
    "reload_dataloaders_every_n_epochs": "loaders are made once per fit and reshuffled every epoch by set_epoch",
    "use_distributed_sampler": "graphtrainer's loaders split ids between ranks themselves",
}


def lightning_trainer_way(name: str) -> Optional[str]:
    """graphtrainer's way for Lightning's ``Trainer`` argument ``name``; None if it is not one."""
    return _TRAINER_OPTIONS.get(name)


def check_trainer_options(options: Dict[str, Any]) -> None:
    """A ``TypeError`` for keyword arguments ``Trainer`` does not take, naming graphtrainer's way
    for Lightning's."""
    for name, value in options.items():
        way = _TRAINER_OPTIONS.get(name)
        if way is None:
            raise TypeError(f"Trainer() got an unexpected keyword argument {name!r} (docs/lightning-habits.md maps "
                            "Lightning's arguments)")
        raise TypeError(f"Trainer({name}={value!r}) is Lightning's; graphtrainer: {way}")
