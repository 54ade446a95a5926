"""Exact metric reduction across ranks.

``self.log(name, value, batch_size=n)`` adds ``value * n`` and ``n`` to local float64
sums, on the value's device so training never waits on the host. At the end of a phase
(after leaving ``Join``) :meth:`MetricStore.reduce` sums both over ranks: the result is
the weighted mean over every sample of every rank, never a mean of per-rank means.

``reduce_fx="sum"`` gives totals instead (counts, e.g. nodes scored), summed over every
call of every rank.

Metrics that are not means (ROC-AUC, F1) need every prediction: log a
``torchmetrics.Metric`` object (``self.log("val_auc", self.auroc)`` after
``self.auroc.update(scores, labels)``); :meth:`MetricStore.reduce` computes it over every
rank (torchmetrics' own ``sync_on_compute``) and resets it. Without torchmetrics, gather
predictions with ``GraphTask.all_gather`` in an epoch-end hook and compute them once, e.g.
with :func:`graphtrainer.evaluation.ranking.roc_auc` (or :class:`graphtrainer.evaluation.ranking.LinkScores` for link
prediction).
"""
from __future__ import annotations

import sys
import warnings
import zlib
from typing import Any, Dict, List, Optional, Tuple

import torch
from torch import nn

from .. import comm as gdist
from ..nn.blocks import is_torch_graph
from ..nn.collection import leaves


#: How ``self.log`` values of one phase combine: exact weighted mean, or total.
REDUCE_FXS = ("mean", "sum")
#: Kind of a name logged with a torchmetrics object: this prefix plus where the object lives
#: on the task (an attribute path), so a rank that did not log the name can still find it.
_METRIC = "metric:"


