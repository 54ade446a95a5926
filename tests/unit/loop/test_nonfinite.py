"""The first non-finite training loss: the host path (CPU losses, read directly) and the device
path (kernels only, no sync: what accelerators use) note the same first loss, and it is
reported once."""
from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from graphtrainer.loop.nonfinite import NonFiniteLosses

LOSSES = [0.5, 0.4, float("nan"), float("inf"), 0.3]


@pytest.mark.parametrize("path", ["_note_on_host", "_note_on_device"])
def test_both_paths_keep_the_first_nonfinite_loss_only(path):
    watch, state = NonFiniteLosses(stop=False), SimpleNamespace(rank=0, current_epoch=2, global_step=0)
    for batch_idx, value in enumerate(LOSSES):
        state.global_step = 10 + batch_idx
        getattr(watch, path)(torch.tensor(value), batch_idx, state)
    step, value, batch_idx = watch.first.tolist()
    assert (step, batch_idx) == (12, 2) and math.isnan(value)
    with pytest.warns(RuntimeWarning, match=r"rank 0: the training loss was nan at epoch 2, batch 2, step 12"):
        watch.report(state)
    watch.report(state)  # once only
    assert watch.reported


def test_finite_losses_leave_nothing_to_report():
    for path in ("_note_on_host", "_note_on_device"):
        watch, state = NonFiniteLosses(stop=False), SimpleNamespace(rank=0, current_epoch=0, global_step=0)
        for value in (1.0, 2.0):
            getattr(watch, path)(torch.tensor(value), 0, state)
        watch.report(state)
        assert not watch.reported
