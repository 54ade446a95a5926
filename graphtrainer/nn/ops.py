"""Message passing in plain torch over in-edges (CSC), for DGL and torch graphs: neighbour
sums, means and maxima, degrees, edge softmax. Unweighted sums are one ``torch.sparse`` CSR
product; weighted sums and maxima gather a row per edge and reduce by destination."""
from __future__ import annotations

import warnings
from typing import Any, Callable, Optional, Tuple, Union

import torch

from .blocks import TorchBlock, TorchHeteroBlock
from .convert import csc_tensors, is_dgl_graph


class Structure:
    """A graph's in-edges: ``indptr`` over destinations, ``indices`` (sources), ``edge_ids``
    (the graph's id of each CSC position), node counts, whether it is a block, and ``dst``:
    the destination of each CSC position (int64: scatter indices must be), made on first use
    (a sum by sparse product needs none, and on a GPU each kernel not launched counts)."""

    __slots__ = ("indptr", "indices", "edge_ids", "num_src", "num_dst", "is_block", "_dst")

    def __init__(self, indptr: torch.Tensor, indices: torch.Tensor, edge_ids: torch.Tensor, num_src: int,
                 num_dst: int, is_block: bool, dst: Union[torch.Tensor, Callable[[], torch.Tensor]]):
        self.indptr, self.indices, self.edge_ids = indptr, indices, edge_ids
        self.num_src, self.num_dst, self.is_block = num_src, num_dst, is_block
        self._dst = dst

    @property
    def dst(self) -> torch.Tensor:
        if callable(self._dst):
            self._dst = self._dst()
        return self._dst

    @property
    def num_edges(self) -> int:
        return int(self.indices.numel())

    def in_degrees(self) -> torch.Tensor:
        return self.indptr[1:] - self.indptr[:-1]

    def out_degrees(self) -> torch.Tensor:
        return torch.bincount(self.indices, minlength=self.num_src)

    def to_csc_order(self, edge_values: torch.Tensor) -> torch.Tensor:
        """Per-edge values given in edge-id order (DGL's ``edata`` order), in CSC order."""
        if edge_values.shape[0] != self.num_edges:
            raise ValueError(f"edge values have {edge_values.shape[0]} rows; the graph has {self.num_edges} edges")
        return edge_values[self.edge_ids]

    def to_edge_order(self, csc_values: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(csc_values)
        out[self.edge_ids] = csc_values
        return out


def structure(graph: Any, layer: str) -> Structure:
    """The in-edges of a one-relation DGL graph/block or :class:`TorchBlock`; a clear error
    naming ``layer`` for anything else."""
    if isinstance(graph, TorchBlock):
        return Structure(graph.indptr, graph.indices, graph.edge_ids, graph.num_src, graph.num_dst,
                         graph.is_block, graph.dst_index)
    if isinstance(graph, TorchHeteroBlock) or (is_dgl_graph(graph) and len(graph.canonical_etypes) > 1):
        raise ValueError(f"{layer} got a graph with relations {list(graph.canonical_etypes)}: one layer handles "
                         "one relation; wrap one layer per relation in graphtrainer.nn.HeteroGraphConv")
    if not is_dgl_graph(graph):
        raise TypeError(f"{layer} expects a DGL graph/block or a graphtrainer.nn.TorchBlock, got "
                        f"{type(graph).__name__}")
    indptr, indices, eids = csc_tensors(graph, layer=layer)
    etype = graph.canonical_etypes[0]
    if graph.is_block:
        num_src, num_dst = graph.num_src_nodes(), graph.num_dst_nodes()
    else:
        num_src, num_dst = graph.num_nodes(etype[0]), graph.num_nodes(etype[2])

    def dst() -> torch.Tensor:
        return torch.repeat_interleave(torch.arange(num_dst, device=indices.device),
                                       (indptr[1:] - indptr[:-1]).long(), output_size=indices.numel())

    return Structure(indptr, indices, eids, num_src, num_dst, bool(graph.is_block), dst)


def _csr(s: Structure, dtype: torch.dtype) -> torch.Tensor:
    with warnings.catch_warnings():  # "sparse CSR support is in beta": it is what we use, on purpose
        warnings.simplefilter("ignore", UserWarning)
        values = torch.ones(s.num_edges, dtype=dtype, device=s.indices.device)
        return torch.sparse_csr_tensor(s.indptr, s.indices, values, size=(s.num_dst, s.num_src))


def neighbour_sum(s: Structure, x: torch.Tensor, edge_weight: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``out[v] = sum over in-edges (u, v) of w_e * x[u]``; ``edge_weight`` in CSC order,
    broadcast against ``x``'s rows. Destinations without in-edges get zeros."""
    if x.shape[0] != s.num_src:
        raise ValueError(f"features have {x.shape[0]} rows but the graph has {s.num_src} source nodes")
    tail = x.shape[1:]
    if s.num_edges == 0:
        return x.new_zeros((s.num_dst, *tail))
    if edge_weight is None and x.dtype in (torch.float32, torch.float64) and x.device.type in ("cpu", "cuda"):
        # Autocast would cast the product to bfloat16/float16, which sparse CSR kernels lack:
        # the aggregation stays in x's precision.
        with torch.autocast(x.device.type, enabled=False):
            return (_csr(s, x.dtype) @ x.reshape(s.num_src, -1)).reshape(s.num_dst, *tail)
    msg = x.index_select(0, s.indices)  # whole rows at once; x[idx] copies element by element
    if edge_weight is not None:
        msg = msg * edge_weight
    return msg.new_zeros((s.num_dst, *tail)).index_add_(0, s.dst, msg)


def neighbour_mean(s: Structure, x: torch.Tensor, edge_weight: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Mean over in-edges (zeros where there are none), as DGL's ``fn.mean``."""
    total = neighbour_sum(s, x, edge_weight)
    deg = s.in_degrees().clamp(min=1).to(total.dtype)
    return total / deg.reshape(-1, *([1] * (total.dim() - 1)))


def neighbour_max(s: Structure, x: torch.Tensor, edge_weight: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Maximum over in-edges (zeros where there are none), as DGL's ``fn.max``."""
    if x.shape[0] != s.num_src:
        raise ValueError(f"features have {x.shape[0]} rows but the graph has {s.num_src} source nodes")
    if s.num_edges == 0:
        return x.new_zeros((s.num_dst, *x.shape[1:]))
    msg = x.index_select(0, s.indices)
    if edge_weight is not None:
        msg = msg * edge_weight
    return segment_max(msg, s.dst, s.num_dst)


def segment_max(rows: torch.Tensor, segment: torch.Tensor, num_segments: int) -> torch.Tensor:
    """Per-segment maximum of ``rows`` (zeros for empty segments). Ties (a source reached by
    two parallel edges) share the gradient, so the source gets it once, as in DGL."""
    index = segment.reshape(-1, *([1] * (rows.dim() - 1))).expand_as(rows)
    return rows.new_zeros((num_segments, *rows.shape[1:])).scatter_reduce(0, index, rows, "amax",
                                                                         include_self=False)


def edge_softmax(s: Structure, logits: torch.Tensor) -> torch.Tensor:
    """Softmax of per-edge ``logits`` (CSC order, ``[E, ...]``) over each destination's in-edges."""
    if s.num_edges == 0:
        return logits
    shape = (s.num_dst, *logits.shape[1:])
    index = s.dst.reshape(-1, *([1] * (logits.dim() - 1))).expand_as(logits)
    # The maximum only keeps exp() finite; it cancels in the ratio, so no gradient flows through it.
    peak = logits.new_full(shape, float("-inf")).scatter_reduce(0, index, logits.detach(), "amax")
    e = torch.exp(logits - peak.index_select(0, s.dst))
    total = e.new_zeros(shape).index_add_(0, s.dst, e)
    return e / total.index_select(0, s.dst)


def check_in_degrees(s: Structure, layer: str, allowed: bool) -> None:
    """DGL's refusal of destinations without in-edges (their output would be only the bias)."""
    if not allowed and s.num_dst and bool((s.in_degrees() == 0).any()):
        raise ValueError(
            f"{layer}: there are 0-in-degree nodes in the graph, whose output would be invalid (as DGL refuses "
            "them too). Fix: add self-loops to the graph (g = dgl.add_self_loop(g)), or construct the layer with "
            "allow_zero_in_degree=True to accept them.")


def split_features(s: Structure, feat: Any) -> Tuple[torch.Tensor, torch.Tensor, bool]:
    """``(src, dst, given_as_pair)`` as DGL's ``expand_as_pair``: a pair is taken as it is; a
    block's destination features are the first ``num_dst`` source rows."""
    if isinstance(feat, (tuple, list)):
        return feat[0], feat[1], True
    return feat, (feat[:s.num_dst] if s.is_block else feat), False
