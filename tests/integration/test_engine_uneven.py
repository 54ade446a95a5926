"""Uneven inputs: rank 0 gets 3 batches of 4 rows, rank 1 gets 7 batches of 6, from a plain
iterable (no ``len``, no ``set_epoch``). Training finishes inside ``Join``, the ranks stay
in step, and epoch metrics are exact weighted means over both ranks."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from graphtrainer import Callback, Trainer
from graphtrainer import comm as gdist

from conftest import rank_children
from tasks import RegressionTask
from launch_env import launchers

BATCHES = [3, 7]
ROWS = [4, 6]
EPOCHS = 2


class UnevenBatches:
    """Rank r: ``BATCHES[r]`` random index batches of ``ROWS[r]`` rows; a different draw per pass."""

    def __init__(self) -> None:
        self.passes = 0

    def __iter__(self):
        rank = gdist.get_rank()
        gen = torch.Generator().manual_seed(100 * rank + self.passes)
        self.passes += 1
        return iter([torch.randint(0, 64, (ROWS[rank],), generator=gen) for _ in range(BATCHES[rank])])


class UnevenTask(RegressionTask):
    def __init__(self, out: str):
        # Momentum and a per-step scheduler: state that early-finishing ranks must not lose.
        super().__init__(n=64, momentum=0.9, scheduler="step_interval", gamma=0.95, validate=False)
        self.out = out
        self.steps: list = []

    def train_dataloader(self) -> Any:
        return UnevenBatches()

    def training_step(self, idx: torch.Tensor, batch_idx: int) -> torch.Tensor:
        loss = super().training_step(idx, batch_idx)
        self.log("probe", 100.0 * self.rank + batch_idx, batch_size=idx.numel())
        self.steps.append([float(loss), idx.numel()])
        return loss


class StepDump(Callback):
    """Each rank's parameters after every step, and its optimizer state at each epoch end."""

    def __init__(self, out: str):
        self.out = out

    def on_train_batch_end(self, trainer: Any, task: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        state = {k: v.clone() for k, v in task.module.state_dict().items()}
        torch.save(state, Path(self.out) / f"step_r{trainer.rank}_e{trainer.current_epoch}_b{batch_idx}.pt")

    def on_train_epoch_end(self, trainer: Any, task: Any) -> None:
        torch.save({"params": task.module.state_dict(), "optimizer": trainer.optimizers[0].state_dict(),
                    "global_step": trainer.global_step},
                   Path(self.out) / f"end_r{trainer.rank}_e{trainer.current_epoch}.pt")
        with open(Path(self.out) / f"losses_r{trainer.rank}_e{trainer.current_epoch}.json", "w") as fh:
            json.dump(task.steps, fh)
        task.steps = []


def _equal_nested(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_equal_nested(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_equal_nested(x, y) for x, y in zip(a, b))
    return a == b


@pytest.mark.timeout(90)
@pytest.mark.parametrize("launcher", launchers("fork", "forkserver", "spawn"))
def test_uneven_batch_counts_finish_in_step_with_exact_metrics(root_dir, tmp_path, launcher):
    trainer = Trainer(num_procs=2, launcher=launcher, max_epochs=EPOCHS, seed=0, progress_bar=False,
                      default_root_dir=root_dir, callbacks=[StepDump(str(tmp_path))])
    task = UnevenTask(str(tmp_path))
    trainer.fit(task)
    assert not rank_children()

    load = lambda name: torch.load(tmp_path / name, weights_only=True)  # noqa: E731
    for epoch in range(EPOCHS):
        end = [load(f"end_r{r}_e{epoch}.pt") for r in range(2)]
        # Same parameters, optimizer state (momentum, learning rate) and step count everywhere:
        # the model took the 7 steps of the longest rank.
        assert _equal_nested(end[0]["params"], end[1]["params"])
        assert _equal_nested(end[0]["optimizer"], end[1]["optimizer"])
        assert end[0]["global_step"] == end[1]["global_step"] == 7 * (epoch + 1)
        # While both ranks train, their parameters agree after every step (from epoch 1 on this
        # needs the early rank to have been given the optimizer state it missed).
        for b in range(BATCHES[0]):
            r0, r1 = load(f"step_r0_e{epoch}_b{b}.pt"), load(f"step_r1_e{epoch}_b{b}.pt")
            assert _equal_nested(r0, r1), (epoch, b)

        # Exact weighted means over both ranks: sum(value * rows) / sum(rows).
        probe = (sum(ROWS[r] * (100.0 * r + b) for r in range(2) for b in range(BATCHES[r]))
                 / sum(ROWS[r] * BATCHES[r] for r in range(2)))
        assert trainer.history[epoch]["probe"] == pytest.approx(probe, rel=1e-12)
        assert probe != pytest.approx((1.0 + 103.0) / 2)  # not the mean of per-rank means
        steps = sum((json.loads((tmp_path / f"losses_r{r}_e{epoch}.json").read_text()) for r in range(2)), [])
        assert len(steps) == sum(BATCHES)
        loss = sum(value * n for value, n in steps) / sum(n for _, n in steps)
        assert trainer.history[epoch]["train_loss"] == pytest.approx(loss, rel=1e-6)
    assert trainer.global_step == 7 * EPOCHS
    assert [row["step"] for row in trainer.history] == [7, 14]
    final = load(f"end_r0_e{EPOCHS - 1}.pt")["params"]
    assert _equal_nested({k: v for k, v in task.module.state_dict().items()}, final)


# ---- Join only where it is needed ------------------------------------------------------------
class JoinProbe(RegressionTask):
    """Records, per training step, whether DDP ran inside ``Join`` (its join hook enabled)."""

    def __init__(self, loader: str):
        super().__init__(n=64, validate=False, scheduler=None)
        self.loader = loader
        self.joined: list = []

    def train_dataloader(self) -> Any:
        if self.loader == "uneven":
            return UnevenBatches()
        from torch.utils.data import DataLoader, TensorDataset

        # Map-style: an exact len, the same on both ranks (shares of 64 rows).
        return DataLoader(TensorDataset(torch.arange(64)), batch_size=8,
                          sampler=torch.utils.data.distributed.DistributedSampler(torch.arange(64)))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        idx = batch[0] if isinstance(batch, list) else batch
        self.joined.append(bool(self.model._join_config.enable))
        return super().training_step(idx, batch_idx)

    def on_fit_end(self) -> None:
        self.log("joined_steps", sum(self.joined), reduce_fx="sum")
        self.log("steps", len(self.joined), reduce_fx="sum")
        self.trainer.callback_metrics.update(self.step_log.metrics.reduce())
        self.trainer.history.append(dict(self.trainer.callback_metrics))


@pytest.mark.timeout(90)
@pytest.mark.parametrize("launcher", launchers("fork", "forkserver", "spawn"))
@pytest.mark.parametrize("loader, all_joined", [("equal", False), ("uneven", True)])
def test_join_only_when_batch_counts_differ_or_are_unknown(root_dir, loader, all_joined, launcher):
    trainer = Trainer(num_procs=2, launcher=launcher, max_epochs=2, progress_bar=False, default_root_dir=root_dir)
    trainer.fit(JoinProbe(loader))
    final = trainer.history[-1]
    assert final["steps"] > 0
    assert final["joined_steps"] == (final["steps"] if all_joined else 0)
