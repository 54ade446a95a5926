"""``self.log(name, torchmetrics.Metric)``: computed over every rank at the end of the phase
(after ``Join``), equal to scikit-learn on the gathered predictions, reset after; ranks that
logged nothing still take part; clear errors for metrics that cannot work; and everything
else runs without torchmetrics installed."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any, List

import pytest
import torch
import torch.nn.functional as F
from torch import nn

torchmetrics = pytest.importorskip("torchmetrics")  # the [metrics] extra, in the tested set
from sklearn.metrics import accuracy_score, mean_squared_error, roc_auc_score  # noqa: E402
from torchmetrics.classification import BinaryAccuracy, BinaryAUROC  # noqa: E402

from graphtrainer import GraphTask, Trainer  # noqa: E402
from graphtrainer import comm as gdist  # noqa: E402

from conftest import rank_children  # noqa: E402

TRAIN_BATCHES = [3, 5]  # per rank: uneven, so training ends inside Join
TRAIN_ROWS = [4, 6]
EPOCHS = 2


class _Batches:
    """Rank r: ``counts[r]`` batches of ``rows[r]`` random row indices, a new draw per pass."""

    def __init__(self, n: int, counts: List[int], rows: List[int]) -> None:
        self.n, self.counts, self.rows, self.passes = n, counts, rows, 0

    def __iter__(self):
        rank = gdist.get_rank()
        gen = torch.Generator().manual_seed(100 * rank + self.passes)
        self.passes += 1
        return iter([torch.randint(0, self.n, (self.rows[rank],), generator=gen)
                     for _ in range(self.counts[rank])])


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
        self.val_mse = torchmetrics.MeanSquaredError()  # a metric that lives on the model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class MetricTask(GraphTask):
    """Binary classification of random rows. Logs torchmetrics objects held three ways (an
    attribute, a submodule of the model, called as ``metric(...)`` or ``.update``) and dumps
    every rank's scores per phase so the test can compute the same numbers with scikit-learn."""

    def __init__(self, out: str, val_rows_per_rank: List[int] = (12, 11)):
        super().__init__()
        gen = torch.Generator().manual_seed(0)
        self.x = torch.randn(64, 4, generator=gen)
        self.y = (self.x[:, 0] + 0.5 * torch.randn(64, generator=gen) > 0).float()
        self.out, self.val_rows_per_rank = out, list(val_rows_per_rank)
        self.train_auc = BinaryAUROC()
        self.train_acc = BinaryAccuracy()
        self.val_auc = BinaryAUROC()
        self.seen: List[torch.Tensor] = []

    def configure_model(self) -> nn.Module:
        return _Net()

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.model.parameters(), lr=0.1)

    def train_dataloader(self) -> Any:
        return _Batches(64, TRAIN_BATCHES, TRAIN_ROWS)

    def val_dataloader(self) -> Any:
        # Validation rows 40..: rank r gets val_rows_per_rank[r] of them in batches of 5.
        start = 40 + sum(self.val_rows_per_rank[:self.rank])
        ids = torch.arange(start, start + self.val_rows_per_rank[self.rank])
        return [ids[i:i + 5] for i in range(0, ids.numel(), 5)]

    def _scores(self, idx: torch.Tensor) -> torch.Tensor:
        return self.model(self.x[idx]).squeeze(-1)

    def training_step(self, idx: torch.Tensor, batch_idx: int) -> torch.Tensor:
        logits = self._scores(idx)
        loss = F.binary_cross_entropy_with_logits(logits, self.y[idx])
        probs = torch.sigmoid(logits.detach())
        self.train_auc(probs, self.y[idx].long())  # forward: also the batch's value
        self.train_acc.update(probs, self.y[idx].long())
        self.log("train_auc", self.train_auc)
        self.log("train_acc", self.train_acc)
        self.seen.append(torch.stack([probs, self.y[idx]]))
        return loss

    def validation_step(self, idx: torch.Tensor, batch_idx: int) -> None:
        probs = torch.sigmoid(self._scores(idx))
        self.val_auc.update(probs, self.y[idx].long())
        self.module.val_mse.update(probs, self.y[idx])
        self.log("val_auc", self.val_auc)
        self.log("val_mse", self.module.val_mse)
        self.log("val_rows", float(idx.numel()), reduce_fx="sum")  # a plain value beside the metrics
        self.seen.append(torch.stack([probs, self.y[idx]]))

    def _dump(self, phase: str) -> None:
        rows = torch.cat(self.seen, dim=1) if self.seen else torch.empty(2, 0)
        torch.save(rows, Path(self.out) / f"{phase}_r{self.rank}_e{self.current_epoch}.pt")
        self.seen = []

    def on_validation_epoch_start(self) -> None:
        self._dump("train")  # what the training steps of this epoch scored

    def on_validation_epoch_end(self) -> None:
        self._dump("val")


