"""Trainer(block_type="torch") against the DGL-block fit: 2 ranks (fork, gloo), the same
seeds, and the per-epoch metrics equal to 1e-4, for node classification, link prediction,
graph classification and a heterograph; the torch run's steps really saw torch blocks."""
from __future__ import annotations

import pytest
import torch

from graphtrainer import Trainer

from conftest import rank_children
from nn_fit_cases import CASES, GraphKinds, read_kinds

# Two 2-rank fits per case: node and link classification take 5 s or more, the others 1-3 s.
SLOW = {"node", "link"}


def _fit(make_task, block_type, root, tmp_path, **trainer_kwargs):
    out = tmp_path / block_type
    out.mkdir()
    trainer = Trainer(num_procs=2, launcher="fork", max_epochs=2, seed=5, threads_per_proc=1, progress_bar=False,
                      default_root_dir=root, logger=False, block_type=block_type,
                      callbacks=[GraphKinds(str(out))], **trainer_kwargs)
    trainer.fit(make_task(None))
    kinds = [set(row["kinds"]) for row in read_kinds(out, 2)]
    assert not rank_children()
    return trainer.history, kinds


@pytest.mark.timeout(400)
@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.slow) if c in SLOW else c for c in CASES])
def test_torch_blocks_fit_equals_dgl_blocks_fit(case, root_dir, tmp_path):
    make_task, kwargs, torch_kinds = CASES[case]
    dgl_hist, dgl_kinds = _fit(make_task, "dgl", root_dir, tmp_path, **kwargs)
    torch_hist, torch_kinds_seen = _fit(make_task, "torch", root_dir, tmp_path, **kwargs)
    assert all(k and not any(name.startswith("Torch") for name in k) for k in dgl_kinds)
    assert all(k == torch_kinds for k in torch_kinds_seen)
    assert len(dgl_hist) == len(torch_hist) == 2
    for ref, got in zip(dgl_hist, torch_hist):
        assert ref.keys() == got.keys()
        metrics = [k for k in ref if k not in ("epoch", "step")]
        assert any(k.startswith("train_loss") for k in metrics)
        for k in metrics:
            assert got[k] == pytest.approx(ref[k], abs=1e-4, rel=1e-4), (case, k)
