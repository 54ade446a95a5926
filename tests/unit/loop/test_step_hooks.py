"""What the per-step hooks see (gradients, the loss given to backward, clipping, accumulation),
logging from them, Lightning's rank names on ``trainer``, and the refusals and warnings for
Lightning habits graphtrainer does not have. Hook order is tested in test_engine_hooks.py."""
from __future__ import annotations

import math
import warnings
from typing import Any, Dict, List

import pytest
import torch

from graphtrainer import Callback, Trainer
from graphtrainer.loop.hooks import PER_BATCH_HOOKS, used_hooks
from graphtrainer.loop.lightning_names import NOT_CALLED, check_lightning_names

from tasks import RegressionTask


class GradientWatcher(Callback):
    """Records, per optimizer step, the gradient norm each hook saw, and the losses given to backward."""

    def __init__(self) -> None:
        self.losses: List[float] = []
        self.after_backward: List[float] = []
        self.before_step: List[float] = []
        self.before_zero: List[float] = []
        self.ranks: List[Any] = []

    @staticmethod
    def _norm(task: Any) -> float:
        grads = [p.grad for p in task.module.parameters() if p.grad is not None]
        return float(torch.norm(torch.stack([g.norm() for g in grads]))) if grads else float("nan")

    def on_train_batch_start(self, trainer: Any, task: Any, batch: Any, batch_idx: int) -> None:
        assert all(p.grad is None for p in task.module.parameters()) or batch_idx % 2 == 1

    def on_before_backward(self, trainer: Any, task: Any, loss: torch.Tensor) -> None:
        self.losses.append(float(loss))

    def on_after_backward(self, trainer: Any, task: Any) -> None:
        self.after_backward.append(self._norm(task))

    def on_before_optimizer_step(self, trainer: Any, task: Any, optimizer: torch.optim.Optimizer) -> None:
        assert optimizer is trainer.optimizers[0]
        self.before_step.append(self._norm(task))

    def on_before_zero_grad(self, trainer: Any, task: Any, optimizer: torch.optim.Optimizer) -> None:
        self.before_zero.append(self._norm(task))
        self.ranks.append((trainer.global_rank, trainer.local_rank, trainer.is_global_zero))


