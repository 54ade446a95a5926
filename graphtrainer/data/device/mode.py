"""Where a loader samples: ``Trainer(sampling=...)`` applied to each loader in a rank.

- ``"cpu"``: DGL's sampler on the CPU (in the rank or its workers);
- ``"device"``: the torch sampler on the rank's device; a loader it cannot serve is refused
  before the first batch, naming the part and the fix. Gathered data that does not fit beside
  the structure stays on the host, gathered there per batch (rank 0 says which);
- ``"auto"`` (default): on GPU ranks the device when the sampler is supported and the
  structure and data fit in :data:`DEVICE_SHARE` of its free memory, else the CPU (rank 0
  says why); on CPU ranks DGL's sampler (faster there: ``benchmarks/device_sampling.py``).

``GRAPHTRAINER_SAMPLING_BUDGET`` (bytes), when set, replaces the measured memory budget.
"""
from __future__ import annotations

import os
import sys
from typing import Any, Tuple

import torch

from .graph import copied_bytes, plan_copy
from .sampler import DeviceSampler, Unsupported, merge_keys

SAMPLING_MODES = ("auto", "device", "cpu")
#: The share of the device's free memory the sampler's copy may take under ``"auto"`` and ``"device"``.
DEVICE_SHARE = 0.5
BUDGET_ENV = "GRAPHTRAINER_SAMPLING_BUDGET"


def check_sampling(value: str) -> str:
    if value not in SAMPLING_MODES:
        raise ValueError(f"sampling={value!r}: choose 'auto' (the device on GPU ranks when the graph fits), "
                         "'device' (torch ops on the rank's device) or 'cpu' (DGL's sampler)")
    return value


def budget(device: torch.device) -> Tuple[int, str]:
    """Bytes the sampler's copy may take on ``device``, and where that figure comes from."""
    raw = os.environ.get(BUDGET_ENV, "").strip()
    if raw:
        try:
            value = int(float(raw))
        except ValueError:
            value = -1
        if value < 0:
            raise ValueError(f"{BUDGET_ENV}={raw!r}: give the bytes the sampler's copy may take, e.g. 8e9 for 8 GB, "
                             f"or unset it to use {DEVICE_SHARE:.0%} of the device's free memory")
        return value, f"${BUDGET_ENV}"
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free * DEVICE_SHARE), f"{DEVICE_SHARE:.0%} of {device}'s free memory"
    import psutil

    return int(psutil.virtual_memory().available * DEVICE_SHARE), f"{DEVICE_SHARE:.0%} of available RAM"


