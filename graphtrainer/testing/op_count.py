"""How many torch ops a piece of code dispatches: on a GPU each is a kernel (or a view) the host
launches, and a sampler whose host launches more ops than the device can run is bound by the
host (what bounded the device sampler on an H100; ``docs/gpus.md``). Counted on any device."""
from __future__ import annotations

from collections import Counter
from typing import Any

from torch.utils._python_dispatch import TorchDispatchMode


class OpCounter(TorchDispatchMode):
    """``with OpCounter() as c: ...`` then ``c.total`` ops, ``c.by_op`` per op name, and
    ``c.kernels``: the ops that are not views (whose count does not hang on tensor shapes)."""

    def __init__(self) -> None:
        super().__init__()
        self.by_op: Counter = Counter()
        self.kernels = 0

    @property
    def total(self) -> int:
        return sum(self.by_op.values())

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.by_op[func.overloadpacket.__name__] += 1
        self.kernels += not func.is_view
        return func(*args, **(kwargs or {}))
