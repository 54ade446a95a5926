"""A validation runs once per check point (Lightning's rule): when a stop (an early stop, or
``max_steps``) ends an epoch right after a ``val_check_interval`` validation, the epoch's end
does not validate again at that step (same weights, same numbers), its history row keeps that
validation's values, and ``EarlyStopping`` counts it as one check. An epoch that ends normally,
or stops at a step not just validated, still validates at its end."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from graphtrainer import Callback, EarlyStopping, ModelCheckpoint

from mid_epoch_runs import mid_epoch_trainer as _trainer
from tasks import RegressionTask

# 64 samples, batch 8: 4 batches per rank and epoch with 2 ranks, 8 with 1;
# val_check_interval=2 validates after every second batch (not the last) and at the epoch's end.


class _Validations(Callback):
    """Appends ``step val_loss`` for every validation run (rank 0 writes; all ranks validate together)."""

    def __init__(self, path: Path):
        self.path = path

    def on_validation_epoch_end(self, trainer, task):
        if trainer.rank == 0:
            with open(self.path, "a") as fh:
                fh.write(f"{trainer.global_step}\n")

    def steps(self):
        return [int(s) for s in self.path.read_text().split()] if self.path.exists() else []


@pytest.mark.timeout(180)
def test_an_early_stop_mid_epoch_validates_once_and_counts_one_check_per_validation(root_dir, tmp_path):
    # lr=0: val_loss is the same at every validation; checks at steps 2 (best), 4 (epoch 0's end),
    # 6 (epoch 1 after its batch 1: the second without improvement, the stop). Epoch 1's end is no check.
    es = EarlyStopping(monitor="val_loss", patience=2, verbose=False)
    # Saved at epoch ends only: last.ckpt holds EarlyStopping's state after epoch 1's end.
    mc = ModelCheckpoint(dirpath=tmp_path / "ck", save_top_k=0, save_last=True, save_on_train_epoch_end=True)
    runs = _Validations(tmp_path / "validations.txt")
    trainer = _trainer(root_dir, 5, [es, runs, mc])
    trainer.fit(RegressionTask(lr=0.0))
    assert trainer.global_step == 6 and es.stopped_epoch == 1
    assert runs.steps() == [2, 4, 6]
    assert es.wait_count == 2
    assert "for 2 checks" in es.stop_reason
    saved = torch.load(tmp_path / "ck" / "last.ckpt", weights_only=True)
    assert saved["global_step"] == 6 and saved["callbacks"][es.state_key]["wait_count"] == 2
    # The stopped epoch's row carries the validation at step 6.
    assert [(r["epoch"], r["step"]) for r in trainer.history] == [(0, 4), (1, 6)]
    assert trainer.history[-1]["val_loss"] == pytest.approx(trainer.callback_metrics["val_loss"])
    assert trainer.state.validated_this_epoch and trainer.state.last_validation_step == 6


@pytest.mark.timeout(180)
def test_max_steps_at_a_validated_step_validates_once_and_its_row_holds_that_validation(root_dir, tmp_path):
    # 1 rank, 8 batches: validations after batches 1, 3 (steps 2, 4); max_steps=4 stops at the second.
    runs = _Validations(tmp_path / "validations.txt")
    es = EarlyStopping(monitor="val_loss", patience=1, verbose=False, check_on_train_epoch_end=True)
    trainer = _trainer(root_dir, 3, [runs, es], num_procs=1, max_steps=4)
    trainer.fit(RegressionTask())
    assert trainer.global_step == 4
    assert runs.steps() == [2, 4]
    assert len(trainer.history) == 1 and trainer.history[0]["step"] == 4
    assert trainer.history[0]["val_loss"] == pytest.approx(trainer.callback_metrics["val_loss"])
    assert es.best_score == pytest.approx(trainer.callback_metrics["val_loss"])  # epoch-end check: step 4's
    assert trainer.state.validated_this_epoch


@pytest.mark.timeout(180)
@pytest.mark.parametrize("max_steps, validated", [(-1, [2, 4, 6, 8]), (3, [2, 3])], ids=["epoch-end", "max-steps"])
def test_an_epoch_ending_after_its_last_validation_still_validates_at_its_end(root_dir, tmp_path, max_steps,
                                                                              validated):
    # 1 rank, 8 batches: mid-epoch validations at steps 2, 4, 6; the end validates at step 8, or at
    # step 3 where max_steps stops an epoch at a step not validated.
    runs = _Validations(tmp_path / "validations.txt")
    trainer = _trainer(root_dir, 1, [runs], num_procs=1, max_steps=max_steps)
    trainer.fit(RegressionTask())
    assert runs.steps() == validated
    assert trainer.history[-1]["step"] == validated[-1] and "val_loss" in trainer.history[-1]


@pytest.mark.timeout(180)
def test_an_epoch_check_val_every_n_epoch_skips_validates_neither_mid_epoch_nor_at_its_end(root_dir, tmp_path):
    # 2 ranks, 4 batches each (steps 4 per epoch), check_val_every_n_epoch=2: epochs 1 and 3
    # validate after batch 1 and at their ends; epochs 0 and 2 not at all (Lightning).
    runs = _Validations(tmp_path / "validations.txt")
    trainer = _trainer(root_dir, 4, [runs], check_val_every_n_epoch=2)
    trainer.fit(RegressionTask())
    assert runs.steps() == [6, 8, 14, 16]
    assert ["val_loss" in row for row in trainer.history] == [False, True, False, True]


@pytest.mark.timeout(60)
def test_an_interval_longer_than_the_epoch_fails_in_the_first_epoch_even_one_that_does_not_validate(root_dir):
    with pytest.raises(Exception, match="val_check_interval=9 is larger than the epoch"):
        _trainer(root_dir, 2, [], num_procs=1, val_check_interval=9, check_val_every_n_epoch=2).fit(RegressionTask())
