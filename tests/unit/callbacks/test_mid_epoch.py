"""With ``val_check_interval``, ModelCheckpoint and EarlyStopping act after each validation
(as Lightning's): a checkpoint written mid-epoch resumes exactly at the next batch, and an
early stop decided mid-epoch ends that epoch on every rank."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch

from graphtrainer import Callback, EarlyStopping, ModelCheckpoint

from mid_epoch_runs import mid_epoch_trainer as _trainer
from tasks import RegressionTask

# 64 samples, batch 8, 2 ranks: 4 batches per rank and epoch; val_check_interval=2 validates
# after batch 1 (step 2 of epoch 0) and at the epoch's end.


class _Where(Callback):
    """Writes where each rank's fit ended."""

    def __init__(self, out_dir: str):
        self.out_dir = out_dir

    def on_fit_end(self, trainer, task):
        Path(self.out_dir, f"rank{trainer.rank}.json").write_text(
            json.dumps([trainer.global_step, trainer.current_epoch, trainer.should_stop]))


@pytest.mark.timeout(120)
def test_checkpoints_after_each_validation_named_with_the_step_and_ranked_on_its_value(root_dir, tmp_path):
    mc = ModelCheckpoint(dirpath=tmp_path / "ck", filename="{epoch}-{step}", monitor="val_loss", save_top_k=-1)
    trainer = _trainer(root_dir, 2, [mc])
    trainer.fit(RegressionTask())
    names = ["epoch=0-step=2.ckpt", "epoch=0-step=4.ckpt", "epoch=1-step=6.ckpt", "epoch=1-step=8.ckpt"]
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == names
    with open(Path(trainer.log_dir) / "metrics.csv") as fh:
        val = {int(r["step"]): float(r["val_loss"]) for r in csv.DictReader(fh) if r.get("val_loss")}
    assert sorted(val) == [2, 4, 6, 8] and len(set(val.values())) == 4
    for name in names:
        path = str(tmp_path / "ck" / name)
        assert mc.best_k_models[path] == pytest.approx(val[int(name.split("=")[-1][:-5])], rel=1e-5)
    mid = torch.load(tmp_path / "ck" / names[0], weights_only=True)
    assert (mid["epoch"], mid["epoch_finished"], mid["global_step"], mid["batches_done_in_epoch"]) == (0, False, 2, 2)
    end = torch.load(tmp_path / "ck" / names[1], weights_only=True)
    assert end["epoch_finished"] and "batches_done_in_epoch" not in end


@pytest.mark.timeout(180)
def test_resuming_from_a_mid_epoch_checkpoint_equals_the_uninterrupted_run(root_dir, tmp_path):
    def fit(folder, ckpt_path=None):
        task = RegressionTask(dropout=0.3)  # dropout: the resumed run needs the generators as they were
        mc = ModelCheckpoint(dirpath=tmp_path / folder, monitor="val_loss", save_top_k=-1)
        trainer = _trainer(root_dir, 2, [mc])
        trainer.fit(task, ckpt_path=ckpt_path)
        return trainer, {k: v.detach().clone() for k, v in task.module.state_dict().items()}

    whole, weights = fit("a")
    resumed, resumed_weights = fit("b", ckpt_path=str(tmp_path / "a" / "epoch=1-step=6.ckpt"))
    assert resumed.global_step == whole.global_step == 8
    assert sorted(resumed_weights) == sorted(weights)
    for key in weights:
        assert torch.equal(resumed_weights[key], weights[key]), key


@pytest.mark.timeout(120)
def test_early_stopping_stops_mid_epoch_on_every_rank(root_dir, tmp_path):
    # lr=0: val_loss is the same at every validation; checks at steps 2 (best), 4, 6 (stop).
    es = EarlyStopping(monitor="val_loss", patience=2, verbose=False)
    trainer = _trainer(root_dir, 5, [es, _Where(str(tmp_path))])
    trainer.fit(RegressionTask(lr=0.0))
    assert es.stopped_epoch == 1 and trainer.global_step == 6
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0] == ranks[1] == [6, 1, True]  # epoch 1 ended after its batch 1
    # check_on_train_epoch_end=True (Lightning's meaning): epoch ends only (8 batches per epoch).
    es = EarlyStopping(monitor="val_loss", patience=2, verbose=False, check_on_train_epoch_end=True)
    trainer = _trainer(root_dir, 5, [es], num_procs=1)
    trainer.fit(RegressionTask(lr=0.0))
    assert es.stopped_epoch == 2 and trainer.global_step == 24


@pytest.mark.timeout(120)
def test_with_gradient_accumulation_only_validations_at_step_boundaries_checkpoint(root_dir, tmp_path):
    mc = ModelCheckpoint(dirpath=tmp_path / "ck", monitor="val_loss", save_top_k=-1)
    trainer = _trainer(root_dir, 1, [mc], num_procs=1, accumulate_grad_batches=2, val_check_interval=1)
    trainer.fit(RegressionTask())  # 8 batches, validated after each; steps after batches 1, 3, 5, 7
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == [f"epoch=0-step={s}.ckpt" for s in (1, 2, 3, 4)]
