"""Where a rank's time goes: ``Trainer(profiler="simple")`` sections and table, and
``profiler="pytorch"``'s trace of a few training steps on rank 0.

The *stages* split a fit's time on a rank without overlap (their sum is the fit's wall
time, less loop bookkeeping): epoch start (seeding, batch counts, the Join decision,
``on_train_epoch_start``), sample, to device, forward, backward, optimizer,
on_train_batch_end, join (waiting for ranks with more batches, and their state), validation,
epoch end (metric reduction, callbacks, checkpoints, logs), fit end. Hooks are timed too, as their
own rows; they fall inside stages. DDP's
all-reduce runs during backward, so its row overlaps ``backward``.
"""
from __future__ import annotations

import contextlib
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

import torch

STAGES = ("epoch start", "sample", "to device", "forward", "backward", "optimizer", "on_train_batch_end",
          "join", "validation", "epoch end", "fit end")
ALL_REDUCE = "all-reduce (inside backward)"


class Profiler:
    """Collects wall time per named section on one rank; does nothing unless ``enabled``."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.seconds: Dict[str, float] = defaultdict(float)
        self.calls: Dict[str, int] = defaultdict(int)
        self._fit_start: Optional[float] = None

    @contextlib.contextmanager
    def section(self, name: str) -> Iterator[None]:
        if not self.enabled:
            yield
            return
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] += time.perf_counter() - start
            self.calls[name] += 1

    def start_fit(self) -> None:
        self._fit_start = time.perf_counter()

    def summary(self) -> Dict[str, float]:
        """Seconds per section, plus ``"fit"`` (the wall time since :meth:`start_fit`)."""
        out = dict(self.seconds)
        if self._fit_start is not None:
            out["fit"] = time.perf_counter() - self._fit_start
        return out

    def time_all_reduce(self, ddp: Any) -> None:
        """Time DDP's gradient all-reduces with a communication hook (default all-reduce)."""
        if not self.enabled:
            return
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

        def timed(state, bucket):  # type: ignore[no-untyped-def]  # DDP rejects any annotation but its own
            start = time.perf_counter()
            fut = allreduce_hook(state, bucket)

            def done(f: torch.futures.Future) -> Any:
                self.seconds[ALL_REDUCE] += time.perf_counter() - start
                self.calls[ALL_REDUCE] += 1
                return f.value()[0] if isinstance(f.value(), list) else f.value()

            return fut.then(done)

        ddp.register_comm_hook(None, timed)


def table(per_rank: List[Dict[str, float]]) -> str:
    """Stages, then hooks and the rest, one column per rank, with the share of the fit time."""
    names = [s for s in STAGES if any(s in r for r in per_rank)]
    names += sorted({k for r in per_rank for k in r} - set(STAGES) - {"fit"})
    width = max(len(n) for n in names + ["stage / hook"])
    head = f"{'stage / hook':<{width}}" + "".join(f"  {'rank ' + str(i):>14}" for i in range(len(per_rank)))
    lines = [head, "-" * len(head)]
    for name in names:
        cells = []
        for r in per_rank:
            sec, fit = r.get(name, 0.0), r.get("fit", 0.0)
            cells.append(f"  {sec:8.3f}s {100 * sec / fit if fit else 0:4.0f}%")
        lines.append(f"{name:<{width}}" + "".join(cells))
    staged = [sum(r.get(s, 0.0) for s in STAGES) for r in per_rank]
    lines.append(f"{'sum of stages':<{width}}" + "".join(f"  {s:8.3f}s" + " " * 6 for s in staged))
    lines.append(f"{'fit (wall)':<{width}}" + "".join(f"  {r.get('fit', 0.0):8.3f}s" + " " * 6 for r in per_rank))
    return "\n".join(lines)


class TorchTrace:
    """A ``torch.profiler`` trace of a few training steps of rank 0 (wait 1, warm up 1,
    record 3) written to ``folder`` as a Chrome trace."""

    def __init__(self, folder: Optional[Path], enabled: bool):
        self.prof: Any = None
        if not enabled or folder is None:
            return
        folder.mkdir(parents=True, exist_ok=True)
        self.folder = folder
        self.prof = torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU]
            + ([torch.profiler.ProfilerActivity.CUDA] if torch.cuda.is_available() else []),
            schedule=torch.profiler.schedule(wait=1, warmup=1, active=3, repeat=1),
            on_trace_ready=self._write, record_shapes=False)
        self.prof.start()

    def _write(self, prof: Any) -> None:
        prof.export_chrome_trace(str(self.folder / "trace.json"))

    def step(self) -> None:
        if self.prof is not None:
            self.prof.step()

    def stop(self) -> None:
        if self.prof is not None:
            self.prof.stop()
            self.prof = None
