"""``ckpt_path="last"`` where the ModelCheckpoint kept no ``last.ckpt`` (``save_last=False``, the
default): a restart goes on from the newest run's newest checkpoint and says which, rather than
retraining from epoch 0."""
from __future__ import annotations

import os
import re
import time

import pytest

from graphtrainer import ModelCheckpoint, Trainer

from tasks import RegressionTask


def _trainer(root, epochs, **ckpt):
    return Trainer(max_epochs=epochs, seed=0, progress_bar=False, enable_model_summary=False,
                   default_root_dir=root, callbacks=[ModelCheckpoint(**ckpt)])


def test_last_without_last_ckpt_resumes_from_the_newest_checkpoint_and_says_which(root_dir, capsys):
    _trainer(root_dir, 3, save_top_k=-1).fit(RegressionTask(n=16))
    folder = root_dir / "version_0" / "checkpoints"
    assert sorted(p.name for p in folder.iterdir()) == ["epoch=0-step=2.ckpt", "epoch=1-step=4.ckpt",
                                                        "epoch=2-step=6.ckpt"]
    capsys.readouterr()
    resumed = _trainer(root_dir, 5).fit(RegressionTask(n=16), ckpt_path="last")  # a new process's view
    out = capsys.readouterr().out
    assert f"ckpt_path='last': no last.ckpt in {folder} (ModelCheckpoint(save_last=True) keeps one): using its " \
           f"newest checkpoint, {folder / 'epoch=2-step=6.ckpt'}" in out
    assert [row["epoch"] for row in resumed.history] == [3, 4]


def test_the_newest_file_wins_over_a_better_named_one_and_last_ckpt_over_both(root_dir, capsys):
    _trainer(root_dir, 2, monitor="val_loss", save_top_k=2).fit(RegressionTask(n=16))
    folder = root_dir / "version_0" / "checkpoints"
    older, newer = sorted(folder.iterdir())
    now = time.time()
    os.utime(newer, (now - 100, now - 100))  # the epoch-0 file written last
    os.utime(older, (now, now))
    capsys.readouterr()
    _trainer(root_dir, 3).fit(RegressionTask(n=16), ckpt_path="last")
    assert re.search(rf"using its newest checkpoint, {re.escape(str(older))}\n", capsys.readouterr().out)
    last = root_dir / "version_1" / "checkpoints" / "last.ckpt"
    _trainer(root_dir, 4, save_last=True).fit(RegressionTask(n=16), ckpt_path="last")  # writes version_2's
    capsys.readouterr()
    trainer = _trainer(root_dir, 5)
    trainer.fit(RegressionTask(n=16), ckpt_path="last")
    assert f"ckpt_path='last': using {root_dir / 'version_2' / 'checkpoints' / 'last.ckpt'}" \
        in capsys.readouterr().out
    assert not last.exists()  # version_1 kept no last.ckpt: version_2, the newest, answered


def test_test_with_last_and_no_checkpoint_at_all_still_raises(root_dir):
    with pytest.raises(ValueError, match=r"no last checkpoint found in .*version_\*/checkpoints"):
        _trainer(root_dir, 1).test(RegressionTask(n=16), ckpt_path="last")
