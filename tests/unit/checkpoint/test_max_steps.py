"""A fit that ``max_steps`` stops mid-epoch writes checkpoints that resume at the next batch
(not as a finished epoch), and resuming a run that reached ``max_steps``/``max_epochs`` trains
nothing and says so."""
from __future__ import annotations

import pytest
import torch

from graphtrainer import ModelCheckpoint, Trainer

from tasks import RegressionTask


def _fit(root, folder, ckpt_path=None, **kw):
    task = RegressionTask(dropout=0.3)  # dropout: the resumed run needs the generators as they were
    trainer = Trainer(num_procs=1, seed=0, progress_bar=False, enable_model_summary=False, default_root_dir=root,
                      callbacks=[ModelCheckpoint(dirpath=folder, save_top_k=0, save_last=True)], **kw)
    trainer.fit(task, ckpt_path=ckpt_path)
    return trainer, {k: v.detach().clone() for k, v in task.module.state_dict().items()}


def test_a_max_steps_stop_mid_epoch_resumes_at_the_next_batch_exactly(root_dir, tmp_path):
    whole, weights = _fit(root_dir, tmp_path / "a", max_epochs=3)  # 8 batches per epoch
    _fit(root_dir, tmp_path / "b", max_epochs=3, max_steps=12)  # stops after batch 3 of epoch 1
    saved = torch.load(tmp_path / "b" / "last.ckpt", weights_only=True)
    assert (saved["epoch"], saved["epoch_finished"], saved["global_step"]) == (1, False, 12)
    assert saved["batches_done_in_epoch"] == 4
    assert saved["lr_scheduler_states"][0]["last_epoch"] == 1  # not stepped for the unfinished epoch
    last = str(tmp_path / "b" / "last.ckpt")
    resumed, resumed_weights = _fit(root_dir, tmp_path / "c", max_epochs=3, ckpt_path=last)
    assert resumed.global_step == whole.global_step == 24
    assert sorted(resumed_weights) == sorted(weights)
    for key in weights:
        assert torch.equal(resumed_weights[key], weights[key]), key
    assert [row["epoch"] for row in resumed.history] == [1, 2]


@pytest.mark.parametrize("limits, reached", [(dict(max_epochs=2), "max_epochs=2"),
                                             (dict(max_epochs=5, max_steps=10), "max_steps=10")])
def test_resuming_a_run_that_reached_its_limit_trains_nothing_and_says_so(root_dir, tmp_path, capsys,
                                                                           limits, reached):
    done, weights = _fit(root_dir, tmp_path / "a", max_epochs=2)
    capsys.readouterr()
    again, again_weights = _fit(root_dir, tmp_path / "b", ckpt_path=str(tmp_path / "a" / "last.ckpt"), **limits)
    assert again.history == [] and again.global_step == done.global_step == 16
    for key in weights:
        assert torch.equal(again_weights[key], weights[key]), key
    out = capsys.readouterr().out
    assert f"[graphtrainer] {reached}" in out and "already reached it, nothing to train" in out