def _size(n: int) -> str:
    if n < 2**20 // 10:
        return f"{max(n, 0):,} bytes"
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def device_batches(loader: Any, device: torch.device, host_data: bool = False) -> Any:
    """The device sampling of a node or edge loader, or :class:`Unsupported` naming why not.
    ``host_data``: data that does not fit beside the structure stays on the host."""
    from .batches import DeviceNodeBatches
    from .edges import DeviceEdgeBatches, pair_edge_keys

    if getattr(loader, "dataloader_kwargs", None):
        raise Unsupported(f"DataLoader options {sorted(loader.dataloader_kwargs)} are for DGL's CPU sampling")
    graph = loader.graph
    sampler = DeviceSampler.from_dgl(loader.sampler, graph)
    if getattr(loader, "batch_keys", None):  # PyG batches read x, y and edge_attr whatever the sampler names
        sampler = sampler.with_batch_keys(graph, *loader.batch_keys, getattr(loader, "batch_attrs", ((), ())))
    allowed, source = budget(device)
    copied = copied_bytes(graph, device) if source == f"${BUDGET_ENV}" else 0
    if copied:  # a fixed total: a copy made for an earlier loader counts against it
        allowed -= copied  # (measured free memory has shrunk by that copy already)
        source += f", less the {_size(copied)} an earlier loader's copy holds"
    # What this loader adds: a later loader of the same graph (validation after training) shares the copy.
    edge_keys = merge_keys(sampler.edge_keys(), pair_edge_keys(loader)) if hasattr(loader, "pairs") else \
        sampler.edge_keys()
    plan = plan_copy(graph, device, sampler.node_keys(), edge_keys, allowed,
                     edge_index=hasattr(loader, "pairs") and (loader.pairs is None or loader.exclude is not None),
                     weights=sampler.prob)
    need = plan.structure + plan.data + plan.host_bytes
    over = f"more than the {_size(allowed)} allowed ({source})"
    if (plan.structure and plan.structure > allowed) or (plan.host_bytes and not host_data):
        also = "" if plan.structure > allowed else (
            f"; Trainer(sampling='device') samples there and gathers {plan.names_on_host()} "
            f"({_size(plan.host_bytes)}) on the host")
        if source.startswith("$"):
            also += f"; raise ${BUDGET_ENV} (bytes) or unset it"
        raise Unsupported(f"the graph's structure and gathered data need {_size(need)} on {device}, {over}{also}")
    if hasattr(loader, "pairs"):
        batches: Any = DeviceEdgeBatches(loader, sampler, device, plan.on_host)
    else:
        batches = DeviceNodeBatches(graph, sampler, loader.batch_size, loader.drop_last, loader.spans, device,
                                    plan.on_host)
    batches.footprint = f"structure and gathered data {_size(plan.structure + plan.data)} of the {_size(allowed)} " \
                        f"allowed ({source})"
    batches.host_note = "" if not plan.host_bytes else (
        f"; gathered on the host per batch: {plan.names_on_host()} ({_size(plan.host_bytes)}), since with it "
        f"the copy would need {_size(need)}, {over}")
    return batches


def auto_samples_on(device: torch.device) -> bool:
    """Whether ``"auto"`` tries the device sampler on ``device`` (GPUs only)."""
    return device.type == "cuda"


def place(loader: Any, device: torch.device, mode: str, announce: bool) -> str:
    """Set and return where ``loader`` samples (``"device"``, or ``"cpu"``, also for other
    loaders, left alone). ``announce``: say what ``"auto"`` chose on a GPU, and which data
    ``"device"`` gathers on the host."""
    if not hasattr(loader, "use_device_sampling"):
        # DGL's own neighbour-sampling DataLoader (not GraphDataLoader: whole graphs, nothing to sample)
        if type(loader).__module__.startswith("dgl.") and getattr(loader, "graph_sampler", None) is not None:
            name = type(loader).__name__
            fix = "return self.node_dataloader(ids, sampler, batch_size) or self.edge_dataloader(...)"
            if mode == "device":
                raise ValueError(f"sampling='device' cannot sample DGL's own {name} (it samples as it was built, "
                                 f"on the CPU). Fix: {fix}, or use Trainer(sampling='cpu')")
            if mode == "auto" and announce and auto_samples_on(device):  # nothing falls back silently
                print(f"[graphtrainer] sampling='auto': DGL's own {name} samples on the CPU because it samples as "
                      f"it was built; {fix} to sample on {device}", file=sys.stderr)
        return "cpu"
    if mode == "cpu" or (mode == "auto" and not auto_samples_on(device)):
        loader.use_device_sampling(None)
        return "cpu"
    name = type(loader).__name__
    try:
        batches = device_batches(loader, device, host_data=mode == "device")
    except Unsupported as why:
        if mode == "device":
            raise ValueError(f"sampling='device' cannot sample this {name} on {device}: {why}. Fix: change that "
                             "part (docs/gpus.md lists what the device sampler reads), or use "
                             "Trainer(sampling='cpu') (or 'auto', which falls back to the CPU)") from None
        loader.use_device_sampling(None)
        if announce:
            print(f"[graphtrainer] sampling='auto': {name} samples on the CPU because {why}; "
                  "Trainer(sampling='cpu') says so without this line", file=sys.stderr)
        return "cpu"
    loader.use_device_sampling(batches)
    if announce and (mode == "auto" or batches.host_note):
        print(f"[graphtrainer] sampling={mode!r}: {name} samples on {device} ({batches.footprint}){batches.host_note}",
              file=sys.stderr)
    return "device"
