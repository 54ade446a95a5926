"""Hangs blamed on the right rank: one rank stuck in user code while the other waits inside
a collective that DDP runs by itself (its bucket rebuild at the second step, the buffer
broadcast before every forward of a model with buffers, its constructor), and a rank
stopped outright (SIGSTOP), a rank stuck inside backward (a gradient hook) or alone in a
collective; each named within ``hang_timeout`` + 2 s of the fault (docs/reliability.md)."""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from torch import nn

from graphtrainer import RankFailedError, Trainer

from conftest import rank_children
from tasks import FailingTask

HANG_S = 5
#: What docs/reliability.md promises: a hang is named within hang_timeout + this many seconds.
DETECTION_SLACK_S = 2.0


def _stamp(path: str) -> None:
    Path(path).write_text(repr(time.time()))


class _Stamped(FailingTask):
    """Writes the time into ``self.stamp`` (when set) as its planned sleep starts."""

    stamp = ""

    def training_step(self, idx, batch_idx):
        if self.stamp and self.how == "sleep" and self.rank == self.fail_rank and self.global_step == self.at_step:
            _stamp(self.stamp)
        return super().training_step(idx, batch_idx)


class _WithBuffers(_Stamped):
    """A BatchNorm model: DDP broadcasts its buffers before every forward."""

    def configure_model(self):
        return nn.Sequential(nn.Linear(self.d, self.hidden), nn.BatchNorm1d(self.hidden), nn.ReLU(),
                             nn.Linear(self.hidden, 1))


class _StuckBuildingTheModel(_Stamped):
    """Rank 1 hangs in configure_model; rank 0 goes on into DDP's constructor."""

    def configure_model(self):
        if self.rank == 1:
            _stamp(self.stamp)
            time.sleep(600)  # the hang the launcher must name
        return super().configure_model()


class _Stopped(FailingTask):
    """Rank 1 stops itself (SIGSTOP) at ``at_step``, first writing the time into ``stamp``."""

    def __init__(self, stamp: str, **kwargs):
        super().__init__(**kwargs)
        self.stamp = stamp

    def training_step(self, idx, batch_idx):
        if self.rank == 1 and self.global_step == self.at_step:
            Path(self.stamp).write_text(repr(time.time()))
            os.kill(os.getpid(), signal.SIGSTOP)
        return super().training_step(idx, batch_idx)


def _fit(root_dir, task, hang_timeout=HANG_S):
    trainer = Trainer(num_procs=2, launcher="fork", max_epochs=5, progress_bar=False, default_root_dir=root_dir,
                      hang_timeout=hang_timeout, enable_model_summary=False)
    start = time.monotonic()
    with pytest.raises(RankFailedError) as info:
        trainer.fit(task)
    return info.value, time.monotonic() - start


@pytest.mark.slow
@pytest.mark.timeout(90)
@pytest.mark.parametrize("case", ["bucket rebuild", "buffer broadcast", "DDP constructor"])
def test_the_stuck_rank_is_blamed_not_the_one_waiting_inside_ddp(root_dir, case):
    task = {"bucket rebuild": _Stamped(how="sleep", at_step=1),
            "buffer broadcast": _WithBuffers(how="sleep", at_step=3),
            "DDP constructor": _StuckBuildingTheModel()}[case]
    task.stamp = str(root_dir / "stuck_at")
    err, took = _fit(root_dir, task)
    after = time.time() - float(Path(task.stamp).read_text())
    print(f"{case}: named after {took:.1f} s from fit, {after:.1f} s from the hang (hang_timeout={HANG_S})")
    assert after < HANG_S + DETECTION_SLACK_S
    assert err.error_type == "Hang" and err.rank == 1 and err.ranks == [1], err.message
    hook = "configure_model" if case == "DDP constructor" else "training_step"
    assert err.message.split(": ", 1)[1].startswith(f"rank 1 in {hook}")
    where = "DDP's construction" if case == "DDP constructor" else "DDP's forward sync"
    assert f"Waiting for it: rank 0 waiting in {where}" in err.message
    assert str(err).index("rank 1:") < len(str(err))  # rank 1's stack comes along
    assert not rank_children()


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_a_stopped_rank_is_named_about_two_seconds_after_the_timeout(root_dir):
    stamp = root_dir / "stopped_at"
    err, _ = _fit(root_dir, _Stopped(str(stamp), how="none", at_step=3), hang_timeout=10)
    took = time.time() - float(stamp.read_text())
    print(f"SIGSTOP: named {took:.1f} s after the rank stopped (hang_timeout=10)")
    assert err.error_type == "Hang" and err.ranks == [1]
    assert "rank 1 is stopped (SIGSTOP" in err.remote_traceback
    assert took < 10 + DETECTION_SLACK_S
    assert not rank_children()


