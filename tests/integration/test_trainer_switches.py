"""What Lightning users reach for: precision, debugging and time switches, Lightning habits,
the model summary and the profilers. Real processes (gloo on CPU), each multi-process test
bounded by a timeout."""
from __future__ import annotations

import json
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from graphtrainer import Callback, EarlyStopping, ModelCheckpoint, Trainer
from graphtrainer.callbacks.summary import summarize
from graphtrainer import comm as gdist
from graphtrainer.loop.profiler import STAGES

from conftest import rank_children
from tasks import IndexBatches, RegressionTask

TESTS = Path(__file__).resolve().parents[1] / "helpers"  # the shared task modules


def _trainer(root, procs=2, epochs=2, **kwargs):
    kwargs.setdefault("progress_bar", False)
    kwargs.setdefault("enable_model_summary", False)
    return Trainer(num_procs=procs, launcher="fork", max_epochs=epochs, default_root_dir=root, **kwargs)


# ---- precision -----------------------------------------------------------------------------
class DtypeProbe(RegressionTask):
    """Logs whether the forward pass inside the steps ran in bfloat16."""

    def training_step(self, idx, batch_idx):
        out = self.model(self.x[idx])
        self.log("train_bf16", float(out.dtype == torch.bfloat16))
        loss = torch.nn.functional.mse_loss(out.float(), self.y[idx])
        self.log("train_loss", loss)
        return loss

    def validation_step(self, idx, batch_idx):
        self.log("val_bf16", float(self.model(self.vx[idx]).dtype == torch.bfloat16))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("precision, bf16", [("32", 0.0), ("bf16-mixed", 1.0)])
def test_precision_sets_the_dtype_inside_the_steps(root_dir, precision, bf16):
    trainer = _trainer(root_dir, precision=precision)
    trainer.fit(DtypeProbe())
    assert trainer.history[-1]["train_bf16"] == bf16 and trainer.history[-1]["val_bf16"] == bf16
    assert trainer.history[-1]["train_loss"] == trainer.history[-1]["train_loss"]  # finite, not NaN


@pytest.mark.timeout(120)
def test_bf16_mixed_resumes_exactly(root_dir, tmp_path):
    full_task, part_task, resumed_task = (RegressionTask(dropout=0.3) for _ in range(3))
    ckpt = ModelCheckpoint(dirpath=tmp_path / "ck", save_top_k=0, save_last=True)
    _trainer(root_dir, epochs=4, precision="bf16-mixed").fit(full_task)
    _trainer(root_dir, epochs=2, precision="bf16-mixed", callbacks=[ckpt]).fit(part_task)
    saved = torch.load(tmp_path / "ck" / "last.ckpt", weights_only=True)
    assert saved["precision"] == "bf16-mixed"
    _trainer(root_dir, epochs=4, precision="bf16-mixed").fit(resumed_task, ckpt_path=str(tmp_path / "ck" / "last.ckpt"))
    for name, value in full_task.module.state_dict().items():
        assert torch.equal(value, resumed_task.module.state_dict()[name]), name


def test_bad_precision_is_refused_before_any_rank_starts():
    with pytest.raises(ValueError, match=r"precision='64': choose one of '32'"):
        Trainer(precision="64")
    with pytest.raises(ValueError, match="precision='16-mixed' needs GPUs.*use precision='bf16-mixed'"):
        Trainer(num_procs=2, precision="16-mixed")


# ---- debugging and time switches ---------------------------------------------------------------
@pytest.mark.timeout(60)
def test_fast_dev_run_runs_one_batch_of_everything_and_writes_nothing(root_dir):
    ckpt = ModelCheckpoint(save_last=True)
    trainer = _trainer(root_dir, epochs=5, fast_dev_run=True, callbacks=[ckpt])
    task = RegressionTask()
    trainer.fit(task)
    assert list(root_dir.iterdir()) == [] and ckpt.last_model_path == ""
    assert trainer.global_step == 1 and len(trainer.history) == 1
    assert trainer.history[0]["val_loss"] == trainer.history[0]["val_loss"]  # validation ran
    assert trainer.test(task)["test_loss"] >= 0
    assert trainer.predict(_Predicting()).shape[0] == 2 * 8  # one batch of 8 per rank


class _Predicting(RegressionTask):
    def predict_dataloader(self):
        return IndexBatches(self.vx.shape[0], 8, shuffle=False)

    def predict_step(self, idx, batch_idx):
        return self.model(self.vx[idx])


class ValidationSteps(Callback):
    """The global step at each validation, in order (rank 0's list comes back)."""

    def __init__(self):
        self.steps = []

    @property
    def state_key(self):
        return "ValidationSteps"

    def state_dict(self):
        return {"steps": list(self.steps)}

    def load_state_dict(self, state):
        self.steps = list(state["steps"])

    def on_validation_epoch_start(self, trainer, task):
        self.steps.append(trainer.global_step)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("interval", [2, 0.5])
