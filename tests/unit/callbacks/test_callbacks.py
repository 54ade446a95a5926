"""Callbacks (ModelCheckpoint, EarlyStopping, ProgressBar, PrintMetrics, LearningRateMonitor) and
training controls (optimizer/scheduler forms, gradient clipping, accumulation)."""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import torch

from graphtrainer.callbacks.summary import summarize
from graphtrainer import (Callback, EarlyStopping, LearningRateMonitor, ModelCheckpoint, PrintMetrics,
                          ProgressBar, RankFailedError, Trainer)

from tasks import RegressionTask, Recorder


def _trainer(root, epochs, callbacks=(), num_procs=1, **kw):
    return Trainer(num_procs=num_procs, launcher="fork", max_epochs=epochs, seed=0, progress_bar=False,
                   default_root_dir=root, callbacks=list(callbacks), **kw)


def _files(dirpath):
    return sorted(p.name for p in Path(dirpath).iterdir())


def expected_stop(values, mode, patience, min_delta):
    """Index of the epoch at which EarlyStopping's rule stops, or None."""
    best, wait = None, 0
    for epoch, value in enumerate(values):
        if not math.isfinite(value):
            return epoch
        if best is None or (value < best - min_delta if mode == "min" else value > best + min_delta):
            best, wait = value, 0
        else:
            wait += 1
            if wait >= max(1, patience):
                return epoch
    return None


# ---- ModelCheckpoint ---------------------------------------------------------------------
SCORES = [0.5, 0.3, 0.8, 0.2, 0.6, 0.4]


@pytest.mark.parametrize("mode, kept, best", [
    ("min", ["epoch=1-score=0.3000.ckpt", "epoch=3-score=0.2000.ckpt"], ("epoch=3-score=0.2000.ckpt", 0.2)),
    ("max", ["epoch=2-score=0.8000.ckpt", "epoch=4-score=0.6000.ckpt"], ("epoch=2-score=0.8000.ckpt", 0.8)),
])
def test_top_k_rotation_keeps_exactly_the_k_best(root_dir, tmp_path, mode, kept, best):
    ckpt = ModelCheckpoint(dirpath=tmp_path / "ck", filename="{epoch}-{score:.4f}", monitor="score",
                           mode=mode, save_top_k=2)
    rec = Recorder()
    _trainer(root_dir, len(SCORES), [ckpt, rec]).fit(RegressionTask(script={"score": SCORES}))
    assert _files(tmp_path / "ck") == kept
    assert Path(ckpt.best_model_path).name == best[0]
    assert ckpt.best_model_score == pytest.approx(best[1])
    assert sorted(Path(p).name for p in ckpt.best_k_models) == kept
    # At every epoch the callback held at most 2 files, the 2 best so far.
    for row in rec.rows:
        so_far = SCORES[: row["epoch"] + 1]
        top = sorted(so_far, reverse=(mode == "max"))[:2]
        assert sorted(row["best_k_models"].values()) == pytest.approx(sorted(top))
    # Each kept file is the checkpoint of its epoch.
    for name in kept:
        epoch = int(name.split("-")[0].split("=")[1])
        saved = torch.load(tmp_path / "ck" / name, weights_only=True)
        assert saved["epoch"] == epoch and saved["epoch_finished"]  # the file name's epoch


def test_filename_format_with_metric(root_dir, tmp_path):
    ckpt = ModelCheckpoint(dirpath=tmp_path / "ck", filename="{epoch}-{val_loss:.4f}", monitor="val_loss",
                           save_top_k=1)
    task = RegressionTask(validate=False, script={"val_loss": [0.9, 0.8, 0.5, 0.1234, 0.3]})
    _trainer(root_dir, 5, [ckpt]).fit(task)
    assert _files(tmp_path / "ck") == ["epoch=3-val_loss=0.1234.ckpt"]
    assert ckpt.best_model_path == str(tmp_path / "ck" / "epoch=3-val_loss=0.1234.ckpt")


def test_save_last_and_every_n_epochs(root_dir, tmp_path):
    ckpt = ModelCheckpoint(dirpath=tmp_path / "ck", save_top_k=-1, save_last=True, every_n_epochs=2)
    _trainer(root_dir, 5, [ckpt]).fit(RegressionTask())
    # 8 steps per epoch; saves after epochs 1 and 3 only.
    assert _files(tmp_path / "ck") == ["epoch=1-step=16.ckpt", "epoch=3-step=32.ckpt", "last.ckpt"]
    last = torch.load(tmp_path / "ck" / "last.ckpt", weights_only=True)
    assert last["epoch"] == 3 and last["epoch_finished"] and last["global_step"] == 32
    assert ckpt.last_model_path == str(tmp_path / "ck" / "last.ckpt")


