"""ModelCheckpoint's file names, as Lightning's: ``format_checkpoint_name`` with and without
``auto_insert_metric_name``, the version counter's ``-v<n>``, and the argument checks. No fit runs
here; the fits that use these names are in test_checkpoint_options.py."""
from __future__ import annotations

import warnings

import pytest

from graphtrainer import ModelCheckpoint


@pytest.mark.parametrize("filename, metrics, auto_insert, expected", [
    ("{epoch}-{step}", {"epoch": 3, "step": 40}, True, "epoch=3-step=40.ckpt"),
    ("{epoch}-{step}", {"epoch": 3, "step": 40}, False, "3-40.ckpt"),
    ("{epoch:03d}-{val_loss:.2f}", {"epoch": 5, "val_loss": 0.123456}, True, "epoch=005-val_loss=0.12.ckpt"),
    ("{epoch:03d}-{val_loss:.2f}", {"epoch": 5, "val_loss": 0.123456}, False, "005-0.12.ckpt"),
    # Lightning's advice for names with "/": write the names yourself and turn the insertion off.
    ("epoch={epoch}-acc={val/acc:.1f}", {"epoch": 2, "val/acc": 0.87}, False, "epoch=2-acc=0.9.ckpt"),
    ("{val/acc:.1f}", {"val/acc": 0.87}, True, "val_acc=0.9.ckpt"),  # never a sub-folder
    ("best", {"epoch": 1}, True, "best.ckpt"),
    (None, {"epoch": 0, "step": 8}, True, "epoch=0-step=8.ckpt"),  # None: Lightning's default
])
def test_format_checkpoint_name(filename, metrics, auto_insert, expected):
    callback = ModelCheckpoint(filename=filename, auto_insert_metric_name=auto_insert)
    assert callback.format_checkpoint_name(metrics) == expected


def test_a_version_is_appended_before_the_extension_and_the_folder_is_prepended(tmp_path):
    callback = ModelCheckpoint(dirpath=tmp_path, filename="{epoch}")
    assert callback.format_checkpoint_name({"epoch": 2}) == str(tmp_path / "epoch=2.ckpt")
    assert callback.format_checkpoint_name({"epoch": 2}, ver=3) == str(tmp_path / "epoch=2-v3.ckpt")
    assert callback.format_checkpoint_name({}, filename="last", ver=1) == str(tmp_path / "last-v1.ckpt")


def test_a_field_that_was_not_logged_is_written_as_0_warning_once_naming_those_that_were():
    # As Lightning's _format_checkpoint_name, which formats a missing field as 0.
    callback = ModelCheckpoint(filename="{epoch}-{val_acc:.2f}-{val_n:d}")
    with pytest.warns(UserWarning) as caught:
        assert callback.format_checkpoint_name({"epoch": 0, "step": 1}) == "epoch=0-val_acc=0.00-val_n=0.ckpt"
    assert [str(w.message) for w in caught] == [  # one per missing field
        f"ModelCheckpoint filename uses {{{name}}}, which was not logged: written as 0 (as Lightning); logged: "
        f"['epoch', 'step']. Log '{name}' with self.log, or drop it from filename" for name in ("val_acc", "val_n")]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per field
        assert callback.format_checkpoint_name({"epoch": 1, "step": 2}) == "epoch=1-val_acc=0.00-val_n=0.ckpt"
        assert callback.format_checkpoint_name({"epoch": 1, "val_acc": 0.5, "val_n": 3}) == \
            "epoch=1-val_acc=0.50-val_n=3.ckpt"


@pytest.mark.parametrize("save_last", ["copy", "links", 2])
def test_save_last_takes_true_false_or_link_only(save_last):
    with pytest.raises(ValueError, match=rf"save_last={save_last!r}: use True \(last.ckpt, a copy\), 'link'"):
        ModelCheckpoint(save_last=save_last)


def test_the_new_options_default_as_lightnings():
    callback = ModelCheckpoint(save_last="link")
    assert callback.save_last == "link"
    assert callback.enable_version_counter and callback.auto_insert_metric_name
    assert not callback.save_weights_only


def _state(dirpath, best):
    return {"best_k_models": {best: 0.2}, "best_model_path": best, "best_model_score": 0.2,
            "last_model_path": f"{dirpath}/last.ckpt", "saved_order": [best], "dirpath": str(dirpath)}


def test_state_from_another_folder_restores_only_the_best_path_and_warns(tmp_path):
    # Lightning's rule for a changed dirpath: best_model_path alone comes back, with a warning.
    this, other = tmp_path / "this-run", tmp_path / "earlier-run"
    same = ModelCheckpoint(dirpath=this, monitor="val_loss")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        same.load_state_dict(_state(this, f"{this}/epoch=1.ckpt"))
    assert same.best_k_models == {f"{this}/epoch=1.ckpt": 0.2} and same.best_model_score == 0.2
    assert same.last_model_path == f"{this}/last.ckpt"
    callback = ModelCheckpoint(dirpath=this, monitor="val_loss")
    with pytest.warns(UserWarning, match=r"ModelCheckpoint: the checkpoint was written into .*earlier-run, not this "
                                         r"run's dirpath .*this-run: only best_model_path is restored"):
        callback.load_state_dict(_state(other, f"{other}/epoch=1.ckpt"))
    assert callback.best_model_path == f"{other}/epoch=1.ckpt"
    assert callback.best_k_models == {} and callback.best_model_score is None and callback.last_model_path == ""
