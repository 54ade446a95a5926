"""An MLflow logger (``pip install mlflow-skinny``): ``Trainer(logger=MLflowLogger(...))``.

Rank 0 logs, once each: the task's hyper-parameters as params, every epoch row and step row
as metrics (at the trainer's ``global_step``), and at the end of ``fit`` the best checkpoint
of the run's :class:`~graphtrainer.ModelCheckpoint` as an artifact (``log_checkpoint``).
The MLflow run id is kept in every checkpoint, so ``fit(task, ckpt_path=...)`` continues the
same run rather than opening a new one.

A local store needs no server: ``tracking_uri="file:///path/mlruns"``. MLflow 3 refuses its
file store unless ``MLFLOW_ALLOW_FILE_STORE=true`` is set (it prefers ``sqlite:///mlflow.db``,
which needs the full ``mlflow`` package). The Trainer checks the store when it is made
(:meth:`MLflowLogger.check`), in the caller, so a store that cannot work fails there with one
line and no rank starts. After ``fit``, :attr:`MLflowLogger.run_id` holds the run's id in the
caller too; the Trainer's settings are params beside the task's (``trainer/max_epochs``, ...).
"""
from __future__ import annotations

import time
from pathlib import Path
from urllib.parse import urlparse
from typing import Any, Dict, List, Optional

#: Values longer than this are cut: MLflow refuses longer params.
_PARAM_LENGTH = 6000


def _flatten(params: Dict[str, Any], prefix: str = "") -> Dict[str, str]:
    out: Dict[str, str] = {}
    for key, value in params.items():
        if isinstance(value, dict):
            out.update(_flatten(value, f"{prefix}{key}/"))
        else:
            out[f"{prefix}{key}"] = str(value)[:_PARAM_LENGTH]
    return out


class MLflowLogger:
    """Logs a ``fit`` to MLflow from rank 0 (see the module docstring).

    Args:
        experiment_name: created when missing.
        tracking_uri: where runs are stored; None: MLflow's default (``MLFLOW_TRACKING_URI``).
        run_name: the new run's name; ``run_id``: log into this existing run instead.
        tags: set on the run.
        log_checkpoint: ``"best"`` (the best checkpoint, at the end of fit), ``"all"`` (every
            file ModelCheckpoint writes, when it writes it) or False.
    """

    def __init__(self, experiment_name: str = "graphtrainer", tracking_uri: Optional[str] = None,
                 run_name: Optional[str] = None, run_id: Optional[str] = None,
                 tags: Optional[Dict[str, str]] = None, log_checkpoint: Any = "best"):
        if log_checkpoint not in ("best", "all", False):
            raise ValueError(f"log_checkpoint={log_checkpoint!r}: use 'best', 'all' or False")
        try:
            import mlflow  # noqa: F401  (checked here, before any rank starts)
        except ImportError as err:
            raise ImportError("MLflowLogger needs mlflow: pip install mlflow-skinny (or mlflow)") from err
        self.experiment_name, self.tracking_uri, self.run_name = experiment_name, tracking_uri, run_name
        self.tags, self.log_checkpoint = dict(tags or {}), log_checkpoint
        self.run_id = run_id
        self._client: Any = None
        self._params: Dict[str, str] = {}
        self._checkpoint_callback: Any = None

    def check(self) -> None:
        """Refuse a store MLflow will not open: a ``file:`` store (or a plain path) without
        ``MLFLOW_ALLOW_FILE_STORE=true`` under MLflow 3, an unknown scheme, a ``sqlite:`` store
        without the full ``mlflow`` package. Called by the Trainer, before any rank starts."""
        import mlflow
        import mlflow.environment_variables as env

        uri = self.tracking_uri or mlflow.get_tracking_uri()
        allow = getattr(env, "MLFLOW_ALLOW_FILE_STORE", None)  # MLflow 3 and later
        if urlparse(str(uri)).scheme in ("", "file") and allow is not None and not allow.get():
            raise ValueError(f"MLflowLogger(tracking_uri={uri!r}) is a file store, which MLflow "
                             f"{mlflow.__version__} opens only with MLFLOW_ALLOW_FILE_STORE=true in the "
                             "environment: set it before fit, or use a tracking server (http://...) or "
                             "'sqlite:///mlflow.db' (needs the full mlflow package)")
        try:
            from mlflow.tracking._tracking_service.utils import _get_store
        except ImportError:  # another MLflow layout: the rank reports what fails
            return
        try:
            _get_store(str(uri))  # builds the store object only: no run, no request to a server
        except Exception as err:  # MLflow raises several kinds: one line that names the URI
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise ValueError(f"MLflowLogger(tracking_uri={uri!r}) cannot open its store: {first}") from None

    # The client holds sockets and locks: built on first use in the rank, never pickled.
    def __getstate__(self) -> Dict[str, Any]:
        return {**self.__dict__, "_client": None}

    @property
    def experiment(self) -> Any:
        """The ``MlflowClient`` (its run is :attr:`run_id`), as Lightning's ``logger.experiment``."""
        if self._client is None:
            from mlflow.tracking import MlflowClient

            self._client = MlflowClient(tracking_uri=self.tracking_uri)
        return self._client

    def _run(self) -> str:
        """The run id; the run is opened on first need, after a resume could set :attr:`run_id`."""
        client = self.experiment
        if self.run_id is None:
            found = client.get_experiment_by_name(self.experiment_name)
            experiment_id = found.experiment_id if found else client.create_experiment(self.experiment_name)
            self.run_id = client.create_run(experiment_id, run_name=self.run_name, tags=self.tags).info.run_id
        if self._params:
            self._log_params()
        return self.run_id

    def _log_params(self) -> None:
        from mlflow.entities import Param

        logged = self.experiment.get_run(self.run_id).data.params
        # A resumed run has them already, and MLflow refuses to change a param: its first value
        # stays (a resume's larger trainer/max_epochs is not logged again).
        fresh = [Param(k, v) for k, v in self._params.items() if k not in logged]
        self._params = {}
        if fresh:
            self.experiment.log_batch(self.run_id, params=fresh)

    def log_hyperparams(self, params: Dict[str, Any]) -> None:
        """Kept until the run is open (a resume may name it); then logged once."""
        self._params.update(_flatten(dict(params)))

    def log_metrics(self, metrics: Dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        rows: List[Any] = [Metric(k, float(v), now, int(step)) for k, v in metrics.items() if k != "step"]
        if rows:
            self.experiment.log_batch(self._run(), metrics=rows)

    def after_save_checkpoint(self, checkpoint_callback: Any) -> None:
        self._checkpoint_callback = checkpoint_callback
        if self.log_checkpoint == "all":
            for path in {checkpoint_callback.best_model_path, getattr(checkpoint_callback, "last_model_path", "")}:
                if path and Path(path).is_file():
                    self.experiment.log_artifact(self._run(), path, "checkpoints")

    def finalize(self, status: str) -> None:
        """The best checkpoint as an artifact (``log_checkpoint="best"``); the run ends."""
        cb = self._checkpoint_callback
        best = getattr(cb, "best_model_path", "") if cb is not None else ""
        if self.log_checkpoint == "best" and best and Path(best).is_file():
            self.experiment.log_artifact(self._run(), best, "checkpoints")
        if self.run_id is not None or self._params:
            self.experiment.set_terminated(self._run(), "FINISHED" if status == "success" else "FAILED")

    def state_dict(self) -> Dict[str, Any]:
        return {"run_id": self._run()}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Continue the checkpoint's run, unless this logger was given a run id of its own."""
        if self.run_id is None and state.get("run_id"):
            self.run_id = str(state["run_id"])
