"""``Trainer(sampling="device")`` on 2 CPU ranks, through every stage: each stage's loader really
samples on the device (not DGL's CPU path, which would pass every equality test silently),
uneven training shares finish in ``Join``, evaluation sees every id once with exact metrics,
predictions come back in the given order, and layer-wise inference runs beside it."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from graphtrainer import Trainer
from graphtrainer.data.node_loader import NodeLoader, default_sampler

from conftest import rank_children
from tasks import SageTask, make_graph, manual_sage_outputs

TRAIN_IDS = torch.arange(33)  # batch 8 over 2 ranks, not padded: 17 ids (3 batches) and 16 (2 batches)


class StageProbe(SageTask):
    """Writes, per stage and rank, each batch's block class and seed ids; validates layer-wise
    inference against a full forward (it samples with DGL on the CPU whatever ``sampling`` says)."""

    def __init__(self, graph: Any, out: str, predict_ids: torch.Tensor):
        super().__init__(graph, fanouts=(3, 3), batch_size=8, eval_batch_size=8, dropout=0.0,
                         predict_ids=predict_ids)
        self.out = out

    def train_dataloader(self) -> Any:
        # even="none": ranks get different batch counts, so the epoch ends in Join
        return NodeLoader(self.graph, TRAIN_IDS, default_sampler(self.graph, self.fanouts), self.batch_size,
                          even="none")

    def _record(self, stage: str, batch: Any) -> None:
        _, seeds, blocks = batch
        with open(Path(self.out) / f"{stage}_r{self.rank}.jsonl", "a") as fh:
            fh.write(json.dumps([type(blocks[0]).__name__, seeds.tolist()]) + "\n")

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self._record("train", batch)
        return super().training_step(batch, batch_idx)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self._record("val", batch)
        super().validation_step(batch, batch_idx)

    def predict_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self._record("predict", batch)
        return super().predict_step(batch, batch_idx)

    def on_validation_epoch_end(self) -> None:
        from graphtrainer.data.inference import layerwise

        g = self.graph
        lw = layerwise(self.module, g, g.ndata["feat"], batch_size=16)
        with torch.no_grad():
            full = self.module([g] * len(self.fanouts), g.ndata["feat"])
        self.log("lw_diff", float((lw - full).abs().max()), reduce_fx="sum")  # sum of both ranks' largest


def _read(out: Path, stage: str, rank: int) -> list:
    path = out / f"{stage}_r{rank}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.timeout(180)
def test_every_stage_samples_on_the_device_with_the_loaders_promises(root_dir, tmp_path):
    graph = make_graph()
    gen = torch.Generator().manual_seed(3)
    predict_ids = torch.randperm(graph.num_nodes(), generator=gen)[:29]  # any order; uneven over 2 ranks
    task = StageProbe(graph, str(tmp_path), predict_ids)
    trainer = Trainer(num_procs=2, launcher="fork", max_epochs=1, seed=2, sampling="device", threads_per_proc=1,
                      progress_bar=False, logger=False, enable_model_summary=False, default_root_dir=root_dir)
    trainer.fit(task)
    state = {k: v.clone() for k, v in task.module.state_dict().items()}
    predictions = trainer.predict(task)
    for stage in ("train", "val", "predict"):
        kinds = {kind for r in (0, 1) for kind, _ in _read(tmp_path, stage, r)}
        assert kinds == {"TorchBlock"}, (stage, kinds)  # DGL's CPU path gives DGLBlock on CPU ranks
    train = [[ids for _, ids in _read(tmp_path, "train", r)] for r in (0, 1)]
    assert [len(b) for b in train] == [3, 2]  # uneven: Join ran, and the fit finished
    assert sorted(i for b in train for ids in b for i in ids) == TRAIN_IDS.tolist()  # each id once
    val_ids = task.split["val"]
    val = [[i for _, ids in _read(tmp_path, "val", r) for i in ids] for r in (0, 1)]
    assert val == [val_ids[0::2].tolist(), val_ids[1::2].tolist()]  # every id once, rank r: r, r + 2, ...
    # Full neighbourhoods sample the same graph on the device as DGL's do: the metrics are exact.
    logits = manual_sage_outputs(task, state, val_ids)
    labels = graph.ndata["label"][val_ids]
    assert trainer.history[0]["val_acc"] == pytest.approx(float((logits.argmax(1) == labels).double().mean()),
                                                          abs=1e-6)
    assert trainer.history[0]["val_loss"] == pytest.approx(float(F.cross_entropy(logits.double(), labels)),
                                                           abs=1e-5)
    assert trainer.history[0]["lw_diff"] < 2e-5
    assert torch.allclose(predictions, manual_sage_outputs(task, state, predict_ids), atol=1e-5)  # in id order
    assert not rank_children()
