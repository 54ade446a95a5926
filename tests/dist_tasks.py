"""Tasks and helpers of the DistDGL tests; also the script one simulated machine runs:

    python tests/dist_tasks.py PART_CONFIG IP_CONFIG OUT_DIR EPOCHS MACHINE [FAIL]

(fits, tests the best checkpoint, writes the result or the error as JSON to
OUT_DIR/machine<MACHINE>.json).
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from graphtrainer import GraphTask, ModelCheckpoint, Trainer  # noqa: E402
from graphtrainer.dist_graph import PartitionedGraph  # noqa: E402
from graphtrainer.models import LinkPredictor  # noqa: E402
from graphtrainer.partition import to_partition_ids  # noqa: E402
from graphtrainer.ranking import LinkScores  # noqa: E402
from graphtrainer.examples.node_classification import NodeClassification  # noqa: E402

#: Tutorial 1's Cora settings.
CORA = dict(fanouts=[10, 10], hidden=128, dropout=0.6, lr=0.005, weight_decay=5e-4, batch_size=32,
            eval_batch_size=512)


class SeedRecorder(NodeClassification):
    """Writes, after every training epoch, the seed nodes all ranks trained on (gathered
    on rank 0) to ``<out>/seeds_epoch<e>.pt``. With ``fail`` ("raise" or "kill-server"),
    rank ``fail_rank`` breaks the run at global step 3."""

    def __init__(self, graph: Any, out: str, fail: str = "", fail_rank: int = 1, **kwargs: Any):
        super().__init__(graph, **kwargs)
        self.out, self.fail, self.fail_rank = out, fail, fail_rank
        self._seen: list = []

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        if self.fail and self.rank == self.fail_rank and self.global_step == 3:
            if self.fail == "raise":
                raise RuntimeError("trainer fault at step 3")
            if self.fail == "kill-server":
                kill_graph_servers(self.out)
        self._seen.append(batch[1].clone())
        return super().training_step(batch, batch_idx)

    def on_train_epoch_end(self) -> None:
        seen = self.all_gather(torch.cat(self._seen) if self._seen else torch.empty(0, dtype=torch.int64))
        self._seen = []
        if self.rank == 0:
            torch.save(seen, os.path.join(self.out, f"seeds_epoch{self.current_epoch}.pt"))


class DistLinkPrediction(GraphTask):
    """GraphSAGE + dot product on a partitioned training graph (``datasets.link_split``'s,
    without exclusion); held-out pairs in partition numbering; exact ranking metrics. Writes
    the seed edges of each training epoch to ``<out>/edges_epoch<e>.pt`` like SeedRecorder."""

    def __init__(self, part_config: str, val: Any, test: Any, out: str, hidden: int = 64):
        super().__init__()
        self.graph = PartitionedGraph(part_config)
        self.val = tuple(to_partition_ids(part_config, t) for t in val)
        self.test = tuple(to_partition_ids(part_config, t) for t in test)
        self.in_feats, self.hidden, self.out = self.graph.feature_shape("feat")[0], hidden, out
        self._seen: list = []

    def configure_model(self) -> torch.nn.Module:
        return LinkPredictor(self.in_feats, self.hidden, num_layers=2)

    def configure_optimizers(self) -> Any:
        return torch.optim.Adam(self.model.parameters(), lr=5e-3)

    def train_dataloader(self) -> Any:
        return self.edge_dataloader(torch.arange(self.graph.num_edges()), [10, 10], 256, negatives=1)

    def _eval_loader(self, pairs: Any) -> Any:
        import dgl

        sampler = dgl.dataloading.MultiLayerFullNeighborSampler(2, prefetch_node_feats=["feat"])
        return self.edge_dataloader(pairs, sampler, 256, negatives=20, shuffle=False)

    def val_dataloader(self) -> Any:
        return self._eval_loader(self.val)

    def test_dataloader(self) -> Any:
        return self._eval_loader(self.test)

    def _scores(self, batch: Any) -> tuple:
        _, pos_graph, neg_graph, blocks = batch
        return self.model(blocks, blocks[0].srcdata["feat"], pos_graph, neg_graph)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        import dgl

        self._seen.append(batch[1].edata[dgl.EID].clone())
        pos, neg = self._scores(batch)
        loss = (F.binary_cross_entropy_with_logits(pos, torch.ones_like(pos))
                + F.binary_cross_entropy_with_logits(neg, torch.zeros_like(neg)))
        self.log("train_loss", loss)
        return loss

    def on_train_epoch_end(self) -> None:
        seen = self.all_gather(torch.cat(self._seen) if self._seen else torch.empty(0, dtype=torch.int64))
        self._seen = []
        if self.rank == 0:
            torch.save(seen, os.path.join(self.out, f"edges_epoch{self.current_epoch}.pt"))

    def on_validation_epoch_start(self) -> None:
        self.scores = LinkScores(20, hits=(20,))

    on_test_epoch_start = on_validation_epoch_start

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.scores.add(*self._scores(batch))

    test_step = validation_step

    def on_validation_epoch_end(self) -> None:
        self.log_dict(self.scores.compute("val_"))

    def on_test_epoch_end(self) -> None:
        self.log_dict(self.scores.compute("test_"))


def kill_graph_servers(out: str) -> None:
    """SIGKILL this run's graph servers (children of the launching process) and note when."""
    import signal
    import time

    import psutil

    driver = psutil.Process(os.getppid())
    servers = [p for p in driver.children() if "graph_servers" in " ".join(p.cmdline())]
    Path(out, "killed_at").write_text(repr(time.time()))
    for proc in servers:
        os.kill(proc.pid, signal.SIGKILL)


def run_machine(part_config: str, ip_config: str, out: str, epochs: int, machine: int, fail: str = "") -> None:
    """One machine's script: fit, test the best checkpoint, write ``<out>/machine<m>.json``
    (the result, or the error this machine raised)."""
    task = SeedRecorder(part_config, out, fail="" if fail == "alone" else fail, fail_rank=1, **CORA)
    ckpt = ModelCheckpoint(monitor="val_acc", mode="max", dirpath=os.path.join(out, "checkpoints"))
    trainer = Trainer(num_procs=1, max_epochs=epochs, ip_config=ip_config, progress_bar=False,
                      default_root_dir=os.path.join(out, "runs"), callbacks=[ckpt],
                      hang_timeout=10 if fail == "alone" else 120,  # "alone": the other machine never starts
                      enable_model_summary=False)
    path = os.path.join(out, f"machine{machine}.json")
    try:
        trainer.fit(task)
        result = trainer.test(task, ckpt_path="best")
    except Exception as err:
        with open(path, "w") as fh:
            json.dump({"error": str(err).splitlines()[0], "type": type(err).__name__, "at": time.time()}, fh)
        raise
    with open(path, "w") as fh:
        json.dump({"rank": trainer.state.rank, "world_size": trainer.world_size, "test": result,
                   "last_epoch": trainer.history[-1]}, fh)


if __name__ == "__main__":
    run_machine(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]),
                sys.argv[6] if len(sys.argv) > 6 else "")
