"""Collectives a training epoch costs besides DDP's gradient all-reduce and the task's own: at
most two (the metric reduction and the stop agreement), counted in both ranks of a 2-rank fit
with one logged metric and no validation. Every ``torch.distributed`` collective is counted,
in real processes (gloo on CPU)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from graphtrainer import GraphTask, Trainer
from graphtrainer.loop import preemption

from tasks import ExactBatches


EPOCHS = 4
_NAMES = ("all_reduce", "all_gather", "all_gather_object", "broadcast", "broadcast_object_list", "barrier",
          "reduce", "gather", "scatter", "all_to_all", "reduce_scatter")
_count = {"n": 0, "depth": 0}


def _counting(fn):
    def wrapper(*args, **kwargs):
        # DDP's gradient buckets (its comm hook) are not counted, nor collectives inside others.
        outer = _count["depth"] == 0 and sys._getframe(1).f_globals.get("__name__") != "graphtrainer.loop.ddp"
        _count["n"] += outer
        _count["depth"] += 1
        try:
            return fn(*args, **kwargs)
        finally:
            _count["depth"] -= 1
    return wrapper


class _CountingTask(GraphTask):
    """An MLP on 64 rows, ``train_loss`` logged per step; writes the collective count at each
    epoch's start and at the fit's end."""

    def __init__(self, out: str):
        super().__init__()
        self.out, self.marks = out, []
        self.x, self.y = torch.randn(64, 4, generator=torch.Generator().manual_seed(0)), torch.randn(64, 1)

    def setup(self, stage: str) -> None:
        for name in _NAMES:
            setattr(dist, name, _counting(getattr(dist, name)))

    def configure_model(self) -> nn.Module:
        return nn.Linear(4, 1)

    def configure_optimizers(self):
        return torch.optim.SGD(self.model.parameters(), lr=0.01)

    def train_dataloader(self):
        return ExactBatches(torch.arange(64), 8)

    def training_step(self, idx, batch_idx):
        loss = F.mse_loss(self.model(self.x[idx]), self.y[idx])
        self.log("train_loss", loss)
        return loss

    def on_train_epoch_start(self) -> None:
        self.marks.append(_count["n"])

    def on_fit_end(self) -> None:
        self.marks.append(_count["n"])
        Path(self.out, f"r{self.rank}.json").write_text(json.dumps(self.marks))


class _EpochEndLogging(_CountingTask):
    def on_train_epoch_end(self) -> None:
        self.log("mean_y", float(self.y.mean()), batch_size=1)


def _per_epoch(tmp_path, task_type=_CountingTask):
    Trainer(num_procs=2, launcher="fork", max_epochs=EPOCHS, progress_bar=False, logger=False,
            enable_model_summary=False, default_root_dir=tmp_path).fit(task_type(str(tmp_path)))
    counts = []
    for rank in range(2):
        marks = json.loads((tmp_path / f"r{rank}.json").read_text())
        assert len(marks) == EPOCHS + 1
        counts.append([b - a for a, b in zip(marks, marks[1:])])
    assert counts[0] == counts[1]  # every rank ran the same collectives
    return counts[0]


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_an_epoch_costs_two_collectives(tmp_path, monkeypatch):
    # The signal exchange runs every AGREE_EVERY_S of training: set past these epochs' length
    # so the count does not depend on this machine's speed (its cost is counted below).
    monkeypatch.setattr(preemption, "AGREE_EVERY_S", 60.0)
    counts = _per_epoch(tmp_path)
    # Epoch 0 also learns the logged names (and exchanges stop signals every step, before any
    # step time is known); every later epoch: the metric sums and the stop agreement.
    assert counts[1:] == [2] * (EPOCHS - 1), counts


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_signal_exchange_per_step_and_an_epoch_end_log_are_the_only_extras(tmp_path, monkeypatch):
    monkeypatch.setattr(preemption, "AGREE_EVERY_S", 0)  # a signal exchange at every step: 4 per epoch
    counts = _per_epoch(tmp_path, _EpochEndLogging)  # + the reduction of what on_train_epoch_end logs
    assert counts[1:] == [2 + 4 + 1] * (EPOCHS - 1), counts
