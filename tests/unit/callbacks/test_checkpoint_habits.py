"""More of Lightning's ModelCheckpoint habits: ``verbose`` (rank 0 says what each save point did), a
filename field never logged written as 0, and resuming a fit from a weights-only file refused in the
calling process, before any rank starts."""
from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from graphtrainer import CheckpointError, ModelCheckpoint, Trainer

from tasks import RegressionTask


def _trainer(root, epochs, callbacks, **kw):
    return Trainer(max_epochs=epochs, seed=0, progress_bar=False, enable_model_summary=False,
                   default_root_dir=root, callbacks=list(callbacks), **kw)


@pytest.mark.timeout(120)
def test_verbose_prints_each_save_point_once_from_rank_0(root_dir, tmp_path, capfd):
    folder = tmp_path / "ck"
    mc = ModelCheckpoint(dirpath=folder, monitor="score", save_last=True, verbose=True)
    _trainer(root_dir, 3, [mc], num_procs=2).fit(RegressionTask(n=32, script={"score": [0.5, 0.3, 0.4]}))
    lines = [ln for ln in capfd.readouterr().out.splitlines() if "ModelCheckpoint:" in ln]
    assert lines == [
        f"[graphtrainer] ModelCheckpoint: epoch 0, step 2: 'score' reached 0.5 (best 0.5), saved "
        f"{folder / 'epoch=0-step=2.ckpt'} as top 1; last: {folder / 'last.ckpt'}",
        f"[graphtrainer] ModelCheckpoint: epoch 1, step 4: 'score' reached 0.3 (best 0.3), saved "
        f"{folder / 'epoch=1-step=4.ckpt'} as top 1; last: {folder / 'last.ckpt'}; removed epoch=0-step=2.ckpt",
        f"[graphtrainer] ModelCheckpoint: epoch 2, step 6: 'score' was 0.4, not in top 1; last: "
        f"{folder / 'last.ckpt'}",
    ]
    _trainer(root_dir, 1, [ModelCheckpoint(dirpath=tmp_path / "quiet")]).fit(RegressionTask(n=16))
    assert "ModelCheckpoint:" not in capfd.readouterr().out  # verbose=False (Lightning's default) says nothing


def test_a_filename_field_never_logged_is_written_as_0_with_one_warning(root_dir, tmp_path):
    mc = ModelCheckpoint(dirpath=tmp_path / "ck", filename="{epoch}-{val_acc:.2f}", save_top_k=-1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _trainer(root_dir, 2, [mc]).fit(RegressionTask(n=16))
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == ["epoch=0-val_acc=0.00.ckpt",
                                                                   "epoch=1-val_acc=0.00.ckpt"]
    said = [str(w.message) for w in caught if "filename uses" in str(w.message)]
    assert said == ["ModelCheckpoint filename uses {val_acc}, which was not logged: written as 0 (as Lightning); "
                    "logged: ['epoch', 'step', 'train_loss', 'val_loss']. Log 'val_acc' with self.log, or drop it "
                    "from filename"]


@pytest.mark.timeout(120)
def test_resuming_from_a_weights_only_file_is_refused_before_any_rank_starts(root_dir, tmp_path):
    mc = ModelCheckpoint(dirpath=tmp_path / "ck", save_weights_only=True)
    _trainer(root_dir, 1, [mc]).fit(RegressionTask(n=16))
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    trainer = _trainer(fresh, 3, [ModelCheckpoint(dirpath=tmp_path / "ck2")], num_procs=2)
    with pytest.raises(CheckpointError, match=r"epoch=0-step=2\.ckpt holds only the model's weights \(ModelCheckpoint"
                                              r"\(save_weights_only=True\) writes such files\).*Pass it to "
                                              r"validate/test/predict\(ckpt_path=\.\.\.\)"):
        trainer.fit(RegressionTask(n=16), ckpt_path=mc.best_model_path)
    assert list(fresh.iterdir()) == [] and not (tmp_path / "ck2").exists()  # no run folder: no rank started
    assert Path(mc.best_model_path).name == "epoch=0-step=2.ckpt"
