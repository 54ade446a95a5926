"""Hangs blamed on the right rank: one rank stuck in user code while the other waits inside
a collective that DDP runs by itself (its bucket rebuild at the second step, the buffer
broadcast before every forward of a model with buffers, its constructor), and a rank
stopped outright (SIGSTOP), named within about 2 s of ``hang_timeout``."""
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


class _WithBuffers(FailingTask):
    """A BatchNorm model: DDP broadcasts its buffers before every forward."""

    def configure_model(self):
        return nn.Sequential(nn.Linear(self.d, self.hidden), nn.BatchNorm1d(self.hidden), nn.ReLU(),
                             nn.Linear(self.hidden, 1))


class _StuckBuildingTheModel(FailingTask):
    """Rank 1 hangs in configure_model; rank 0 goes on into DDP's constructor."""

    def configure_model(self):
        if self.rank == 1:
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
    task = {"bucket rebuild": FailingTask(how="sleep", at_step=1),
            "buffer broadcast": _WithBuffers(how="sleep", at_step=3),
            "DDP constructor": _StuckBuildingTheModel()}[case]
    err, took = _fit(root_dir, task)
    print(f"{case}: named after {took:.1f} s (hang_timeout={HANG_S})")
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
    assert took < 10 + 3.5
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
