"""``ckpt_path`` checked in the calling process: under torchrun only rank 0 says which file
"last"/"best" chose (the process group does not exist yet, so every rank used to say it)."""
from __future__ import annotations

from graphtrainer import ModelCheckpoint, Trainer

from tasks import RegressionTask


def _trainer(root, epochs=1, **kwargs):
    return Trainer(max_epochs=epochs, seed=0, progress_bar=False, enable_model_summary=False,
                   default_root_dir=root, callbacks=[ModelCheckpoint(save_last=True)], **kwargs)


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
