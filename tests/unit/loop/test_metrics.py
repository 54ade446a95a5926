"""``self.log(..., reduce_fx=...)``: exact weighted means and totals over all ranks."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from graphtrainer import Trainer

from tasks import RegressionTask


class CountingTask(RegressionTask):
    """Logs, per validation batch, its row count as a total and its loss as a mean."""

    def validation_step(self, idx, batch_idx):
        self.log("val_rows", idx.numel(), reduce_fx="sum")
        self.log("val_loss", F.mse_loss(self.model(self.vx[idx]), self.vy[idx]), batch_size=idx.numel())


@pytest.mark.timeout(90)
@pytest.mark.parametrize("num_procs", [1, 2, 3])
def test_sum_counts_every_validation_row_once_and_mean_is_exact(root_dir, num_procs):
    task = CountingTask(eval_batch_size=5)  # 24 validation rows: uneven batches on every rank
    trainer = Trainer(num_procs=num_procs, max_epochs=2, progress_bar=False, default_root_dir=root_dir)
    trainer.fit(task)
    assert [row["val_rows"] for row in trainer.history] == [24.0, 24.0]
    with torch.no_grad():  # the trained weights came back: the exact mean over all 24 rows
        expected = F.mse_loss(task.module(task.vx), task.vy).item()
    assert trainer.history[-1]["val_loss"] == pytest.approx(expected, rel=1e-6)


def test_one_name_with_two_reductions_is_rejected(root_dir):
    class Mixed(RegressionTask):
        def validation_step(self, idx, batch_idx):
            self.log("val_rows", idx.numel(), reduce_fx="sum" if batch_idx == 0 else "mean")

    with pytest.raises(ValueError, match=r"'val_rows'.*reduce_fx='sum' before and 'mean' now"):
        Trainer(max_epochs=1, progress_bar=False, default_root_dir=root_dir).fit(Mixed())


def test_unknown_reduction_names_the_choices(root_dir):
    class Bad(RegressionTask):
        def validation_step(self, idx, batch_idx):
            self.log("val_rows", 1.0, reduce_fx="max")

    with pytest.raises(ValueError, match=r"reduce_fx='max'; choose one of \('mean', 'sum'\)"):
        Trainer(max_epochs=1, progress_bar=False, default_root_dir=root_dir).fit(Bad())


class OneRankLogs(RegressionTask):
    def validation_step(self, idx, batch_idx):
        super().validation_step(idx, batch_idx)
        if self.rank == 1:  # the other rank never logs this name
            self.log("rank1_rows", idx.numel(), reduce_fx="sum")


@pytest.mark.timeout(60)
def test_a_name_logged_on_one_rank_only_is_reduced_on_all(root_dir):
    trainer = Trainer(num_procs=2, max_epochs=1, progress_bar=False, default_root_dir=root_dir)
    trainer.fit(OneRankLogs(eval_batch_size=5))
    assert trainer.history[-1]["rank1_rows"] == 12.0  # rank 1's half of the 24 validation rows
    assert "val_loss" in trainer.history[-1]