def test_default_dirpath_is_inside_the_run_directory(root_dir):
    ckpt = ModelCheckpoint(save_top_k=1)
    trainer = _trainer(root_dir, 2, [ckpt]).fit(RegressionTask())
    assert trainer.log_dir == root_dir / "version_0"
    assert _files(root_dir / "version_0" / "checkpoints") == ["epoch=1-step=16.ckpt"]


@pytest.mark.timeout(60)
def test_two_ranks_agree_on_checkpoints_and_caller_sees_best(root_dir, tmp_path):
    # Per-rank values; the decision must use their exact mean (0.6, 0.5, 0.45, 0.35, 0.5),
    # whose 2 best epochs (3, 2) differ from rank 0's own (3, 1).
    script = {"score": [[0.5, 0.3, 0.8, 0.2, 0.6], [0.7, 0.7, 0.1, 0.5, 0.4]]}
    ckpt = ModelCheckpoint(dirpath=tmp_path / "ck", filename="{epoch}-{score:.4f}", monitor="score",
                           save_top_k=2, save_last=True)
    (tmp_path / "ranks").mkdir()
    trainer = _trainer(root_dir, 5, [ckpt, Recorder(str(tmp_path / "ranks"))], num_procs=2)
    trainer.fit(RegressionTask(script=script))
    assert [row["score"] for row in trainer.history] == pytest.approx([0.6, 0.5, 0.45, 0.35, 0.5])
    # Written once (one file per name, no leftovers from a second writer).
    assert _files(tmp_path / "ck") == ["epoch=2-score=0.4500.ckpt", "epoch=3-score=0.3500.ckpt", "last.ckpt"]
    # The caller's callback object knows the outcome of the run.
    assert ckpt.best_model_path == str(tmp_path / "ck" / "epoch=3-score=0.3500.ckpt")
    assert ckpt.best_model_score == pytest.approx(0.35)
    assert ckpt.last_model_path == str(tmp_path / "ck" / "last.ckpt")
    # Every rank held the same state after every epoch.
    rank0 = json.loads((tmp_path / "ranks" / "rank0.json").read_text())
    rank1 = json.loads((tmp_path / "ranks" / "rank1.json").read_text())
    assert len(rank0) == 5 and rank0 == rank1
    assert rank0[-1]["best_model_path"] == ckpt.best_model_path


