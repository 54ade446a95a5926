"""Preparing the task's graphs in the launching process, before any rank starts: their
sparse formats built once, and moved to shared memory for launchers that do not fork."""
from __future__ import annotations

import warnings
from typing import Any, List, Sequence

from ..data.formats import build_formats, formats_for
from ..data.sharded_loader import ShardedLoader
from . import forkserver
from .shared_graph import share_graph

#: Launchers whose ranks get the graph through shared memory rather than by inheriting it.
SHARED_MEMORY_LAUNCHERS = ("spawn", "forkserver")
#: More DGL graphs than this on a task draw a warning under spawn (see :func:`prepare_graphs`).
MANY_GRAPHS = 256

def prepare_graphs(task: Any, method: str) -> None:
    """Build the sparse formats the task's samplers read (:mod:`graphtrainer.data.formats`)
    once, shared copy-on-write by forked ranks; for spawn and forkserver, also move each graph
    to shared memory in place (:func:`graphtrainer.launch.shared_graph.share_graph`)."""
    if method == "forkserver":
        # Started first: its imports (seconds) overlap the work below; launch() stops it.
        forkserver.start_server()
        try:
            _prepare(task, method)
        except BaseException:
            forkserver.stop_server()
            raise
        return
    _prepare(task, method)


def _prepare(task: Any, method: str) -> None:
    graphs = find_graphs(task)
    shares = method in SHARED_MEMORY_LAUNCHERS
    if shares and len(graphs) > MANY_GRAPHS:
        warnings.warn(
            f"{type(task).__name__} holds {len(graphs)} DGL graphs in its attributes. With launcher='{method}' "
            "each one travels to the ranks through its own shared-memory files, several file "
            "descriptors per graph, which fails with 'Too many open files' under the common limit of "
            "1024 (`ulimit -n`). Pack the dataset once instead, self.graphs = "
            "graphtrainer.data.graph_loader.PackedGraphs(dataset), and keep the list of graphs off the task.",
            UserWarning, stacklevel=4)
    for graph in graphs:
        prepare_graph(graph, formats_for(task, graph))
        if shares and len(graphs) <= MANY_GRAPHS:
            share_graph(graph)


def prepare_graph(graph: Any, formats: Sequence[str] = ("csc",)) -> Any:
    """Build ``formats`` of ``graph`` once (default CSC) for forked ranks to share
    (:mod:`graphtrainer.data.formats`)."""
    return build_formats(graph, formats)


def find_graphs(obj: Any) -> List[Any]:
    """DGL graphs held by ``obj``'s attributes (one level, and inside lists, tuples and dicts)."""
    try:
        import dgl  # here, not at the top: the engine imports without DGL for plain-torch tasks
    except ImportError:
        return []
    found: List[Any] = []

    def visit(value: Any, depth: int) -> None:
        if isinstance(value, dgl.DGLGraph):
            if all(value is not g for g in found):
                found.append(value)
        elif isinstance(value, ShardedLoader):
            visit(getattr(value, "graph", None), depth)
        elif depth > 0 and isinstance(value, (list, tuple)):
            for item in value:
                visit(item, depth - 1)
        elif depth > 0 and isinstance(value, dict):
            for item in value.values():
                visit(item, depth - 1)

    for value in vars(obj).values():
        visit(value, 2)
    return found