class LoggingTask(RegressionTask):
    """Logs the gradient norm from ``on_after_backward``, as Lightning users do."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(scheduler=None, validate=False, **kwargs)
        self.train_losses: List[float] = []

    def training_step(self, idx: torch.Tensor, batch_idx: int) -> torch.Tensor:
        loss = super().training_step(idx, batch_idx)
        self.train_losses.append(float(loss))
        return loss

    def on_after_backward(self) -> None:
        grads = [p.grad.norm() for p in self.module.parameters() if p.grad is not None]
        self.log("grad_norm", torch.norm(torch.stack(grads)))


def test_step_hooks_see_the_gradients_accumulated_and_unclipped(root_dir):
    watcher = GradientWatcher()
    task = LoggingTask(n=32, batch_size=8, scale=20.0)
    trainer = Trainer(max_epochs=1, accumulate_grad_batches=2, gradient_clip_val=0.01, progress_bar=False,
                      enable_model_summary=False, default_root_dir=root_dir, callbacks=[watcher])
    trainer.fit(task)
    # 4 batches: backward per batch, one optimizer step per 2 batches.
    assert len(watcher.losses) == len(watcher.after_backward) == 4
    assert len(watcher.before_step) == len(watcher.before_zero) == 2
    # The loss given to backward is the step's loss divided for accumulation.
    assert watcher.losses == pytest.approx([v / 2 for v in task.train_losses])
    # The second batch's backward adds to the first's gradients; the step sees them all, unclipped
    # (clipping comes after the hook), and zero_grad comes after the clipped step.
    assert watcher.before_step == pytest.approx([watcher.after_backward[1], watcher.after_backward[3]])
    assert min(watcher.before_step) > 0.01
    assert watcher.before_zero == pytest.approx([0.01, 0.01], rel=1e-3)
    assert watcher.ranks == [(0, 0, True)] * 2
    # self.log from on_after_backward reaches the epoch's metrics.
    assert math.isfinite(trainer.history[-1]["grad_norm"]) and trainer.history[-1]["grad_norm"] > 0


class RankNames(Callback):
    def on_train_epoch_end(self, trainer: Any, task: Any) -> None:
        task.log("is_zero", float(trainer.is_global_zero), reduce_fx="sum")
        task.log("rank_sum", float(trainer.global_rank + trainer.local_rank), reduce_fx="sum")


@pytest.mark.timeout(90)
def test_lightning_rank_names_on_two_ranks(root_dir):
    trainer = Trainer(num_procs=2, launcher="fork", max_epochs=1, progress_bar=False, enable_model_summary=False,
                      default_root_dir=root_dir, callbacks=[RankNames()])
    trainer.fit(RegressionTask(n=32, scheduler=None, validate=False))
    assert trainer.history[-1]["is_zero"] == 1.0
    assert trainer.history[-1]["rank_sum"] == 2.0  # (0 + 0) + (1 + 1)


def test_per_batch_hooks_are_called_only_where_overridden(root_dir):
    class Plain(Callback):
        pass

    trainer = Trainer(max_epochs=1, progress_bar=False, default_root_dir=root_dir, callbacks=[Plain()])
    ctx = trainer._context(RegressionTask(n=16))
    assert used_hooks(ctx, PER_BATCH_HOOKS) == frozenset()
    trainer = Trainer(max_epochs=1, progress_bar=False, default_root_dir=root_dir, callbacks=[GradientWatcher()])
    assert used_hooks(trainer._context(LoggingTask()), PER_BATCH_HOOKS) == {
        "on_train_batch_start", "on_before_backward", "on_after_backward", "on_before_optimizer_step",
        "on_before_zero_grad"}


class PortedTask(RegressionTask):
    """Hooks a Lightning 1.x user might bring along."""

    def training_epoch_end(self, outputs: Any) -> None:
        raise AssertionError("never called")

    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        raise AssertionError("never called")


class PortedCallback(Callback):
    def on_validation_start(self, trainer: Any, task: Any) -> None:
        raise AssertionError("never called")


def test_lightning_hooks_that_are_never_called_are_named_with_the_way(root_dir):
    trainer = Trainer(max_epochs=1, progress_bar=False, enable_model_summary=False, default_root_dir=root_dir,
                      callbacks=[PortedCallback()])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(PortedTask(n=16, scheduler=None))
    said = [str(w.message) for w in caught if "Lightning hook" in str(w.message)]
    assert len(said) == 3
    assert any("PortedTask.training_epoch_end" in s and "on_train_epoch_end()" in s for s in said)
    assert any("PortedTask.on_before_batch_transfer" in s and "transfer_batch_to_device" in s for s in said)
    assert any("PortedCallback.on_validation_start" in s and "on_validation_epoch_start()" in s for s in said)
    assert [w.filename for w in caught if "Lightning hook" in str(w.message)] == [__file__] * 3


def test_no_warning_for_hooks_graphtrainer_calls():
    assert check_lightning_names(LoggingTask(), [GradientWatcher()]) is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_lightning_names(LoggingTask(), [GradientWatcher()])
    assert not set(NOT_CALLED) & set(PER_BATCH_HOOKS)


def test_manual_optimization_is_refused_before_any_rank_starts(root_dir):
    class Manual(RegressionTask):
        automatic_optimization = False

    trainer = Trainer(num_procs=2, max_epochs=1, progress_bar=False, default_root_dir=root_dir)
    with pytest.raises(ValueError, match="Manual.automatic_optimization is False.*return the loss"):
        trainer.fit(Manual(n=16))
    assert not list(root_dir.iterdir())  # refused before the run folder was made


def test_a_callback_that_is_not_graphtrainers_is_refused():
    class LightningStyle:
        def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None: ...

    with pytest.raises(TypeError, match="LightningStyle is not a graphtrainer.callbacks.Callback"):
        Trainer(callbacks=[LightningStyle()])


def test_hooks_run_in_evaluation_with_outputs(root_dir):
    seen: Dict[str, List[Any]] = {"start": [], "end": []}

    class Batches(Callback):
        def on_test_batch_start(self, trainer: Any, task: Any, batch: Any, batch_idx: int) -> None:
            seen["start"].append(batch_idx)

        def on_predict_batch_end(self, trainer: Any, task: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
            seen["end"].append((batch_idx, tuple(outputs.shape), batch.numel()))

    class Predicting(RegressionTask):
        def predict_dataloader(self) -> Any:
            return self.test_dataloader()

        def predict_step(self, idx: torch.Tensor, batch_idx: int) -> torch.Tensor:
            return self.model(self.vx[idx])

    trainer = Trainer(progress_bar=False, enable_model_summary=False, default_root_dir=root_dir, callbacks=[Batches()])
    task = Predicting(n=16)
    trainer.test(task)
    trainer.predict(task)
    assert seen["start"] == [0, 1, 2]  # 24 test rows, batches of 8
    assert seen["end"] == [(0, (8, 1), 8), (1, (8, 1), 8), (2, (8, 1), 8)]


def test_minus_one_from_on_train_batch_start_is_named_not_ignored(root_dir):
    class Skipping(RegressionTask):
        def on_train_batch_start(self, batch: Any, batch_idx: int) -> Any:
            return -1 if batch_idx == 1 else None

    trainer = Trainer(max_epochs=1, progress_bar=False, enable_model_summary=False, default_root_dir=root_dir)
    with pytest.warns(UserWarning, match="on_train_batch_start returned -1.*should_stop = True"):
        trainer.fit(Skipping(n=32, scheduler=None, validate=False))
    assert trainer.global_step == 4  # every batch trained
