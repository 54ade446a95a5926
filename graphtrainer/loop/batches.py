"""A stage's loaders: checked before the first batch, iterated with batch limits, epochs and
evaluation mode, and whether ``len`` can be trusted."""
from __future__ import annotations

import contextlib
import math
import sys
from typing import Any, Callable, ContextManager, Iterable, Iterator, Optional, Tuple

import torch
from torch.utils.data import DataLoader, IterableDataset

from .. import heartbeat
from ..data.device.mode import place as place_sampling
from ..data.formats import warn_unbuilt_formats
from ..data.sharded_loader import ShardedLoader
from ..data.validation import check_loader
from ..nn.transfer import BatchTransfer
from ..state import BatchLimit, RunState, TrainerConfig


def check_loaders(state: RunState, training: Any = None, evaluation: Any = None,
                  config: Optional[TrainerConfig] = None) -> None:
    """Check a stage's loaders before the first batch (``evaluation``: every id scored
    once) and choose where they sample (``config.sampling``; without a config, on the CPU).
    In ranks launched from a prepared graph, rank 0 also warns about sparse formats their
    sampling reads that were not built before launch (each rank would build its own)."""
    if training is not None:
        check_loader(training, state.world_size)
    if evaluation is not None:
        check_loader(evaluation, state.world_size, evaluation=True)
    for loader in (training, evaluation):
        if loader is not None:
            place_sampling(loader, state.device, config.sampling if config is not None else "cpu",
                           announce=state.rank == 0)
    if state.launched and state.world_size > 1 and state.rank == 0:
        for loader in (training, evaluation):
            if loader is not None:
                warn_unbuilt_formats(loader)


def batch_limit(loader: Any, limit: BatchLimit) -> Optional[int]:
    """Batches to run: ``limit`` as a count (int) or a fraction (float) of ``len(loader)``."""
    if limit is None:
        return None
    if isinstance(limit, float) and limit <= 1.0:
        try:
            return int(math.floor(len(loader) * limit))
        except TypeError:
            raise ValueError("a fractional batch limit needs a loader with len()") from None
    return int(limit)


def with_last(iterable: Iterable[Any], limit: Optional[int], place: str,
              timer: Optional[Callable[[str], ContextManager[Any]]] = None) -> Iterator[Tuple[int, Any, bool]]:
    """``(index, item, is_last)`` so accumulation can step on the final batch. Fetching a
    batch counts as being in ``place`` for the hang check (sampling can hang too), and as
    the ``"sample"`` section of ``timer``."""
    if limit is not None and limit <= 0:
        return
    fetching = (lambda: timer("sample")) if timer is not None else contextlib.nullcontext
    heartbeat.beat(place, 0)
    it = iter(iterable)
    try:
        with fetching():
            current = next(it)
    except StopIteration:
        return
    idx = 0
    while True:
        if limit is not None and idx + 1 >= limit:
            yield idx, current, True
            return
        try:
            heartbeat.beat(place, idx + 1)
            with fetching():
                nxt = next(it)
        except StopIteration:
            yield idx, current, True
            return
        yield idx, current, False
        current, idx = nxt, idx + 1


def require_training_loader(loader: Any, task_name: str) -> None:
    """A clear error when ``train_dataloader()`` gave nothing to train on."""
    if loader is None:
        raise TypeError(f"{task_name}.train_dataloader() returned None, but fit needs the batches to train on: "
                        "return an iterable of batches from it (graphtrainer's node loader, a DGL DataLoader, a "
                        "list); only val_dataloader() may return None (no validation)")


def batch_transfer(task: Any, device: torch.device, config: TrainerConfig) -> BatchTransfer:
    """How this stage's batches reach ``device`` (``config.block_type``): iterate
    ``.batches(loader)``, then ``.to_device(item)`` per batch. Only graphtrainer's own
    ``transfer_batch_to_device`` is replaced by pinning, copying and prefetching; a task's
    override gets the (converted) batch and moves it itself."""
    default = getattr(type(task).transfer_batch_to_device, "graphtrainer_default", False)
    return BatchTransfer(device, config.block_type, task.transfer_batch_to_device, hook_is_default=default,
                         prefetch=config.prefetch_batches)


def set_epoch(loader: Any, epoch: int) -> None:
    """Tell the loader (or its sampler) which epoch's permutation to use."""
    for obj in (loader, getattr(loader, "sampler", None), getattr(loader, "batch_sampler", None)):
        if obj is not None and hasattr(obj, "set_epoch"):
            obj.set_epoch(epoch)
            return


def for_evaluation(loader: Any) -> Any:
    """Put a graphtrainer loader in evaluation mode (every id once, in order)."""
    if loader is not None and hasattr(loader, "for_evaluation"):
        loader.for_evaluation()
    return loader


def exact_len(loader: Any) -> bool:
    """Whether ``len(loader)`` is exactly the batches an iteration yields: graphtrainer's,
    DGL's and torch's map-style loaders. With any other iterable a wrong ``len`` would
    hang a rank waiting for a batch its peers never run."""
    if isinstance(loader, ShardedLoader):
        return True
    dgl = sys.modules.get("dgl")
    if dgl is not None and isinstance(loader, dgl.dataloading.DataLoader):
        return True
    return isinstance(loader, DataLoader) and not isinstance(loader.dataset, IterableDataset)


def count_batches(loader: Any, limit: BatchLimit) -> Optional[int]:
    """Batches this rank runs this epoch (None when the loader has no length)."""
    cap = batch_limit(loader, limit)
    try:
        n = len(loader)
    except TypeError:
        return cap
    return n if cap is None else min(n, cap)
