"""ModelCheckpoint's Lightning options in fits on one rank (in this process): the version counter
(``enable_version_counter``), ``save_weights_only`` (and resuming from such a file refused),
``save_last="link"``, and a resume from another folder restoring ``best_model_path`` only. The same
options on two ranks: test_checkpoint_options_ranks.py."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from graphtrainer import Callback, ModelCheckpoint, Preempted, Trainer
from graphtrainer.checkpoint.content import CheckpointError

from mid_epoch_runs import mid_epoch_trainer
from tasks import RegressionTask, SigtermAt as _StoppedAt


def _trainer(root, epochs, callbacks, **kw):
    return Trainer(max_epochs=epochs, seed=0, progress_bar=False, enable_model_summary=False,
                   default_root_dir=root, callbacks=list(callbacks), **kw)


def _files(folder: Path):
    return sorted(p.name for p in folder.iterdir())


def _contents(folder: Path):
    """Each entry's bytes, or a link's target."""
    return {p.name: (os.readlink(p) if p.is_symlink() else p.read_bytes()) for p in folder.iterdir()}


# ---- the version counter ---------------------------------------------------------------------
def test_a_second_fit_into_the_same_folder_adds_versions_and_leaves_the_first_runs_files(root_dir, tmp_path, capsys):
    folder = tmp_path / "ck"

    def fit(epochs, ckpt_path=None):
        mc = ModelCheckpoint(dirpath=folder, save_top_k=-1, save_last=True)
        trainer = _trainer(root_dir, epochs, [mc])
        trainer.fit(RegressionTask(n=16), ckpt_path=ckpt_path)
        return trainer, mc

    fit(2)
    first = ["epoch=0-step=2.ckpt", "epoch=1-step=4.ckpt", "last.ckpt"]
    assert _files(folder) == first
    kept = _contents(folder)
    _, mc = fit(2)
    assert _files(folder) == sorted(first + ["epoch=0-step=2-v1.ckpt", "epoch=1-step=4-v1.ckpt", "last-v1.ckpt"])
    assert {name: data for name, data in _contents(folder).items() if name in first} == kept
    assert mc.last_model_path == str(folder / "last-v1.ckpt")
    assert mc.best_model_path == str(folder / "epoch=1-step=4-v1.ckpt")
    # "last" in a new trainer: the newest last file; the resumed fit (same folder) writes that one again.
    capsys.readouterr()
    trainer, mc = fit(3, ckpt_path="last")
    assert f"ckpt_path='last': using {folder / 'last-v1.ckpt'}" in capsys.readouterr().out
    assert [row["epoch"] for row in trainer.history] == [2]
    assert mc.last_model_path == str(folder / "last-v1.ckpt") and "last-v2.ckpt" not in _files(folder)
    assert torch.load(folder / "last-v1.ckpt", weights_only=True)["global_step"] == 6
    assert "epoch=2-step=6.ckpt" in _files(folder)


def test_a_preempted_fit_in_a_reused_folder_writes_the_next_last_name_and_resumes_from_it(root_dir, tmp_path):
    folder = tmp_path / "ck"

    def trainer(epochs):
        return _trainer(root_dir, epochs, [ModelCheckpoint(dirpath=folder, save_top_k=0, save_last=True)])

    trainer(1).fit(RegressionTask(n=16))
    kept = (folder / "last.ckpt").read_bytes()
    with pytest.raises(Preempted) as info:  # stopped in its first epoch, before it saved anything
        trainer(3).fit(_StoppedAt(at_step=0, n=16))
    assert info.value.checkpoint == str(folder / "last-v1.ckpt")
    assert (folder / "last.ckpt").read_bytes() == kept  # the earlier run's file is not overwritten
    resumed = trainer(3)
    resumed.fit(_StoppedAt(n=16), ckpt_path="last")
    assert resumed.checkpoint_callback.last_model_path == str(folder / "last-v1.ckpt")
    assert _files(folder) == ["last-v1.ckpt", "last.ckpt"]
    assert torch.load(folder / "last-v1.ckpt", weights_only=True)["global_step"] == 6


def test_without_the_version_counter_a_second_fit_overwrites(root_dir, tmp_path):
    folder = tmp_path / "ck"
    for lr in (0.1, 0.05):
        mc = ModelCheckpoint(dirpath=folder, save_top_k=-1, save_last=True, enable_version_counter=False)
        _trainer(root_dir, 2, [mc]).fit(RegressionTask(n=16, lr=lr))
    assert _files(folder) == ["epoch=0-step=2.ckpt", "epoch=1-step=4.ckpt", "last.ckpt"]
    for name in _files(folder):
        assert torch.load(folder / name, weights_only=True)["hyper_parameters"]["lr"] == 0.05


def test_a_monitored_name_written_again_in_an_epoch_gets_versions(root_dir, tmp_path):
    # filename "{epoch}", validations at steps 2, 4, 6, 8 of epoch 0, all kept: Lightning's -v1, -v2, -v3.
    mc = ModelCheckpoint(dirpath=tmp_path / "ck", filename="{epoch}", monitor="val_loss", save_top_k=-1)
    mid_epoch_trainer(root_dir, 1, [mc], num_procs=1).fit(RegressionTask())
    names = ["epoch=0.ckpt", "epoch=0-v1.ckpt", "epoch=0-v2.ckpt", "epoch=0-v3.ckpt"]
    assert _files(tmp_path / "ck") == sorted(names)
    assert sorted(mc.best_k_models) == sorted(str(tmp_path / "ck" / n) for n in names)
    steps = [torch.load(tmp_path / "ck" / n, weights_only=True)["global_step"] for n in names]
    assert steps == [2, 4, 6, 8]


# ---- save_weights_only -------------------------------------------------------------------------
class _SaveWeights(Callback):
    def __init__(self, path: Path):
        self.path = path

    def on_train_end(self, trainer, task):
        trainer.save_checkpoint(self.path, weights_only=True)


def test_weights_only_files_evaluate_and_refuse_to_resume_a_fit(root_dir, tmp_path):
    folder = tmp_path / "ck"
    mc = ModelCheckpoint(dirpath=folder, save_weights_only=True, save_last=True)
    task = RegressionTask(n=16)
    trainer = _trainer(root_dir, 2, [mc, _SaveWeights(tmp_path / "own.ckpt")])
    trainer.fit(task)
    assert _files(folder) == ["epoch=1-step=4.ckpt", "last.ckpt"]
    for path in (folder / "last.ckpt", folder / "epoch=1-step=4.ckpt", tmp_path / "own.ckpt"):
        saved = torch.load(path, weights_only=True)
        assert sorted(saved) == ["epoch", "epoch_finished", "format_version", "global_step", "graphtrainer",
                                 "hyper_parameters", "state_dict", "weights_only"]
        assert saved["weights_only"] is True and saved["global_step"] == 4
        for key, value in task.module.state_dict().items():
            assert torch.equal(saved["state_dict"][key], value)
    # validate / test / predict take it: the same weights give the same metrics.
    expected = trainer.validate(task)
    assert _trainer(root_dir, 1, []).validate(RegressionTask(n=16), ckpt_path=str(folder / "last.ckpt")) == expected
    with pytest.raises(CheckpointError, match=r"last\.ckpt holds only the model's weights \(ModelCheckpoint\("
                                              r"save_weights_only=True\) writes such files\), not the optimizer.*"
                                              r"Pass it to validate/test/predict\(ckpt_path=\.\.\.\); resume from a "
                                              r"full checkpoint"):
        _trainer(root_dir, 3, [ModelCheckpoint(dirpath=folder)]).fit(RegressionTask(n=16), ckpt_path="last")


# ---- save_last="link" --------------------------------------------------------------------------
def test_last_links_to_the_newest_saved_checkpoint(root_dir, tmp_path):
    # score 0.5, 0.3 (best), 0.4: epoch 2 saves no file, so last.ckpt still points at epoch 1's (Lightning).
    folder = tmp_path / "ck"
    mc = ModelCheckpoint(dirpath=folder, filename="{epoch}", monitor="score", save_last="link")
    _trainer(root_dir, 3, [mc]).fit(RegressionTask(n=16, script={"score": [0.5, 0.3, 0.4, 0.1]}))
    assert _files(folder) == ["epoch=1.ckpt", "last.ckpt"]
    assert (folder / "last.ckpt").is_symlink() and os.readlink(folder / "last.ckpt") == "epoch=1.ckpt"
    assert mc.last_model_path == str(folder / "last.ckpt")
    # "last" follows the link; the resumed fit (same folder) moves it to its new best file.
    trainer = _trainer(root_dir, 4, [ModelCheckpoint(dirpath=folder, filename="{epoch}", monitor="score",
                                                     save_last="link")])
    trainer.fit(RegressionTask(n=16, script={"score": [0.5, 0.3, 0.4, 0.1]}), ckpt_path="last")
    assert [row["epoch"] for row in trainer.history] == [2, 3]
    assert _files(folder) == ["epoch=3.ckpt", "last.ckpt"] and os.readlink(folder / "last.ckpt") == "epoch=3.ckpt"
    # With no top-k file to point at, last.ckpt is a checkpoint of its own (as Lightning).
    _trainer(root_dir, 1, [ModelCheckpoint(dirpath=tmp_path / "zero", save_top_k=0, save_last="link")]).fit(
        RegressionTask(n=16))
    assert _files(tmp_path / "zero") == ["last.ckpt"] and not (tmp_path / "zero" / "last.ckpt").is_symlink()


def test_last_is_a_copy_where_it_cannot_link(root_dir, tmp_path, monkeypatch):
    tried = []

    def refuse(*args, **kwargs):
        tried.append(args)
        raise OSError(1, "Operation not permitted")

    monkeypatch.setattr(os, "symlink", refuse)
    folder = tmp_path / "ck"
    _trainer(root_dir, 2, [ModelCheckpoint(dirpath=folder, save_last="link")]).fit(RegressionTask(n=16))
    assert len(tried) == 2  # one link asked for per save point
    last = folder / "last.ckpt"
    assert last.is_file() and not last.is_symlink()
    assert _files(folder) == ["epoch=1-step=4.ckpt", "last.ckpt"]
    assert last.read_bytes() == (folder / "epoch=1-step=4.ckpt").read_bytes()


# ---- resuming from another folder ----------------------------------------------------------------
def test_a_resume_from_another_folder_restores_the_best_path_only_and_warns(root_dir, tmp_path):
    script = {"score": [0.5, 0.3, 0.4]}
    first = ModelCheckpoint(dirpath=tmp_path / "a", monitor="score", save_last=True)
    _trainer(root_dir, 2, [first]).fit(RegressionTask(n=16, script=script))
    best = str(tmp_path / "a" / "epoch=1-step=4.ckpt")
    assert first.best_model_path == best
    other = ModelCheckpoint(dirpath=tmp_path / "b", monitor="score", save_top_k=0, save_last=True)
    with pytest.warns(UserWarning, match=r"written into .*/a, not this run's dirpath .*/b: only best_model_path is "
                                         r"restored"):
        _trainer(root_dir, 3, [other]).fit(RegressionTask(n=16, script=script),
                                          ckpt_path=str(tmp_path / "a" / "last.ckpt"))
    assert other.best_model_path == best  # as Lightning: "best" still finds the earlier run's best file
    assert other.best_k_models == {} and other.best_model_score is None
    assert other.last_model_path == str(tmp_path / "b" / "last.ckpt")
    assert _files(tmp_path / "a") == ["epoch=1-step=4.ckpt", "last.ckpt"]  # never touched
