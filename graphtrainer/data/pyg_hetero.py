"""``batch_format="pyg"`` on a heterograph: a node loader's batches as PyG's ``HeteroData``
(:mod:`graphtrainer.nn.pyg_hetero`), as ``NeighborLoader(hetero_data, num_neighbors=...,
input_nodes=(ntype, ids))`` yields them; the checks before any batch.

PyG samples from one seed type: the ids are ``{ntype: ids}`` with one type. Link batches
(``LinkNeighborLoader`` on a ``HeteroData``) are not built: refused, naming DGL's batches.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence, Tuple

import torch

from ..nn.pyg import PYG_KEYS
from ..nn.pyg_hetero import blocks_to_hetero_pyg


#: A ``HeteroData`` given as the graph: the conversion, once (the by-hand line is kept working by a test).
HETERODATA_REFUSAL = (
    "the graph is a torch_geometric HeteroData: graphtrainer's loaders sample a DGL graph, and batch_format='pyg' "
    "gives HeteroData batches from a DGL heterograph. Convert it once: g = torch_geometric.utils.to_dgl(data) (it "
    "keeps PyG's names, which the batches read: x, y, edge_attr; it counts each node type's nodes from its edges, so "
    "where a type has nodes past the last one an edge reaches, build it by hand: g = dgl.heterograph({et: "
    "tuple(data[et].edge_index) for et in data.edge_types}, num_nodes_dict={t: data[t].num_nodes for t in "
    "data.node_types}), then copy the data, g.nodes[t].data['x'] = data[t].x and g.edges[et].data['edge_attr'] = "
    "data[et].edge_attr)")


def is_heterograph(graph: Any) -> bool:
    """Several node types or several relations (a DGL graph, or anything with those names)."""
    return len(getattr(graph, "ntypes", None) or []) > 1 or len(getattr(graph, "canonical_etypes", None) or []) > 1


def check_hetero_loader(loader: Any) -> str:
    """The seed type of a heterograph's loader asking for PyG batches, or a ``ValueError``
    naming the fix: a link loader, or seeds of several types."""
    graph = loader.graph
    if hasattr(loader, "pairs"):
        raise ValueError(f"batch_format='pyg' on a heterograph (node types {list(graph.ntypes)}) builds node batches "
                         "only (PyG's NeighborLoader on a HeteroData); link batches (LinkNeighborLoader on a "
                         "HeteroData) are not built here. Fix: keep DGL's batches for the edge loader "
                         "(batch_format='dgl', pair graphs per relation) with graphtrainer.nn.HeteroGraphConv")
    typed = getattr(loader, "typed", None)
    types = list(typed) if isinstance(typed, dict) else []
    if len(types) != 1:
        raise ValueError(f"batch_format='pyg' on a heterograph takes seeds of one node type, as PyG's NeighborLoader "
                         f"(input_nodes=(ntype, ids)); got {types or 'no typed ids'}. Fix: one loader per type, "
                         f"ids={{{(types or list(graph.ntypes))[0]!r}: ids}}, or DGL's batches "
                         "(batch_format='dgl'), which take several types")
    return types[0]


def _first_present(field: str, views: Any) -> str:
    names = PYG_KEYS[field]
    return next((k for k in names if any(k in v for v in views)), names[0])


def resolve_hetero_keys(graph: Any, seed_type: str, feat_key: Optional[str], label_key: Optional[str],
                        edge_key: Optional[str]) -> Tuple[str, str, str]:
    """The data a heterograph's PyG batch reads as ``x`` (each node type having it), ``y`` (the
    seed type's) and ``edge_attr`` (each relation having it): the keys named, else ``feat`` where a
    node type has it, else ``x``; ``label``, else ``y``; edge data ``feat``, else ``edge_attr``."""
    nodes = [graph.nodes[nt].data for nt in graph.ntypes]
    edges = [graph.edges[et].data for et in graph.canonical_etypes]
    return (_first_present("x", nodes) if feat_key is None else feat_key,
            _first_present("y", [graph.nodes[seed_type].data]) if label_key is None else label_key,
            _first_present("edge_attr", edges) if edge_key is None else edge_key)


class HeteroBatches:
    """Turns a heterograph's node batches into ``HeteroData`` with ``input_id``: each seed's place
    in the loader's ids of the seed type (the first place, for an id given twice), carrying the
    other node and edge data ``attrs`` names (where a type has it; ``None``: all, each type's own)."""

    def __init__(self, loader: Any, seed_type: str, keys: Tuple[str, str, str],
                 attrs: Optional[Sequence[str]] = ()):
        self.seed_type, self.keys, self.attrs = seed_type, keys, None if attrs is None else tuple(attrs)
        ids = loader.typed[seed_type]
        self.order = torch.argsort(ids, stable=True)
        self.sorted = ids[self.order]

    def input_id(self, seeds: torch.Tensor) -> torch.Tensor:
        if self.sorted.device != seeds.device:  # sampled on the device: the table moves once
            self.order, self.sorted = self.order.to(seeds.device), self.sorted.to(seeds.device)
        return self.order[torch.searchsorted(self.sorted, seeds.long())]

    def __call__(self, batch: Any) -> Any:
        _, seeds, blocks = batch
        return blocks_to_hetero_pyg(blocks, *self.keys, seed_type=self.seed_type,
                                    input_id=self.input_id(seeds[self.seed_type]), attrs=self.attrs)
