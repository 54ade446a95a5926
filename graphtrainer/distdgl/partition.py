"""Partitioning a graph for DistDGL (the command line is :mod:`graphtrainer.cli.partition`).

    python -m graphtrainer.cli.partition --dataset cora --parts 2 --out parts/
    python -m graphtrainer.cli.partition --graph g.bin --parts 4 --out parts/ --features feat,label

Wraps ``dgl.distributed.partition_graph`` (METIS or random, halo nodes up to ``--halo-hops``
away) and writes, in the output folder:

- ``<name>.json`` and ``part<i>/``: DGL's config and parts, renumbered so each part's inner
  nodes (edges) form one contiguous id range: the *partition ids*.
- ``<name>.orig_ids.pt``: ``{"nodes": t, "edges": t}``, ``t[i]`` the original id of
  partition id ``i`` (:func:`load_orig_ids`).
- ``<name>.meta.json``: sizes, per-part rows, edge cut, node data shapes and dtypes,
  ``num_classes`` (when ``label`` is kept) and split sizes (:func:`read_meta`).

Node data kept: the ``features`` asked for (default all) plus every ``*_mask`` and the train
mask; edge data whole. With METIS and ``balance_train`` (default) the train mask is balanced
as a node type, so parts get similar numbers of training nodes.

The edge cut counts stored edges (both directions of an undirected edge) whose endpoints lie
in different parts. DGL's "edge cuts" line says 0 with halo hops >= 1 (every edge is inner in
its destination's part); METIS's log counts each symmetrised pair once (Cora, 2 parts: 336
there, 672 here).
"""
from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import numbers
import os
import pathlib
import shutil
import sys
import time
from typing import Any, Dict, List, Optional, Sequence, Union

import torch

os.environ.setdefault("DGLBACKEND", "pytorch")
import dgl  # noqa: E402

__all__ = ["METHODS", "PartRow", "PartitionSummary", "partition_graph", "read_meta", "load_orig_ids"]

METHODS = ("metis", "random")
# Names DGL skips when it saves node/edge data (partition.py: `if name in [NID, "inner_node"]`).
_DGL_SKIPPED_NDATA = (dgl.NID, "inner_node")
_DGL_SKIPPED_EDATA = (dgl.EID, "inner_edge")

PathLike = Union[str, os.PathLike]


@dataclasses.dataclass(frozen=True)
class PartRow:
    """One part: owned nodes, halo nodes, owned edges (inner nodes' in-edges), owned training
    nodes (None without a train mask), bytes on disk."""
    inner_nodes: int
    halo_nodes: int
    inner_edges: int
    train_nodes: Optional[int]
    bytes: int


@dataclasses.dataclass(frozen=True)
class PartitionSummary:
    """What :func:`partition_graph` wrote."""
    config: pathlib.Path
    name: str
    num_nodes: int
    num_edges: int
    parts: int
    method: str
    halo_hops: int
    balance_train: bool  # whether METIS balanced train nodes (never with random or 1 part)
    edge_cuts: int
    rows: List[PartRow]
    seconds: float
    dgl_log: str  # DGL's prints while partitioning, kept out of the table

    @property
    def cut_fraction(self) -> float:
        return self.edge_cuts / self.num_edges if self.num_edges else 0.0

    def table(self) -> str:
        """The plain-text table the command line prints (without the time line)."""
        balance = ", train-balanced" if self.balance_train else ""
        lines = [f"{self.name}: {self.num_nodes} nodes, {self.num_edges} edges -> {self.parts} parts "
                 f"({self.method}{balance}, halo hops {self.halo_hops})",
                 f"{'part':>4} {'inner nodes':>11} {'halo nodes':>10} {'inner edges':>11} "
                 f"{'train nodes':>11} {'MB on disk':>10}"]
        for i, r in enumerate(self.rows):
            train = "-" if r.train_nodes is None else str(r.train_nodes)
            lines.append(f"{i:>4} {r.inner_nodes:>11} {r.halo_nodes:>10} {r.inner_edges:>11} "
                         f"{train:>11} {r.bytes / 1e6:>10.1f}")
        lines.append(f"edge cut: {self.edge_cuts} of {self.num_edges} edges ({100 * self.cut_fraction:.2f}%), "
                     "each direction counted")
        lines.append(f"config: {self.config}")
        return "\n".join(lines)


