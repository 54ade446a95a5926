"""Graph-classification datasets: DGL's generated MiniGC, and TU-format text files."""
from __future__ import annotations

import pathlib

import torch

import dgl
import dgl.data

from ._checks import PathLike, _check_int


def minigc(num_graphs: int = 1000, min_nodes: int = 10, max_nodes: int = 20, seed: int = 0) -> list:
    """DGL's ``MiniGCDataset`` (8 synthetic graph families, generated here, no download) as
    a list of ``(graph, label)``; each graph gets self-loops and ``ndata["feat"]``, its
    in-degree as a float column ``[N, 1]`` (the families differ in degree structure)."""
    _check_int("num_graphs", num_graphs, 1)
    if min_nodes < 10:
        raise ValueError(f"min_nodes={min_nodes}: MiniGCDataset needs at least 10 nodes per graph")
    # Always generated here: nothing read from or written to ~/.dgl (a cache other processes
    # could race on). Generation seeds numpy's global RNG with `seed`.
    ds = dgl.data.MiniGCDataset(num_graphs, min_nodes, max_nodes, seed=seed, save_graph=False,
                                 force_reload=True)
    out = []
    for i in range(len(ds)):
        g, label = ds[i]
        g = dgl.add_self_loop(g)
        g.ndata["feat"] = g.in_degrees().float().unsqueeze(1)
        out.append((g, torch.as_tensor(label, dtype=torch.int64)))
    return out


def read_tu(folder: PathLike, name: str) -> list:
    """A graph-classification dataset in the TU text format, as a list of ``(graph, label)``.

    Reads ``<name>_A.txt`` (``"i, j"`` edges, 1-based node ids over the dataset, kept as
    listed), ``_graph_indicator.txt`` (each node's 1-based graph), ``_graph_labels.txt``
    (mapped to ``0..C-1`` sorted) and, if present, ``_node_attributes.txt`` (floats per node
    → ``ndata["feat"]``; else ``feat`` is the in-degree, ``[N, 1]``).
    """
    folder = pathlib.Path(folder)
    files = {k: folder / f"{name}_{k}.txt" for k in ("A", "graph_indicator", "graph_labels")}
    for path in files.values():
        if not path.is_file():
            raise FileNotFoundError(f"TU dataset {name!r}: {path} is missing (needs {name}_A.txt, "
                                    f"{name}_graph_indicator.txt and {name}_graph_labels.txt)")

    def rows(path: pathlib.Path) -> list:
        with open(path) as f:
            return [[float(x) for x in line.replace(",", " ").split()] for line in f if line.strip()]

    indicator = torch.tensor([int(r[0]) for r in rows(files["graph_indicator"])], dtype=torch.int64) - 1
    raw_labels = [r[0] for r in rows(files["graph_labels"])]
    num_graphs = len(raw_labels)
    if num_graphs == 0:
        raise ValueError(f"TU dataset {name!r}: {files['graph_labels']} lists no graphs")
    if indicator.numel() == 0 or int(indicator.min()) < 0 or int(indicator.max()) >= num_graphs:
        raise ValueError(f"TU dataset {name!r}: graph ids in {files['graph_indicator']} must lie in "
                         f"[1, {num_graphs}]")
    edges = torch.tensor(rows(files["A"]), dtype=torch.int64).reshape(-1, 2) - 1
    num_nodes = indicator.numel()
    if edges.numel() and (int(edges.min()) < 0 or int(edges.max()) >= num_nodes):
        raise ValueError(f"TU dataset {name!r}: node ids in {files['A']} must lie in [1, {num_nodes}]")
    attr_path = folder / f"{name}_node_attributes.txt"
    feat = torch.tensor(rows(attr_path), dtype=torch.float32) if attr_path.is_file() else None
    if feat is not None and feat.shape[0] != num_nodes:
        raise ValueError(f"TU dataset {name!r}: {attr_path} has {feat.shape[0]} rows for {num_nodes} nodes")
    classes = {v: i for i, v in enumerate(sorted(set(raw_labels)))}
    labels = torch.tensor([classes[v] for v in raw_labels], dtype=torch.int64)
    if edges.numel() and bool((indicator[edges[:, 0]] != indicator[edges[:, 1]]).any()):
        raise ValueError(f"TU dataset {name!r}: an edge in {files['A']} joins two different graphs")
    if bool((indicator[1:] < indicator[:-1]).any()):
        raise ValueError(f"TU dataset {name!r}: {files['graph_indicator']} must list each graph's nodes "
                         "together, graphs in ascending order (as the TU format does)")
    # Nodes of a graph are contiguous in the TU format; first node id of each graph:
    counts = torch.bincount(indicator, minlength=num_graphs)
    first = torch.cumsum(counts, 0) - counts
    edge_graph = indicator[edges[:, 0]] if edges.numel() else torch.zeros(0, dtype=torch.int64)
    out = []
    for gi in range(num_graphs):
        e = edges[edge_graph == gi] - first[gi]
        g = dgl.graph((e[:, 0], e[:, 1]), num_nodes=int(counts[gi]))
        nodes = slice(int(first[gi]), int(first[gi] + counts[gi]))
        g.ndata["feat"] = feat[nodes] if feat is not None else g.in_degrees().float().unsqueeze(1)
        out.append((g, labels[gi]))
    return out
