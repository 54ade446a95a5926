"""Runs that survive preemption: a stop signal (SIGTERM, Slurm's SIGUSR1) on any rank stops
every rank at the same batch boundary, rank 0 writes last.ckpt holding the position in the
epoch, fit raises Preempted (exit status 75), and fit(ckpt_path="last") resumes at the next
batch: the finished run equals one never stopped, bit for bit. Real processes (gloo on CPU)."""
from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from graphtrainer import PREEMPTED_EXIT_CODE, ModelCheckpoint, Preempted, Trainer
from graphtrainer.checkpoint.content import read_checkpoint
from graphtrainer.loop import preemption

from conftest import rank_children
from launch_env import env_without_launch
from tasks import ExactBatches, RegressionTask

STOP_AT_STEP = 5


@pytest.fixture(autouse=True)
def _agree_at_every_step(monkeypatch):
    """Exact stop positions: the ranks exchange their stop flags at every step (forked ranks
    inherit the setting; a test may set another interval)."""
    monkeypatch.setattr(preemption, "AGREE_EVERY_S", 0)


TESTS = Path(__file__).resolve().parents[1] / "helpers"  # the shared task modules and drivers


class _SignalledTask(RegressionTask):
    """Dropout and momentum, so a resume must restore RNG and optimizer state; rank
    ``signal_rank`` sends itself ``sig`` during step ``at_step`` (never on a resumed run, which
    starts past it). ``exact``: a loader of exact length (no Join), else the test tasks'
    own (Join every epoch: stopped at the epoch's end)."""

    def __init__(self, sig=None, signal_rank=1, exact=True, at_step=STOP_AT_STEP, **kwargs):
        super().__init__(dropout=0.3, scheduler="step", **kwargs)
        self.sig, self.signal_rank, self.exact, self.at_step = sig, signal_rank, exact, at_step

    def train_dataloader(self):
        if not self.exact:
            return super().train_dataloader()
        return ExactBatches(torch.arange(self.n), self.batch_size, seed=self.trainer.seed)

    def training_step(self, idx, batch_idx):
        if self.sig is not None and self.rank == self.signal_rank and self.global_step == self.at_step:
            os.kill(os.getpid(), self.sig)
        return super().training_step(idx, batch_idx)


def _trainer(root, folder, procs):
    return Trainer(num_procs=procs, launcher="fork", max_epochs=3, seed=7, progress_bar=False, logger=False,
                   enable_model_summary=False, default_root_dir=root,
                   callbacks=[ModelCheckpoint(dirpath=folder, save_last=True, save_top_k=0)])


def _same(a: dict, b: dict) -> None:
    for key, value in a.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(value, b[key]), key
        elif isinstance(value, dict):
            _same(value, b[key])
        elif isinstance(value, list):
            _same(dict(enumerate(value)), dict(enumerate(b[key])))
        else:
            assert value == b[key], key


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("procs,sig", [(2, signal.SIGUSR1), (2, signal.SIGTERM), (1, signal.SIGTERM)])
def test_a_stopped_run_resumed_from_last_equals_one_never_stopped(tmp_path, procs, sig, capsys):
    _trainer(tmp_path / "a", tmp_path / "whole", procs).fit(_SignalledTask())
    whole = read_checkpoint(tmp_path / "whole" / "last.ckpt")

    stopped = _trainer(tmp_path / "b", tmp_path / "parts", procs)
    started = time.monotonic()
    with pytest.raises(Preempted) as info:
        stopped.fit(_SignalledTask(sig=sig, signal_rank=procs - 1), ckpt_path="last")
    print(f"{procs} rank(s), {sig.name}: stopped, checkpoint written, fit raised in "
          f"{time.monotonic() - started:.1f} s from fit start")
    assert info.value.code == PREEMPTED_EXIT_CODE == 75
    batches = 64 // procs // 8
    # Ranks agree one step after the signal (the exchange of a boundary is read at the next).
    stop_step = STOP_AT_STEP + 1 + (1 if procs > 1 else 0)
    epoch, done = divmod(stop_step, batches)
    assert f"fit stopped by {sig.name} (received by rank {procs - 1}) at epoch {epoch} after batch {done - 1} " \
        in str(info.value)
    assert "Resume with fit(task, ckpt_path='last')" in str(info.value)
    assert "ckpt_path='last': no last checkpoint found in" in capsys.readouterr().out  # a fresh start, said so
    assert not rank_children()
    mid = read_checkpoint(tmp_path / "parts" / "last.ckpt")
    assert mid["epoch"] == epoch and not mid["epoch_finished"]
    assert mid["global_step"] == stop_step and mid["batches_done_in_epoch"] == done

    _trainer(tmp_path / "b", tmp_path / "parts", procs).fit(_SignalledTask(sig=sig), ckpt_path="last")
    resumed = read_checkpoint(tmp_path / "parts" / "last.ckpt")
    assert resumed["global_step"] == whole["global_step"] == 3 * batches
    _same(whole["state_dict"], resumed["state_dict"])
    _same({"o": whole["optimizer_states"]}, {"o": resumed["optimizer_states"]})