class MetricStore:
    """Local sums of logged values for the current phase, plus the latest step values.

    ``owner``: the object (the task) that attribute paths of logged torchmetrics objects
    start from.
    """

    def __init__(self, owner: Any = None) -> None:
        self.owner = owner
        self._sums: Dict[str, Tuple[torch.Tensor, float]] = {}
        #: torchmetrics objects logged this phase: name -> (metric, attribute path on owner).
        self._metric_objs: Dict[str, Tuple[Any, str]] = {}
        #: name -> (metric, path) of the last metric logged under it (the search runs once).
        self._known: Dict[str, Tuple[Any, str]] = {}
        self._reduce: Dict[str, str] = {}
        #: phase -> (names and kinds, updated metrics) of its last reduction, the same on every rank.
        self._layouts: Dict[str, Tuple[List[Tuple[str, str]], List[str]]] = {}
        self.prog_bar: set = set()
        self.last: Dict[str, torch.Tensor] = {}
        #: Values logged since :meth:`start_step` (this rank's own, for the step rows of logs).
        self.step_values: Dict[str, torch.Tensor] = {}

    def add(self, name: str, value: torch.Tensor | float, weight: float, prog_bar: bool = False,
            reduce_fx: str = "mean") -> None:
        if reduce_fx not in REDUCE_FXS:
            raise ValueError(f"self.log({name!r}): reduce_fx={reduce_fx!r}; choose one of {REDUCE_FXS}")
        if self._reduce.get(name) == "metric":
            raise ValueError(f"self.log({name!r}): logged with a torchmetrics object before and a value now; "
                             "use one per name")
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

    def stash(self) -> Tuple[Dict[str, Tuple[torch.Tensor, float]], Dict[str, Tuple[Any, str]]]:
        """Take what this phase logged so far (sums and torchmetrics objects) out of the store,
        to reduce another phase in between (validation in the middle of an epoch)."""
        taken = (self._sums, self._metric_objs)
        self._sums, self._metric_objs = {}, {}
        return taken

    def restore(self, taken: Tuple[Dict[str, Tuple[torch.Tensor, float]], Dict[str, Tuple[Any, str]]]) -> None:
        """Put back what :meth:`stash` took."""
        self._sums, self._metric_objs = taken

    def add_metric(self, name: str, metric: Any, prog_bar: bool = False) -> None:
        """Note that ``metric`` (a ``torchmetrics.Metric`` the step updated) gives ``name``'s
        value this phase. Local: it is computed, synchronised and reset in :meth:`reduce`."""
        if self._reduce.setdefault(name, "metric") != "metric":
            raise ValueError(f"self.log({name!r}): logged as a value (reduce_fx={self._reduce[name]!r}) before "
                             "and with a torchmetrics object now; use one per name")
        known = self._metric_objs.get(name)
        if known is not None and known[0] is metric:
            path = known[1]
        else:
            if known is not None:
                raise ValueError(f"self.log({name!r}): two different metric objects logged under one name in "
                                 "one phase; log each under its own name")
            seen = self._known.get(name)
            path = seen[1] if seen is not None and seen[0] is metric else _checked_path(name, metric, self.owner)
            self._known[name] = self._metric_objs[name] = (metric, path)
        value = getattr(metric, "_forward_cache", None)  # the batch's value when called as metric(...)
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            value = value.detach().reshape(()).to(torch.float64)
            self.last[name] = value
            self.step_values[name] = value
        if prog_bar:
            self.prog_bar.add(name)

    def start_step(self) -> None:
        """Forget the previous step's values (the next step row holds only its own)."""
        self.step_values.clear()

    def reduce(self, phase: str = "") -> Dict[str, float]:
        """Epoch values over all ranks (weighted means, or sums); clears the sums. Must be
        called on all processes, for the same phases in the same order.

        The sums are laid out as in the previous reduction of ``phase`` (the same on every
        rank), under a header counting the ranks that logged other names: when it is 0 (every
        epoch after the first, as a rule) that one all-reduce is all. A phase's first reduction
        compares the names' checksums first; ranks that logged other names exchange them."""
        local = {name: self._reduce[name] for name in self._sums}
        local.update({name: _METRIC + path for name, (_, path) in self._metric_objs.items()})
        # What the list states (concatenated on compute) of each updated metric hold.
        shapes = {name: _list_states(m) for name, (m, _) in self._metric_objs.items() if _update_count(m) > 0}
        signature = (sorted(local.items()), sorted(shapes))
        out = None
        if gdist.is_distributed():
            layout = self._layouts.get(phase)
            if layout is None and gdist.same_on_all_ranks(zlib.crc32(repr(signature).encode())):
                layout = self._layouts[phase] = signature
            if layout is not None:
                out = self._reduce_sums(_sum_names(dict(layout[0])), local, differs=signature != layout)
        if out is None:
            if gdist.is_distributed():
                # Rare: some rank logged other names, or logged a metric it never updated (e.g.
                # it had no validation batch).
                local, shapes = _agree_names(local, shapes)
                self._layouts[phase] = (sorted(local.items()), sorted(shapes))
            out = self._reduce_sums(_sum_names(local), local)
        self._sums.clear()
        out.update(self._compute_metrics(sorted(n for n, kind in local.items() if kind.startswith(_METRIC)),
                                         local, shapes))
        return out

    def _reduce_sums(self, names: List[str], kinds: Dict[str, str],
                     differs: Optional[bool] = None) -> Optional[Dict[str, float]]:
        """The reduced values of ``names`` (sums in ``_sums``). With ``differs`` (whether this
        rank logged other names than ``names``' layout) in the header: None when some rank did.
        Collective (when distributed)."""
        header = [] if differs is None else [1.0 if differs else 0.0]
        buf = torch.zeros(len(header) + 2 * len(names), dtype=torch.float64)
        buf[:len(header)] = torch.tensor(header, dtype=torch.float64)
        sums, counts = buf[len(header):len(header) + len(names)], buf[len(header) + len(names):]
        if not differs:
            for i, name in enumerate(names):
                if name in self._sums:
                    total, n = self._sums[name]
                    sums[i] = total.cpu()
                    counts[i] = n
        if buf.numel():
            buf = gdist.all_reduce(buf, "sum")
        if header and buf[0] > 0:
            return None
        sums, counts = buf[len(header):len(header) + len(names)], buf[len(header) + len(names):]
        out: Dict[str, float] = {}
        for i, name in enumerate(names):
            n = float(counts[i])
            if kinds[name] == "sum":
                out[name] = float(sums[i])
            else:
                out[name] = float(sums[i]) / n if n > 0 else float("nan")
        return out

    def _compute_metrics(self, names: List[str], local: Dict[str, str],
                         shapes: Dict[str, Dict[str, Tuple[str, Tuple[int, ...]]]]) -> Dict[str, float]:
        """``compute()`` (collective: torchmetrics gathers the states of every rank) of each
        metric, in the same order on every rank, then ``reset()`` of each."""
        objs = []
        for name in names:
            logged = self._metric_objs.get(name)
            objs.append(logged[0] if logged is not None else _resolve(self.owner, name, local[name][len(_METRIC):]))
        self._metric_objs.clear()
        out: Dict[str, float] = {}
        try:
            for name, metric in zip(names, objs):
                with warnings.catch_warnings():
                    if _update_count(metric) == 0:
                        # This rank had no data for it (e.g. no validation batch); the others did.
                        warnings.filterwarnings("ignore", message=r".*compute.*called before.*update")
                        _empty_like_peers(metric, shapes.get(name, {}))
                    value = metric.compute()
                out[name] = _scalar(name, value)
        finally:
            for metric in {id(m): m for m in objs}.values():
                metric.reset()
        return out

