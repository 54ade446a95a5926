"""Getting a rank's batches onto its device when DGL cannot go there.

DGL's PyPI wheel is CPU-only: ``block.to("cuda")`` raises. With ``block_type="torch"`` (the
``"auto"`` choice on a GPU rank without DGL's CUDA build) every DGL block, pair graph and
batched graph of a batch becomes a :mod:`torch graph <graphtrainer.nn.blocks>` on the CPU,
is pinned, and is copied with ``non_blocking=True``. With the task's default
``transfer_batch_to_device``, the copy of a batch is enqueued on a side CUDA stream before
the step of the batch before it runs, so copies overlap compute:

- the side stream first waits for the compute stream (``wait_stream``), so a copy never
  races with work already queued there;
- an event recorded after each batch's copies is what the compute stream waits on (only
  that batch's copies, not the ones queued after it);
- every copied tensor is marked as used by the compute stream (``record_stream``), so the
  caching allocator does not reuse its memory while a kernel there may still read it.

PyG batches (``batch_format="pyg"``, :mod:`graphtrainer.nn.pyg`) hold torch tensors already:
they are pinned, copied and prefetched the same way, whatever ``block_type`` says.

On CPU ranks, ``"torch"`` only converts (for tests and measurement); ``"dgl"`` keeps DGL's
graphs and the task's hook as they are. A ``dgl.nn`` layer fed a torch graph fails at its
first batch with an error naming the fixes (see :func:`graphtrainer.nn.graph_views.dgl_only`).
"""
from __future__ import annotations

import time
from typing import Any, Dict, Iterable, Iterator, Optional

import torch

from .blocks import is_torch_graph
from .collection import apply_to_leaves, leaves
from .convert import contains_dgl_graph, convert_batch, is_dgl_graph
from .pyg import is_pyg_data

BLOCK_TYPES = ("auto", "torch", "dgl")
_DGL_DEVICES: Dict[str, bool] = {}


def check_block_type(block_type: str) -> str:
    if block_type not in BLOCK_TYPES:
        raise ValueError(f"block_type={block_type!r}: choose 'auto' (DGL's graphs where DGL runs on the device, "
                         "torch-only graphs where it does not), 'torch' or 'dgl'")
    return block_type


def dgl_runs_on(device: torch.device) -> bool:
    """Whether DGL's graphs can move to ``device`` (always on CPU; on a GPU only with DGL's
    CUDA build). Probed once per device with a one-edge graph."""
    if device.type == "cpu":
        return True
    key = str(device)
    if key not in _DGL_DEVICES:
        import dgl

        try:
            dgl.graph(([0], [0])).to(device)
            _DGL_DEVICES[key] = True
        except Exception:  # DGLError "Device API cuda is not enabled": the PyPI wheel
            _DGL_DEVICES[key] = False
    return _DGL_DEVICES[key]


def resolve_block_type(block_type: str, device: torch.device) -> str:
    """``"torch"`` or ``"dgl"`` for batches holding DGL graphs on ``device``; refuses
    ``"dgl"`` where DGL cannot run, naming the fixes."""
    check_block_type(block_type)
    if block_type == "torch":
        return "torch"
    runs = dgl_runs_on(device)
    if block_type == "dgl" and not runs:
        raise RuntimeError(f"block_type='dgl' on {device}: this DGL build cannot move graphs to {device} (the PyPI "
                           "wheel is CPU-only). Use block_type='auto' or 'torch' with graphtrainer.nn layers, or "
                           "install DGL's CUDA build from DGL's wheel index.")
    return "dgl" if runs else "torch"


def _copied_whole(obj: Any) -> bool:
    """Tensors, torch graphs and PyG batches: each pinned and copied as one."""
    return isinstance(obj, torch.Tensor) or is_torch_graph(obj) or is_pyg_data(obj)


