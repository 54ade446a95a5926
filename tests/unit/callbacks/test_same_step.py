"""ModelCheckpoint writes each global step's checkpoints once (Lightning's rule): after a stop
mid-epoch (an early stop or ``max_steps`` at a ``val_check_interval`` validation) the epoch's
own end comes at the same step (without validating again), and saves nothing more there. The record of the saved
step is the fit's own, never a checkpoint's: a resumed fit has saved nothing yet."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from graphtrainer import Callback, EarlyStopping, ModelCheckpoint

from mid_epoch_runs import mid_epoch_trainer as _trainer
from tasks import RegressionTask

# 64 samples, batch 8: 4 batches per rank and epoch with 2 ranks, 8 with 1;
# val_check_interval=2 validates after every second batch and at the epoch's end.


class _Saves(Callback):
    """Appends the global step of every checkpoint written (on rank 0, which builds them) to a file."""

    def __init__(self, path: Path):
        self.path = path

    def on_save_checkpoint(self, trainer, task, checkpoint):
        with open(self.path, "a") as fh:
            fh.write(f"{checkpoint['global_step']}\n")

    def steps(self):
        return [int(s) for s in self.path.read_text().split()] if self.path.exists() else []


def _files(folder: Path):
    return sorted(p.name for p in folder.iterdir())


@pytest.mark.timeout(180)
@pytest.mark.parametrize("options, saves, kept", [
    (dict(save_top_k=2, save_last=True), [2, 2, 4, 4, 6, 6],
     ["epoch=0-step=4.ckpt", "epoch=1-step=6.ckpt", "last.ckpt"]),
    (dict(monitor="val_loss", save_top_k=-1), [2, 4, 6],
     ["epoch=0-step=2.ckpt", "epoch=0-step=4.ckpt", "epoch=1-step=6.ckpt"]),
], ids=["recent-and-last", "monitored"])
def test_a_mid_epoch_early_stop_writes_its_steps_checkpoints_once(root_dir, tmp_path, options, saves, kept):
    # lr=0: val_loss is the same at every validation; checks at steps 2 (best), 4, 6 (stop, epoch 1 after
    # its batch 1), then epoch 1's end comes at step 6 (keeping that validation's values).
    mc = ModelCheckpoint(dirpath=tmp_path / "ck", **options)
    log = _Saves(tmp_path / "saves.txt")
    trainer = _trainer(root_dir, 5, [mc, EarlyStopping(monitor="val_loss", patience=2, verbose=False), log])
    trainer.fit(RegressionTask(lr=0.0))
    assert trainer.global_step == 6
    assert log.steps() == saves
    assert _files(tmp_path / "ck") == kept
    top_k = [str(tmp_path / "ck" / name) for name in kept if name != "last.ckpt"]
    assert sorted(mc.best_k_models) == top_k
    assert mc.best_model_path in top_k
    saved = torch.load(tmp_path / "ck" / kept[-1], weights_only=True)
    assert saved["global_step"] == 6 and saved["batches_done_in_epoch"] == 2
    # Lightning keeps the saved step out of the callback's state: a resumed fit has saved nothing yet.
    state = saved["callbacks"][mc.state_key]
    assert not any("step" in key for key in state)
    fresh = ModelCheckpoint(dirpath=tmp_path / "ck", **options)
    fresh.load_state_dict(state)
    assert fresh._last_global_step_saved is None and sorted(fresh.best_k_models) == top_k


@pytest.mark.timeout(180)
def test_max_steps_at_a_validation_saves_once_and_a_resumed_fit_saves_its_new_steps(root_dir, tmp_path):
    # 1 rank, 8 batches: validations after batches 1, 3 (steps 2, 4); max_steps=4 stops there, and the
    # epoch's end comes at step 4 too.
    def fit(max_steps, ckpt_path=None):
        mc = ModelCheckpoint(dirpath=tmp_path / "ck", save_top_k=-1, save_last=True)
        log = _Saves(tmp_path / f"saves-{max_steps}.txt")
        trainer = _trainer(root_dir, 3, [mc, log], num_procs=1, max_steps=max_steps)
        trainer.fit(RegressionTask(), ckpt_path=ckpt_path)
        return trainer, mc, log.steps()

    trainer, mc, saves = fit(4)
    assert trainer.global_step == 4 and saves == [2, 2, 4, 4]
    assert _files(tmp_path / "ck") == ["epoch=0-step=2.ckpt", "epoch=0-step=4.ckpt", "last.ckpt"]
    # Resumed at step 4 in the same folder: it saves at its own steps (6, where max_steps stops it) once each.
    trainer, mc, saves = fit(6, ckpt_path=str(tmp_path / "ck" / "last.ckpt"))
    assert trainer.global_step == 6 and saves == [6, 6]
    assert sorted(Path(p).name for p in mc.best_k_models) == [f"epoch=0-step={s}.ckpt" for s in (2, 4, 6)]


@pytest.mark.timeout(180)
def test_a_file_name_written_again_at_a_later_step_is_counted_once_in_the_top_k(root_dir, tmp_path):
    # filename "{epoch}": the validations of an epoch (steps 2, 4, 6, 8 of epoch 0) overwrite one file;
    # top-2 then keeps epoch 0's and epoch 1's files.
    mc = ModelCheckpoint(dirpath=tmp_path / "ck", filename="{epoch}", save_top_k=2)
    _trainer(root_dir, 2, [mc], num_procs=1).fit(RegressionTask())
    assert _files(tmp_path / "ck") == ["epoch=0.ckpt", "epoch=1.ckpt"]
    assert sorted(mc.best_k_models) == [str(tmp_path / "ck" / n) for n in ("epoch=0.ckpt", "epoch=1.ckpt")]
    assert mc.best_model_path == str(tmp_path / "ck" / "epoch=1.ckpt")
