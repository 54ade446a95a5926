"""The first non-finite training loss of a run, found without a host sync per step."""
from __future__ import annotations

import warnings
from typing import Optional

import torch

from ..state import RunState


class NonFiniteLosses:
    """The first non-finite training loss of a run: an error at once with
    ``detect_anomaly``, else noted on the device (no host sync per step) and reported once
    at the end of its epoch."""

    def __init__(self, stop: bool):
        self.stop = stop
        self.first: Optional[torch.Tensor] = None  # (step, loss, batch index), -1 while none
        self.reported = False

    def check(self, loss: torch.Tensor, batch_idx: int, state: RunState) -> None:
        if self.stop:
            if not bool(torch.isfinite(loss.detach())):
                raise FloatingPointError(
                    f"rank {state.rank}: the training loss is {float(loss)} at epoch {state.current_epoch}, "
                    f"batch {batch_idx}, step {state.global_step} (Trainer(detect_anomaly=True) stops at the "
                    "first non-finite loss)")
            return
        if self.reported:
            return
        if self.first is None:
            self.first = torch.full((3,), -1.0, dtype=torch.float64, device=loss.device)

        def scalar(value: float) -> torch.Tensor:  # a fill kernel, not a copy from the host
            return torch.full((), value, dtype=torch.float64, device=loss.device)

        value = loss.detach().double().reshape(())
        seen = torch.stack([scalar(state.global_step), value, scalar(batch_idx)])
        self.first.copy_(torch.where(~torch.isfinite(value) & (self.first[0] < 0), seen, self.first))

    def report(self, state: RunState) -> None:
        if self.first is None or self.reported:
            return
        step, value, batch_idx = self.first.tolist()
        if step < 0:
            return
        self.reported = True
        warnings.warn(f"rank {state.rank}: the training loss was {value} at epoch {state.current_epoch}, batch "
                      f"{int(batch_idx)}, step {int(step)}; training went on (reported once). "
                      "Trainer(detect_anomaly=True) stops there instead, and EarlyStopping(check_finite=True) "
                      "stops on a non-finite monitored value.", RuntimeWarning, stacklevel=2)
