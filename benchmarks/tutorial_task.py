"""The job of ``dgl_tutorial.py`` as a GraphTask with every graphtrainer default.

    python benchmarks/tutorial_task.py GRAPH.bin NPROCS EPOCHS OUT.json [OPTION=VALUE ...]

``Trainer(num_procs=NPROCS)``, progress bar, logger and summary on; the example task with the
tutorial's network (``tutorial_model.Model``), ``NeighborSampler([4, 4])``, batch 1024, Adam.
Rank 0 writes each epoch's start and the end of ``fit`` to OUT.json. OPTION=VALUE (e.g.
``allocator=lean``, ``pin_cpus=false``) sets that Trainer option, for ablations.
"""
from __future__ import annotations

import json
import sys
import tempfile
import time
from typing import Any, List, Tuple

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
    """Rank 0 writes when each training epoch started and when ``fit`` ended."""

    def __init__(self, out: str):
        self.out, self.starts, self.steps = out, [], 0  # type: str, List[float], int

    def on_train_epoch_start(self, trainer: Any, task: Any) -> None:
        self.starts.append(time.perf_counter())
        self.steps = 0

    def on_train_batch_end(self, trainer: Any, task: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.steps += 1

    def on_fit_end(self, trainer: Any, task: Any) -> None:
        if trainer.rank == 0:
            with open(self.out, "w", encoding="utf-8") as fh:
                json.dump({"epoch_starts": self.starts, "end": time.perf_counter(), "steps_per_epoch": self.steps}, fh)


def _option(text: str) -> Tuple[str, Any]:
    """``allocator=lean`` or ``pin_cpus=false``: one Trainer option of an ablation arm."""
    name, value = text.split("=", 1)
    return name, {"true": True, "false": False}.get(value, value)


def main(argv: List[str]) -> None:
    import dgl

    graph_file, nprocs, epochs, out = argv[0], int(argv[1]), int(argv[2]), argv[3]
    extra = dict(_option(text) for text in argv[4:])
    (graph,), _ = dgl.load_graphs(graph_file)
    with tempfile.TemporaryDirectory() as root:
        trainer = Trainer(num_procs=nprocs, max_epochs=epochs, default_root_dir=root, callbacks=[EpochStarts(out)],
                          **extra)
        trainer.fit(TutorialTask(graph))


if __name__ == "__main__":
    main(sys.argv[1:])
