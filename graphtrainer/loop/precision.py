"""Mixed precision for a rank: autocast around the steps' forward passes, and for float16 a
gradient scaler between backward and the optimizer step."""
from __future__ import annotations

import contextlib
from typing import Any, Callable, ContextManager, Dict, List, Optional

import torch


class Precision:
    """``"32"``: nothing changes. ``"bf16-mixed"``: forward passes run under bfloat16
    autocast (CPU and GPU); gradients and weights stay float32, so no scaler is needed.
    ``"16-mixed"``: float16 autocast on the GPU, the loss scaled before backward and the
    gradients unscaled before clipping and the step (steps with inf/NaN gradients are
    skipped and the scale lowered, as ``torch.cuda.amp.GradScaler`` does)."""

    def __init__(self, name: str, device: torch.device):
        self.name, self.device = name, device
        self.dtype: Optional[torch.dtype] = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}.get(name)
        self.scaler: Optional[Any] = None
        if name == "16-mixed":
            if device.type != "cuda":
                raise ValueError("precision='16-mixed' needs a GPU rank; use 'bf16-mixed' on CPU")
            self.scaler = torch.cuda.amp.GradScaler()

    def autocast(self) -> ContextManager[Any]:
        """Around a step's forward pass."""
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.dtype)

    def backward(self, loss: torch.Tensor) -> None:
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()

    def step(self, optimizers: List[torch.optim.Optimizer], clip: Optional[Callable[[], None]],
             before_step: Optional[Callable[[torch.optim.Optimizer], None]] = None) -> None:
        """Unscale (float16), ``before_step`` each optimizer, clip, step every optimizer."""
        if self.scaler is not None:
            for opt in optimizers:
                self.scaler.unscale_(opt)
        for opt in optimizers if before_step is not None else ():
            before_step(opt)
        if clip is not None:
            clip()
        for opt in optimizers:
            if self.scaler is not None:
                self.scaler.step(opt)
            else:
                opt.step()
        if self.scaler is not None:
            self.scaler.update()

    def state_dict(self) -> Optional[Dict[str, Any]]:
        return self.scaler.state_dict() if self.scaler is not None else None

    def load_state_dict(self, state: Optional[Dict[str, Any]]) -> None:
        if self.scaler is not None and state:
            self.scaler.load_state_dict(state)
