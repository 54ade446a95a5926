"""Run directories, hparams.yaml, metrics.csv (epoch and step rows, crash safety),
the optional TensorBoard logger and an unwritable ``default_root_dir``."""
from __future__ import annotations

import csv
import sys

import pytest
import yaml

import graphtrainer.launch.local as local_launch
import graphtrainer.trainer as trainer_module
from graphtrainer import LearningRateMonitor, ModelCheckpoint, RankFailedError, Trainer
from graphtrainer.loop.loggers import TensorBoardLogger

from tasks import RegressionTask, SageTask, make_graph
from conftest import rank_children


def _rows(path):
    with open(path, newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def _epoch_rows(rows):
    return [r for r in rows if r.get("train_loss")]


def _step_rows(rows):
    return [r for r in rows if r.get("train_loss_step")]


@pytest.mark.timeout(60)
def test_successive_fits_get_versioned_run_dirs(root_dir):
    first = Trainer(max_epochs=1, progress_bar=False, default_root_dir=root_dir).fit(RegressionTask())
    second = Trainer(max_epochs=1, progress_bar=False, default_root_dir=root_dir).fit(RegressionTask())
    ckpt = ModelCheckpoint(save_top_k=1)
    third = Trainer(num_procs=2, launcher="fork", max_epochs=1, progress_bar=False, default_root_dir=root_dir,
                    callbacks=[ckpt]).fit(RegressionTask())
    assert (first.log_dir, second.log_dir, third.log_dir) == tuple(root_dir / f"version_{i}" for i in range(3))
    assert sorted(p.name for p in root_dir.iterdir()) == ["version_0", "version_1", "version_2"]
    for i in range(3):
        assert {"hparams.yaml", "metrics.csv"} <= {p.name for p in (root_dir / f"version_{i}").iterdir()}
    # The checkpoints of a run live in its directory by default.
    assert ckpt.best_model_path == str(root_dir / "version_2" / "checkpoints" / "epoch=0-step=4.ckpt")
    assert (root_dir / "version_2" / "checkpoints" / "epoch=0-step=4.ckpt").is_file()


def test_hparams_yaml_holds_saved_hyperparameters(root_dir):
    task = RegressionTask(hidden=12, lr=0.05, dropout=0.25, script={"score": [0.5]})
    trainer = Trainer(max_epochs=1, progress_bar=False, default_root_dir=root_dir).fit(task)
    saved = yaml.safe_load((trainer.log_dir / "hparams.yaml").read_text())
    assert saved == task.hparams
    assert saved["hidden"] == 12 and saved["lr"] == 0.05 and saved["dropout"] == 0.25
    assert saved["script"] == {"score": [0.5]}


@pytest.mark.timeout(60)
def test_hparams_yaml_with_named_hyperparameters_two_ranks(root_dir):
    task = SageTask(make_graph(), hidden=8, lr=0.02)
    trainer = Trainer(num_procs=2, launcher="fork", max_epochs=1, progress_bar=False,
                      default_root_dir=root_dir).fit(task)
    saved = yaml.safe_load((trainer.log_dir / "hparams.yaml").read_text())
    # Only the names given to save_hyperparameters; never the graph.
    assert saved == {"fanouts": [4, 4], "hidden": 8, "dropout": 0.5, "lr": 0.02, "batch_size": 16}


@pytest.mark.timeout(60)
def test_metrics_csv_has_reduced_epoch_rows_and_step_rows(root_dir):
    # Per-rank values 0.2 and 0.4 (weight 1 each): the logged epoch value is their mean.
    task = RegressionTask(script={"score": [[0.2, 0.2, 0.2], [0.4, 0.6, 0.8]]})
    trainer = Trainer(num_procs=2, launcher="fork", max_epochs=3, progress_bar=False, default_root_dir=root_dir,
                      log_every_n_steps=3, callbacks=[LearningRateMonitor()])
    trainer.fit(task)
    rows = _rows(trainer.log_dir / "metrics.csv")
    epochs = _epoch_rows(rows)
    assert [int(r["epoch"]) for r in epochs] == [0, 1, 2]
    for row, hist in zip(epochs, trainer.history):
        for name in ("train_loss", "val_loss", "score", "lr-SGD"):
            assert float(row[name]) == hist[name]
        assert int(row["step"]) == hist["step"]
    assert [float(r["score"]) for r in epochs] == pytest.approx([0.3, 0.4, 0.5])
    # 2 ranks x 32 samples / batch 8: 4 steps per epoch, 12 in all; a row every 3rd step.
    steps = _step_rows(rows)
    assert [int(r["step"]) for r in steps] == [3, 6, 9, 12]
    assert [int(r["epoch"]) for r in steps] == [0, 1, 2, 2]
    assert all(float(r["train_loss_step"]) > 0 for r in steps)
    # Rows are written in order: step rows of an epoch come before its epoch row.
    order = [("e" if r.get("train_loss") else "s") + r["step"] for r in rows]
    assert order == ["s3", "e4", "s6", "e8", "s9", "s12", "e12"]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("hard", [False, True], ids=["exception", "process_killed"])
def test_crash_keeps_rows_logged_before_it(root_dir, hard):
    task = RegressionTask(fail_at_epoch=2, hard_fail=hard)
    trainer = Trainer(num_procs=2, launcher="fork", max_epochs=5, progress_bar=False, default_root_dir=root_dir)
    with pytest.raises(RankFailedError) as info:
        trainer.fit(task)
    assert info.value.rank == 0
    assert info.value.error_type == ("ProcessDied" if hard else "RuntimeError")
    rows = _rows(root_dir / "version_0" / "metrics.csv")
    assert [int(r["epoch"]) for r in _epoch_rows(rows)] == [0, 1]
    assert all(float(r["train_loss"]) > 0 and float(r["val_loss"]) > 0 for r in _epoch_rows(rows))
    assert not rank_children()


def test_crash_in_process_keeps_rows(root_dir):
    trainer = Trainer(max_epochs=5, progress_bar=False, default_root_dir=root_dir)
    with pytest.raises(RuntimeError, match="planned failure at epoch 2"):
        trainer.fit(RegressionTask(fail_at_epoch=2))
    rows = _rows(root_dir / "version_0" / "metrics.csv")
    assert [int(r["epoch"]) for r in _epoch_rows(rows)] == [0, 1]


def test_logger_false_writes_no_metrics(root_dir):
    trainer = Trainer(max_epochs=1, progress_bar=False, default_root_dir=root_dir, logger=False)
    trainer.fit(RegressionTask())
    assert list(trainer.log_dir.iterdir()) == []


@pytest.mark.timeout(60)
@pytest.mark.parametrize("num_procs", [1, 2])
def test_tensorboard_logger_writes_the_reduced_epoch_scalars(root_dir, num_procs):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    trainer = Trainer(num_procs=num_procs, max_epochs=3, progress_bar=False, default_root_dir=root_dir,
                      logger=TensorBoardLogger())
    trainer.fit(RegressionTask())
    assert (trainer.log_dir / "metrics.csv").is_file()  # the CSV logger always runs beside it
    events = EventAccumulator(str(trainer.log_dir))
    events.Reload()
    for name in ("train_loss", "val_loss"):
        logged = [e.value for e in events.Scalars(name)]
        assert logged == pytest.approx([row[name] for row in trainer.history], rel=1e-6)


def test_tensorboard_logger_without_tensorboard_says_how_to_install(root_dir, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # import now fails
    trainer = Trainer(max_epochs=1, progress_bar=False, default_root_dir=root_dir, logger=TensorBoardLogger())
    with pytest.raises(ImportError, match=r"TensorBoardLogger needs tensorboard: pip install"):
        trainer.fit(RegressionTask())


# ---- unwritable default_root_dir ----------------------------------------------------------
@pytest.mark.timeout(60)
@pytest.mark.parametrize("num_procs", [1, 2])
def test_unwritable_root_dir_fails_before_launch(tmp_path, monkeypatch, num_procs):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    root = blocker / "runs"  # its parent is a regular file: no one, not even root, can create it
    launched, ran = [], []
    real_launch, real_run_rank = local_launch.launch, trainer_module.run_rank
    monkeypatch.setattr(local_launch, "launch", lambda *a, **k: launched.append(1) or real_launch(*a, **k))
    monkeypatch.setattr(trainer_module, "run_rank", lambda *a, **k: ran.append(1) or real_run_rank(*a, **k))
    trainer = Trainer(num_procs=num_procs, launcher="fork", max_epochs=1, progress_bar=False,
                      default_root_dir=root)
    with pytest.raises(PermissionError, match=f"default_root_dir {root} cannot be written"):
        trainer.fit(RegressionTask())
    assert launched == [] and ran == []
    assert not rank_children()
    assert blocker.read_text() == "not a directory"
