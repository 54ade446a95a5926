"""Exact metric reduction across ranks.

``self.log(name, value, batch_size=n)`` adds ``value * n`` and ``n`` to local float64
sums, on the value's device so training never waits on the host. At the end of a phase
(after leaving ``Join``) :meth:`MetricStore.reduce` sums both over ranks: the result is
the weighted mean over every sample of every rank, never a mean of per-rank means.

``reduce_fx="sum"`` gives totals instead (counts, e.g. nodes scored), summed over every
call of every rank.

Metrics that are not means (ROC-AUC, F1) need every prediction: gather them with
:func:`gather` and compute them with scikit-learn, e.g. :func:`roc_auc`.
"""
from __future__ import annotations

import sys
import zlib
from typing import Dict, List, Optional, Tuple

import torch

from . import distributed as gdist


#: How ``self.log`` values of one phase combine: exact weighted mean, or total.
REDUCE_FXS = ("mean", "sum")


class MetricStore:
    """Local sums of logged values for the current phase, plus the latest step values."""

    def __init__(self) -> None:
        self._sums: Dict[str, Tuple[torch.Tensor, float]] = {}
        self._reduce: Dict[str, str] = {}
        self.prog_bar: set = set()
        self.last: Dict[str, torch.Tensor] = {}
        #: Values logged since :meth:`start_step` (this rank's own, for the step rows of logs).
        self.step_values: Dict[str, torch.Tensor] = {}

    def add(self, name: str, value: torch.Tensor | float, weight: float, prog_bar: bool = False,
            reduce_fx: str = "mean") -> None:
        if reduce_fx not in REDUCE_FXS:
            raise ValueError(f"self.log({name!r}): reduce_fx={reduce_fx!r}; choose one of {REDUCE_FXS}")
        if self._reduce.setdefault(name, reduce_fx) != reduce_fx:
            raise ValueError(f"self.log({name!r}): logged with reduce_fx={self._reduce[name]!r} before and "
                             f"{reduce_fx!r} now; use one per name")
        if not isinstance(value, torch.Tensor):
            value = torch.tensor(float(value), dtype=torch.float64)
        value = value.detach()
        if value.numel() != 1:
            raise ValueError(f"self.log({name!r}): value must be a scalar, got shape {tuple(value.shape)}")
        value = value.reshape(()).to(torch.float64)
        if reduce_fx == "sum":
            weight = 1.0
        total, n = self._sums.get(name, (torch.zeros((), dtype=torch.float64, device=value.device), 0.0))
        self._sums[name] = (total + value * weight, n + weight)
        self.last[name] = value
        self.step_values[name] = value
        if prog_bar:
            self.prog_bar.add(name)

    def start_step(self) -> None:
        """Forget the previous step's values (the next step row holds only its own)."""
        self.step_values.clear()

    def reduce(self) -> Dict[str, float]:
        """Epoch values over all ranks (weighted means, or sums); clears the sums. Must be
        called on all processes."""
        local = {name: self._reduce[name] for name in self._sums}
        if gdist.is_distributed() and not _same_on_all_ranks(local):
            merged: Dict[str, str] = {}
            for kinds in gdist.all_gather_object(local):  # rare: some rank logged other names
                merged.update(kinds)
            local = merged
        names = sorted(local)
        if not names:
            return {}
        buf = torch.zeros(2 * len(names), dtype=torch.float64)
        for i, name in enumerate(names):
            if name in self._sums:
                total, n = self._sums[name]
                buf[i] = total.cpu()
                buf[len(names) + i] = n
        buf = gdist.all_reduce(buf, "sum")
        self._sums.clear()
        out: Dict[str, float] = {}
        for i, name in enumerate(names):
            n = float(buf[len(names) + i])
            if local[name] == "sum":
                out[name] = float(buf[i])
            else:
                out[name] = float(buf[i]) / n if n > 0 else float("nan")
        return out

def _same_on_all_ranks(kinds: Dict[str, str]) -> bool:
    """Whether every rank logged the same names with the same reductions, by a checksum
    instead of gathering the names. Collective."""
    return gdist.same_on_all_ranks(zlib.crc32(repr(sorted(kinds.items())).encode()))


def gather(tensor: torch.Tensor) -> torch.Tensor:
    """Every rank's rows concatenated in rank order (lengths may differ).

    Must be called on all processes, outside ``training_step`` (inside ``Join`` only
    DDP's own all-reduce may run): e.g. in ``on_validation_epoch_end``.
    """
    return gdist.all_gather_tensor(tensor)


def roc_auc(scores: torch.Tensor, labels: torch.Tensor) -> float:
    """ROC-AUC of binary ``labels`` given positive-class ``scores`` (scikit-learn)."""
    from sklearn.metrics import roc_auc_score

    labels = labels.detach().cpu().numpy()
    if len(set(labels.tolist())) < 2:
        return float("nan")
    return float(roc_auc_score(labels, scores.detach().float().cpu().numpy()))


def accuracy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Fraction of rows whose arg-max equals the label, as a 0-d tensor (no host sync)."""
    if labels.numel() == 0:
        return torch.zeros((), device=logits.device)
    return (logits.argmax(dim=-1) == labels).float().mean()


def infer_batch_size(batch: object) -> Optional[int]:
    """The number of seeds in a batch, or None when it cannot tell.

    - DGL edge batches ``(input_nodes, pair_graph, [neg_pair_graph,] blocks)``: the seed
      edges (edges of the positive pair graph).
    - DGL node batches ``(input_nodes, output_nodes, blocks)``: the seed nodes (on a
      heterograph, the seeds of every type together).
    - A batched graph (``dgl.batch``), alone or first in a tuple such as
      ``(graphs, labels)``: the number of graphs.
    - A tensor: its rows. A dict: its first value.
    """
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() > 0 else 1
    if _is_graph(batch):
        return int(batch.batch_size)
    if isinstance(batch, (tuple, list)) and batch:
        if len(batch) in (3, 4) and _is_graph(batch[1]) and isinstance(batch[-1], (list, tuple)):
            return int(batch[1].num_edges())
        if len(batch) == 3 and isinstance(batch[1], torch.Tensor):
            return int(batch[1].shape[0])
        if len(batch) == 3 and isinstance(batch[1], dict) and batch[1] \
                and all(isinstance(v, torch.Tensor) for v in batch[1].values()):
            return int(sum(v.shape[0] for v in batch[1].values()))  # heterograph: seeds of every type
        return infer_batch_size(batch[0])
    if isinstance(batch, dict) and batch:
        return infer_batch_size(next(iter(batch.values())))
    return None


def _is_graph(obj: object) -> bool:
    dgl = sys.modules.get("dgl")
    return dgl is not None and isinstance(obj, dgl.DGLGraph)
