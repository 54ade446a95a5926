"""The job of ``dgl_tutorial.py`` as a GraphTask with every graphtrainer default: ``Trainer(num_procs=NPROCS)``,
progress bar, logger and summary on; the tutorial's network, ``NeighborSampler([4, 4])``, batch 1024, Adam.

    python benchmarks/tutorial_task.py GRAPH.bin NPROCS EPOCHS OUT.json [OPTION=VALUE ...]

Rank 0 writes each epoch's start and the end of ``fit`` to OUT.json; OPTION=VALUE (``profiler=simple``,
``pin_cpus=false``) sets that Trainer option."""
from __future__ import annotations

import json
import sys
import tempfile
import time
from typing import Any, List

import harness  # noqa: F401  (graphtrainer from this checkout, DGL on PyTorch)
from graphtrainer import Trainer
from graphtrainer.callbacks import Callback
from graphtrainer.examples.node_classification import NodeClassification
from tutorial_model import HIDDEN, Model


class TutorialTask(NodeClassification):
    """The tutorial's model, sampler, batch size and optimizer; training only."""

    def __init__(self, graph: Any):
        super().__init__(graph, fanouts=[4, 4], hidden=HIDDEN, batch_size=1024, lr=1e-3)

    def configure_model(self) -> Any:
        return Model(self.in_feats, self.hidden, self.num_classes)

    def val_dataloader(self) -> Any:
        return None


class EpochStarts(Callback):
    def __init__(self, out: str):
        self.out = out
        self.starts: List[float] = []

    def on_train_epoch_start(self, trainer: Any, task: Any) -> None:
        self.starts.append(time.perf_counter())

    def on_fit_end(self, trainer: Any, task: Any) -> None:
        if trainer.rank == 0:
            with open(self.out, "w", encoding="utf-8") as fh:
                json.dump({"epoch_starts": self.starts, "end": time.perf_counter(),
                           "steps_per_epoch": trainer.num_training_batches}, fh)


if __name__ == "__main__":
    import dgl

    (graph,), _ = dgl.load_graphs(sys.argv[1])
    options = {k: {"true": True, "false": False}.get(v, v) for k, v in (a.split("=", 1) for a in sys.argv[5:])}
    with tempfile.TemporaryDirectory() as root:
        Trainer(num_procs=int(sys.argv[2]), max_epochs=int(sys.argv[3]), default_root_dir=root,
                callbacks=[EpochStarts(sys.argv[4])], **options).fit(TutorialTask(graph))