# ---- EarlyStopping -------------------------------------------------------------------------
@pytest.mark.timeout(60)
def test_early_stopping_two_ranks_stop_at_the_same_epoch(root_dir, tmp_path):
    # Alone, rank 0 would stop at epoch 5 and rank 1 at epoch 4; their mean stops at 3.
    script = {"score": [[1.0, 0.7, 0.80, 0.62, 0.9, 0.9, 0.9, 0.9],
                        [1.0, 0.9, 0.84, 0.92, 0.9, 0.9, 0.9, 0.9]]}
    es = EarlyStopping(monitor="score", patience=2, min_delta=0.05, verbose=False)
    (tmp_path / "ranks").mkdir()
    trainer = _trainer(root_dir, 8, [es, Recorder(str(tmp_path / "ranks"))], num_procs=2)
    trainer.fit(RegressionTask(script=script))
    logged = [row["score"] for row in trainer.history]
    stop = expected_stop(logged + [0.9] * 8, "min", 2, 0.05)
    assert stop == 3
    assert len(trainer.history) == stop + 1 and trainer.current_epoch == stop + 1
    assert es.stopped_epoch == stop and "did not improve" in es.stop_reason
    ranks = [json.loads((tmp_path / "ranks" / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0] == ranks[1]
    assert [row["epoch"] for row in ranks[0]] == list(range(stop + 1))
    assert [row["should_stop"] for row in ranks[0]] == [False] * stop + [True]


def test_early_stopping_nan_stops_at_once(root_dir, capsys):
    es = EarlyStopping(monitor="score", patience=10)
    trainer = _trainer(root_dir, 6, [es])
    trainer.fit(RegressionTask(script={"score": [1.0, 0.5, float("nan"), 0.1, 0.1, 0.1]}))
    assert len(trainer.history) == 3
    assert es.stopped_epoch == 2
    assert "early stopping at epoch 2: score = nan is not finite" in capsys.readouterr().out


@pytest.mark.parametrize("mode, patience, min_delta, values, stop", [
    ("min", 1, 0.0, [1.0, 0.9, 0.9, 0.8, 0.7], 2),              # equal is not better
    ("min", 3, 0.1, [1.0, 0.95, 0.92, 0.91, 0.5, 0.4], 3),      # gains below min_delta do not count
    ("min", 2, 0.1, [1.0, 0.85, 0.95, 0.74, 0.7, 0.8, 0.3], 5),  # 0.74 < 0.85 - 0.1 resets patience
    ("max", 2, 0.0, [0.1, 0.2, 0.3, 0.25, 0.31, 0.2, 0.2, 0.9], 6),
    ("max", 3, 0.0, [0.1, 0.2, 0.3, 0.4, 0.5], None),           # always improving: runs to the end
])
def test_early_stopping_patience_and_min_delta(root_dir, mode, patience, min_delta, values, stop):
    assert expected_stop(values, mode, patience, min_delta) == stop
    es = EarlyStopping(monitor="score", mode=mode, patience=patience, min_delta=min_delta, verbose=False)
    trainer = _trainer(root_dir, len(values), [es])
    trainer.fit(RegressionTask(validate=False, script={"score": values}))
    assert len(trainer.history) == (len(values) if stop is None else stop + 1)
    assert es.stopped_epoch == stop


@pytest.mark.parametrize("make", [lambda: EarlyStopping(monitor="nope"),
                                  lambda: ModelCheckpoint(monitor="nope")], ids=["early_stopping", "checkpoint"])
def test_monitor_never_logged_fails_at_first_check(root_dir, make):
    trainer = _trainer(root_dir, 3, [make()])
    with pytest.raises(KeyError, match=r"'nope', which was not logged by the end of epoch 0; logged metrics: \['train_loss', 'val_loss'\]"):
        trainer.fit(RegressionTask())
    assert trainer.current_epoch == 0 and trainer.history == []


@pytest.mark.timeout(60)
def test_monitor_never_logged_two_ranks(root_dir):
    trainer = _trainer(root_dir, 3, [EarlyStopping(monitor="nope")], num_procs=2)
    with pytest.raises(RankFailedError, match=r"KeyError: .*'nope'.*logged metrics: \['train_loss', 'val_loss'\]"):
        trainer.fit(RegressionTask())


# ---- ProgressBar -----------------------------------------------------------------------------
def test_progress_bar_silent_when_not_a_tty(root_dir, capsys):
    trainer = Trainer(max_epochs=2, default_root_dir=root_dir)  # progress_bar=True by default
    assert any(isinstance(cb, ProgressBar) for cb in trainer.callbacks)
    task = RegressionTask()
    trainer.fit(task)
    captured = capsys.readouterr()
    # Nothing but the model summary (on by default, printed once at the start).
    assert captured.err == "" and captured.out == summarize(task.module) + "\n"


def test_progress_bar_forced_shows_epoch_steps_loss_and_rate(root_dir, capsys):
    bar = ProgressBar(force=True, refresh_rate=2)
    Trainer(max_epochs=2, default_root_dir=root_dir, progress_bar=False, callbacks=[bar]).fit(RegressionTask())
    err = capsys.readouterr().err
    lines = [part for part in re.split(r"[\r\n]", err) if part]
    final0 = [s for s in lines if s.startswith("epoch 0: 100%")][-1]
    final1 = [s for s in lines if s.startswith("epoch 1: 100%")][-1]
    assert "8/8" in final0 and "step=8" in final0 and "step=16" in final1
    for line in (final0, final1):
        assert re.search(r"it/s=[0-9.]+", line) and re.search(r"loss=[0-9.]+", line)
        assert re.search(r"train_loss=[0-9.]+", line)  # logged with prog_bar=True


@pytest.mark.timeout(60)
def test_progress_bar_only_on_rank_zero(root_dir, capfd):
    _trainer(root_dir, 2, [ProgressBar(force=True)], num_procs=2).fit(RegressionTask())
    err = capfd.readouterr().err
    # Each bar starts by drawing itself at 0%: one bar per epoch, not one per rank.
    assert len(re.findall(r"epoch 0:\s+0%", err)) == 1
    assert len(re.findall(r"epoch 1:\s+0%", err)) == 1
    assert "4/4" in err  # rank 0's share: 32 samples in batches of 8


# ---- PrintMetrics ----------------------------------------------------------------------------
@pytest.mark.timeout(60)
def test_print_metrics_one_reduced_line_per_epoch_on_rank_zero(root_dir, capfd):
    # Each rank logs its own score at its validation epoch end: the line shows the mean over
    # both ranks, so it is printed after validation and after the reduction.
    script = {"score": [[0.0, 1.0, 2.0], [1.0, 2.0, 3.0]]}
    show = PrintMetrics(["score", "val_loss", "never_logged"], formats={"score": ".2f"})
    trainer = _trainer(root_dir, 3, [show], num_procs=2)
    trainer.fit(RegressionTask(script=script))
    lines = [line for line in capfd.readouterr().out.splitlines() if line.startswith("epoch")]
    # One line per epoch (rank 0 only), numbered as history rows and checkpoint names are.
    assert [row["epoch"] for row in trainer.history] == [0, 1, 2]
    assert lines == [f"epoch {row['epoch']:3d}  score {row['score']:.2f}  val_loss {row['val_loss']:.4f}"
                     for row in trainer.history]
    assert [row["score"] for row in trainer.history] == [0.5, 1.5, 2.5]


def test_print_metrics_keys_patterns_and_formats():
    metrics = {"train_loss": 0.25, "b_rank1": 2.0, "b_rank0": 3.0, "val_acc": 0.5}
    show = PrintMetrics(["train_loss", "b_rank*", "val_auc", "train_loss"], formats={"b_rank*": ".0f"})
    assert show.selected(metrics) == ["train_loss", "b_rank0", "b_rank1"]  # missing left out, once each
    assert show.format_line(7, metrics, seconds=12.4) == "epoch   7  train_loss 0.2500  b_rank0 3  b_rank1 2  (12 s)"
    assert PrintMetrics(fmt=".1f").format_line(0, {"z": 1.0, "a": 2.0}) == "epoch   0  a 2.0  z 1.0"
    with pytest.raises(TypeError, match="sequence of metric names"):
        PrintMetrics("train_loss")


# ---- LearningRateMonitor and configure_optimizers forms -------------------------------------
def test_lr_monitor_follows_step_lr(root_dir):
    trainer = _trainer(root_dir, 4, [LearningRateMonitor()])
    trainer.fit(RegressionTask(scheduler="step", gamma=0.5))
    assert [row["lr-SGD"] for row in trainer.history] == pytest.approx([0.1, 0.05, 0.025, 0.0125])
    assert trainer.optimizers[0].param_groups[0]["lr"] == pytest.approx(0.1 * 0.5 ** 4)


def test_bare_optimizer_keeps_lr(root_dir):
    task = RegressionTask(scheduler="bare")
    before = [p.detach().clone() for p in task.configure_model().parameters()]
    trainer = _trainer(root_dir, 3, [LearningRateMonitor()]).fit(task)
    assert trainer.lr_schedulers == [] and len(trainer.optimizers) == 1
    assert [row["lr-SGD"] for row in trainer.history] == [0.1, 0.1, 0.1]
    assert trainer.history[-1]["train_loss"] < trainer.history[0]["train_loss"]
    assert len(before) == len(list(task.module.parameters()))


class LrPerStep(Callback):
    def __init__(self):
        self.lrs = []

    def on_train_batch_end(self, trainer, task, outputs, batch, batch_idx):
        self.lrs.append((trainer.global_step, trainer.optimizers[0].param_groups[0]["lr"]))


def test_step_interval_scheduler_changes_lr_every_step(root_dir):
    rec = LrPerStep()
    _trainer(root_dir, 2, [rec]).fit(RegressionTask(scheduler="step_interval", gamma=0.9))
    assert [s for s, _ in rec.lrs] == list(range(1, 17))
    assert [lr for _, lr in rec.lrs] == pytest.approx([0.1 * 0.9 ** s for s in range(1, 17)])


def test_reduce_on_plateau_with_monitor(root_dir):
    task = RegressionTask(scheduler="plateau", gamma=0.5, plateau_monitor="score",
                          script={"score": [1.0, 1.0, 1.0, 0.5, 0.5]})
    trainer = _trainer(root_dir, 5, [LearningRateMonitor()]).fit(task)
    assert isinstance(trainer.lr_schedulers[0].scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)
    # patience=0: every epoch without improvement halves the LR for the next epoch.
    assert [row["lr-SGD"] for row in trainer.history] == pytest.approx([0.1, 0.1, 0.05, 0.025, 0.025])


def test_reduce_on_plateau_without_monitor_is_rejected(root_dir):
    class NoMonitor(RegressionTask):
        def configure_optimizers(self):
            opt = torch.optim.SGD(self.model.parameters(), lr=0.1)
            return [opt], [torch.optim.lr_scheduler.ReduceLROnPlateau(opt)]

    with pytest.raises(ValueError, match="ReduceLROnPlateau needs a metric"):
        _trainer(root_dir, 1).fit(NoMonitor())


# ---- gradient clipping ------------------------------------------------------------------------
class GradNorms(Callback):
    """Total gradient norm seen by the optimizer at each step (after any clipping)."""

    def __init__(self):
        self.norms = []

    @property
    def state_key(self):
        return "GradNorms"

    def state_dict(self):  # comes back to the caller from rank 0
        return {"norms": list(self.norms)}

    def load_state_dict(self, state):
        self.norms = list(state["norms"])

    def on_fit_start(self, trainer, task):
        def pre_step(opt, args, kwargs):
            grads = [p.grad for group in opt.param_groups for p in group["params"] if p.grad is not None]
            self.norms.append(float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))))

        trainer.optimizers[0].register_step_pre_hook(pre_step)