class _StuckInBackward(FailingTask):
    """At epoch 1, batch 1, a gradient hook of rank 1 (on the first layer's weight, whose
    gradient backward computes last) writes the time into ``stamp``, then sleeps or stops its
    own process (SIGSTOP): rank 0 meanwhile launches its gradient all-reduce and waits."""

    def __init__(self, stamp: str, stuck: str):
        super().__init__(how="none", at_step=10**9)  # (no planned failure)
        self.stamp, self.stuck = stamp, stuck

    def training_step(self, idx, batch_idx):
        if self.rank == 1 and self.current_epoch == 1 and batch_idx == 1:
            next(self.model.parameters()).register_hook(self._hang)
        return super().training_step(idx, batch_idx)

    def _hang(self, grad):
        Path(self.stamp).write_text(repr(time.time()))
        if self.stuck == "stop":
            os.kill(os.getpid(), signal.SIGSTOP)
        time.sleep(600)  # the hang the launcher must name
        return grad


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("stuck", ["sleep", "stop"])
@pytest.mark.parametrize("launcher", ["fork", "spawn"])
def test_a_rank_stuck_in_backward_is_blamed_not_its_peer_waiting_in_the_all_reduce(root_dir, launcher, stuck):
    stamp = root_dir / "stuck_at"
    trainer = Trainer(num_procs=2, launcher=launcher, max_epochs=5, progress_bar=False, default_root_dir=root_dir,
                      hang_timeout=HANG_S, enable_model_summary=False)
    with pytest.raises(RankFailedError) as info:
        trainer.fit(_StuckInBackward(str(stamp), stuck))
    err = info.value
    assert stamp.exists(), str(err)
    took = time.time() - float(stamp.read_text())
    print(f"{launcher}, rank 1 {stuck} in a gradient hook: named {took:.1f} s after (hang_timeout={HANG_S})")
    assert err.error_type == "Hang" and err.rank == 1 and err.ranks == [1], err.message
    assert str(err).startswith("rank 1 failed: Hang: ")
    assert err.message.split(": ", 1)[1].startswith("rank 1 in backward (epoch 1, batch 1)")
    assert "Waiting for it: rank 0 waiting in DDP's gradient all-reduce (epoch 1, batch 1)" in err.message
    if stuck == "stop":
        assert "(its process is stopped: SIGSTOP, Ctrl-Z or a debugger)" in err.message
        assert "rank 1 is stopped (SIGSTOP" in err.remote_traceback
    else:
        assert "in _hang" in err.remote_traceback
    assert took < HANG_S + DETECTION_SLACK_S
    assert not rank_children()


class _StuckInACollective(FailingTask):
    """At step 3 rank 1 alone enters a collective that never completes, first writing the time
    into ``stamp``: graphtrainer's barrier (marked as waiting: every rank then waits) or a
    receive from rank 0 in torch.distributed (not marked). Both block in C++, where SIGINT is
    not seen, while rank 0 waits in DDP's all-reduce."""

    def __init__(self, stamp: str, collective: str):
        super().__init__(how="none", at_step=10**9)  # (no planned failure)
        self.stamp, self.collective = stamp, collective

    def training_step(self, idx, batch_idx):
        if self.rank == 1 and self.global_step == 3:
            import torch
            import torch.distributed as dist

            from graphtrainer import comm

            Path(self.stamp).write_text(repr(time.time()))
            if self.collective == "barrier":
                comm.barrier()
            else:
                dist.recv(torch.zeros(1), src=0)
        return super().training_step(idx, batch_idx)


@pytest.mark.slow
@pytest.mark.timeout(90)
@pytest.mark.parametrize("collective", ["barrier", "recv"])
def test_a_hang_inside_a_collective_is_named_within_the_documented_bound(root_dir, collective):
    stamp = root_dir / "stuck_at"
    err, _ = _fit(root_dir, _StuckInACollective(str(stamp), collective))
    took = time.time() - float(stamp.read_text())
    print(f"rank 1 alone in {collective}: named {took:.1f} s after (hang_timeout={HANG_S})")
    assert err.error_type == "Hang" and err.ranks == [1], err.message
    where = "waiting in barrier" if collective == "barrier" else "in training_step"
    assert err.message.split(": ", 1)[1].startswith(f"rank 1 {where} (epoch 0, batch 3)")
    assert took < HANG_S + DETECTION_SLACK_S
    assert not rank_children()


class _MismatchedCollective(FailingTask):
    """The ranks all-reduce tensors of different sizes at ``at_step``: gloo aborts in C++."""

    def training_step(self, idx, batch_idx):
        if self.global_step == self.at_step:
            import torch
            import torch.distributed as dist

            dist.all_reduce(torch.zeros(23050 if self.rank == 0 else 1))
        return super().training_step(idx, batch_idx)


@pytest.mark.timeout(90)
def test_a_cxx_abort_is_reported_with_its_reason(root_dir, capfd):
    err, took = _fit(root_dir, _MismatchedCollective(how="none", at_step=2), hang_timeout=60)
    print(f"gloo abort: named after {took:.1f} s")
    assert err.error_type == "ProcessDied" and "killed by signal SIGABRT" in err.message
    assert "op.preamble.length <= op.nbytes" in err.message  # gloo's reason, from the rank's stderr
    assert f"the last lines rank {err.rank} wrote to stderr" in err.remote_traceback
    assert "op.preamble.length <= op.nbytes" in capfd.readouterr().err  # still shown as it happened
    assert not rank_children()