def _gathered(out: Path, phase: str, epoch: int) -> torch.Tensor:
    return torch.cat([torch.load(out / f"{phase}_r{r}_e{epoch}.pt", weights_only=True) for r in range(2)], dim=1)


@pytest.mark.timeout(90)
def test_metrics_equal_sklearn_on_gathered_predictions_with_uneven_inputs(root_dir, tmp_path):
    trainer = Trainer(num_procs=2, launcher="fork", max_epochs=EPOCHS, progress_bar=False, default_root_dir=root_dir)
    trainer.fit(MetricTask(str(tmp_path)))
    assert not rank_children()
    for epoch in range(EPOCHS):
        row = trainer.history[epoch]
        train, val = _gathered(tmp_path, "train", epoch), _gathered(tmp_path, "val", epoch)
        # Each epoch only its own rows: the metrics were reset after the previous one.
        assert train.shape[1] == sum(b * r for b, r in zip(TRAIN_BATCHES, TRAIN_ROWS))
        assert val.shape[1] == 23
        probs, labels = train[0].numpy(), train[1].numpy()
        assert row["train_auc"] == pytest.approx(roc_auc_score(labels, probs), abs=1e-6)
        assert row["train_acc"] == pytest.approx(accuracy_score(labels, probs > 0.5), abs=1e-6)
        probs, labels = val[0].numpy(), val[1].numpy()
        assert row["val_auc"] == pytest.approx(roc_auc_score(labels, probs), abs=1e-6)
        assert row["val_mse"] == pytest.approx(mean_squared_error(labels, probs), abs=1e-6)
        assert row["val_rows"] == 23
        # Not the mean of per-rank values.
        per_rank = [torch.load(tmp_path / f"val_r{r}_e{epoch}.pt", weights_only=True) for r in range(2)]
        per_rank_auc = sum(roc_auc_score(p[1].numpy(), p[0].numpy()) for p in per_rank) / 2
        assert row["val_auc"] != pytest.approx(per_rank_auc, abs=1e-6)


@pytest.mark.timeout(90)
def test_rank_with_no_validation_batch_still_computes_with_the_others(root_dir, tmp_path):
    # Rank 1 has no validation batch, so it never logs val_auc or val_mse; the names are
    # exchanged and it joins the collective compute through the attribute paths.
    task = MetricTask(str(tmp_path), val_rows_per_rank=[17, 0])
    trainer = Trainer(num_procs=2, launcher="fork", max_epochs=1, progress_bar=False, default_root_dir=root_dir)
    trainer.fit(task)
    val = _gathered(tmp_path, "val", 0)
    assert val.shape[1] == 17
    assert trainer.history[0]["val_auc"] == pytest.approx(roc_auc_score(val[1].numpy(), val[0].numpy()), abs=1e-6)
    assert trainer.history[0]["val_mse"] == pytest.approx(mean_squared_error(val[1].numpy(), val[0].numpy()),
                                                          abs=1e-6)
    assert trainer.history[0]["val_rows"] == 17
    # Trainer.validate reduces the same way (the task's trained weights carried back).
    metrics = trainer.validate(task)
    val = _gathered(tmp_path, "val", 1)  # current_epoch is 1 after one fitted epoch
    assert metrics["val_auc"] == pytest.approx(roc_auc_score(val[1].numpy(), val[0].numpy()), abs=1e-6)
    assert not rank_children()