def _update_count(metric: Any) -> int:
    return int(getattr(metric, "_update_count", 1))


def _list_states(metric: Any) -> Dict[str, Tuple[str, Tuple[int, ...]]]:
    """dtype and row shape of each non-empty list state of ``metric`` (e.g. AUROC's
    predictions and targets)."""
    out = {}
    for attr in getattr(metric, "_defaults", {}):
        value = getattr(metric, attr, None)
        if isinstance(value, list) and value and isinstance(value[0], torch.Tensor):
            out[attr] = (str(value[0].dtype).replace("torch.", ""), tuple(value[0].shape[1:]))
    return out


def _empty_like_peers(metric: Any, states: Dict[str, Tuple[str, Tuple[int, ...]]]) -> None:
    """Give a metric this rank never updated empty list states of the dtype and row shape
    the other ranks have: torchmetrics would gather an empty float32 vector, which a rank
    holding int64 targets or 2-d scores cannot be gathered with (gloo aborts)."""
    for attr, (dtype, row) in states.items():
        current = getattr(metric, attr, None)
        if isinstance(current, list) and not current:
            setattr(metric, attr, [torch.empty((0,) + tuple(row), dtype=getattr(torch, dtype), device=metric.device)])


def _merge(per_rank: List[Dict[str, str]]) -> Dict[str, str]:
    """Every rank's names and kinds; the same error on every rank if two disagree."""
    merged: Dict[str, str] = {}
    for rank, kinds in enumerate(per_rank):
        for name, kind in kinds.items():
            if merged.setdefault(name, kind) != kind:
                raise ValueError(f"self.log({name!r}) was logged as {_describe(merged[name])} on one rank and as "
                                 f"{_describe(kind)} on rank {rank}: log a name the same way on every rank")
    return merged


def _describe(kind: str) -> str:
    if kind.startswith(_METRIC):
        return f"the torchmetrics object task.{kind[len(_METRIC):]}"
    return f"a value with reduce_fx={kind!r}"


def is_metric(value: Any) -> bool:
    """Whether ``value`` is a ``torchmetrics.Metric`` (without importing torchmetrics: an
    object of it exists only if the user imported it)."""
    tm = sys.modules.get("torchmetrics")
    return tm is not None and isinstance(value, tm.Metric)


def _checked_path(name: str, metric: Any, owner: Any) -> str:
    """Where ``metric`` lives on ``owner``; clear errors for metrics that cannot be
    computed exactly and safely at the end of the phase."""
    if getattr(metric, "dist_sync_on_step", False):
        raise ValueError(f"self.log({name!r}, metric): the metric was made with dist_sync_on_step=True, which "
                         "runs a collective in every step (inside Join with uneven inputs: a hang). Make it "
                         "with dist_sync_on_step=False (the default); its epoch value is synchronised anyway")
    if not getattr(metric, "sync_on_compute", True):
        raise ValueError(f"self.log({name!r}, metric): the metric was made with sync_on_compute=False, so its "
                         "value would differ between ranks. Make it with sync_on_compute=True (the default)")
    path = _find(owner, metric) if owner is not None else None
    if path is None:
        raise ValueError(f"self.log({name!r}, metric): the metric must be an attribute of the task (e.g. "
                         f"self.val_acc = torchmetrics.Accuracy(...) in __init__) or a submodule of one, so "
                         "it keeps its state over the phase and every rank can compute it at its end")
    return path


