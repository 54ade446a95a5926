"""How often the ranks exchange stop flags: about ``AGREE_EVERY_S`` of training in steps of
the last epoch's length, the smallest over the ranks, at least 1 and at most
``MAX_STEPS_BETWEEN``; 0 means every step."""
from __future__ import annotations

import pytest

from graphtrainer.loop import preemption
from graphtrainer.loop.preemption import StopAgreement


def _measured(step_s: float, boundaries: int) -> StopAgreement:
    agreement = StopAgreement()
    agreement.start_epoch()
    agreement._first, agreement._last, agreement._boundaries = 100.0, 100.0 + step_s * (boundaries - 1), boundaries
    return agreement


@pytest.mark.parametrize("step_s, every", [(0.01, 20), (0.05, 4), (0.3, 1), (1e-6, preemption.MAX_STEPS_BETWEEN)])
def test_the_interval_is_agree_every_s_in_steps_of_the_last_epoch(monkeypatch, step_s, every):
    monkeypatch.setattr(preemption, "AGREE_EVERY_S", 0.2)
    agreement = _measured(step_s, 30)
    assert agreement.proposal() == every
    agreement.agree_interval(agreement.proposal())
    agreement.start_epoch()
    assert agreement.every == every and agreement._countdown == every


def test_no_step_time_keeps_the_interval_and_zero_means_every_step(monkeypatch):
    monkeypatch.setattr(preemption, "AGREE_EVERY_S", 0.2)
    agreement = _measured(0.01, 1)  # one boundary: no step time
    agreement.every = 7
    assert agreement.proposal() == 7
    monkeypatch.setattr(preemption, "AGREE_EVERY_S", 0)
    assert _measured(0.01, 30).proposal() == 1
    agreement.agree_interval(0.0)  # never below one step
    assert agreement.every == 1
