"""Any Lightning-style logger object, and the real MLflow package on its local file store
(no server, no network): params, per-epoch metrics and the best checkpoint logged once by
rank 0 of 2, and a resumed fit continuing the same MLflow run."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict

import pytest

from graphtrainer import ModelCheckpoint, Trainer

from tasks import RegressionTask


class RecordingLogger:
    """A Lightning-style logger without a base class: every call as a JSON line in ``path``
    (the calls happen in rank processes, so a file is what the test can read)."""

    def __init__(self, path: str):
        self.path = path

    def _write(self, *call: Any) -> None:
        with open(self.path, "a") as fh:
            fh.write(json.dumps(call) + "\n")

    def log_hyperparams(self, params: Dict[str, Any]) -> None:
        self._write("log_hyperparams", sorted(params))

    def log_metrics(self, metrics: Dict[str, float], step: int) -> None:
        self._write("log_metrics", sorted(metrics), step)

    def save(self) -> None:
        self._write("save")

    def after_save_checkpoint(self, checkpoint_callback: Any) -> None:
        self._write("after_save_checkpoint", Path(checkpoint_callback.best_model_path).name)

    def finalize(self, status: str) -> None:
        self._write("finalize", status)


@pytest.mark.slow  # 2 ranks, 2 epochs: about 7 s on 2 busy cores
@pytest.mark.timeout(120)
def test_a_plain_logger_object_gets_each_call_once_from_rank_0(root_dir, tmp_path):
    path = tmp_path / "calls.jsonl"
    trainer = Trainer(num_procs=2, launcher="fork", max_epochs=2, progress_bar=False, default_root_dir=root_dir,
                      logger=RecordingLogger(str(path)), callbacks=[ModelCheckpoint(monitor="val_loss")])
    trainer.fit(RegressionTask(n=32))
    calls = [json.loads(line) for line in path.read_text().splitlines()]
    names = [c[0] for c in calls]
    assert names[0] == "log_hyperparams" and names[-1] == "finalize" and calls[-1][1] == "success"
    assert names.count("log_hyperparams") == 1 and names.count("finalize") == 1  # rank 0 only
    epochs = [c for c in calls if c[0] == "log_metrics" and "epoch" in c[1]]
    assert len(epochs) == 2 and all("val_loss" in c[1] for c in epochs)
    assert names.count("save") == 2 and names.count("after_save_checkpoint") == 2
    assert (root_dir / "version_0" / "metrics.csv").is_file()  # the CSV logger still runs beside it


def test_an_object_without_log_metrics_is_refused_before_any_rank_starts(root_dir):
    with pytest.raises(TypeError, match=r"logger=.*log_metrics\(metrics, step\)"):
        Trainer(num_procs=2, logger=object(), default_root_dir=root_dir)
    assert not root_dir.exists() or not list(root_dir.iterdir())


@pytest.fixture
def mlflow_store(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 asks for this to use files
    return f"file://{tmp_path / 'mlruns'}"


def _history(client: Any, run_id: str, name: str) -> list:
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, name))


@pytest.mark.slow  # two fits on 2 ranks
@pytest.mark.timeout(240)
def test_mlflow_run_gets_params_epoch_metrics_best_checkpoint_and_resumes(root_dir, mlflow_store, tmp_path):
    from mlflow.tracking import MlflowClient

    from graphtrainer.integrations.mlflow_logger import MLflowLogger

    ckpt = ModelCheckpoint(monitor="val_loss", save_last=True)
    logger = MLflowLogger("exp", tracking_uri=mlflow_store)
    first = Trainer(num_procs=2, launcher="fork", max_epochs=2, progress_bar=False, default_root_dir=root_dir,
                    callbacks=[ckpt], logger=logger)
    task = RegressionTask(n=32, hidden=6)
    first.fit(task)
    client = MlflowClient(tracking_uri=mlflow_store)
    runs = client.search_runs([client.get_experiment_by_name("exp").experiment_id])
    assert len(runs) == 1
    run = runs[0]
    assert run.info.status == "FINISHED"
    assert logger.run_id == run.info.run_id  # the caller's logger object knows the run the ranks logged to
    assert run.data.params["hidden"] == "6" and run.data.params["n"] == "32"
    # The Trainer's settings beside the task's; hparams.yaml keeps the task's only.
    assert run.data.params["trainer/max_epochs"] == "2" and run.data.params["trainer/num_procs"] == "2"
    assert run.data.params["trainer/launcher"] == "fork"
    assert "trainer" not in (root_dir / "version_0" / "hparams.yaml").read_text()
    # One value per epoch at the step it ended on: rank 1 logged nothing (else two each).
    steps = [row["step"] for row in first.history]
    assert _history(client, run.info.run_id, "val_loss") == [(s, h["val_loss"]) for s, h in zip(steps, first.history)]
    assert [v for _, v in _history(client, run.info.run_id, "epoch")] == [0.0, 1.0]
    artifacts = [a.path for a in client.list_artifacts(run.info.run_id, "checkpoints")]
    assert len(artifacts) == 1 and artifacts[0].startswith("checkpoints/epoch=")
    local = Path(client.download_artifacts(run.info.run_id, artifacts[0], str(tmp_path)))
    best = next((root_dir / "version_0" / "checkpoints").glob(Path(artifacts[0]).name))
    assert local.read_bytes() == best.read_bytes()

    # Resume from last.ckpt with a fresh logger: the same MLflow run goes on to epoch 3.
    second = Trainer(num_procs=2, launcher="fork", max_epochs=4, progress_bar=False, default_root_dir=root_dir,
                     callbacks=[ModelCheckpoint(monitor="val_loss")],
                     logger=MLflowLogger("exp", tracking_uri=mlflow_store))
    second.fit(RegressionTask(n=32, hidden=6), ckpt_path=str(root_dir / "version_0" / "checkpoints" / "last.ckpt"))
    runs = client.search_runs([client.get_experiment_by_name("exp").experiment_id])
    assert [r.info.run_id for r in runs] == [run.info.run_id]
    assert [v for _, v in _history(client, run.info.run_id, "epoch")] == [0.0, 1.0, 2.0, 3.0]
    assert len(_history(client, run.info.run_id, "val_loss")) == 4


def test_mlflow_file_store_without_its_setting_is_refused_before_any_rank_starts(root_dir, tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    from graphtrainer.integrations.mlflow_logger import MLflowLogger

    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    store = tmp_path / "mlruns"
    with pytest.raises(ValueError, match=r"MLflowLogger\(tracking_uri='file://.*mlruns'\) is a file store, which "
                                         r"MLflow .* opens only with MLFLOW_ALLOW_FILE_STORE=true"):
        Trainer(num_procs=2, default_root_dir=root_dir, logger=MLflowLogger("exp", tracking_uri=f"file://{store}"))
    assert not list(root_dir.iterdir()) and not store.exists()  # no run folder, no half-made store
    with pytest.raises(ValueError, match=r"MLflowLogger\(tracking_uri='nosuch://x'\) cannot open its store: "):
        Trainer(num_procs=2, default_root_dir=root_dir, logger=MLflowLogger("exp", tracking_uri="nosuch://x"))


def test_a_tensorboard_folder_that_cannot_be_written_is_refused_in_the_caller(root_dir, tmp_path):
    from graphtrainer.loop.loggers import TensorBoardLogger

    blocker = tmp_path / "a_file"
    blocker.write_text("")  # a folder under a file cannot be made, even by root
    with pytest.raises(PermissionError, match=r"TensorBoardLogger\(log_dir='.*a_file/tb'\) cannot be written"):
        Trainer(num_procs=2, default_root_dir=root_dir, logger=TensorBoardLogger(blocker / "tb"))
    assert not list(root_dir.iterdir())
