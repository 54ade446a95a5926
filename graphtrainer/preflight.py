"""Checks and preparation done in the launching process, before any rank starts."""
from __future__ import annotations

import warnings
from typing import Any

from .sampling import find_graphs, prepare_graph

#: Launchers whose ranks get the graph through shared memory rather than by inheriting it.
SHARED_MEMORY_LAUNCHERS = ("spawn", "forkserver")
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
    from .nn.sparse_embedding import check_sparse_embeddings

    check_sparse_embeddings(task)


def prepare_graphs(task: Any, method: str) -> None:
    """Build the sparse formats the task's samplers read (:mod:`graphtrainer.formats`),
    once, before ranks start; for launchers whose ranks do not inherit memory, move each
    graph to shared memory in place.

    With fork the children share the formats copy-on-write instead of each building its
    own. With spawn and forkserver the graph's structure and tensors go to shared memory
    once and ranks attach to it; the graph object is pointed at the shared copy
    (:func:`graphtrainer.shared_graph.share_graph`), so this process holds no second one.
    """
    if method == "forkserver":
        # Started first: its imports (seconds) overlap the work below; launch() stops it.
        from .forkserver import start_server, stop_server

        start_server()
        try:
            _prepare(task, method)
        except BaseException:
            stop_server()
            raise
        return
    _prepare(task, method)


def _prepare(task: Any, method: str) -> None:
    from .formats import formats_for

    graphs = find_graphs(task)
    shares = method in SHARED_MEMORY_LAUNCHERS
    if shares and len(graphs) > MANY_GRAPHS:
        warnings.warn(
            f"{type(task).__name__} holds {len(graphs)} DGL graphs in its attributes. With launcher='{method}' "
            "each one travels to the ranks through its own shared-memory files, several file "
            "descriptors per graph, which fails with 'Too many open files' under the common limit of "
            "1024 (`ulimit -n`). Pack the dataset once instead, self.graphs = "
            "graphtrainer.graph_loader.PackedGraphs(dataset), and keep the list of graphs off the task.",
            UserWarning, stacklevel=4)
    for graph in graphs:
        prepare_graph(graph, formats_for(task, graph))
        if shares and len(graphs) <= MANY_GRAPHS:
            from .shared_graph import share_graph

            share_graph(graph)