# ---- one process: the bookkeeping and the errors -------------------------------------------
class _Bare(GraphTask):
    def __init__(self, **metrics: Any):
        super().__init__()
        for name, metric in metrics.items():
            setattr(self, name, metric)


def test_in_process_compute_reset_and_step_values():
    task = _Bare(acc=BinaryAccuracy())
    task.acc(torch.tensor([0.9, 0.2]), torch.tensor([1, 1]))  # batch value 0.5
    task.log("acc", task.acc, prog_bar=True)
    assert float(task.step_log.metrics.step_values["acc"]) == 0.5 and "acc" in task.step_log.metrics.prog_bar
    task.acc.update(torch.tensor([0.9, 0.8]), torch.tensor([1, 1]))
    task.log("acc", task.acc)
    assert task.step_log.metrics.reduce() == {"acc": 0.75}
    assert task.acc._update_count == 0  # reset
    assert task.step_log.metrics.reduce() == {}  # not logged this phase: not reported


def test_metric_not_held_by_the_task_is_rejected():
    task = _Bare()
    with pytest.raises(ValueError, match=r"must be an attribute of the task .*self\.val_acc = "):
        task.log("acc", BinaryAccuracy())


@pytest.mark.parametrize("kwargs, match", [({"dist_sync_on_step": True}, "dist_sync_on_step=False"),
                                           ({"sync_on_compute": False}, "sync_on_compute=True")])
def test_metric_that_would_sync_in_the_step_or_never_is_rejected(kwargs, match):
    task = _Bare(acc=BinaryAccuracy(**kwargs))
    with pytest.raises(ValueError, match=match):
        task.log("acc", task.acc)


def test_metric_and_value_under_one_name_and_reduce_fx_are_rejected():
    task = _Bare(acc=BinaryAccuracy())
    with pytest.raises(ValueError, match="reduces itself; drop reduce_fx"):
        task.log("acc", task.acc, reduce_fx="sum")
    task.log("acc", task.acc)
    with pytest.raises(ValueError, match="use one per name"):
        task.log("acc", 0.5)


def test_non_scalar_metric_names_the_fix():
    task = _Bare(acc=torchmetrics.Accuracy(task="multiclass", num_classes=3, average="none"))
    task.acc.update(torch.tensor([0, 1, 2]), torch.tensor([0, 1, 1]))
    task.log("acc", task.acc)
    with pytest.raises(ValueError, match=r"compute\(\) gave \(3,\), not a scalar.*average='macro'"):
        task.step_log.metrics.reduce()
    assert task.acc._update_count == 0  # reset even so


@pytest.mark.timeout(60)
@pytest.mark.slow  # 3 s or more on 2 cores: a fresh interpreter
def test_everything_else_works_without_torchmetrics(tmp_path):
    # A fresh interpreter where importing torchmetrics fails: graphtrainer imports, fits and
    # logs values; nothing imported torchmetrics behind the user's back.
    code = (
        "import sys; sys.modules['torchmetrics'] = None\n"
        "from graphtrainer import Trainer\n"
        "from tasks import RegressionTask\n"
        f"t = Trainer(max_epochs=1, progress_bar=False, enable_model_summary=False, "
        f"default_root_dir={str(tmp_path)!r}).fit(RegressionTask())\n"
        "assert t.history[0]['val_loss'] > 0, t.history\n"
        "assert sys.modules['torchmetrics'] is None\n"
        "print('ok')\n")
    here = Path(__file__).resolve().parents[2] / "helpers"
    env = {**__import__("os").environ, "PYTHONPATH": f"{here.parents[1]}:{here}", "DGLBACKEND": "pytorch"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=50, env=env)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]
