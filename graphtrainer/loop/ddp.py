"""Building the DDP wrapper from the trainer's options, and explaining its commonest error.

A model whose parameters do not all take part in every loss (a heterograph model whose
relation weights a batch does not touch, a branch used only sometimes) stops DDP at the
next forward with "Expected to have finished reduction in the prior iteration". DDP
needs ``find_unused_parameters=True`` for such models: after each forward it walks the
autograd graph to find the parameters that got no gradient and marks them ready. That
walk costs time on every step, so it is off by default.

With the option on, DDP prints once per rank "find_unused_parameters=True was specified ... but
did not find any unused parameters in the forward pass". It checks step by step and warns the
first time a step used every parameter; other steps of the same run may leave some unused (a
batch without a seed type or relation), and those are why the option is needed. Measured with
HeteroSAGE built on DGL's HeteroGraphConv (before its torch-only layers), 2 ranks
(``benchmarks/sparse_embedding.py --ddp-unused``, results in ``benchmarks/results/ddp_unused/``):
paper-only seeds fail without the option, and with it both ranks print that warning all the
same. The warning is not a reason to drop the option. ``ddp_kwargs={"static_graph": True}``
(no search, no warning) applies only when every step uses the same parameters: it ran with
paper and word seeds (every relation in every batch) and failed with paper-only seeds.
"""
from __future__ import annotations

import weakref
from typing import Any, Callable, Dict, Optional, Tuple

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from .. import heartbeat

#: DDP arguments the trainer sets itself.
_OWNED = ("module", "device_ids", "output_device", "process_group")

_UNUSED_MARK = "Expected to have finished reduction in the prior iteration"


def check_ddp_kwargs(find_unused_parameters: bool, ddp_kwargs: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    """The keyword arguments for ``DistributedDataParallel``, or a ``ValueError``."""
    if not isinstance(ddp_kwargs, (dict, type(None))):
        raise ValueError(f"ddp_kwargs must be a dict of DistributedDataParallel arguments, got "
                         f"{type(ddp_kwargs).__name__}")
    kwargs = dict(ddp_kwargs or {})
    owned = sorted(set(kwargs) & set(_OWNED))
    if owned:
        raise ValueError(f"ddp_kwargs: {', '.join(owned)} are set by the trainer (one device per rank)")
    if "find_unused_parameters" in kwargs and bool(kwargs["find_unused_parameters"]) != bool(find_unused_parameters):
        raise ValueError("ddp_kwargs['find_unused_parameters'] disagrees with Trainer(find_unused_parameters=...): "
                         "set it in one place")
    kwargs["find_unused_parameters"] = bool(find_unused_parameters or kwargs.get("find_unused_parameters", False))
    return kwargs


class GraphDDP(DistributedDataParallel):
    """``DistributedDataParallel`` whose "unused parameters" error names the trainer option,
    and whose own collectives mark this rank as waiting on its peers: those before a forward
    (the bucket rebuild after the first step, the buffer broadcast of a model with buffers),
    and the gradient all-reduce from the moment its last bucket is launched, which is when
    this rank has computed every gradient and only waits (until then a rank in ``backward``
    works, and a hang there is its own). A hang where a rank waits is a peer's, and the
    launcher must not blame this rank for it.

    The mark comes from a communication hook that DDP runs for every bucket. It runs the
    hook registered with :meth:`register_comm_hook` (the user's, the profiler's), else an
    all-reduce that scales as DDP's built-in one does, so results are unchanged."""

    #: (state, hook) registered through :meth:`register_comm_hook`; None: the built-in all-reduce.
    _chosen_hook: Optional[Tuple[Any, Callable[..., Any]]] = None

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        # Straight to the reducer: DDP's own registration would refuse the user's hook later.
        dist._register_comm_hook(self.reducer, weakref.ref(self), _marked_reduction)

    def register_comm_hook(self, state: object, hook: Callable[..., Any]) -> None:
        """As DDP's (once, before the first backward); the hook runs inside the marking one."""
        if self._chosen_hook is not None:
            raise RuntimeError("register_comm_hook or register_builtin_comm_hook can only be called once.")
        self._check_comm_hook(hook)
        if getattr(self, "logger", None) is not None:
            self.logger._set_comm_hook_name(hook.__qualname__)
        self._chosen_hook = (state, hook)

    def _register_builtin_comm_hook(self, comm_hook_type: Any) -> None:
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import fp16_compress_hook

        if comm_hook_type == dist.BuiltinCommHookType.FP16_COMPRESS:
            self.register_comm_hook(self.process_group, fp16_compress_hook)
        else:
            self.register_comm_hook(self.process_group, _allreduce_mean)

    if hasattr(DistributedDataParallel, "_pre_forward"):
        def _pre_forward(self, *args: Any, **kwargs: Any) -> Any:
            with heartbeat.waiting("DDP's forward sync"):
                return super()._pre_forward(*args, **kwargs)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().forward(*args, **kwargs)
        except RuntimeError as err:
            if _UNUSED_MARK not in str(err) or self.find_unused_parameters:
                raise
            if getattr(self, "static_graph", False):
                raise RuntimeError(
                    "ddp_kwargs={'static_graph': True} needs every training step to use the same parameters, "
                    "but this step's differ from the first step's (a batch without some relation or seed type). "
                    "Use Trainer(find_unused_parameters=True) instead. DDP said: "
                    + str(err).splitlines()[0]) from None
            raise RuntimeError(
                "some parameters of the model got no gradient in the previous training step, so DDP "
                "cannot finish its gradient reduction (typical of heterograph models: the weights of a "
                "relation that a batch does not contain are unused). Pass "
                "Trainer(find_unused_parameters=True); it costs a walk of the autograd graph per step. "
                "Or make every parameter take part in every loss. DDP said: "
                + str(err).splitlines()[0]) from None


def _marked_reduction(ddp_ref: Any, bucket):  # type: ignore[no-untyped-def]  # DDP checks hooks' annotations
    """DDP's communication hook: the chosen reduction, and once the last bucket is launched
    the mark that this rank now only waits on its peers (cleared by the next progress)."""
    ddp = ddp_ref()
    state, hook = ddp._chosen_hook or (ddp.process_group, _allreduce_mean)
    future = hook(state, bucket)
    if bucket.is_last():
        heartbeat.waiting_from_now("DDP's gradient all-reduce")
    return future


def _allreduce_mean(process_group, bucket):  # type: ignore[no-untyped-def]  # (as above)
    """DDP's built-in reduction: every gradient times 1/world size (DDP's own rounding: a
    product, not a division), summed over the ranks."""
    buffer = bucket.buffer()
    buffer.mul_(1.0 / dist.get_world_size(process_group))
    work = dist.all_reduce(buffer, group=process_group, async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0])


def wrap(module: nn.Module, device: torch.device, kwargs: Dict[str, Any]) -> GraphDDP:
    """``module`` in DDP for this rank's ``device`` with the trainer's extra ``kwargs``."""
    ids = [device.index] if device.type == "cuda" else None
    with heartbeat.waiting("DDP's construction"):  # it broadcasts the parameters: waits for every rank
        return GraphDDP(module, device_ids=ids, **kwargs)
