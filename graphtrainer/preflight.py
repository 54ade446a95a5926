"""Checks and preparation done in the launching process, before any rank starts."""
from __future__ import annotations

import warnings
from typing import Any

from .sampling import find_graphs, prepare_graph

#: More DGL graphs than this on a task draw a warning under spawn (see :func:`prepare_graphs`).
MANY_GRAPHS = 256

_REQUIRED = {
    "fit": ("training_step", "train_dataloader", "configure_optimizers"),
    "validate": ("validation_step", "val_dataloader"),
    "test": ("test_step", "test_dataloader"),
    "predict": ("predict_step", "predict_dataloader"),
}


def check_task(task: Any, stage: str) -> None:
    """Fail early, naming the hook, when ``task`` cannot run ``stage``."""
    from .task import GraphTask

    if not isinstance(task, GraphTask):
        raise TypeError(f"Trainer expects a GraphTask, got {type(task).__name__}")
    if not hasattr(task, "_metrics"):
        raise TypeError(f"{type(task).__name__}.__init__ must call super().__init__()")
    for hook in _REQUIRED[stage]:
        if getattr(type(task), hook) is getattr(GraphTask, hook):
            raise NotImplementedError(f"{type(task).__name__} does not override {hook}(), which "
                                      f"Trainer.{stage} needs")
    if task.module is None and type(task).configure_model is GraphTask.configure_model:
        raise NotImplementedError(f"{type(task).__name__} has no model: override configure_model() "
                                  "or assign self.model in __init__")


def prepare_graphs(task: Any, method: str) -> None:
    """Build every sparse format of the task's graphs once, before ranks start.

    With fork the children then share them copy-on-write instead of each building its
    own; with spawn, pickling through torch's multiprocessing reductions puts the
    structure and every node/edge tensor in shared memory once, and ranks attach to it.
    """
    graphs = find_graphs(task)
    if method == "spawn" and len(graphs) > MANY_GRAPHS:
        warnings.warn(
            f"{type(task).__name__} holds {len(graphs)} DGL graphs in its attributes. With launcher='spawn' "
            "each one travels to the ranks through its own shared-memory files, several file "
            "descriptors per graph, which fails with 'Too many open files' under the common limit of "
            "1024 (`ulimit -n`). Pack the dataset once instead, self.graphs = "
            "graphtrainer.graph_loader.PackedGraphs(dataset), and keep the list of graphs off the task.",
            UserWarning, stacklevel=3)
    for graph in graphs:
        prepare_graph(graph)
