"""The first non-finite training loss of a run, found without a host sync per step."""
from __future__ import annotations

import math
import warnings
from typing import Optional

import torch

from ..state import RunState


class NonFiniteLosses:
    """The first non-finite training loss of a run: an error at once with
    ``detect_anomaly``, else noted (on an accelerator, on the device: no host sync per step)
    and reported once at the end of its epoch."""

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
        if loss.device.type == "cpu":
            self._note_on_host(loss, batch_idx, state)
        else:
            self._note_on_device(loss, batch_idx, state)

    def _note_on_host(self, loss: torch.Tensor, batch_idx: int, state: RunState) -> None:
        """Reading a CPU loss costs no sync: one check, no kernels."""
        value = float(loss.detach())
        if not math.isfinite(value) and (self.first is None or self.first[0] < 0):
            self.first = torch.tensor([float(state.global_step), value, float(batch_idx)], dtype=torch.float64)

    def _note_on_device(self, loss: torch.Tensor, batch_idx: int, state: RunState) -> None:
        """Kernels on the loss's device only, so the step never waits for the device."""
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
