"""Trainer(block_type="torch") against the DGL-block fit: 2 ranks (fork, gloo), the same
seeds, and the per-epoch metrics equal to 1e-4, for node classification, link prediction,
graph classification and a heterograph; the torch run's steps really saw torch blocks."""
from __future__ import annotations

import json
import os

import pytest
import torch

from graphtrainer import Trainer
from graphtrainer.callbacks import Callback

from conftest import rank_children
from hetero_tasks import HeteroLinkTask, HeteroTask, make_hetero
from link_tasks import GraphClsTask, LinkTask, numbered_minigc, rand_link_graph
from tasks import SageTask, make_graph

# Two 2-rank fits per case: node and link classification take 5 s or more, the others 1-3 s.
SLOW = {"node", "link"}


class GraphKinds(Callback):
    """Each rank writes the class names of the graphs its training batches held."""

    def __init__(self, out_dir: str):
        self.out_dir, self.kinds = out_dir, set()

    def on_train_batch_end(self, trainer, task, outputs, batch, batch_idx):
        def walk(x):
            if isinstance(x, (list, tuple)):
                for y in x:
                    walk(y)
            elif hasattr(x, "num_edges"):
                self.kinds.add(type(x).__name__)
        walk(batch)

    def on_train_epoch_end(self, trainer, task):
        with open(os.path.join(self.out_dir, f"kinds_r{trainer.rank}.json"), "w") as fh:
            json.dump(sorted(self.kinds), fh)


def _fit(make_task, block_type, root, tmp_path, **trainer_kwargs):
    out = tmp_path / block_type
    out.mkdir()
    trainer = Trainer(num_procs=2, launcher="fork", max_epochs=2, seed=5, threads_per_proc=1, progress_bar=False,
                      default_root_dir=root, logger=False, block_type=block_type,
                      callbacks=[GraphKinds(str(out))], **trainer_kwargs)
    trainer.fit(make_task())
    kinds = [set(json.loads((out / f"kinds_r{r}.json").read_text())) for r in range(2)]
    assert not rank_children()
    return trainer.history, kinds


CASES = {
    "node": (lambda: SageTask(make_graph(), fanouts=(3, 3), batch_size=16), {}, {"TorchBlock"}),
    "link": (lambda: LinkTask(rand_link_graph(), torch.arange(120), torch.arange(120, 160), fanouts=[3, 3],
                              hidden=8, batch_size=16, eval_batch_size=20, eval_negatives=5), {}, {"TorchBlock"}),
    "graph": (lambda: GraphClsTask(numbered_minigc(64), torch.arange(48), torch.arange(48, 64), hidden=8,
                                   batch_size=8), {}, {"TorchBlock"}),
    "hetero": (lambda: HeteroTask(make_hetero(), {"paper": torch.arange(48), "word": torch.arange(16)}, 8,
                                  fanouts=(3, 3)), {"find_unused_parameters": True}, {"TorchHeteroBlock"}),
    "hetero-link": (lambda: HeteroLinkTask(make_hetero(), 16), {"find_unused_parameters": True},
                    {"TorchHeteroBlock"}),
}


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
