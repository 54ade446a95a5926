"""Where a training step's time goes, inside each rank of a graphtrainer run.

:class:`BreakdownTask` is the example's GraphSAGE training with each part of a step timed as an
interval on the rank's clock: ``sample`` (the loader's ``next()``, no prefetch), ``gather``
(features and labels), ``forward`` (with the loss), ``log``, ``backward``, ``allreduce`` (DDP's
gradient all-reduce through a hook that waits for it, slower rank included), ``optimizer`` and
``other`` (the trainer's own per-step work). :func:`summarize_rank` adds up the intervals in the
steady window, so the parts plus ``other`` are its wall time. ``instrument=False``: step ends only.
"""
from __future__ import annotations

import json
import os
import time
from typing import Any, Dict, List, Optional, Sequence

import torch
import torch.nn.functional as F

from graphtrainer import GraphTask

PARTS = ("sample", "gather", "forward", "log", "backward", "allreduce", "optimizer", "other")


class _TimedIterable:
    """Wraps a loader; records the (start, end) of every ``next()``."""

    def __init__(self, loader: Any, sink: List[tuple]):
        self.loader, self.sink = loader, sink

    def __len__(self) -> int:
        return len(self.loader)

    def set_epoch(self, epoch: int) -> None:
        self.loader.set_epoch(epoch)

    def __iter__(self) -> Any:
        it = iter(self.loader)
        sink = self.sink
        while True:
            t0 = time.perf_counter()
            try:
                item = next(it)
            except StopIteration:
                return
            sink.append(("sample", t0, time.perf_counter()))
            yield item


def _timed_allreduce_hook(state, bucket):  # no annotations: DDP checks them against dist.GradBucket
    import torch.distributed as dist

    t0 = time.perf_counter()
    buf = bucket.buffer()
    buf.div_(state["world"])
    dist.all_reduce(buf)
    state["events"].append(("allreduce", t0, time.perf_counter()))
    fut: Any = torch.futures.Future()
    fut.set_result(buf)
    return fut


class BreakdownTask(GraphTask):
    """GraphSAGE node classification with every part of a step timed (see module doc)."""

    def __init__(self, graph: Any, out_dir: str, fanouts: Sequence[int] = (10, 10), hidden: int = 64,
                 batch_size: int = 1024, lr: float = 3e-3, dropout: float = 0.5, instrument: bool = True):
        super().__init__()
        self.graph = graph
        self.out_dir = str(out_dir)
        self.fanouts, self.hidden, self.batch_size = list(fanouts), hidden, batch_size
        self.lr, self.dropout, self.instrument = lr, dropout, instrument
        self.num_classes = int(graph.ndata["label"].max()) + 1
        mask = graph.ndata["train_mask"]
        self.train_ids = (mask[:, 0] if mask.dim() > 1 else mask).nonzero(as_tuple=True)[0]
        self.events: List[tuple] = []
        self.step_ends: List[float] = []
        self.seeds: List[int] = []
        self._ts_end: Optional[float] = None

    def configure_model(self) -> torch.nn.Module:
        from graphtrainer.models import SAGE

        return SAGE(self.graph.ndata["feat"].shape[1], self.hidden, self.num_classes,
                    num_layers=len(self.fanouts), dropout=self.dropout)

    def configure_optimizers(self) -> Any:
        opt = torch.optim.Adam(self.model.parameters(), lr=self.lr)
        if self.instrument:
            opt.register_step_pre_hook(self._opt_pre)
            opt.register_step_post_hook(self._opt_post)
        return opt

    def _opt_pre(self, opt: Any, args: Any, kwargs: Any) -> None:
        now = time.perf_counter()
        if self._ts_end is not None:
            self.events.append(("backward+allreduce", self._ts_end, now))
        self._opt_t0 = now

    def _opt_post(self, opt: Any, args: Any, kwargs: Any) -> None:
        self.events.append(("optimizer", self._opt_t0, time.perf_counter()))

    def on_fit_start(self) -> None:
        from torch.nn.parallel import DistributedDataParallel

        if self.instrument and isinstance(self.model, DistributedDataParallel):
            self.model.register_comm_hook({"world": self.world_size, "events": self.events}, _timed_allreduce_hook)

    def train_dataloader(self) -> Any:
        import dgl

        sampler = dgl.dataloading.NeighborSampler(self.fanouts)  # no prefetch: gather is timed apart
        loader = self.node_dataloader(self.train_ids, sampler, self.batch_size, shuffle=True)
        return _TimedIterable(loader, self.events) if self.instrument else loader

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        input_nodes, seeds, blocks = batch
        t0 = time.perf_counter()
        x = self.graph.ndata["feat"][input_nodes]
        y = self.graph.ndata["label"][seeds]
        t1 = time.perf_counter()
        loss = F.cross_entropy(self.model(blocks, x), y)
        t2 = time.perf_counter()
        self.log("train_loss", loss, batch_size=int(seeds.shape[0]))
        t3 = time.perf_counter()
        if self.instrument:
            self.events += [("gather", t0, t1), ("forward", t1, t2), ("log", t2, t3)]
        self._ts_end = time.perf_counter()
        return loss

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.step_ends.append(time.perf_counter())
        self.seeds.append(int(batch[1].shape[0]))

    def on_fit_end(self) -> None:
        import dgl

        payload = {"rank": self.rank, "world": self.world_size, "pid": os.getpid(),
                   "torch_threads": torch.get_num_threads(), "dgl_threads": dgl.utils.get_num_threads(),
                   "events": self.events, "step_ends": self.step_ends, "seeds": self.seeds}
        path = os.path.join(self.out_dir, f"rank_{self.rank}.json")
        with open(path + ".tmp", "w", encoding="utf-8") as fh:
            json.dump(payload, fh)
        os.replace(path + ".tmp", path)


def summarize_rank(data: Dict[str, Any], warmup: int) -> Dict[str, Any]:
    """Steady-state window = from the end of step ``warmup - 1`` to the end of the last step.

    Returns the window, its seeds, and per part the milliseconds per step (parts that
    straddle a window edge count for the overlapping fraction only).
    """
    ends, seeds = data["step_ends"], data["seeds"]
    if len(ends) <= warmup:
        raise RuntimeError(f"rank {data['rank']} ran {len(ends)} steps, not more than the {warmup} warm-up steps")
    lo, hi = ends[warmup - 1] if warmup > 0 else None, ends[-1]
    if lo is None:
        raise ValueError("warmup must be >= 1")
    steps = len(ends) - warmup
    totals = {p: 0.0 for p in PARTS}
    combined = 0.0
    for name, t0, t1 in data["events"]:
        overlap = max(0.0, min(t1, hi) - max(t0, lo))
        if name == "backward+allreduce":
            combined += overlap
        elif name in totals:
            totals[name] += overlap
    totals["backward"] = max(0.0, combined - totals["allreduce"])
    window = hi - lo
    totals["other"] = max(0.0, window - sum(v for k, v in totals.items() if k != "other"))
    return {"rank": data["rank"], "window_s": window, "steps": steps, "seeds": sum(seeds[warmup:]),
            "torch_threads": data["torch_threads"], "dgl_threads": data["dgl_threads"],
            "ms_per_step": {k: 1000 * v / steps for k, v in totals.items()},
            "step_ms": 1000 * window / steps}
