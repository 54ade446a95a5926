"""``ModelCheckpoint(every_n_train_steps=N)`` as Lightning's: a save each time ``global_step`` reaches a
multiple of N, agreed by the ranks without a collective (they take the same steps), resuming exactly
at the next batch; inside ``Join`` only where every rank still has a batch, else at the epoch's end.
Real processes (fork, gloo)."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader

from graphtrainer import ModelCheckpoint, Trainer

from tasks import ExactBatches, RegressionTask

# 64 samples, batch 8, 2 ranks: 4 batches (and optimizer steps) per rank and epoch.


class _ExactTask(RegressionTask):
    """Dropout (a resume needs the generators as they were) and a loader of exact length: no Join."""

    def __init__(self, **kw):
        kw.setdefault("dropout", 0.3)
        super().__init__(**kw)

    def train_dataloader(self):
        return ExactBatches(torch.arange(self.n), self.batch_size, seed=self.trainer.seed)


class _UnevenTask(_ExactTask):
    """Rank 0 has 3 batches, rank 1 has 5 (torch loaders, so the counts are trusted): epochs in Join."""

    def train_dataloader(self):
        return DataLoader(torch.arange(24) if self.rank == 0 else torch.arange(24, 64), batch_size=8)


def _trainer(root, epochs, callbacks, **kw):
    kw.setdefault("num_procs", 2)
    return Trainer(max_epochs=epochs, seed=0, progress_bar=False, enable_model_summary=False,
                   default_root_dir=root, callbacks=list(callbacks), **kw)


def _files(folder: Path):
    return sorted(p.name for p in folder.iterdir())


def _load(path: Path):
    return torch.load(path, weights_only=True)


def _weights(task):
    return {k: v.detach().clone() for k, v in task.module.state_dict().items()}


@pytest.mark.timeout(120)
def test_saves_every_n_steps_mid_epoch_and_a_save_due_at_the_last_batch_at_the_epochs_end(root_dir, tmp_path):
    mc = ModelCheckpoint(dirpath=tmp_path / "ck", every_n_train_steps=3, save_top_k=-1, save_last=True)
    assert mc.every_n_epochs == 0  # as Lightning: steps set, epochs unset saves at steps only
    _trainer(root_dir, 3, [mc]).fit(_ExactTask())
    mid = ["epoch=0-step=3.ckpt", "epoch=1-step=6.ckpt", "epoch=2-step=9.ckpt"]
    assert _files(tmp_path / "ck") == sorted(mid + ["epoch=2-step=12.ckpt", "last.ckpt"])
    for name, step, done in zip(mid, (3, 6, 9), (3, 2, 1)):
        ckpt = _load(tmp_path / "ck" / name)
        assert (ckpt["global_step"], ckpt["epoch_finished"], ckpt["batches_done_in_epoch"]) == (step, False, done)
    end = _load(tmp_path / "ck" / "epoch=2-step=12.ckpt")  # step 12 is epoch 2's last batch
    assert end["epoch_finished"] and "batches_done_in_epoch" not in end
    assert _load(tmp_path / "ck" / "last.ckpt")["global_step"] == 12
    assert mc.last_model_path == str(tmp_path / "ck" / "last.ckpt")


def _same_run(whole, resumed, resumed_epoch):
    """Weights, optimizer state, step; the history of the epochs after the resumed one, and the resumed
    epoch's validation (its training mean covers the batches after the checkpoint)."""
    (w_trainer, w_task), (r_trainer, r_task) = whole, resumed
    assert r_trainer.global_step == w_trainer.global_step
    w, r = _weights(w_task), _weights(r_task)
    assert sorted(w) == sorted(r) and all(torch.equal(w[k], r[k]) for k in w)
    w_rows = {row["epoch"]: row for row in w_trainer.history}
    r_rows = {row["epoch"]: row for row in r_trainer.history}
    assert sorted(r_rows) == list(range(resumed_epoch, max(w_rows) + 1))
    assert r_rows[resumed_epoch]["val_loss"] == w_rows[resumed_epoch]["val_loss"]
    for epoch in range(resumed_epoch + 1, max(w_rows) + 1):
        assert r_rows[epoch] == w_rows[epoch], epoch


@pytest.mark.timeout(240)
@pytest.mark.parametrize("accumulate, name, epoch", [(1, "epoch=1-step=6.ckpt", 1), (2, "epoch=1-step=3.ckpt", 1)])
def test_resuming_from_a_step_checkpoint_equals_the_uninterrupted_run(root_dir, tmp_path, accumulate, name, epoch):
    # accumulate_grad_batches=2: 2 steps per epoch, so step 3 is epoch 1's first step (after its batch 1).
    def fit(folder, ckpt_path=None):
        task = _ExactTask()
        mc = ModelCheckpoint(dirpath=tmp_path / folder, every_n_train_steps=3, save_top_k=-1, save_last=True)
        trainer = _trainer(root_dir, 3, [mc], accumulate_grad_batches=accumulate)
        trainer.fit(task, ckpt_path=ckpt_path)
        return trainer, task

    whole = fit("a")
    start = _load(tmp_path / "a" / name)
    assert not start["epoch_finished"] and start["batches_done_in_epoch"] == 2
    resumed = fit("b", ckpt_path=str(tmp_path / "a" / name))
    _same_run(whole, resumed, epoch)
    w_last, r_last = _load(tmp_path / "a" / "last.ckpt"), _load(tmp_path / "b" / "last.ckpt")
    for w_opt, r_opt in zip(w_last["optimizer_states"], r_last["optimizer_states"]):
        for key, value in w_opt["state"].items():
            assert torch.equal(value["momentum_buffer"], r_opt["state"][key]["momentum_buffer"])