@pytest.mark.timeout(120)
def test_after_a_preemption_the_trainer_and_task_show_what_ran(tmp_path):
    # As Lightning's trainer after an interruption: the finished epochs' rows, the step and
    # epoch reached, the metrics and the trained weights reach the launching process.
    trainer = _trainer(tmp_path, tmp_path / "ckpt", 2)
    task = _SignalledTask(sig=signal.SIGUSR1)
    with pytest.raises(Preempted) as info:
        trainer.fit(task)
    stop_step = STOP_AT_STEP + 2  # 4 steps per epoch and rank; agreed one step after the signal
    assert info.value.checkpoint == str(tmp_path / "ckpt" / "last.ckpt")
    assert [row["epoch"] for row in trainer.history] == [0]
    assert (trainer.global_step, trainer.current_epoch) == (stop_step, 1)
    assert "train_loss" in trainer.callback_metrics and "val_loss" in trainer.callback_metrics
    stopped = read_checkpoint(info.value.checkpoint)
    _same(stopped["state_dict"], task.module.state_dict())
    assert not rank_children()


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_an_epoch_inside_join_stops_at_its_end_and_resumes_exactly(tmp_path):
    _trainer(tmp_path / "a", tmp_path / "whole", 2).fit(_SignalledTask(exact=False))
    whole = read_checkpoint(tmp_path / "whole" / "last.ckpt")
    stopped = r"fit stopped by SIGUSR1 \(received by rank 1\) at the end of epoch 1 \(step 8\)"
    with pytest.raises(Preempted, match=stopped):
        _trainer(tmp_path / "b", tmp_path / "parts", 2).fit(_SignalledTask(sig=signal.SIGUSR1, exact=False))
    assert read_checkpoint(tmp_path / "parts" / "last.ckpt")["global_step"] == 8
    _trainer(tmp_path / "b", tmp_path / "parts", 2).fit(_SignalledTask(exact=False), ckpt_path="last")
    resumed = read_checkpoint(tmp_path / "parts" / "last.ckpt")
    _same(whole["state_dict"], resumed["state_dict"])
    _same({"o": whole["optimizer_states"]}, {"o": resumed["optimizer_states"]})


def _torchrun(owner, out, *extra):
    # Two restarts allowed where the script needs one: on torch 2.15 a restarted rank has once
    # aborted in C++ ("terminate called without an active exception", CI of 2026-11-26); a
    # further restart resumes from the same last.ckpt, so the run must still equal the unstopped one.
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
            "--max-restarts", "2", str(TESTS / "torchrun_restart_script.py"), str(out), *extra]
    done = owner.run(argv, env=env_without_launch(), timeout=200)
    assert done.returncode == 0, done.stdout + done.stderr
    return torch.load(out / "final.pt", weights_only=True), done.stdout + done.stderr


@pytest.mark.slow
@pytest.mark.timeout(480)
def test_torchrun_restart_after_a_killed_rank_resumes_from_last_and_equals_a_run_never_stopped(tmp_path,
                                                                                                process_owner):
    whole, _ = _torchrun(process_owner, tmp_path / "whole")
    restarted, log = _torchrun(process_owner, tmp_path / "restarted", "kill")
    assert "ckpt_path='last': using" in log and "starting from scratch" in log  # first start, then resume
    assert "restart" in log.lower()
    _same(whole["params"], restarted["params"])
    _same({"o": whole["optimizer"]}, {"o": restarted["optimizer"]})


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_signal_at_an_epochs_last_step_stops_at_its_end_and_resumes_exactly(tmp_path):
    # 4 steps per epoch and rank: a signal in step 7 (the last of epoch 1) is agreed as that epoch ends.
    _trainer(tmp_path / "a", tmp_path / "whole", 2).fit(_SignalledTask())
    whole = read_checkpoint(tmp_path / "whole" / "last.ckpt")
    with pytest.raises(Preempted, match=r"at the end of epoch 1 \(step 8\)"):
        _trainer(tmp_path / "b", tmp_path / "parts", 2).fit(_SignalledTask(sig=signal.SIGTERM, at_step=7))
    _trainer(tmp_path / "b", tmp_path / "parts", 2).fit(_SignalledTask(), ckpt_path="last")
    resumed = read_checkpoint(tmp_path / "parts" / "last.ckpt")
    _same(whole["state_dict"], resumed["state_dict"])
    _same({"o": whole["optimizer_states"]}, {"o": resumed["optimizer_states"]})


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_with_a_long_agreement_interval_a_mid_epoch_signal_stops_at_the_epochs_end_exactly(tmp_path, monkeypatch):
    # Epoch 0 exchanges at every step (no step time yet); from epoch 1 on the ranks agree to
    # exchange every 10 s of training, so not within an epoch: a signal in step 5 (the second
    # of epoch 1's 4) is seen in the epoch's closing agreement, and the run stops at its end.
    monkeypatch.setattr(preemption, "AGREE_EVERY_S", 10.0)
    _trainer(tmp_path / "a", tmp_path / "whole", 2).fit(_SignalledTask())
    whole = read_checkpoint(tmp_path / "whole" / "last.ckpt")
    with pytest.raises(Preempted, match=r"fit stopped by SIGTERM \(received by rank 1\) at the end of epoch 1 "
                                        r"\(step 8\)"):
        _trainer(tmp_path / "b", tmp_path / "parts", 2).fit(_SignalledTask(sig=signal.SIGTERM))
    _trainer(tmp_path / "b", tmp_path / "parts", 2).fit(_SignalledTask(), ckpt_path="last")
    resumed = read_checkpoint(tmp_path / "parts" / "last.ckpt")
    _same(whole["state_dict"], resumed["state_dict"])
    _same({"o": whole["optimizer_states"]}, {"o": resumed["optimizer_states"]})