def partition_graph(graph: dgl.DGLGraph, name: str, parts: int, out: PathLike, *, method: str = "metis",
                    halo_hops: int = 1, balance_train: bool = True, train_mask: str = "train_mask",
                    features: Optional[Sequence[str]] = None, overwrite: bool = False) -> PartitionSummary:
    """Partition a homogeneous ``graph`` into ``parts`` parts under ``out`` (see the module doc).

    ``balance_train`` applies to METIS with 2 parts or more. ``random`` draws from DGL's
    generator (``dgl.seed`` makes it repeatable). The graph is not modified. Raises
    ``ValueError`` naming the problem and the fix, before DGL runs, for a bad graph, argument,
    feature key, train mask or output folder (one holding ``<name>.json``, unless
    ``overwrite``, or another partition's ``part<i>/``); and when DGL fails to split because
    a part would own no node or no edge. Long because each refusal comes before DGL runs.
    """
    start = time.perf_counter()
    out = pathlib.Path(out)
    if not graph.is_homogeneous:
        raise ValueError(f"graph has node types {graph.ntypes} and edge types {graph.canonical_etypes}: "
                         "only homogeneous graphs are partitioned here; convert with dgl.to_homogeneous")
    _check_name(name)
    if method not in METHODS:
        raise ValueError(f"method {method!r} is unknown: use one of {', '.join(METHODS)}")
    n = graph.num_nodes()
    if isinstance(parts, bool) or not isinstance(parts, numbers.Integral) or parts < 1:
        raise ValueError(f"parts={parts!r}: give a whole number of parts, at least 1")
    parts = int(parts)
    if parts > n:
        raise ValueError(f"parts={parts} is more than the graph's {n} nodes: every part needs a node; "
                         f"use at most {n} parts")
    if isinstance(halo_hops, bool) or not isinstance(halo_hops, numbers.Integral) or halo_hops < 1:
        raise ValueError(f"halo_hops={halo_hops!r}: DistDGL needs at least 1 hop of halo nodes; "
                         "give a whole number >= 1")
    halo_hops = int(halo_hops)
    if graph.num_edges() == 0:
        raise ValueError("the graph has no edges: DGL cannot partition it; give a graph with edges")
    keys = _kept_ndata(graph, features, train_mask)
    balance = balance_train and method == "metis" and parts > 1
    train = _train_mask(graph, train_mask, required=balance)
    config = out / f"{name}.json"
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file; give a folder (it is created if missing)")
    if config.exists():
        if not overwrite:
            raise ValueError(f"{config} already exists: pick another --name or --out, or pass --overwrite "
                             "(overwrite=True) to replace that partition")
        _remove_partition(config)
    # DGL names part folders part<i> whatever the graph's name: another partition's would be mixed in.
    taken = [p.name for p in (out / f"part{i}" for i in range(parts)) if p.exists()]
    if taken:
        raise ValueError(f"{out} already holds {', '.join(taken)} from another partition (DGL names part "
                         "folders part<i> whatever --name is): give an empty or new --out folder")

    # A copy with the kept data, int64 ids (METIS) and COO (partition_graph): the caller's graph stays.
    src, dst = graph.edges()
    work = dgl.graph((src.long(), dst.long()), num_nodes=n)
    for key in keys:
        work.ndata[key] = graph.ndata[key]
    for key, value in graph.edata.items():
        if key not in _DGL_SKIPPED_EDATA:
            work.edata[key] = value

    log = io.StringIO()
    try:
        with contextlib.redirect_stdout(log):  # DGL's timing prints; its C++ log goes to stderr as is
            orig_nids, orig_eids = dgl.distributed.partition_graph(
                work, name, parts, str(out), num_hops=halo_hops, part_method=method,
                balance_ntypes=train if balance else None, return_mapping=True)
    except (IndexError, dgl.DGLError) as err:
        sys.stderr.write(log.getvalue())  # what DGL said before failing
        # DGL 2.1 fails so (empty max(), null subgraph) before writing when a part owns no node or edge.
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ValueError(f"DGL could not split {name!r} ({n} nodes, {graph.num_edges()} edges) into {parts} "
                         f"parts ({type(err).__name__}: {first}); most likely a part owns no node or no "
                         "edge: use fewer parts") from err
    except BaseException:
        sys.stderr.write(log.getvalue())
        raise
    torch.save({"nodes": orig_nids, "edges": orig_eids}, out / f"{name}.orig_ids.pt")

    with open(config) as fh:
        ranges = json.load(fh)["node_map"]["_N"]  # [start, end) of each part's partition ids
    assign = torch.empty(n, dtype=torch.int64)
    for i, (lo, hi) in enumerate(ranges):
        assign[orig_nids[lo:hi]] = i
    cuts = int((assign[src.long()] != assign[dst.long()]).sum())
    rows = [_part_row(out / f"part{i}", orig_nids[lo:hi], train) for i, (lo, hi) in enumerate(ranges)]
    summary = PartitionSummary(config=config.resolve(), name=name, num_nodes=n, num_edges=graph.num_edges(),
                               parts=parts, method=method, halo_hops=halo_hops, balance_train=balance,
                               edge_cuts=cuts, rows=rows, seconds=time.perf_counter() - start,
                               dgl_log=log.getvalue())
    _write_meta(out / f"{name}.meta.json", summary, work, train_mask)
    return summary


