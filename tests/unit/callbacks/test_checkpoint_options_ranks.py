"""ModelCheckpoint's Lightning options on two ranks (fork, gloo), where rank 0 alone looks at the
folder, writes, links and warns: version counter, ``auto_insert_metric_name=False``,
``save_weights_only`` and ``save_last="link"`` together, and a resume from another folder."""
from __future__ import annotations

import json
import os
import sys
import warnings
from pathlib import Path

import pytest
import torch

from graphtrainer import CheckpointError, ModelCheckpoint, Trainer

from tasks import RegressionTask, Recorder

# Per-rank scores; their exact means (0.6, 0.4, 0.3) rank the files.
SCRIPT = {"score": [[0.5, 0.3, 0.2], [0.7, 0.5, 0.4]]}


def _trainer(root, epochs, callbacks):
    return Trainer(num_procs=2, launcher="fork", max_epochs=epochs, seed=0, progress_bar=False,
                   enable_model_summary=False, default_root_dir=root, callbacks=list(callbacks))


def _print_warning(message, category, filename, lineno, file=None, line=None):
    sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))


def _files(folder: Path):
    return sorted(p.name for p in folder.iterdir())


@pytest.mark.timeout(180)
def test_two_ranks_version_link_and_save_weights_only_into_a_reused_folder(root_dir, tmp_path):
    folder = tmp_path / "ck"

    def fit(out):
        mc = ModelCheckpoint(dirpath=folder, filename="{epoch}-{score:.2f}", auto_insert_metric_name=False,
                             monitor="score", save_top_k=2, save_last="link", save_weights_only=True)
        (tmp_path / out).mkdir()
        task = RegressionTask(n=32, script=SCRIPT)
        _trainer(root_dir, 3, [mc, Recorder(str(tmp_path / out))]).fit(task)
        return mc, task

    fit("first")
    first = {"1-0.40.ckpt", "2-0.30.ckpt", "last.ckpt"}
    assert _files(folder) == sorted(first)
    assert os.readlink(folder / "last.ckpt") == "2-0.30.ckpt"
    kept = {name: (folder / name).read_bytes() for name in first}
    mc, task = fit("second")
    # The second run versions every name the first left (the top-2 dropped its own 0-0.60-v1.ckpt).
    assert _files(folder) == sorted(first | {"1-0.40-v1.ckpt", "2-0.30-v1.ckpt", "last-v1.ckpt"})
    assert {name: (folder / name).read_bytes() for name in first} == kept
    assert os.readlink(folder / "last.ckpt") == "2-0.30.ckpt"
    assert os.readlink(folder / "last-v1.ckpt") == "2-0.30-v1.ckpt"
    assert mc.best_model_path == str(folder / "2-0.30-v1.ckpt") and mc.best_model_score == pytest.approx(0.3)
    assert mc.last_model_path == str(folder / "last-v1.ckpt")
    # Both ranks held the same decisions at every epoch.
    rank0, rank1 = (json.loads((tmp_path / "second" / f"rank{r}.json").read_text()) for r in (0, 1))
    assert len(rank0) == 3 and rank0 == rank1
    saved = torch.load(folder / "last-v1.ckpt", weights_only=True)
    assert saved["weights_only"] is True and "optimizer_states" not in saved and "callbacks" not in saved
    for key, value in task.module.state_dict().items():
        assert torch.equal(saved["state_dict"][key], value)
    # Resuming a fit from it is refused in this process, before any rank starts, naming the way out.
    with pytest.raises(CheckpointError, match=r"holds only the model's weights") as info:
        _trainer(root_dir, 4, [ModelCheckpoint(dirpath=folder)]).fit(RegressionTask(n=32, script=SCRIPT),
                                                                     ckpt_path=str(folder / "last-v1.ckpt"))
    assert "Pass it to validate/test/predict(ckpt_path=...)" in str(info.value)


@pytest.mark.timeout(180)
def test_two_ranks_resuming_from_another_folder_warn_once_and_keep_the_best_path(root_dir, tmp_path, capfd,
                                                                                 monkeypatch):
    first = ModelCheckpoint(dirpath=tmp_path / "a", monitor="score", save_last=True)
    _trainer(root_dir, 2, [first]).fit(RegressionTask(n=32, script=SCRIPT))
    best = str(tmp_path / "a" / "epoch=1-step=4.ckpt")
    assert first.best_model_path == best
    capfd.readouterr()
    other = ModelCheckpoint(dirpath=tmp_path / "b", monitor="score", save_top_k=0, save_last=True)
    with warnings.catch_warnings():
        # Every warning printed, as outside pytest (whose recorder the forked ranks would inherit).
        warnings.simplefilter("always")
        monkeypatch.setattr(warnings, "showwarning", _print_warning)
        _trainer(root_dir, 3, [other]).fit(RegressionTask(n=32, script=SCRIPT),
                                          ckpt_path=str(tmp_path / "a" / "last.ckpt"))
    err = capfd.readouterr().err
    assert err.count("only best_model_path is restored") == 1, err  # rank 0 says it, once
    assert f"written into {tmp_path / 'a'}, not this run's dirpath {tmp_path / 'b'}" in err
    assert other.best_model_path == best and other.best_k_models == {}
    assert _files(tmp_path / "a") == ["epoch=1-step=4.ckpt", "last.ckpt"]
    assert _files(tmp_path / "b") == ["last.ckpt"]


@pytest.mark.timeout(180)
def test_after_a_fit_in_other_processes_save_checkpoint_writes_the_trained_weights_only(root_dir, tmp_path):
    trainer, task = _trainer(root_dir, 2, []), RegressionTask()
    trainer.fit(task)
    with pytest.raises(RuntimeError, match=r"weights_only=True.*last_model_path"):
        trainer.save_checkpoint(tmp_path / "full.ckpt")  # the optimizer states left with the ranks
    assert not (tmp_path / "full.ckpt").exists()
    path = tmp_path / "weights.ckpt"
    trainer.save_checkpoint(path, weights_only=True)
    ckpt = torch.load(path, weights_only=False)
    assert ckpt["weights_only"] and ckpt["global_step"] == trainer.global_step > 0
    trained = task.module.state_dict()
    assert ckpt["state_dict"].keys() == trained.keys()
    assert all(torch.equal(ckpt["state_dict"][k], trained[k]) for k in trained)
    assert "optimizer_states" not in ckpt
    tester = Trainer(num_procs=2, launcher="fork", progress_bar=False, enable_model_summary=False,
                     default_root_dir=root_dir)
    from_file = tester.test(RegressionTask(), ckpt_path=str(path))  # a fresh model: the file's weights
    assert from_file and from_file == tester.test(task)