def _find(owner: Any, metric: Any) -> Optional[str]:
    """The attribute path of ``metric`` on ``owner``: ``"acc"`` or ``"model.head.acc"``."""
    attrs = vars(owner)
    for attr, value in attrs.items():
        if value is metric:
            return attr
    for attr, value in attrs.items():
        if isinstance(value, nn.parallel.DistributedDataParallel):
            value = value.module  # the path is the same whether the model is wrapped or not
        if isinstance(value, nn.Module):
            for sub, module in value.named_modules():
                if module is metric:
                    return f"{attr}.{sub}"
    return None


def _resolve(owner: Any, name: str, path: str) -> Any:
    obj = owner
    try:
        for part in path.split("."):
            if isinstance(obj, nn.parallel.DistributedDataParallel):
                obj = obj.module
            obj = getattr(obj, part)
    except AttributeError:
        obj = None
    if not is_metric(obj):
        raise ValueError(f"self.log({name!r}, metric): another rank logged task.{path}, which this rank does not "
                         "have: create the metric in the task's __init__ (or setup) on every rank")
    return obj


def _scalar(name: str, value: Any) -> float:
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return float(value)
    if isinstance(value, (int, float)):
        return float(value)
    shape = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
    raise ValueError(f"self.log({name!r}, metric): compute() gave {shape}, not a scalar; configure the metric to "
                     "give one number (e.g. average='macro'), or log each scalar under its own name")


def _sum_names(kinds: Dict[str, str]) -> List[str]:
    return sorted(n for n, kind in kinds.items() if not kind.startswith(_METRIC))


def _agree_names(local: Dict[str, str], shapes: Dict[str, Any]) -> Tuple[Dict[str, str], Dict[str, Any]]:
    """Every rank's logged names and list-state shapes, merged. Collective."""
    gathered = gdist.all_gather_object((local, shapes))
    merged: Dict[str, Any] = {}
    for _, per_rank in gathered:
        for name, states in per_rank.items():
            merged.setdefault(name, states)
    return _merge([kinds for kinds, _ in gathered]), merged


def infer_batch_size(batch: object) -> Optional[int]:
    """The number of seeds in a batch, or None when it cannot tell.

    - DGL edge batches ``(input_nodes, pair_graph, [neg_pair_graph,] blocks)``: the seed
      edges (edges of the positive pair graph).
    - DGL node batches ``(input_nodes, output_nodes, blocks)``: the seed nodes (on a
      heterograph, the seeds of every type together).
    - A batched graph (``dgl.batch``), alone or first in a tuple such as
      ``(graphs, labels)``: the number of graphs.
    - A tensor: its rows. A dict: its first value. Anything with an int ``batch_size``
      (PyG's batches, ``batch_format="pyg"``): that; a ``HeteroData``: its seed type's.
    """
    first = next(leaves(batch, _has_size), None)  # down the first item of each tuple, list or dict
    if isinstance(first, torch.Tensor):
        return int(first.shape[0]) if first.dim() > 0 else 1
    if _is_graph(first):
        return int(first.batch_size)
    if isinstance(first, (tuple, list)) and first:
        return _dgl_batch_seeds(first)
    size = getattr(first, "batch_size", None)  # a PyG batch: its seed nodes (seed edges for links)
    if size is None and hasattr(first, "node_stores"):  # PyG's HeteroData: its seed type's
        size = next((s.batch_size for s in first.node_stores if "batch_size" in s), None)
    return size if isinstance(size, int) and not isinstance(size, bool) else None


def _has_size(obj: object) -> bool:
    """Where the walk for a batch size stops: anything but a non-empty tuple, list or dict,
    and DGL's node and edge batch tuples."""
    if isinstance(obj, (tuple, list)) and obj:
        return _dgl_batch_seeds(obj) is not None
    return not (isinstance(obj, dict) and obj)


def _dgl_batch_seeds(batch: Any) -> Optional[int]:
    if len(batch) in (3, 4) and _is_graph(batch[1]) and isinstance(batch[-1], (list, tuple)):
        return int(batch[1].num_edges())
    if len(batch) == 3 and isinstance(batch[1], torch.Tensor):
        return int(batch[1].shape[0])
    if len(batch) == 3 and isinstance(batch[1], dict) and batch[1] \
            and all(isinstance(v, torch.Tensor) for v in batch[1].values()):
        return int(sum(v.shape[0] for v in batch[1].values()))  # heterograph: seeds of every type
    return None


def _is_graph(obj: object) -> bool:
    if is_torch_graph(obj):
        return True
    dgl = sys.modules.get("dgl")
    return dgl is not None and isinstance(obj, dgl.DGLGraph)
