"""``PrintMetrics``: one line per epoch on rank 0 with the exactly reduced epoch metrics."""
from __future__ import annotations

import fnmatch
import time
import warnings
from typing import List, Mapping, Optional, Sequence

from .base import Callback
from .._moved import metric_key
from ..state import RunView
from ..task import GraphTask


class PrintMetrics(Callback):
    """Prints ``epoch   N  name value  name value ...`` on rank 0 at the end of every epoch.

    ``N`` is the 0-based epoch just ended (as in ``trainer.history`` and checkpoint names);
    values are the reduced ``trainer.callback_metrics``, validation included when it ran.

    Args:
        keys: the metrics to print, in order; an entry may be a shell-style pattern
            (``"train_batches_rank*"``, matches sorted). Missing metrics are left out, so one
            list serves epochs with and without validation; an entry that matched nothing at
            the first epoch end where it should is warned about once. An old metric name
            (``val_hits@20``) prints its new one, with a ``DeprecationWarning``. ``None``
            prints every metric, sorted by name.
        fmt: format spec of a value (``format(value, fmt)``), ``".4f"`` by default.
        formats: format specs of particular metrics, by name or pattern
            (``{"input_nodes": ".0f"}``); they take precedence over ``fmt``.
        elapsed: append ``(S s)``, wall-clock seconds since this callback was made (make it
            just before ``fit``; launched ranks count from the same start).

    Example::

        Trainer(num_procs=2, callbacks=[PrintMetrics(["train_loss", "val_loss", "val_acc"])])
        # epoch   0  train_loss 1.9324  val_loss 1.9069  val_acc 0.4860
    """

    # After the task's on_train_epoch_end and the metrics' reduction, else the line is incomplete.
    after_reduction = True

    def __init__(self, keys: Optional[Sequence[str]] = None, fmt: str = ".4f",
                 formats: Optional[Mapping[str, str]] = None, elapsed: bool = False) -> None:
        if isinstance(keys, str):
            raise TypeError("keys must be a sequence of metric names, not one string: use [name]")
        self.keys = None if keys is None else list(keys)
        self.fmt = fmt
        self.formats = dict(formats or {})
        self.elapsed = elapsed
        self._created = time.time()
        self._warned: set = set()

    def selected(self, metrics: Mapping[str, float]) -> List[str]:
        """The names in ``metrics`` that ``keys`` selects, in printing order, each once."""
        if self.keys is None:
            return sorted(metrics)
        out: List[str] = []
        for key in self.keys:
            matches = sorted(fnmatch.filter(metrics, key)) if _is_pattern(key) else \
                [key] if key in metrics else []
            out.extend(m for m in matches if m not in out)
        return out

    def format_line(self, epoch: int, metrics: Mapping[str, float], seconds: Optional[float] = None) -> str:
        """The line printed for ``epoch`` (without a newline); ``seconds`` adds ``(S s)``."""
        parts = [f"epoch {epoch:3d}"]
        parts += [f"{name} {format(float(metrics[name]), self._spec(name))}" for name in self.selected(metrics)]
        if seconds is not None:
            parts.append(f"({seconds:.0f} s)")
        return "  ".join(parts)

    def _spec(self, name: str) -> str:
        if name in self.formats:
            return self.formats[name]
        for pattern, spec in self.formats.items():
            if fnmatch.fnmatchcase(name, pattern):
                return spec
        return self.fmt

    def on_train_epoch_end(self, trainer: RunView, task: GraphTask) -> None:
        if trainer.rank != 0:
            return
        seconds = time.time() - self._created if self.elapsed else None
        metrics = trainer.state.epoch_metrics()  # no stale validation values
        if self.keys is not None:
            self.keys = [k if _is_pattern(k) else metric_key(k, metrics, "PrintMetrics") for k in self.keys]
            if trainer.state.validated_this_epoch or not trainer.state.has_val_loader:
                self._warn_missing(trainer.current_epoch, metrics)
        # current_epoch still holds the epoch that just ended: the loop advances it after
        # the callbacks acting on reduced metrics ran.
        print(self.format_line(trainer.current_epoch, metrics, seconds), flush=True)

    def _warn_missing(self, epoch: int, metrics: Mapping[str, float]) -> None:
        missing = [k for k in self.keys or [] if k not in self._warned
                   and not (fnmatch.filter(metrics, k) if _is_pattern(k) else k in metrics)]
        for key in missing:
            self._warned.add(key)
            warnings.warn(f"PrintMetrics: {key!r} matched no metric at the end of epoch {epoch} and is left "
                          f"out of the line; the metrics that exist: {sorted(metrics)}", stacklevel=2)


def _is_pattern(key: str) -> bool:
    return any(c in key for c in "*?[")