def read_meta(part_config: PathLike) -> Dict[str, Any]:
    """The ``<name>.meta.json`` next to the DGL config ``<name>.json`` made by this module;
    ``FileNotFoundError`` naming the missing file otherwise."""
    with open(_sibling(pathlib.Path(part_config), ".meta.json")) as fh:
        return json.load(fh)


def load_orig_ids(part_config: PathLike) -> Dict[str, torch.Tensor]:
    """``{"nodes": t, "edges": t}``: ``t[i]`` is the original id of partition id ``i``."""
    path = _sibling(pathlib.Path(part_config), ".orig_ids.pt")
    return torch.load(path, map_location="cpu", weights_only=True)


def to_partition_ids(part_config: PathLike, ids: torch.Tensor, kind: str = "nodes") -> torch.Tensor:
    """Original node (or edge, ``kind="edges"``) ids as the ``DistGraph`` numbers them
    (partitioning renumbers so that each part's ids are contiguous)."""
    orig = load_orig_ids(part_config)[kind]
    inverse = torch.empty_like(orig)
    inverse[orig] = torch.arange(orig.numel(), dtype=orig.dtype)
    return inverse[torch.as_tensor(ids, dtype=torch.int64)]


def _sibling(config: pathlib.Path, suffix: str) -> pathlib.Path:
    if not config.is_file():
        raise FileNotFoundError(f"partition config not found: {config} (give the <name>.json that "
                                "python -m graphtrainer.cli.partition wrote)")
    name = config.name[:-len(".json")] if config.name.endswith(".json") else config.stem
    path = config.with_name(name + suffix)
    if not path.is_file():
        raise FileNotFoundError(f"{config.parent} was not made by graphtrainer.cli.partition: {path.name} is "
                                f"missing next to {config.name}; partition again with "
                                "python -m graphtrainer.cli.partition")
    return path


def _check_name(name: str) -> None:
    if not isinstance(name, str) or not name or name in (".", "..") or "/" in name or os.sep in name:
        raise ValueError(f"name {name!r}: give a plain file name (no folder), e.g. the dataset's name")


def _kept_ndata(graph: dgl.DGLGraph, features: Optional[Sequence[str]], train_mask: str) -> List[str]:
    present = [k for k in graph.ndata.keys() if k not in _DGL_SKIPPED_NDATA]
    if features is None:
        return present
    features = [features] if isinstance(features, str) else list(features)
    missing = [k for k in features if k not in present]
    if missing:
        raise ValueError(f"node data key(s) {', '.join(map(repr, missing))} not in the graph; its keys are: "
                         f"{', '.join(sorted(present)) or '(none)'}")
    always = [k for k in present if k.endswith("_mask") or k == train_mask]
    return list(dict.fromkeys([*features, *always]))


