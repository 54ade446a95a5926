"""Run loggers: ``hparams.yaml`` and ``metrics.csv`` always, plus any logger object given.

``Trainer(logger=obj)`` (or a list) takes any Lightning-style logger: an object with
``log_metrics(metrics, step)``; these methods are called when present: ``log_hyperparams(params)``
(at the start of ``fit``), ``after_save_checkpoint(checkpoint_callback)`` (after
:class:`~graphtrainer.ModelCheckpoint` wrote a file), ``save()`` (after each epoch's row),
``finalize(status)`` (``"success"`` or ``"failed"``), and ``state_dict()``/``load_state_dict()``
(kept in the checkpoint, so a resumed fit continues the same external run). An
``experiment`` attribute is not needed. Only rank 0 holds a logger; other ranks get none.
:class:`~graphtrainer.mlflow_logger.MLflowLogger` is one such object.
"""
from __future__ import annotations

import csv
import os
from pathlib import Path
from typing import Any, Dict, List, Optional

import yaml


class Logger:
    """Interface: every method is called on every rank; only rank 0's instance writes."""

    def log_hyperparams(self, params: Dict[str, Any]) -> None: ...
    def log_metrics(self, metrics: Dict[str, float], step: int) -> None: ...
    def finalize(self, status: str) -> None: ...


class CSVLogger(Logger):
    """``metrics.csv`` (one row per epoch, plus step rows) and ``hparams.yaml`` in ``log_dir``.

    Each row is flushed when logged, so a crash keeps everything logged before it. When a
    row brings a new column, the file is rewritten with the wider header.
    """

    def __init__(self, log_dir: Path):
        self.log_dir = Path(log_dir)
        self.metrics_path = self.log_dir / "metrics.csv"
        self._rows: List[Dict[str, Any]] = []
        self._columns: List[str] = []

    def log_hyperparams(self, params: Dict[str, Any]) -> None:
        with open(self.log_dir / "hparams.yaml", "w", encoding="utf-8") as fh:
            yaml.safe_dump(params, fh, sort_keys=True)

    def log_metrics(self, metrics: Dict[str, float], step: int) -> None:
        row = {k: (float(v) if not isinstance(v, int) else v) for k, v in metrics.items()}
        self._rows.append(row)
        new = [k for k in row if k not in self._columns]
        if new:
            self._columns += new
            self._write_all()
        else:
            with open(self.metrics_path, "a", newline="", encoding="utf-8") as fh:
                csv.DictWriter(fh, self._columns).writerow(row)
                fh.flush()

    def _write_all(self) -> None:
        tmp = self.metrics_path.with_suffix(".csv.tmp")
        with open(tmp, "w", newline="", encoding="utf-8") as fh:
            writer = csv.DictWriter(fh, self._columns)
            writer.writeheader()
            writer.writerows(self._rows)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.metrics_path)


class TensorBoardLogger(Logger):
    """Scalars for TensorBoard in ``log_dir`` (needs ``pip install tensorboard``)."""

    def __init__(self, log_dir: Optional[Path] = None):
        self.log_dir = Path(log_dir) if log_dir is not None else None
        self._writer: Any = None

    def bind(self, log_dir: Path) -> "TensorBoardLogger":
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as err:
            raise ImportError("TensorBoardLogger needs tensorboard: pip install 'graphtrainer[tensorboard]'") from err
        self.log_dir = self.log_dir or Path(log_dir)
        self._writer = SummaryWriter(str(self.log_dir))
        return self

    def log_hyperparams(self, params: Dict[str, Any]) -> None:
        self._writer.add_text("hparams", repr(params))

    def log_metrics(self, metrics: Dict[str, float], step: int) -> None:
        for name, value in metrics.items():
            if name not in ("epoch", "step"):
                self._writer.add_scalar(name, value, step)
        self._writer.flush()

    def finalize(self, status: str) -> None:
        self._writer.close()


class _Many(Logger):
    """The CSV logger and the user's: each call goes to every logger that has the method."""

    def __init__(self, loggers: List[Any]):
        self.loggers = loggers

    def _each(self, method: str, *args: Any) -> None:
        for lg in self.loggers:
            call = getattr(lg, method, None)
            if callable(call):
                call(*args)

    def log_hyperparams(self, params: Dict[str, Any]) -> None:
        self._each("log_hyperparams", params)

    def log_metrics(self, metrics: Dict[str, float], step: int) -> None:
        self._each("log_metrics", metrics, step)
        if "epoch" in metrics:  # an epoch row: a Lightning logger's save() point
            self._each("save")

    def after_save_checkpoint(self, checkpoint_callback: Any) -> None:
        self._each("after_save_checkpoint", checkpoint_callback)

    def finalize(self, status: str) -> None:
        self._each("finalize", status)

    def state_dict(self) -> Dict[str, Any]:
        """``{position: state}`` of the loggers that keep one (for the checkpoint)."""
        return {str(i): lg.state_dict() for i, lg in enumerate(self.loggers) if callable(getattr(lg, "state_dict", None))}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        for i, lg in enumerate(self.loggers):
            if str(i) in state and callable(getattr(lg, "load_state_dict", None)):
                lg.load_state_dict(state[str(i)])


def check_logger(option: Any) -> None:
    """Refuse, before any rank starts, a ``logger`` that is not True/False/None, a logger
    object with ``log_metrics(metrics, step)``, or a list of them."""
    extra = option if isinstance(option, (list, tuple)) else [option]
    for lg in extra:
        if lg is True or lg is False or lg is None:
            continue
        if not callable(getattr(lg, "log_metrics", None)):
            raise TypeError(f"logger={lg!r}: give True (CSV), False (none) or a logger object with "
                            "log_metrics(metrics, step), e.g. graphtrainer.mlflow_logger.MLflowLogger(...)")


def make_logger(option: Any, log_dir: Path, rank: int) -> Optional[Logger]:
    """The logger for this rank: None off rank 0 or when disabled; CSV always with ``True``."""
    if option is False or option is None or rank != 0:
        return None
    loggers: List[Logger] = [CSVLogger(log_dir)]
    extra = option if isinstance(option, (list, tuple)) else ([] if option is True else [option])
    for lg in extra:
        if isinstance(lg, TensorBoardLogger):
            lg.bind(log_dir)
        elif isinstance(lg, CSVLogger):
            continue
        loggers.append(lg)
    return _Many(loggers)