FAKE_SCONTROL = """#!/bin/bash
# Stand-in for Slurm's scontrol: records its arguments; fails when asked to.
echo "$@" >> "$SCONTROL_LOG"
if [ -n "$SCONTROL_FAILS" ]; then echo "slurm_requeue error: $SCONTROL_FAILS" >&2; exit 1; fi
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize("fails", [False, True])
def test_a_preempted_slurm_job_is_requeued_when_asked(tmp_path, monkeypatch, capfd, fails):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "scontrol").write_text(FAKE_SCONTROL)
    (bindir / "scontrol").chmod(0o755)
    log = tmp_path / "scontrol.log"
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    monkeypatch.setenv("SCONTROL_LOG", str(log))
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("GRAPHTRAINER_SLURM_REQUEUE", "1")
    if fails:
        monkeypatch.setenv("SCONTROL_FAILS", "Requested operation is presently disabled")
    with pytest.raises(Preempted) as info:
        _trainer(tmp_path, tmp_path / "ckpt", 1).fit(_SignalledTask(sig=signal.SIGTERM, signal_rank=0))
    assert log.read_text().splitlines() == ["requeue 4242"]  # once, by rank 0
    assert info.value.code == PREEMPTED_EXIT_CODE
    assert (tmp_path / "ckpt" / "last.ckpt").is_file()
    err = capfd.readouterr().err
    if fails:
        assert "Slurm job 4242 requeued" not in str(info.value)
        assert "scontrol requeue 4242 failed: slurm_requeue error: Requested operation is presently disabled" in err
    else:
        assert str(info.value).endswith("; Slurm job 4242 requeued")


class _NamesItsThread(_SignalledTask):
    """Writes the name of the thread that trains when it sends the signal."""

    def __init__(self, record, **kwargs):
        super().__init__(**kwargs)
        self.record = str(record)

    def training_step(self, idx, batch_idx):
        if self.sig is not None and self.rank == self.signal_rank and self.global_step == self.at_step:
            Path(self.record).write_text(threading.current_thread().name)
        return super().training_step(idx, batch_idx)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_rank_that_trains_in_a_fresh_thread_stops_and_checkpoints_too(tmp_path):
    # fork + threads_per_proc > 1 + a launching process with other threads: each rank trains in
    # a fresh thread (a forked OpenMP pool would hang), where Python delivers no signal.
    busy = threading.Event()
    other = threading.Thread(target=busy.wait, daemon=True)
    other.start()
    record = tmp_path / "thread.txt"
    try:
        trainer = Trainer(num_procs=2, launcher="fork", threads_per_proc=2, max_epochs=3, seed=7, progress_bar=False,
                          logger=False, enable_model_summary=False, default_root_dir=tmp_path,
                          callbacks=[ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True, save_top_k=0)])
        with pytest.raises(Preempted, match=r"fit stopped by SIGTERM \(received by rank 1\) at epoch 1 after batch 2"):
            trainer.fit(_NamesItsThread(record, sig=signal.SIGTERM))
    finally:
        busy.set()
    assert record.read_text() == "graphtrainer-rank1"  # the signalled rank trained in a fresh thread
    assert read_checkpoint(tmp_path / "ckpt" / "last.ckpt")["global_step"] == STOP_AT_STEP + 2
    assert not rank_children()
