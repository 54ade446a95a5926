"""Which sparse formats a task's samplers read, and building only those before a launch.

DGL's ``create_formats_()`` builds COO, CSR and CSC, but in-neighbour sampling reads CSC
only (at 2M nodes / 20M edges the unused CSR is about 340 MB per run), so before a launch
graphtrainer builds only what the samplers it can see need (:func:`formats_for`):

- CSC for every graph (DGL's block samplers walk in-edges by default);
- CSR for a ``NeighborSampler(edge_dir="out")``;
- COO for edge loaders (``find_edges`` for negatives and excluded edges);
- whatever the task names in ``GraphTask.graph_formats`` (e.g. ``("csc", "csr")`` or
  ``"all"``), for samplers it builds later, inside the ranks.

A format nobody built is built by DGL on first use, privately in each rank:
:func:`warn_if_missing` says so once and names the fix.
"""
from __future__ import annotations

import warnings
from typing import Any, Iterable, List, Sequence, Set, Tuple, Union

FORMATS = ("coo", "csr", "csc")
#: Built for every graph: what in-neighbour sampling (DGL's default) reads.
DEFAULT_FORMATS = ("csc",)

_warned: Set[Tuple[int, str]] = set()


def check_formats(formats: Union[str, Sequence[str], None], where: str = "graph_formats") -> Tuple[str, ...]:
    """``formats`` as a tuple of format names (``"all"`` means all three), or a ``ValueError``."""
    if formats is None:
        return ()
    if isinstance(formats, str):
        formats = FORMATS if formats == "all" else (formats,)
    try:
        names = tuple(formats)
    except TypeError:
        raise ValueError(f"{where}={formats!r}: give format names from {FORMATS}, or 'all'") from None
    bad = [f for f in names if f not in FORMATS]
    if bad:
        raise ValueError(f"{where}={formats!r}: {bad} not among {FORMATS}; e.g. graph_formats = ('csc', 'csr') "
                         "or 'all'")
    return names


def sampler_formats(sampler: Any) -> Set[str]:
    """The formats a DGL block sampler (or graphtrainer's wrappers of one) reads."""
    import dgl  # here: the engine imports without DGL (plain-torch tasks)

    if sampler is None:
        return set()
    if isinstance(sampler, dgl.dataloading.EdgePredictionSampler):
        # find_edges (negatives, excluded edges) reads the edge list.
        return {"coo"} | sampler_formats(getattr(sampler, "sampler", None))
    inner = getattr(sampler, "sampler", None)
    if inner is not None and inner is not sampler and hasattr(inner, "sample"):
        return sampler_formats(inner)  # graphtrainer's _PairSampler
    edge_dir = getattr(sampler, "edge_dir", "in")
    return {"csr"} if edge_dir == "out" else {"csc"}


def loader_formats(loader: Any) -> Set[str]:
    """Formats a loader's sampling reads (``sampled_formats()`` of graphtrainer's loaders, else
    those of a DGL ``DataLoader``'s sampler; empty for loaders that do not sample a big graph)."""
    if callable(getattr(loader, "sampled_formats", None)):
        return loader.sampled_formats()
    sampler = getattr(loader, "graph_sampler", None)  # DGL's own DataLoader
    return sampler_formats(sampler) if sampler is not None else set()


def formats_for(task: Any, graph: Any) -> Tuple[str, ...]:
    """Formats to build for ``graph`` before launching ``task``, in :data:`FORMATS` order:
    the defaults, the task's ``graph_formats``, and those of every loader or sampler on
    the task's attributes (one level, and inside lists, tuples and dicts) that uses it."""
    wanted = set(check_formats(getattr(task, "graph_formats", None)))
    for value in _attribute_values(task):
        if getattr(value, "graph", None) is graph:
            wanted |= loader_formats(value)
        elif callable(getattr(value, "sample", None)) and not hasattr(value, "graph"):
            wanted |= sampler_formats(value)  # a sampler kept for loaders built in the ranks
    state = graph.formats()
    allowed = set(state["created"]) | set(state["not created"])
    wanted |= {f for f in DEFAULT_FORMATS if f in allowed}  # a graph restricted to others keeps them
    return tuple(f for f in FORMATS if f in wanted)


def _attribute_values(obj: Any) -> Iterable[Any]:
    for value in vars(obj).values():
        if isinstance(value, (list, tuple)):
            yield from value
        elif isinstance(value, dict):
            yield from value.values()
        else:
            yield value


def build_formats(graph: Any, formats: Iterable[str]) -> Any:
    """Build ``formats`` of ``graph`` in place (each relation of a heterograph); others stay unbuilt.
    A ``ValueError`` names a format the graph was restricted against (``graph.formats([...])``)."""
    formats = check_formats(tuple(formats), "formats")
    state = graph.formats()
    allowed = set(state["created"]) | set(state["not created"])
    refused = [f for f in formats if f not in allowed]
    if refused:
        keep = sorted(allowed | set(refused))
        raise ValueError(
            f"the graph is restricted to the sparse formats {sorted(allowed)} (made with graph.formats(...)), "
            f"but its samplers read {[f.upper() for f in refused]}: DGL cannot build them there. Use "
            f"graph = graph.formats({keep!r}) before building the task, or samplers that read "
            f"{sorted(allowed)}.")
    for fmt in formats:
        for etype in graph.canonical_etypes:
            graph.adj_tensors(fmt, etype=etype)  # DGL keeps what it builds on the graph
    return graph


def created_formats(graph: Any) -> List[str]:
    """The formats ``graph`` holds now."""
    return sorted(graph.formats()["created"])


def warn_unbuilt_formats(loader: Any) -> None:
    """Warn when a graphtrainer loader's sampling reads a format of its graph that is not built
    (in ranks launched from a prepared graph)."""
    if callable(getattr(loader, "sampled_formats", None)) and getattr(loader, "graph", None) is not None:
        warn_if_missing(loader.graph, loader.sampled_formats(), type(loader).__name__)


def warn_if_missing(graph: Any, needed: Iterable[str], what: str) -> None:
    """Warn once per graph and format when ``needed`` is not built on ``graph``: sampling
    will build it here, in this process alone, a private copy in every rank."""
    created = set(graph.formats()["created"])
    for fmt in needed:
        key = (id(graph), fmt)
        if fmt in created or key in _warned:
            continue
        _warned.add(key)
        warnings.warn(
            f"{what} reads the graph's {fmt.upper()} format, which was not built before the ranks "
            f"started: each rank now builds its own private copy (about the size of the edge list). "
            f"Set graph_formats = {tuple(sorted(created | {fmt}))!r} on the task (or pass the sampler "
            "as a task attribute) so that it is built once and shared.", UserWarning, stacklevel=3)