def _train_mask(graph: dgl.DGLGraph, key: str, required: bool) -> Optional[torch.Tensor]:
    """The train mask as bool ``[N]``; None when absent and not required."""
    if key not in graph.ndata:
        if not required:
            return None
        keys = ", ".join(sorted(graph.ndata.keys())) or "(none)"
        raise ValueError(f"train mask {key!r} not in the graph's node data (keys: {keys}); name it with "
                         "--train-mask KEY, or pass --no-balance-train (balance_train=False) to partition "
                         "without balancing training nodes")
    mask = graph.ndata[key]
    if mask.dim() != 1 or not bool(((mask == 0) | (mask == 1)).all()):
        if not required:
            return None  # only the table's train column is lost
        raise ValueError(f"train mask {key!r} has shape {tuple(mask.shape)} and dtype {mask.dtype}: it must "
                         "be one 0/1 value per node; name another with --train-mask KEY, or pass "
                         "--no-balance-train")
    return mask.bool()


def _remove_partition(config: pathlib.Path) -> None:
    """Remove what an earlier run wrote under that name: its part folders (as its config
    names them, so a run with more parts leaves none behind) and our two files."""
    folder = config.parent.resolve()
    try:
        with open(config) as fh:
            old = json.load(fh)
        part_dirs = {(folder / v["part_graph"]).parent for k, v in old.items() if k.startswith("part-")}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        part_dirs = set()
    for path in part_dirs:
        if path.resolve().parent == folder and path.is_dir():  # never outside the output folder
            shutil.rmtree(path)
    name = config.name[:-len(".json")]
    for suffix in (".json", ".meta.json", ".orig_ids.pt"):
        (folder / (name + suffix)).unlink(missing_ok=True)


def _part_row(folder: pathlib.Path, inner_orig: torch.Tensor, train: Optional[torch.Tensor]) -> PartRow:
    # The part graph as written (not DGL's prints): inner_node / inner_edge flag what it owns.
    (g,), _ = dgl.load_graphs(str(folder / "graph.dgl"))
    inner = int(g.ndata["inner_node"].bool().sum())
    return PartRow(inner_nodes=inner, halo_nodes=g.num_nodes() - inner,
                   inner_edges=int(g.edata["inner_edge"].bool().sum()),
                   train_nodes=None if train is None else int(train[inner_orig].sum()),
                   bytes=sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()))


def _write_meta(path: pathlib.Path, s: PartitionSummary, work: dgl.DGLGraph, train_mask: str) -> None:
    ndata = {k: {"shape": list(v.shape[1:]), "dtype": str(v.dtype).replace("torch.", "")}
             for k, v in work.ndata.items()}
    meta: Dict[str, Any] = {
        "name": s.name, "num_nodes": s.num_nodes, "num_edges": s.num_edges, "num_parts": s.parts,
        "method": s.method, "halo_hops": s.halo_hops, "balance_train": s.balance_train,
        "train_mask": train_mask if train_mask in work.ndata else None,
        "edge_cuts": s.edge_cuts, "parts": [dataclasses.asdict(r) for r in s.rows], "ndata": ndata,
        "dgl_version": dgl.__version__,
    }
    # Sizes, so a cut copy is refused before servers load it (DGL zero-fills a cut file's rows silently).
    meta["files"] = {f.relative_to(path.parent).as_posix(): f.stat().st_size
                     for i in range(s.parts) for f in sorted((path.parent / f"part{i}").rglob("*")) if f.is_file()}
    if "label" in work.ndata:
        meta["num_classes"] = int(work.ndata["label"].max()) + 1 if s.num_nodes else 0
    # Count of nodes per split; a [N, k] mask (several splits) gives one count per column.
    meta["splits"] = {k: (v.bool().sum(0).tolist() if v.dim() > 1 else int(v.bool().sum()))
                      for k, v in work.ndata.items() if k.endswith("_mask")}
    path.write_text(json.dumps(meta, indent=1) + "\n")