@pytest.mark.parametrize("num_procs", [1, 2])
@pytest.mark.timeout(60)
def test_gradient_clip_val_clips_the_global_norm(root_dir, num_procs):
    unclipped, clipped = GradNorms(), GradNorms()
    kw = dict(scale=100.0, lr=1e-4, scheduler=None)
    _trainer(root_dir, 1, [unclipped]).fit(RegressionTask(**kw))
    assert min(unclipped.norms) > 10  # without clipping the gradients are large ...
    trainer = _trainer(root_dir, 1, [clipped], num_procs=num_procs, gradient_clip_val=0.5)
    trainer.fit(RegressionTask(**kw))
    assert len(clipped.norms) == 8 // num_procs
    # ... with it, exactly at the limit (for 2 ranks: the norm of the all-reduced gradient).
    assert clipped.norms == pytest.approx([0.5] * len(clipped.norms), rel=1e-5)


# ---- gradient accumulation -------------------------------------------------------------------
class CountAllReduces(Callback):
    """Counts DDP all-reduces (bucket 0 of each synchronised backward) and micro-batches;
    its state comes back to the caller from rank 0."""

    def __init__(self):
        self.calls = self.micro = 0

    @property
    def state_key(self):
        return "CountAllReduces"

    def state_dict(self):
        return {"calls": self.calls, "micro": self.micro}

    def load_state_dict(self, state):
        self.calls, self.micro = state["calls"], state["micro"]

    def on_fit_start(self, trainer, task):
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

        def counting_hook(state, bucket):
            if bucket.index() == 0:
                self.calls += 1
            return allreduce_hook(None, bucket)

        if isinstance(task.model, torch.nn.parallel.DistributedDataParallel):
            task.model.register_comm_hook(state=None, hook=counting_hook)

    def on_train_batch_end(self, trainer, task, outputs, batch, batch_idx):
        self.micro += 1


