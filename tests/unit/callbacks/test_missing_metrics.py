"""A callback asked for a metric that does not exist says so, naming it and the metrics that do:
PrintMetrics warns once (a printed line never decides a run), ModelCheckpoint and EarlyStopping
raise (as Lightning). An old metric name (``val_hits@20``) reaches its new one with a warning."""
from __future__ import annotations

import warnings

import pytest

from graphtrainer import EarlyStopping, ModelCheckpoint, PrintMetrics, Trainer

from tasks import RegressionTask


def _fit(root, callbacks, epochs=3, **kw):
    trainer = Trainer(max_epochs=epochs, seed=0, progress_bar=False, enable_model_summary=False,
                      default_root_dir=root, callbacks=list(callbacks), **kw)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(RegressionTask(n=16, script={"val_pooled_hits@20": [0.2, 0.5, 0.4]}))
    return trainer, caught


def _messages(caught, category):
    return [str(w.message) for w in caught if issubclass(w.category, category)]


def test_print_metrics_warns_once_naming_a_missing_key_and_the_keys_that_exist(root_dir, capsys):
    _, caught = _fit(root_dir, [PrintMetrics(["train_loss", "val_los"])])
    missing = [m for m in _messages(caught, UserWarning) if "PrintMetrics" in m]
    assert missing == ["PrintMetrics: 'val_los' matched no metric at the end of epoch 0 and is left out of the "
                       "line; the metrics that exist: ['train_loss', 'val_loss', 'val_pooled_hits@20']"]
    assert capsys.readouterr().out.count("train_loss") == 3  # the lines are still printed


def test_print_metrics_does_not_warn_about_validation_keys_on_epochs_without_validation(root_dir):
    _, caught = _fit(root_dir, [PrintMetrics(["train_loss", "val_loss", "train_*"])], epochs=2,
                     check_val_every_n_epoch=2)  # epoch 0 has no validation: val_loss comes at epoch 1
    assert [m for m in _messages(caught, UserWarning) if "PrintMetrics" in m] == []


def test_print_metrics_given_an_old_metric_name_prints_the_new_one(root_dir, capsys):
    _, caught = _fit(root_dir, [PrintMetrics(["val_hits@20"])])
    assert any("'val_hits@20' is now called 'val_pooled_hits@20'" in m for m in _messages(caught, DeprecationWarning))
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("epoch")]
    assert lines[0].split()[2:] == ["val_pooled_hits@20", "0.2000"]
    assert not [m for m in _messages(caught, UserWarning) if "PrintMetrics" in m]


@pytest.mark.parametrize("make", [lambda: ModelCheckpoint(monitor="val_hits@20", mode="max"),
                                  lambda: EarlyStopping(monitor="val_hits@20", mode="max", patience=1)],
                         ids=["checkpoint", "early_stopping"])
def test_a_monitor_with_an_old_metric_name_monitors_the_new_one(root_dir, make):
    callback = make()
    trainer, caught = _fit(root_dir, [callback])
    assert any("'val_hits@20' is now called 'val_pooled_hits@20'" in m for m in _messages(caught, DeprecationWarning))
    if isinstance(callback, ModelCheckpoint):
        assert callback.best_model_score == 0.5 and "epoch=1" in callback.best_model_path
    else:
        assert callback.best_score == 0.5 and callback.stopped_epoch == 2  # 0.4 did not improve on 0.5


def test_a_monitor_that_does_not_exist_raises_at_the_first_epoch_end_naming_the_keys(root_dir):
    with pytest.raises(KeyError, match=r"ModelCheckpoint monitors 'val_acc', which was not logged by the end of "
                                       r"epoch 0; logged metrics: \['train_loss', 'val_loss', 'val_pooled_hits@20'\]"):
        _fit(root_dir, [ModelCheckpoint(monitor="val_acc")])


def test_the_metrics_validate_returns_read_an_old_name_as_its_new_one(root_dir):
    trainer = Trainer(max_epochs=1, progress_bar=False, enable_model_summary=False, default_root_dir=root_dir)
    metrics = trainer.validate(RegressionTask(n=16, script={"val_pooled_hits@20": [0.3]}))
    with pytest.warns(DeprecationWarning, match=r"'val_hits@20' is now called 'val_pooled_hits@20'"):
        assert metrics["val_hits@20"] == pytest.approx(0.3)