def _pin_one(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.pin_memory() if obj.device.type == "cpu" and not obj.is_pinned() else obj
    if is_torch_graph(obj):
        return obj.pin_memory()
    return obj.apply(lambda t: t if t.is_pinned() else t.pin_memory())  # a PyG batch: its tensors, in place


def pin(batch: Any) -> Any:
    """``batch`` with its CPU tensors and torch graphs in page-locked memory."""
    return apply_to_leaves(batch, _pin_one, _copied_whole)


def copy_to(batch: Any, device: torch.device) -> Any:
    """``batch`` on ``device``: tensors and torch graphs with ``non_blocking=True``."""
    def copy(obj: Any) -> Any:
        return obj.to(device) if is_dgl_graph(obj) else obj.to(device, non_blocking=True)

    return apply_to_leaves(batch, copy, lambda obj: _copied_whole(obj) or is_dgl_graph(obj))


def device_tensors(batch: Any) -> Iterator[torch.Tensor]:
    for leaf in leaves(batch, _copied_whole):
        if isinstance(leaf, torch.Tensor):
            yield leaf
        elif is_torch_graph(leaf):
            yield from leaf.tensors().values()
        else:  # a PyG batch
            yield from (value for _, value in leaf if isinstance(value, torch.Tensor))


class _InFlight:
    """A batch whose copy was enqueued on the side stream, and the event that ends it."""

    __slots__ = ("batch", "event")

    def __init__(self, batch: Any, event: Any):
        self.batch, self.event = batch, event


class CudaStreams:
    """The CUDA stream operations the prefetcher uses (a test on CPU passes a recorder)."""

    def __init__(self, device: torch.device):
        self.device = device

    def new_side_stream(self) -> Any:
        return torch.cuda.Stream(self.device)

    def current(self) -> Any:
        return torch.cuda.current_stream(self.device)

    def use(self, stream: Any) -> Any:
        return torch.cuda.stream(stream)

    def new_event(self) -> Any:
        return torch.cuda.Event()


class BatchTransfer:
    """A rank's batch transfer for one stage: ``batches(loader)`` to iterate, then
    ``to_device(item)`` on each item inside the step's timing section.

    ``hook``: the task's ``transfer_batch_to_device``; ``hook_is_default``: whether it is
    graphtrainer's own (only then are batches pinned, copied and prefetched here; a user's
    hook gets the converted batch and moves it itself). ``measure_wait``: time spent blocked
    on copies (``wait_seconds``; it synchronises, so benchmarks only).
    """

    pin = staticmethod(pin)
    copy = staticmethod(copy_to)

    def __init__(self, device: torch.device, block_type: str, hook: Any, hook_is_default: bool = True,
                 prefetch: bool = True, measure_wait: bool = False, streams: Optional[Any] = None):
        self.device, self.block_type = torch.device(device), check_block_type(block_type)
        self.hook, self.hook_is_default = hook, hook_is_default
        self.prefetch, self.measure_wait = prefetch, measure_wait
        self.streams = streams if streams is not None else (CudaStreams(self.device)
                                                            if self.device.type == "cuda" else None)
        self.resolved: Optional[str] = None
        self.wait_seconds = 0.0
        self.converted = 0

    def mode(self, batch: Any) -> str:
        """``"torch"`` (convert) or ``"dgl"`` (keep), decided at the first batch holding a DGL graph."""
        if self.resolved is None:
            if self.block_type == "torch":
                self.resolved = "torch"
            elif contains_dgl_graph(batch):
                self.resolved = resolve_block_type(self.block_type, self.device)
            elif is_pyg_data(batch):  # torch tensors only: pinned, copied and prefetched here
                self.resolved = "torch"
            else:
                return "dgl"  # nothing to convert (yet): a plain-torch batch
        return self.resolved

    def _convert(self, batch: Any) -> Any:
        self.converted += 1
        return convert_batch(batch)

    def batches(self, loader: Iterable[Any]) -> Iterable[Any]:
        """The loader's items; prefetched (copies started one batch ahead) where they are
        converted, the hook is the default and the device has streams."""
        if not (self.prefetch and self.hook_is_default and self.streams is not None):
            return loader
        return self._prefetched(loader)

    def _prefetched(self, loader: Iterable[Any]) -> Iterator[Any]:
        it = iter(loader)
        try:
            first = next(it)
        except StopIteration:
            return
        if self.mode(first) != "torch":  # DGL moves its own graphs (CUDA build), or nothing to convert
            yield first
            yield from it
            return
        side = self.streams.new_side_stream()
        pending = self._start(first, side)
        for raw in it:
            following = self._start(raw, side)  # enqueued before the step of `pending` runs
            yield pending
            pending = following
        yield pending

    def _start(self, raw: Any, side: Any) -> _InFlight:
        batch = self.pin(self._convert(raw))
        side.wait_stream(self.streams.current())
        with self.streams.use(side):
            moved = self.copy(batch, self.device)
            event = self.streams.new_event()
            event.record(side)
        return _InFlight(moved, event)

    def to_device(self, item: Any) -> Any:
        """The batch on the device, as the step sees it."""
        if isinstance(item, _InFlight):
            current = self.streams.current()
            if self.measure_wait:
                started = time.perf_counter()
                item.event.synchronize()
                self.wait_seconds += time.perf_counter() - started
            current.wait_event(item.event)
            for tensor in device_tensors(item.batch):
                tensor.record_stream(current)
            return item.batch
        if self.mode(item) != "torch":
            return self.hook(item, self.device)
        batch = self._convert(item)
        if not (self.hook_is_default and self.streams is not None):
            return self.hook(batch, self.device)
        started = time.perf_counter()
        moved = self.copy(self.pin(batch), self.device)
        if self.measure_wait:
            self.streams.current().synchronize()
            self.wait_seconds += time.perf_counter() - started
        return moved


def move_to_device(batch: Any, device: torch.device) -> Any:
    """``batch`` with every tensor and graph inside on ``device`` (a no-op for those already there)."""
    def move(obj: Any) -> Any:
        if isinstance(obj, torch.Tensor):
            return obj.to(device, non_blocking=True)
        return obj if getattr(obj, "device", None) == device else obj.to(device)

    return apply_to_leaves(batch, move, _movable)


def _movable(obj: Any) -> bool:  # PyG's Data has no .device
    return isinstance(obj, torch.Tensor) or (hasattr(obj, "to") and (hasattr(obj, "device") or is_pyg_data(obj)))
