"""``ckpt_path`` checked in the calling process: a file that does not exist is refused before any
rank starts (not as every rank's FileNotFoundError after loading the data), and under torchrun only
rank 0 says which file "last"/"best" chose (the process group does not exist yet)."""
from __future__ import annotations

import time

import pytest

from graphtrainer import ModelCheckpoint, Trainer

from tasks import RegressionTask


def _trainer(root, epochs=1, **kwargs):
    return Trainer(max_epochs=epochs, seed=0, progress_bar=False, enable_model_summary=False,
                   default_root_dir=root, callbacks=[ModelCheckpoint(save_last=True)], **kwargs)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("stage", ["fit", "validate", "test", "predict"])
def test_a_missing_checkpoint_file_is_refused_before_any_rank_starts(root_dir, tmp_path, stage):
    trainer = _trainer(root_dir, num_procs=2)
    missing = tmp_path / "nosuch.ckpt"
    start = time.monotonic()
    with pytest.raises(FileNotFoundError, match=r"checkpoint .*nosuch\.ckpt does not exist: pass an existing "
                                                r"file, or ckpt_path='last' / 'best'"):
        getattr(trainer, stage)(RegressionTask(n=16), ckpt_path=str(missing))
    assert time.monotonic() - start < 5  # no rank was started
    assert list(root_dir.iterdir()) == []  # and no run folder made


def test_under_torchrun_only_rank_0_says_which_checkpoint(root_dir, monkeypatch, capsys):
    _trainer(root_dir).fit(RegressionTask(n=16))
    last = root_dir / "version_0" / "checkpoints" / "last.ckpt"
    capsys.readouterr()
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29500")
    monkeypatch.setenv("WORLD_SIZE", "2")
    for rank in ("1", "0"):  # resolved before the process group exists, as a CLI run under torchrun does
        monkeypatch.setenv("RANK", rank)
        assert _trainer(root_dir)._resolve_ckpt("last") == str(last)
        assert capsys.readouterr().out == ("" if rank == "1" else f"[graphtrainer] ckpt_path='last': using {last}\n")
