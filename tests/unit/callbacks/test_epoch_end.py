"""What the callbacks acting at an epoch's end see: a checkpoint holds every other callback's
state after that epoch's update (checkpoint callbacks run last, as Lightning's), and a
monitor acts only on a value produced since it last acted (no stale validation values)."""
from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch

from graphtrainer import EarlyStopping, ModelCheckpoint, Trainer

from tasks import RegressionTask


def _trainer(root, epochs, callbacks, **kw):
    return Trainer(max_epochs=epochs, seed=0, progress_bar=False, enable_model_summary=False,
                   default_root_dir=root, callbacks=list(callbacks), **kw)


@pytest.mark.parametrize("checkpoint_first", [True, False])
def test_last_checkpoint_holds_early_stoppings_state_after_the_epochs_update(root_dir, tmp_path,
                                                                             checkpoint_first):
    mc = ModelCheckpoint(dirpath=tmp_path / "ck", save_top_k=0, save_last=True)
    es = EarlyStopping(monitor="score", patience=5, verbose=False)
    callbacks = [mc, es] if checkpoint_first else [es, mc]
    _trainer(root_dir, 2, callbacks).fit(RegressionTask(n=16, script={"score": [0.5, 0.6]}))
    assert es.wait_count == 1 and es.best_score == pytest.approx(0.5)
    saved = torch.load(tmp_path / "ck" / "last.ckpt", weights_only=True)
    assert saved["epoch"] == 1
    assert saved["callbacks"][es.state_key] == es.state_dict()  # epoch 1's check counted


def test_resume_from_last_checkpoint_stops_where_the_uninterrupted_run_stops(root_dir, tmp_path):
    scores = {"score": [0.5, 0.6, 0.7, 0.8, 0.9, 1.0]}

    def run(epochs, folder, ckpt_path=None):
        es = EarlyStopping(monitor="score", patience=3, verbose=False)
        trainer = _trainer(root_dir, epochs, [ModelCheckpoint(dirpath=tmp_path / folder, save_last=True), es])
        trainer.fit(RegressionTask(n=16, script=scores), ckpt_path=ckpt_path)
        return trainer, es

    whole, _ = run(6, "a")
    run(2, "b")
    resumed, es = run(6, "c", ckpt_path=str(tmp_path / "b" / "last.ckpt"))
    assert whole.current_epoch == 4  # stopped at epoch 3: three checks without improvement
    assert resumed.current_epoch == whole.current_epoch and es.stopped_epoch == 3


def test_epochs_without_validation_neither_count_nor_carry_validation_values(root_dir, tmp_path):
    # Validation at epochs 1, 3, 5 only; the score never improves after epoch 1.
    es = EarlyStopping(monitor="score", patience=2, verbose=False)
    mc = ModelCheckpoint(dirpath=tmp_path / "ck", filename="{epoch}", monitor="score", save_top_k=-1)
    trainer = _trainer(root_dir, 8, [mc, es], check_val_every_n_epoch=2)
    trainer.fit(RegressionTask(n=16, script={"score": [0.5] * 8}))
    assert es.stopped_epoch == 5 and trainer.current_epoch == 6  # checks at 1, 3, 5
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == ["epoch=1.ckpt", "epoch=3.ckpt", "epoch=5.ckpt"]
    validated = [r["epoch"] for r in trainer.history if "score" in r or "val_loss" in r]
    assert validated == [1, 3, 5]
    with open(Path(trainer.log_dir) / "metrics.csv") as fh:
        rows = [r for r in csv.DictReader(fh) if r.get("train_loss")]
    assert [int(r["epoch"]) for r in rows if r.get("val_loss")] == [1, 3, 5]
