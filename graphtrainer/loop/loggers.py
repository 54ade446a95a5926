"""Run loggers: ``hparams.yaml`` and ``metrics.csv`` always, plus any logger object given.

``Trainer(logger=obj)`` (or a list) takes any Lightning-style logger: an object with
``log_metrics(metrics, step)``; these methods are called when present: ``log_hyperparams(params)``
(at the start of ``fit``: the task's hyper-parameters, and the Trainer's settings under
``"trainer"``; ``hparams.yaml`` holds the task's only), ``check()`` (in the caller, when the
``Trainer`` is made, before any rank starts: raise there for a store that cannot work),
``after_save_checkpoint(checkpoint_callback)`` (after
:class:`~graphtrainer.ModelCheckpoint` wrote a file), ``save()`` (after each epoch's row),
``finalize(status)`` (``"success"`` or ``"failed"``), and ``state_dict()``/``load_state_dict()``
(kept in the checkpoint, so a resumed fit continues the same external run; after a launched
``fit`` the caller's logger objects are given rank 0's state, so an MLflow logger knows its
``run_id``). An ``experiment`` attribute is not needed. Only rank 0 holds a logger; other ranks
get none.
:class:`~graphtrainer.integrations.mlflow_logger.MLflowLogger` is one such object.
"""
from __future__ import annotations

import csv
import dataclasses
import os
import tempfile
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

    def check(self) -> None:
        """Refuse, in the caller, an explicit ``log_dir`` that cannot be written."""
        if self.log_dir is None:
            return  # the run's own folder, whose root the Trainer checks before launching
        try:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            tempfile.TemporaryFile(dir=self.log_dir).close()
        except OSError as err:
            raise PermissionError(f"TensorBoardLogger(log_dir={str(self.log_dir)!r}) cannot be written "
                                  f"({err.strerror or err}): give it a writable folder, or none to write "
                                  "into the run's folder") from None

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

    def log_hyperparams(self, params: Dict[str, Any], trainer: Optional[Dict[str, Any]] = None) -> None:
        """``params`` to every logger; ``trainer`` (the settings) beside them, except in hparams.yaml."""
        for lg in self.loggers:
            call = getattr(lg, "log_hyperparams", None)
            if callable(call):
                call(params if trainer is None or isinstance(lg, CSVLogger) else {**params, "trainer": trainer})

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
        return {str(i): lg.state_dict() for i, lg in enumerate(self.loggers)
                if callable(getattr(lg, "state_dict", None))}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        for i, lg in enumerate(self.loggers):
            if str(i) in state and callable(getattr(lg, "load_state_dict", None)):
                lg.load_state_dict(state[str(i)])


def check_logger(option: Any) -> None:
    """Refuse, before any rank starts, a ``logger`` that is not True/False/None, a logger
    object with ``log_metrics(metrics, step)``, or a list of them; run each one's ``check()``."""
    extra = option if isinstance(option, (list, tuple)) else [option]
    for lg in extra:
        if lg is True or lg is False or lg is None:
            continue
        if not callable(getattr(lg, "log_metrics", None)):
            raise TypeError(f"logger={lg!r}: give True (CSV), False (none) or a logger object with "
                            "log_metrics(metrics, step), e.g. "
                            "graphtrainer.integrations.mlflow_logger.MLflowLogger(...)")
        if callable(getattr(lg, "check", None)):
            lg.check()


def _extra(option: Any) -> List[Any]:
    """The logger objects given besides the CSV logger, in order (positions in the state)."""
    extra = option if isinstance(option, (list, tuple)) else ([] if option in (True, False, None) else [option])
    return [lg for lg in extra if not isinstance(lg, CSVLogger)]


def make_logger(option: Any, log_dir: Path, rank: int) -> Optional[Logger]:
    """The logger for this rank: None off rank 0 or when disabled; CSV always with ``True``."""
    if option is False or option is None or rank != 0:
        return None
    loggers: List[Logger] = [CSVLogger(log_dir)]
    for lg in _extra(option):
        if isinstance(lg, TensorBoardLogger):
            lg.bind(log_dir)
        loggers.append(lg)
    return _Many(loggers)


def absorb_logger_states(option: Any, states: Optional[Dict[str, Any]]) -> None:
    """Give the caller's logger objects the state rank 0's copies ended with (``run_id``...)."""
    if states:
        _Many([CSVLogger(Path("."))] + _extra(option)).load_state_dict(states)


def trainer_settings(config: Any) -> Dict[str, Any]:
    """The Trainer's options as loggable params: plain values kept, others as text."""
    out: Dict[str, Any] = {}
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if f.name != "logger":  # logger objects are not settings
            out[f.name] = value if isinstance(value, (bool, int, float, str, type(None))) else str(value)
    return out


def is_plain(value: Any) -> bool:
    """A value a hyper-parameter file holds: numbers, strings, None, and lists and dicts of them."""
    if isinstance(value, (bool, int, float, str, type(None))):
        return True
    if isinstance(value, (list, tuple)):
        return all(is_plain(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and is_plain(v) for k, v in value.items())
    return False
