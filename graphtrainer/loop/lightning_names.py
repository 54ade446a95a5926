"""Lightning hooks and attributes that graphtrainer never calls or reads. A task or callback
ported from Lightning that defines one would otherwise be ignored without a word; the trainer
warns about each, naming graphtrainer's way (:func:`check_lightning_names`)."""
from __future__ import annotations

import warnings
from typing import Any, Dict, List, Sequence

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
