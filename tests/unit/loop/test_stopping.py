"""Every reason a fit stops, answered by one StopController (one process: its agreement is the
rank's own answer)."""
from __future__ import annotations

import os
import signal

import pytest

from graphtrainer import Trainer
from graphtrainer.loop import preemption
from graphtrainer.loop.stopping import AtStep, StopController
from graphtrainer.state import RunState


def _controller(**options) -> StopController:
    config = Trainer(num_procs=1, progress_bar=False, logger=False, enable_model_summary=False, **options).config
    return StopController(config, RunState())


def _end_epoch(stop: StopController, steps: int = 1) -> None:
    stop.state.global_step += steps
    stop.state.current_epoch += 1
    stop.at_epoch_end(next_batches=4)


def test_max_epochs_and_a_callbacks_request_end_the_fit():
    stop = _controller(max_epochs=2)
    assert stop.start_epoch(4) == 4 and not stop.joining
    _end_epoch(stop)
    assert not stop.done()
    stop.state.should_stop = True  # EarlyStopping, or the task
    _end_epoch(stop)
    assert stop.done() and stop.state.should_stop and not stop.preempted


def test_max_steps_ends_the_epoch_at_that_step_then_the_fit_even_before_min_epochs():
    stop = _controller(max_epochs=10, max_steps=3, min_epochs=5)
    stop.start_epoch(8)
    stop.state.global_step = 2
    assert stop.at_step(stepped=True) is AtStep.GO_ON
    stop.state.global_step = 3
    assert stop.at_step(stepped=True) is AtStep.END_EPOCH
    _end_epoch(stop, steps=0)
    assert stop.done()


def test_min_epochs_overrides_a_request_and_max_time_stops(monkeypatch):
    stop = _controller(max_epochs=10, min_epochs=2)
    stop.state.should_stop = True
    _end_epoch(stop)
    assert not stop.state.should_stop  # epoch 1 of at least 2
    timed = _controller(max_epochs=10, max_time={"seconds": 1})
    timed.started -= 2.0
    _end_epoch(timed)
    assert timed.done()


def test_a_signal_stops_at_the_next_step_boundary_and_is_named():
    stop = _controller(max_epochs=10)
    stop.start_epoch(4)
    with preemption.stop_signals():
        assert stop.at_step(stepped=True) is AtStep.GO_ON
        os.kill(os.getpid(), signal.SIGUSR1)
        assert stop.at_step(stepped=False) is AtStep.GO_ON  # accumulating: not a boundary
        assert stop.at_step(stepped=True) is AtStep.PREEMPTED
        assert preemption.describe() == "SIGUSR1 (received by rank 0)"
        _end_epoch(stop)  # a signal seen only as the epoch ends stops there
        assert stop.preempted


@pytest.mark.parametrize("batches", [None, 3])
def test_one_process_never_joins(batches):
    stop = _controller()
    assert stop.start_epoch(batches) == batches and not stop.joining


def test_a_stop_requested_before_min_epochs_is_kept_and_honoured_there():
    stop = _controller(max_epochs=10, min_epochs=3)
    stop.state.should_stop = True  # at epoch 0, e.g. EarlyStopping; nobody asks again
    _end_epoch(stop)
    assert not stop.state.should_stop and not stop.done()
    _end_epoch(stop)
    assert not stop.done()
    _end_epoch(stop)  # epoch 2 ends: min_epochs=3 reached
    assert stop.state.should_stop and stop.done()
