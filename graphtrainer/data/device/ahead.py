"""Sampling the next batch while the current one trains (CUDA devices).

The torch sampler launches a few hundred small kernels per batch and reads back each layer's
sizes once: on a GPU it is bound by the host, not by the device. :func:`sample_ahead` runs
the batches of one iteration in a thread of their own, on the device graph's own CUDA stream,
one batch ahead of the training step: the host work of sampling overlaps the step's (torch
releases the GIL while it launches kernels), and the per-layer read-back waits for the
sampling stream only, never for the training stream.

- The consumer's stream waits for an event recorded after each batch, and every tensor of
  the batch is marked as used there (``record_stream``), so the caching allocator does not
  hand its memory back to the sampling stream too early.
- All iterations over one device graph sample on its one stream, under its one lock: the
  graph's scratch id maps (:class:`~.compact.NodeMaps`) serve one batch at a time, also when
  a mid-epoch validation iterates while the training iterator samples ahead.
- An iteration abandoned early (a batch limit, a failure) stops its thread before returning.
"""
from __future__ import annotations

import queue
import threading
from typing import Any, Callable, Iterator

import torch

from ...nn.transfer import device_tensors

_DONE = object()


class _Failed:
    def __init__(self, error: BaseException):
        self.error = error


class Scratch:
    """One device graph's sampling state: its id maps, the lock around them and, on CUDA, its stream."""

    def __init__(self, maps: Any, device: torch.device):
        self.maps, self.lock = maps, threading.Lock()
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None


def sample_ahead(make: Callable[[], Iterator[Any]], scratch: Scratch, device: torch.device) -> Iterator[Any]:
    """The batches of ``make()``, sampled one ahead in a thread on ``scratch.stream`` (CUDA);
    elsewhere, in this thread as they are asked for."""
    if scratch.stream is None:
        yield from make()
        return
    ready: "queue.Queue[Any]" = queue.Queue(maxsize=1)
    stop = threading.Event()

    def work() -> None:
        try:
            with torch.cuda.device(device), torch.cuda.stream(scratch.stream):
                for batch in make():
                    event = torch.cuda.Event()
                    event.record(scratch.stream)
                    while not stop.is_set():
                        try:
                            ready.put((batch, event), timeout=0.1)
                            break
                        except queue.Full:
                            continue
                    if stop.is_set():
                        return
            ready.put(_DONE)
        except BaseException as err:  # noqa: BLE001  (raised again in the consumer)
            ready.put(_Failed(err))

    thread = threading.Thread(target=work, name="graphtrainer-sample-ahead", daemon=True)
    thread.start()
    current = torch.cuda.current_stream(device)
    try:
        while True:
            item = ready.get()
            if item is _DONE:
                return
            if isinstance(item, _Failed):
                raise item.error
            batch, event = item
            current.wait_event(event)
            for tensor in device_tensors(batch):
                tensor.record_stream(current)
            yield batch
    finally:
        stop.set()
        while thread.is_alive():
            try:
                ready.get(timeout=0.1)
            except queue.Empty:
                pass
        thread.join()