def test_val_check_interval_validates_where_it_says_and_keeps_training_metrics(root_dir, interval):
    probe = ValidationSteps()  # 64 rows, 2 ranks, batches of 8: 4 steps per epoch
    with_checks = _trainer(root_dir, val_check_interval=interval, callbacks=[probe])
    with_checks.fit(RegressionTask(scheduler=None))
    assert probe.steps == [2, 4, 6, 8]  # mid-epoch after batch 2, and at each epoch end
    plain = _trainer(root_dir)
    plain.fit(RegressionTask(scheduler=None))
    # Training sums survived the mid-epoch reductions: the same exact epoch values.
    assert [r["train_loss"] for r in with_checks.history] == [r["train_loss"] for r in plain.history]
    assert [r["val_loss"] for r in with_checks.history] == [r["val_loss"] for r in plain.history]


class _UnevenLen:
    """Rank 0: 3 batches, rank 1: 5 (lengths known): validation may only fall at batch 1."""

    def __len__(self):
        return [3, 5][gdist.get_rank()]

    def __iter__(self):
        return iter([torch.arange(8) + 8 * i for i in range(len(self))])


class _UnevenTask(RegressionTask):
    def train_dataloader(self):
        return _UnevenLen()


@pytest.mark.timeout(60)
def test_val_check_interval_with_uneven_ranks_validates_only_where_all_have_batches(root_dir):
    probe = ValidationSteps()
    _trainer(root_dir, epochs=1, val_check_interval=2, callbacks=[probe]).fit(_UnevenTask(scheduler=None))
    assert probe.steps == [2, 5]  # after batch 1 (step 2), then at the epoch's end (5 steps)
    assert not rank_children()


def test_val_check_interval_larger_than_the_epoch_is_a_clear_error(root_dir):
    with pytest.raises(ValueError, match=r"val_check_interval=9 is larger than the epoch.*has 8"):
        _trainer(root_dir, procs=1, val_check_interval=9).fit(RegressionTask())
    with pytest.raises(ValueError, match="a fraction must lie in"):
        Trainer(val_check_interval=1.5)


def test_max_time_stops_at_the_first_epoch_end(root_dir):
    trainer = _trainer(root_dir, procs=1, epochs=50, max_time={"seconds": 0.001})
    trainer.fit(RegressionTask())
    assert len(trainer.history) == 1
    with pytest.raises(ValueError, match="DD:HH:MM:SS"):
        Trainer(max_time="12 hours")


@pytest.mark.timeout(60)
def test_min_epochs_holds_off_early_stopping(root_dir):
    scores = {"score": [1.0, 2.0, 3.0, 4.0, 5.0]}  # never improves after epoch 0
    stop = EarlyStopping(monitor="score", patience=1, verbose=False)
    trainer = _trainer(root_dir, epochs=5, min_epochs=4, callbacks=[stop])
    trainer.fit(RegressionTask(script=scores))
    assert len(trainer.history) == 4
    early = _trainer(root_dir, epochs=5, callbacks=[EarlyStopping(monitor="score", patience=1, verbose=False)])
    early.fit(RegressionTask(script=scores))
    assert len(early.history) == 2


class _BatchRecorder(RegressionTask):
    def training_step(self, idx, batch_idx):
        self.seen.setdefault(self.current_epoch, []).append(idx.tolist())
        return super().training_step(idx, batch_idx)


def test_overfit_batches_uses_the_same_batches_every_epoch(root_dir):
    task = _BatchRecorder()
    task.seen = {}
    trainer = _trainer(root_dir, procs=1, epochs=3, overfit_batches=2)
    trainer.fit(task)
    assert len(task.seen[0]) == 2 and task.seen[0] == task.seen[1] == task.seen[2]
    assert trainer.num_training_batches == 2


@pytest.mark.timeout(60)
def test_limit_predict_batches_returns_the_covered_rows_in_id_order(root_dir):
    task = _Predicting()
    full = _trainer(root_dir).predict(task)
    part = _trainer(root_dir, limit_predict_batches=1).predict(task)
    assert full.shape[0] == 24 and part.shape[0] == 16
    # Rank r covered positions r, r + 2, ... of its first batch: rows 0..15 of the 24.
    assert torch.equal(part, full[:16])


def test_gradient_clip_by_value_bounds_each_update(root_dir):
    task = RegressionTask(lr=1.0, momentum=0.0, scheduler=None, scale=100.0)
    task.model = task.configure_model()  # trained in this process: the same object
    before = [p.detach().clone() for p in task.model.parameters()]
    _trainer(root_dir, procs=1, max_steps=1, gradient_clip_val=1e-3, gradient_clip_algorithm="value").fit(task)
    changes = torch.cat([(p.detach() - b).abs().flatten() for p, b in zip(task.module.parameters(), before)])
    # Large gradients (scale=100): every clipped element moves by lr * 1e-3, none by more.
    assert 0.9e-3 <= changes.max() <= 1e-3 + 1e-6
    with pytest.raises(ValueError, match="gradient_clip_algorithm='l2'"):
        Trainer(gradient_clip_algorithm="l2")


