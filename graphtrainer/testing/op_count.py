"""How many torch ops a piece of code dispatches, and how often the host waits for a value: on a
GPU each op is a kernel (or a view) the host launches, and each wait a synchronisation. A sampler
whose host launches more than the device can run, or waits often, is bound by the host (what
bounded the device sampler on an H100; ``docs/gpus.md``). Counted on any device, the CPU too."""
from __future__ import annotations

from collections import Counter
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

#: Ops whose output size or value the host must read from the device before it goes on.
_READ_BY_HOST = {"_local_scalar_dense", "nonzero", "unique", "_unique", "_unique2", "unique_dim",
                 "unique_consecutive", "masked_select"}


class OpCounter(TorchDispatchMode):
    """``with OpCounter() as c: ...`` then ``c.total`` ops, ``c.by_op`` per op name,
    ``c.kernels`` (the ops that are not views, whose count does not hang on tensor shapes) and
    ``c.host_reads``: values the host waited for (``item``/``int``/``bool``, ``tolist``,
    ``nonzero``, ``unique``, boolean-mask indexing, ``repeat_interleave`` without ``output_size``)."""

    def __init__(self) -> None:
        super().__init__()
        self.by_op: Counter = Counter()
        self.kernels = self.host_reads = 0

    @property
    def total(self) -> int:
        return sum(self.by_op.values())

    def __enter__(self) -> "OpCounter":
        # A CPU tensor's tolist dispatches nothing: counted where it is called.
        self._own_tolist = "tolist" in vars(torch.Tensor)
        self._tolist = torch.Tensor.tolist
        original = self._tolist

        def tolist(tensor: torch.Tensor) -> Any:
            self.host_reads += 1
            return original(tensor)

        torch.Tensor.tolist = tolist  # type: ignore[method-assign]
        return super().__enter__()

    def __exit__(self, *exc: Any) -> Any:
        if self._own_tolist:
            torch.Tensor.tolist = self._tolist  # type: ignore[method-assign]
        else:
            del torch.Tensor.tolist
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        self.by_op[name] += 1
        self.kernels += not func.is_view
        if name in _READ_BY_HOST or (name == "repeat_interleave" and kwargs.get("output_size") is None) or (
                name == "index" and any(i is not None and i.dtype == torch.bool for i in args[1])):
            self.host_reads += 1
        return func(*args, **kwargs)
