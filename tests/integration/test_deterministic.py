"""``Trainer(deterministic=...)`` with real ranks (gloo on CPU): torch's deterministic mode in
every rank whatever the launcher, DGL's in-rank sampling with two threads repeatable bit for
bit, the caller's process left as it was, and bad values refused before any rank starts."""
from __future__ import annotations

import json
import os

import pytest
import torch

from graphtrainer import Trainer

from tasks import ParamDump, RegressionTask, SageTask, make_graph


class ModeProbe(RegressionTask):
    """Writes, from each rank, torch's deterministic settings and cuBLAS's workspace setting."""

    def __init__(self, out_dir: str):
        super().__init__()
        self.out_dir = out_dir

    def on_train_start(self) -> None:
        seen = {"on": torch.are_deterministic_algorithms_enabled(),
                "warn_only": torch.is_deterministic_algorithms_warn_only_enabled(),
                "cublas": os.environ.get("CUBLAS_WORKSPACE_CONFIG")}
        with open(os.path.join(self.out_dir, f"r{self.rank}.json"), "w") as f:
            json.dump(seen, f)


def _probe(root_dir, out, mode, procs=2, launcher="fork"):
    out.mkdir()
    Trainer(num_procs=procs, launcher=launcher, max_epochs=1, progress_bar=False, logger=False,
            enable_model_summary=False, default_root_dir=root_dir, deterministic=mode).fit(ModeProbe(str(out)))
    return [json.loads((out / f"r{r}.json").read_text()) for r in range(procs)]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode, launcher, warn_only", [(True, "fork", False), pytest.param("warn", "forkserver", True, marks=pytest.mark.slow)])
def test_every_rank_runs_torchs_deterministic_mode(root_dir, tmp_path, monkeypatch, mode, launcher, warn_only):
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    for seen in _probe(root_dir, tmp_path / "out", mode, launcher=launcher):
        assert seen == {"on": True, "warn_only": warn_only, "cublas": ":4096:8"}
    assert not torch.are_deterministic_algorithms_enabled()  # this process was left alone


@pytest.mark.timeout(60)
@pytest.mark.parametrize("users", [":16:8", None])
def test_in_process_the_mode_is_set_for_the_run_and_put_back(root_dir, tmp_path, monkeypatch, users):
    if users is None:
        monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    else:
        monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", users)  # the user's own is kept
    assert _probe(root_dir, tmp_path / "out", True, procs=1) == [
        {"on": True, "warn_only": False, "cublas": users or ":4096:8"}]
    assert not torch.are_deterministic_algorithms_enabled()
    assert os.environ.get("CUBLAS_WORKSPACE_CONFIG") == users  # a later run, or its ranks, do not inherit ours


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", [False, None])  # None: Lightning's default, ported scripts pass it
def test_by_default_the_ranks_keep_torchs_own_setting(root_dir, tmp_path, mode):
    assert [s["on"] for s in _probe(root_dir, tmp_path / "out", mode)] == [False, False]


@pytest.mark.parametrize("value", ["true", 1, 0, "error"])
def test_bad_values_are_refused_before_any_rank_starts(value):
    with pytest.raises(ValueError, match=r"deterministic=.*give True .*'warn'.* or False"):
        Trainer(deterministic=value)


def _fit(root_dir, out, **kwargs):
    out.mkdir()
    trainer = Trainer(num_procs=2, launcher="fork", threads_per_proc=2, max_epochs=2, seed=3, progress_bar=False,
                      logger=False, enable_model_summary=False, default_root_dir=root_dir,
                      callbacks=[ParamDump(str(out))], **kwargs)
    trainer.fit(SageTask(make_graph(num_nodes=2000, avg_degree=10), fanouts=(6, 6), batch_size=64))
    return trainer.history, {r: ParamDump.load(out, "e1", r) for r in (0, 1)}


@pytest.mark.timeout(300)
def test_two_fits_with_two_sampling_threads_per_rank_are_identical(root_dir, tmp_path):
    """DGL's relabelling races no longer decide what later layers draw."""
    history_a, params_a = _fit(root_dir, tmp_path / "a", deterministic=True)
    history_b, params_b = _fit(root_dir, tmp_path / "b", deterministic=True)
    assert history_a == history_b
    for rank in (0, 1):
        for name, value in params_a[rank].items():
            assert torch.equal(value, params_b[rank][name]), (rank, name)