@pytest.mark.parametrize("num_procs", [1, 2])
@pytest.mark.timeout(60)
def test_accumulation_equals_larger_batch(root_dir, num_procs):
    def run(batch_size, accumulate):
        task = RegressionTask(batch_size=batch_size, dropout=0.0, scheduler="step", gamma=0.7)
        counter = CountAllReduces()
        trainer = _trainer(root_dir, 2, [counter], num_procs=num_procs, accumulate_grad_batches=accumulate)
        trainer.fit(task)
        return task, trainer, counter

    small, small_trainer, small_count = run(4, 2)
    big, big_trainer, big_count = run(8, 1)
    steps = 2 * 64 // (8 * num_procs)
    assert small_trainer.global_step == big_trainer.global_step == steps
    for (name, a), b in zip(small.module.state_dict().items(), big.module.state_dict().values()):
        assert torch.allclose(a, b, atol=1e-6, rtol=1e-5), name
    assert not torch.equal(small.module.state_dict()["0.weight"], small.configure_model().state_dict()["0.weight"])
    if num_procs == 2:
        # no_sync on every other micro-batch: one all-reduce per optimizer step.
        assert small_count.micro == 2 * steps and small_count.calls == steps
        assert big_count.micro == steps and big_count.calls == steps


def test_lightning_option_for_acting_every_n_seconds_is_refused_naming_what_graphtrainer_does():
    # Lightning's ModelCheckpoint may act every n seconds; the ranks would need a collective to agree
    # on the time, so graphtrainer refuses it rather than silently ignoring it.
    with pytest.raises(ValueError, match=r"ModelCheckpoint\(train_time_interval=60\).*acts after validations, "
                                         r"at epoch ends or every n optimizer steps.*every_n_train_steps=N"):
        ModelCheckpoint(train_time_interval=60)
    ModelCheckpoint(save_on_train_epoch_end=False, every_n_train_steps=0)  # Lightning's mid-epoch options
    EarlyStopping("val_loss", check_on_train_epoch_end=False)