@pytest.mark.timeout(240)
def test_in_join_steps_save_where_every_rank_has_a_batch_left_else_at_the_epochs_end(root_dir, tmp_path):
    # Rank 0: 3 batches, rank 1: 5; every 2 steps. Epoch 0: step 2 after batch 1 (both ranks go on); step 4
    # falls after rank 0's last batch, so it is saved at the epoch's end (step 5, the longest rank's).
    def fit(folder, ckpt_path=None):
        task = _UnevenTask()
        mc = ModelCheckpoint(dirpath=tmp_path / folder, every_n_train_steps=2, save_top_k=-1)
        trainer = _trainer(root_dir, 2, [mc])
        trainer.fit(task, ckpt_path=ckpt_path)
        return trainer, task

    whole = fit("a")
    assert _files(tmp_path / "a") == ["epoch=0-step=2.ckpt", "epoch=0-step=5.ckpt", "epoch=1-step=10.ckpt",
                                      "epoch=1-step=6.ckpt"]
    assert _load(tmp_path / "a" / "epoch=0-step=5.ckpt")["epoch_finished"]
    assert _load(tmp_path / "a" / "epoch=1-step=6.ckpt")["batches_done_in_epoch"] == 1
    _same_run(whole, fit("b", ckpt_path=str(tmp_path / "a" / "epoch=1-step=6.ckpt")), 1)


@pytest.mark.timeout(120)
def test_with_batch_counts_the_ranks_cannot_trust_step_saves_fall_at_epoch_ends(root_dir, tmp_path):
    # The test tasks' own loader has a len() graphtrainer does not trust: every epoch runs in Join.
    mc = ModelCheckpoint(dirpath=tmp_path / "ck", every_n_train_steps=3, save_top_k=-1)
    _trainer(root_dir, 3, [mc]).fit(RegressionTask())
    assert _files(tmp_path / "ck") == ["epoch=0-step=4.ckpt", "epoch=1-step=8.ckpt", "epoch=2-step=12.ckpt"]


@pytest.mark.timeout(120)
def test_a_monitored_step_save_ranks_on_what_was_logged_so_far_and_waits_for_the_first_value(root_dir, tmp_path):
    mc = ModelCheckpoint(dirpath=tmp_path / "ck", every_n_train_steps=3, monitor="val_loss", save_top_k=-1,
                         filename="{step}")
    trainer = _trainer(root_dir, 3, [mc])
    trainer.fit(_ExactTask())
    val = [row["val_loss"] for row in trainer.history]
    # Step 3 comes before any validation: saved at epoch 0's end (step 4), after its validation.
    # Steps 6 and 9 rank on the last validation's value; step 12 (the last batch) on epoch 2's.
    expected = {"step=4.ckpt": val[0], "step=6.ckpt": val[0], "step=9.ckpt": val[1], "step=12.ckpt": val[2]}
    assert {Path(p).name: s for p, s in mc.best_k_models.items()} == pytest.approx(expected, rel=1e-6)
    assert _files(tmp_path / "ck") == sorted(expected)


def test_a_monitored_step_save_raises_when_the_value_is_still_missing_at_an_epochs_end(root_dir, tmp_path):
    mc = ModelCheckpoint(dirpath=tmp_path / "ck", every_n_train_steps=3, monitor="val_acc")
    with pytest.raises(KeyError, match=r"monitors 'val_acc', which was not logged by the end of epoch 0; logged "
                                       r"metrics: \['train_loss', 'val_loss'\]"):
        _trainer(root_dir, 2, [mc], num_procs=1).fit(_ExactTask(n=32))


@pytest.mark.parametrize("kw, message", [
    ({"every_n_train_steps": 5, "every_n_epochs": 1},
     r"every_n_train_steps=5, every_n_epochs=1\): use one, as Lightning's ModelCheckpoint takes them mutually "
     r"exclusive"),
    ({"every_n_train_steps": 5, "every_n_epochs": 2}, r"every_n_train_steps=5, every_n_epochs=2\): use one"),
    ({"every_n_train_steps": -1}, r"every_n_train_steps=-1\): use None or a count of at least 0"),
    ({"every_n_epochs": -2}, r"every_n_epochs=-2\): use None or a count of at least 0"),
    ({"save_on_exception": True}, r"save_on_exception=True\): when one rank raises, the others cannot join the "
                                  r"collective save.*every_n_train_steps=N and save_last=True"),
])
def test_lightning_rules_for_the_save_triggers(kw, message):
    with pytest.raises(ValueError, match=message):
        ModelCheckpoint(**kw)


def test_step_and_epoch_triggers_resolve_as_lightnings_and_key_the_state():
    steps = ModelCheckpoint(every_n_train_steps=5, every_n_epochs=0)
    assert (steps.every_n_epochs, steps.every_n_train_steps) == (0, 5)
    assert steps.state_key == "ModelCheckpoint{monitor=None,mode=min,every_n_epochs=0,every_n_train_steps=5}"
    plain = ModelCheckpoint(every_n_train_steps=0)
    assert (plain.every_n_epochs, plain.every_n_train_steps) == (1, 0)
    assert plain.state_key == "ModelCheckpoint{monitor=None,mode=min}"  # as before: earlier files' key
    assert not ModelCheckpoint(save_on_exception=False).save_on_exception