# ---- Lightning habits ------------------------------------------------------------------------
class _Habits(RegressionTask):
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)  # the task's parameters(), as in Lightning

    def on_train_epoch_end(self):
        self.log("global_ranks", float(self.global_rank), reduce_fx="sum")
        self.log("local_ranks", float(self.local_rank), reduce_fx="sum")
        self.log("world", float(self.world_size), reduce_fx="sum")


@pytest.mark.timeout(60)
def test_lightning_habits(root_dir):
    ckpt = ModelCheckpoint(save_last=True)
    trainer = _trainer(root_dir, callbacks=[ckpt])
    assert trainer.checkpoint_callback is ckpt and trainer.checkpoint_callbacks == [ckpt]
    trainer.fit(_Habits())
    row = trainer.history[-1]
    assert (row["global_ranks"], row["local_ranks"], row["world"]) == (1.0, 1.0, 4.0)
    with pytest.raises(RuntimeError, match="there is no model yet"):
        list(RegressionTask().parameters())


@pytest.mark.timeout(60)
@pytest.mark.parametrize("procs", [1, 2])
def test_after_fit_the_tasks_epoch_and_step_are_the_trainers(root_dir, procs):
    # Lightning: model.current_epoch and model.global_step after fit equal the trainer's, also
    # where the ranks ran in other processes; the task still pickles (for a later spawned fit).
    task = RegressionTask()
    trainer = _trainer(root_dir, procs=procs, logger=False)
    trainer.fit(task)
    assert (trainer.current_epoch, trainer.global_step) == (2, 2 * 64 // procs // 8)
    assert (task.current_epoch, task.global_step) == (trainer.current_epoch, trainer.global_step)
    again = pickle.loads(pickle.dumps(task))
    assert again.current_epoch == trainer.current_epoch


@pytest.mark.timeout(60)
@pytest.mark.parametrize("procs", [1, 2])
def test_max_steps_0_trains_no_step(root_dir, procs):
    # Lightning: max_steps=-1 is no limit, 0 trains nothing (the model stays as built).
    task = RegressionTask()
    torch.manual_seed(0)
    task.model = task.configure_model()
    before = {k: v.clone() for k, v in task.model.state_dict().items()}
    trainer = _trainer(root_dir, procs=procs, max_steps=0, logger=False)
    trainer.fit(task)
    assert (trainer.global_step, trainer.current_epoch, trainer.history) == (0, 0, [])
    assert all(torch.equal(before[k], v) for k, v in task.module.state_dict().items())
    assert not rank_children()


@pytest.mark.slow  # 3 s or more on 2 cores: a fresh interpreter
def test_spawn_from_stdin_fails_in_the_parent_with_the_reason(tmp_path):
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(TESTS)!r})
        from graphtrainer import Trainer
        from tasks import RegressionTask
        Trainer(num_procs=2, launcher="spawn", max_epochs=1, progress_bar=False,
                default_root_dir={str(tmp_path / 'runs')!r}).fit(RegressionTask())
    """)
    out = subprocess.run([sys.executable, "-"], input=script, capture_output=True, text=True, timeout=120)
    assert out.returncode != 0
    assert "read from <stdin>, which is no file: save the script to a file" in out.stderr
    assert "FileNotFoundError" not in out.stderr


@pytest.mark.timeout(60)
def test_model_summary_printed_once_by_rank_0(root_dir, capfd):
    task = RegressionTask()
    Trainer(num_procs=2, launcher="fork", max_epochs=1, progress_bar=False, default_root_dir=root_dir).fit(task)
    out = capfd.readouterr().out
    assert out.count(summarize(task.module)) == 1
    assert "Sequential: 97 trainable of 97 parameters" in out


# ---- profilers -------------------------------------------------------------------------------
@pytest.mark.timeout(60)
def test_simple_profiler_table_sums_close_to_the_fit_time(root_dir, capfd):
    trainer = _trainer(root_dir, epochs=3, profiler="simple")
    trainer.fit(RegressionTask(n=2048, hidden=256, batch_size=128))
    profile = trainer.state.profile
    assert len(profile) == 2
    for rank in profile:
        staged = sum(rank.get(s, 0.0) for s in STAGES)
        assert 0.8 * rank["fit"] <= staged <= 1.001 * rank["fit"], rank
        assert rank["forward"] > 0 and rank["backward"] > 0 and rank["all-reduce (inside backward)"] > 0
        assert rank["hook on_train_epoch_end"] > 0
    out = capfd.readouterr().out
    assert "sum of stages" in out and "rank 1" in out


@pytest.mark.timeout(60)
def test_pytorch_profiler_writes_a_trace_in_the_run_folder(root_dir):
    trainer = _trainer(root_dir, epochs=2, profiler="pytorch")
    trainer.fit(RegressionTask())
    trace = json.loads((trainer.log_dir / "profile" / "trace.json").read_text())
    assert any("ProfilerStep" in event.get("name", "") for event in trace["traceEvents"])
