"""Several ModelCheckpoints in one trainer (a monitored top-k one first, the one keeping ``last.ckpt``
after it, as Lightning users write them): ``ckpt_path="last"`` takes the newest ``last*.ckpt`` of any of
them, and a preemption replaces the ``last.ckpt`` that the one keeping it wrote."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from graphtrainer import ModelCheckpoint, Preempted, Trainer

from tasks import RegressionTask, SigtermAt as _StoppedAt


def _trainer(root, epochs, callbacks):
    return Trainer(max_epochs=epochs, seed=0, progress_bar=False, enable_model_summary=False,
                   default_root_dir=root, callbacks=list(callbacks))


def _files(folder: Path):
    return sorted(p.name for p in folder.iterdir())


def test_last_is_the_last_ckpt_of_a_later_callback_in_its_own_folder(root_dir, tmp_path, capsys):
    a, b = tmp_path / "a", tmp_path / "b"

    def callbacks():  # the first keeps no last.ckpt, and its newest file is an epoch older
        return [ModelCheckpoint(dirpath=a, every_n_epochs=2),
                ModelCheckpoint(dirpath=b, monitor="val_loss", save_top_k=0, save_last=True)]

    trainer = _trainer(root_dir, 3, callbacks())
    task = RegressionTask(n=16)
    trainer.fit(task)
    assert _files(a) == ["epoch=1-step=4.ckpt"] and _files(b) == ["last.ckpt"]
    capsys.readouterr()
    trainer.validate(task, ckpt_path="last")  # the same trainer
    assert f"ckpt_path='last': using {b / 'last.ckpt'}\n" in capsys.readouterr().out
    resumed = _trainer(root_dir, 4, callbacks())  # a new process's view
    resumed.fit(RegressionTask(n=16), ckpt_path="last")
    assert f"ckpt_path='last': using {b / 'last.ckpt'}\n" in capsys.readouterr().out
    assert [row["epoch"] for row in resumed.history] == [3]  # not epochs 2 and 3 again from a's file


@pytest.mark.parametrize("save_last", [True, "link"])
def test_a_preemption_replaces_the_last_ckpt_of_the_callback_keeping_it(root_dir, tmp_path, save_last):
    folder = tmp_path / "ck"

    def callbacks():
        return [ModelCheckpoint(dirpath=folder, filename="a-{epoch}", monitor="val_loss", save_top_k=-1),
                ModelCheckpoint(dirpath=folder, filename="b-{epoch}", save_last=save_last)]

    with pytest.raises(Preempted) as info:  # in epoch 1, after epoch 0's files
        _trainer(root_dir, 3, callbacks()).fit(_StoppedAt(at_step=3, n=16))
    assert info.value.checkpoint == str(folder / "last.ckpt")
    assert _files(folder) == ["a-epoch=0.ckpt", "b-epoch=0.ckpt", "last.ckpt"]
    assert not (folder / "last.ckpt").is_symlink()  # a full checkpoint in place of the link
    assert torch.load(folder / "b-epoch=0.ckpt", weights_only=True)["global_step"] == 2  # not written over
    resumed = _trainer(root_dir, 3, callbacks())
    resumed.fit(_StoppedAt(n=16), ckpt_path="last")
    assert _files(folder) == ["a-epoch=0.ckpt", "a-epoch=1.ckpt", "a-epoch=2.ckpt", "b-epoch=2.ckpt",
                              "last.ckpt"]  # no last-v1.ckpt left behind
    assert torch.load(folder / "last.ckpt", weights_only=True)["global_step"] == 6
    assert resumed.callbacks[1].last_model_path == str(folder / "last.ckpt")


def test_two_checkpoint_callbacks_with_one_state_key_are_refused_naming_the_fix(root_dir, tmp_path):
    with pytest.raises(ValueError, match=r"two ModelCheckpoint callbacks have the same state key "
                                         r"'ModelCheckpoint\{monitor=val_loss,mode=min\}'.*different monitor, "
                                         r"mode, every_n_epochs or every_n_train_steps"):
        _trainer(root_dir, 1, [ModelCheckpoint(dirpath=tmp_path / "a", monitor="val_loss"),
                               ModelCheckpoint(dirpath=tmp_path / "b", monitor="val_loss", save_top_k=-1)])


def test_callbacks_differing_in_every_n_epochs_keep_their_own_state(root_dir, tmp_path):
    a, b = ModelCheckpoint(dirpath=tmp_path / "a", every_n_epochs=2), ModelCheckpoint(dirpath=tmp_path / "b")
    _trainer(root_dir, 2, [a, b]).fit(RegressionTask(n=16))
    assert a.best_model_path == str(tmp_path / "a" / "epoch=1-step=4.ckpt")
    assert b.best_model_path == str(tmp_path / "b" / "epoch=1-step=4.ckpt")
    states = torch.load(b.best_model_path, weights_only=True)["callbacks"]
    assert states[a.state_key]["dirpath"] == str(tmp_path / "a")
    assert states[b.state_key]["dirpath"] == str(tmp_path / "b")
