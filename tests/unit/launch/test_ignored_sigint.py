"""A launch in a process that ignores SIGINT (a background job of a non-interactive shell)
keeps that, as POSIX asks, but warns once per process that Ctrl-C cannot stop the run."""
from __future__ import annotations

import os
import signal
import warnings

import pytest

from graphtrainer import Trainer
from graphtrainer.launch import leftovers

from tasks import RegressionTask


def _fits(root_dir, times: int) -> list:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(times):
            Trainer(num_procs=2, launcher="fork", max_epochs=1, progress_bar=False, logger=False,
                    enable_model_summary=False, default_root_dir=root_dir).fit(RegressionTask(n=32))
    ours = [w for w in caught if "SIGINT is ignored" in str(w.message)]
    assert all(w.filename == __file__ for w in ours), [w.filename for w in ours]  # shown at the fit
    return [str(w.message) for w in ours]


@pytest.fixture
def ignored_sigint():
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.mark.timeout(120)
def test_a_launch_under_an_ignored_sigint_warns_once_saying_what_stops_the_run(root_dir, monkeypatch,
                                                                                 ignored_sigint):
    monkeypatch.setattr(leftovers, "_sigint_warned", [])
    ours = _fits(root_dir, 2)
    assert len(ours) == 1, ours
    assert "Ctrl-C (SIGINT) will not stop this run" in ours[0] and f"SIGTERM stops it (kill {os.getpid()}" in ours[0]
    assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN  # the launch left it as it was


@pytest.mark.timeout(120)
def test_no_warning_where_ctrl_c_works(root_dir, monkeypatch, terminal_sigint):
    monkeypatch.setattr(leftovers, "_sigint_warned", [])
    assert _fits(root_dir, 1) == []
