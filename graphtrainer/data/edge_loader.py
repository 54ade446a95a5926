"""Link-prediction minibatches over this rank's share of seed edges.

:class:`EdgeLoader` splits edge ids (or positions in a list of node pairs) as
:class:`~graphtrainer.data.node_loader.NodeLoader` splits node ids, and samples with DGL's
``as_edge_prediction_sampler``. The ``j``-th negative of an edge (:class:`PerEdgeUniform`) is a
hash of ``(seed, epoch, edge, j)``: the same whatever the batch, rank or number of ranks.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Dict, Iterator, Optional, Set, Tuple, Union

import torch

from .formats import sampler_formats
from .hetero import check_typed_eids, flatten, type_spans
from .negative_draws import NodeWeights, check_amount, kept_draws
from .node_loader import SampledLoader, default_sampler, iterate_sampled, unfused_if_zero
from .prefetch import per_type_prefetch
from .sharding import check_seed_ids
from .workers import BatchSampling

EXCLUDE_MODES = (None, "self", "reverse_id", "reverse_types")

_P = 2147483647  # 2**31 - 1: products of two residues stay below 2**62 (no int64 overflow)


def _mix(x: torch.Tensor) -> torch.Tensor:
    for _ in range(2):
        x = x ^ (x >> 13)
        x = (x * 1103515245 + 12345) % _P
    return x


def edge_hash(seed: int, epoch: int, keys: torch.Tensor, num: int) -> torch.Tensor:
    """``[len(keys), num]`` pseudo-random non-negative int64, a pure function of ``(seed, epoch,
    key, j)``, on ``keys``' device."""
    base = _mix(torch.tensor([(int(seed) * 1_000_003 + int(epoch)) % _P], dtype=torch.int64, device=keys.device))
    h = _mix((keys.to(torch.int64) % _P) ^ base)
    j = torch.arange(num, dtype=torch.int64, device=keys.device)
    return _mix((h.unsqueeze(1) * 31 + j.unsqueeze(0) + 1) % _P)


class PerEdgeUniform:
    """DGL negative sampler: ``k`` negatives ``(u, w)`` per positive edge ``(u, v)``, ``w`` uniform
    over the nodes, reproducible from ``(seed, epoch, edge id)``; the loader sets :attr:`seed` and
    :attr:`epoch`. With :attr:`random_sources` (PyG's binary negatives) ``u`` is drawn too. A
    fractional ``k`` (PyG's binary ratio) draws ``ceil(p * k)`` per batch of ``p`` edges;
    :attr:`src_weight`/:attr:`dst_weight` draw the ends by node weight (PyG's)."""

    def __init__(self, k: Union[int, float] = 1):
        self.amount = check_amount(k)
        self.k = math.ceil(self.amount)  # draws per edge; a fractional amount keeps some (kept_draws)
        self.seed = 0
        self.epoch = 0

    #: On a heterograph: each edge type's offset in the flat edge-id space (set by the loader),
    #: so that edges of two types with the same id get different negatives.
    offsets: Optional[Dict[Any, int]] = None
    #: Draw the source of each negative as well (``LinkNeighborLoader(neg_sampling="binary")``)
    #: instead of keeping the positive edge's (DGL's ``Uniform``, PyG's ``"triplet"``).
    random_sources: bool = False
    #: Node weights for the drawn sources and destinations (PyG's ``NegativeSampling``
    #: ``src_weight``/``dst_weight``); ``None``: uniform.
    src_weight: Optional[NodeWeights] = None
    dst_weight: Optional[NodeWeights] = None

    def __call__(self, g: Any, eids: Any) -> Any:
        if isinstance(eids, dict):  # heterograph: negatives of each type among its destination type
            out = {}
            for etype, ids in eids.items():
                etype = g.to_canonical_etype(etype)
                src, _ = g.find_edges(ids, etype=etype)
                offset = (self.offsets or {}).get(etype, 0)  # in int64: it may pass an int32 graph's ids
                out[etype] = self.draw(src, ids.long() + offset, g.num_nodes(etype[2]), g.num_nodes(etype[0]))
            return out
        src, _ = g.find_edges(eids)
        return self.draw(src, eids, g.num_nodes())

    def draw(self, src: torch.Tensor, keys: torch.Tensor, num_nodes: int,
             num_src_nodes: Optional[int] = None) -> Tuple[torch.Tensor, torch.Tensor]:
        """The negatives of the edges ``keys`` (one batch), edge by edge: ``(sources, destinations)``."""
        # int64 keys: the hash must not wrap around in an int32 graph's id type. Columns k..2k-1
        # (sources) are the same hash's further draws: destinations stay as without them.
        k = self.k
        drawn = edge_hash(self.seed, self.epoch, keys.long(), 2 * k if self.random_sources else k)
        dst = _ends(drawn[:, :k], num_nodes, self.dst_weight)
        if self.random_sources:
            near = _ends(drawn[:, k:], num_nodes if num_src_nodes is None else num_src_nodes, self.src_weight)
        else:
            near = src.unsqueeze(1).expand(-1, k)
        kept = kept_draws(keys.numel(), self.amount, keys.device)
        if kept is not None:
            return near[kept].to(src.dtype), dst[kept].to(src.dtype)
        return near.reshape(-1).to(src.dtype), dst.reshape(-1).to(src.dtype)


def _ends(drawn: torch.Tensor, num_nodes: int, weights: Optional[NodeWeights]) -> torch.Tensor:
    return drawn % num_nodes if weights is None else weights.pick(drawn, num_nodes)


def check_reverse_eids(graph: Any, reverse_eids: Any) -> torch.Tensor:
    """``reverse_eids`` as int64, or a ``ValueError``: one entry per edge, in range, and edge
    ``reverse_eids[e]`` must run from ``dst(e)`` to ``src(e)`` (DGL itself does not check)."""
    rev = torch.as_tensor(reverse_eids)
    m = graph.num_edges()
    if rev.dtype not in (torch.int64, torch.int32) or rev.dim() != 1 or rev.numel() != m:
        raise ValueError(f"reverse_eids: expected a 1-D integer tensor with one entry per edge ({m}), "
                         f"got dtype {rev.dtype} and shape {tuple(rev.shape)}")
    rev = rev.to(torch.int64)
    if m and (int(rev.min()) < 0 or int(rev.max()) >= m):
        raise ValueError(f"reverse_eids: ids must lie in [0, {m}), found min {int(rev.min())} "
                         f"and max {int(rev.max())}")
    src, dst = graph.edges()
    bad = ((src[rev] != dst) | (dst[rev] != src)).nonzero(as_tuple=True)[0]
    if bad.numel():
        e = int(bad[0])
        raise ValueError(f"reverse_eids: {bad.numel()} of {m} entries do not point at the reverse edge, "
                         f"e.g. edge {e} ({int(src[e])}->{int(dst[e])}) maps to edge {int(rev[e])} "
                         f"({int(src[rev[e]])}->{int(dst[rev[e]])}). Build them with "
                         "graphtrainer.datasets.link_split (or add reverse edges as the second half "
                         "of the edge list and use torch.cat([arange(m, 2m), arange(m)])).")
    return rev


def check_reverse_etypes(graph: Any, reverse_etypes: Dict[Any, Any]) -> Dict[Any, Any]:
    """``reverse_etypes`` with canonical types, or a ``ValueError``: edge ``e`` of a relation's reverse
    must run back along edge ``e`` of the relation, as ``exclude="reverse_types"`` assumes (DGL
    does not check; a wrong map takes unrelated edges out of the blocks)."""
    if not isinstance(reverse_etypes, dict):
        raise ValueError(f"reverse_etypes: expected {{etype: its reverse etype}}, got {type(reverse_etypes).__name__}")
    out = {}
    for a, b in reverse_etypes.items():
        try:
            et, rev = graph.to_canonical_etype(a), graph.to_canonical_etype(b)
        except Exception as exc:  # DGLError
            raise ValueError(f"reverse_etypes: {a!r} -> {b!r}: {str(exc).splitlines()[0]}; the graph has "
                             f"{graph.canonical_etypes}") from None
        if (rev[0], rev[2]) != (et[2], et[0]) or graph.num_edges(et) != graph.num_edges(rev):
            raise ValueError(f"reverse_etypes: {b!r} is not the reverse of {a!r}: {rev} against {et}, "
                             f"{graph.num_edges(rev)} edges against {graph.num_edges(et)} (the reverse relation "
                             "runs back from the destination type, edge e reversing edge e)")
        (u, v), (ru, rv) = graph.edges(etype=et), graph.edges(etype=rev)
        bad = ((u != rv) | (v != ru)).nonzero(as_tuple=True)[0]
        if bad.numel():
            e = int(bad[0])
            raise ValueError(f"reverse_etypes: edge {e} of {rev} ({int(ru[e])}->{int(rv[e])}) does not reverse "
                             f"edge {e} of {et} ({int(u[e])}->{int(v[e])}); {bad.numel()} of {u.numel()} differ. "
                             "Build the reverse relation from the same edge list: {rel: (u, v), rev: (v, u)}")
        out[et] = rev
    return out


def check_negatives(negatives: Any) -> Any:
    """``negatives`` as :class:`PerEdgeUniform` for a number (an int ``k``, or a float: PyG's binary
    ratio), a sampler or ``None`` as given, or a ``ValueError``."""
    if negatives is None or (callable(negatives) and not isinstance(negatives, (bool, int, float))):
        return negatives
    if isinstance(negatives, bool) or not isinstance(negatives, (int, float)) or not negatives > 0:
        raise ValueError(f"negatives={negatives!r}: give k, an int of 1 or more (k uniform negatives per edge; a "
                         "float is PyG's binary ratio: 0.5 draws one per two edges of a batch), a DGL negative "
                         "sampler, or None for no negative graph")
    return PerEdgeUniform(negatives)


class _CopiedExclusion:
    """DGL's exclusion for ``exclude``, computed on a copy of the seed edges: DGL's neighbour
    sampler sorts the excluded ids in place, and for "self" and "reverse_types" those are the
    tensors its pair graph holds as ``edata[EID]``, which then no longer match its edges (DGL 2.1)."""

    def __init__(self, graph: Any, exclude: str, reverse_eids: Any, reverse_etypes: Any):
        if reverse_eids is not None:  # in the graph's id type: DGL refuses int64 exclusions on an int32 graph
            reverse_eids = reverse_eids.to(graph.idtype)
        self.graph, self.exclude, self.reverse_eids, self.reverse_etypes = graph, exclude, reverse_eids, reverse_etypes

    def __call__(self, seed_edges: Any) -> Any:
        import dgl

        copied = {k: v.clone() for k, v in seed_edges.items()} if isinstance(seed_edges, dict) else seed_edges.clone()
        return dgl.dataloading.find_exclude_eids(self.graph, copied, self.exclude, self.reverse_eids,
                                                 self.reverse_etypes)


class _PairSampler:
    """``as_edge_prediction_sampler``'s work for node pairs that need not be edges (held-out
    evaluation edges)."""

    wraps_block_sampler = True  # its blocks are its sampler's (workers.without_data)

    @staticmethod
    def given(edges: Any) -> bool:
        """Whether ``edges`` are node pairs: ``(src, dst)``, or a ``[2, E]`` tensor (PyG's ``edge_label_index``)."""
        if isinstance(edges, torch.Tensor):
            return edges.dim() == 2 and edges.shape[0] == 2
        return isinstance(edges, (tuple, list)) and len(edges) == 2

    @staticmethod
    def check(edges: Any, n: int) -> Tuple[torch.Tensor, torch.Tensor]:
        """``(src, dst)`` node-id pairs, checked against ``n`` nodes."""
        src = check_seed_ids(edges[0], n, "edge_dataloader pairs (src)")
        dst = check_seed_ids(edges[1], n, "edge_dataloader pairs (dst)")
        if src.numel() != dst.numel():
            raise ValueError(f"edge_dataloader pairs: src has {src.numel()} nodes, dst {dst.numel()}")
        return src, dst

    def __init__(self, src: torch.Tensor, dst: torch.Tensor, sampler: Any, negatives: Optional[PerEdgeUniform]):
        self.src, self.dst, self.sampler, self.negatives = src, dst, sampler, negatives
        self.output_device = getattr(sampler, "output_device", None)

    def sample(self, g: Any, positions: torch.Tensor) -> Tuple[Any, ...]:
        import dgl  # here: the engine imports without DGL (plain-torch tasks)

        n = g.num_nodes()
        src, dst = self.src[positions], self.dst[positions]
        pair = dgl.graph((src, dst), num_nodes=n)
        if self.negatives is None:
            pair = dgl.compact_graphs(pair)
            input_nodes, _, blocks = self.sampler.sample(g, pair.ndata[dgl.NID])
            return input_nodes, pair, blocks
        nsrc, ndst = self.negatives.draw(src, positions, n)
        neg = dgl.graph((nsrc, ndst), num_nodes=n)
        pair, neg = dgl.compact_graphs([pair, neg])
        input_nodes, _, blocks = self.sampler.sample(g, pair.ndata[dgl.NID])
        return input_nodes, pair, neg, blocks


def _check_exclude(exclude: Optional[str], hetero: bool, reverse_eids: Any, reverse_etypes: Any) -> None:
    """A ``ValueError`` naming the fix when ``exclude`` does not fit the graph or lacks its ids."""
    if exclude not in EXCLUDE_MODES:
        raise ValueError(f"exclude={exclude!r}: choose one of {EXCLUDE_MODES}")
    if exclude == "reverse_id" and reverse_eids is None:
        raise ValueError('exclude="reverse_id" needs reverse_eids= (the id of each edge\'s reverse)')
    if exclude == "reverse_types" and (not hetero or reverse_etypes is None):
        raise ValueError('exclude="reverse_types" is for heterographs and needs reverse_etypes= '
                         '({etype: its reverse etype}, e.g. {"has": "in", "in": "has"})')
    if hetero and exclude == "reverse_id":
        raise ValueError('exclude="reverse_id" takes a homogeneous graph; on a heterograph use '
                         'exclude="reverse_types" with reverse_etypes={etype: reverse etype}')


class EdgeLoader(SampledLoader):
    """Link-prediction batches over this rank's share of seed edges.

    ``sampler``: a DGL block sampler, or a list of fanouts (``NeighborSampler`` prefetching
    ``feat``). ``edges``: edge ids (1-D integer tensor or edge mask), or node pairs, ``(src, dst)``
    or a ``[2, E]`` tensor (pairs need not be edges: held-out validation/test edges). ``negatives``:
    an int ``k`` (:class:`PerEdgeUniform`: new negatives each training epoch, the same at every
    evaluation; a float ``a``, PyG's binary ratio: ``ceil(p * a)`` per batch of ``p``), any DGL
    negative sampler (edge ids only), or ``None``. ``exclude``: ``None``, ``"self"`` or
    ``"reverse_id"`` (needs ``reverse_eids``; edge ids only) keeps the seed edges (and their
    reverses) out of the blocks.

    On a heterograph ``edges`` is ``{etype: eids}``: each type is split evenly as
    ``NodeLoader``'s node types, batches hold ``{canonical etype: eids}``, ``negatives=k`` draws
    among each type's destination type, and ``exclude="reverse_types"`` takes
    ``reverse_etypes={etype: reverse}``.

    Yields ``(input_nodes, pair_graph, neg_pair_graph, blocks)`` as DGL's edge loader, without
    ``neg_pair_graph`` when there are no negatives.
    """

    def __init__(self, graph: Any, edges: Any, sampler: Any, batch_size: int, *,
                 negatives: Union[int, float, Callable, None] = 1, exclude: Optional[str] = None,
                 reverse_eids: Any = None, shuffle: bool = True, drop_last: bool = False,
                 even: Optional[str] = None, seed: int = 0, reverse_etypes: Optional[Dict[Any, Any]] = None,
                 **dataloader_kwargs: Any):
        import dgl  # here: the engine imports without DGL (plain-torch tasks)

        if isinstance(sampler, (list, tuple)):
            sampler = default_sampler(graph, sampler, label_key="")
        sampler = unfused_if_zero(sampler)
        if not callable(getattr(sampler, "sample", None)):
            raise ValueError(f"edge_dataloader: sampler must be a DGL block sampler (e.g. NeighborSampler) or a "
                             f"list of fanouts, one per layer ({{etype: k}} per layer on a heterograph), got "
                             f"{type(sampler).__name__}")
        hetero = isinstance(edges, dict) or len(graph.canonical_etypes) > 1
        sampler = per_type_prefetch(sampler, graph)  # a flat list on a heterograph: DGL's per-type form
        _check_exclude(exclude, hetero, reverse_eids, reverse_etypes)
        n = graph.num_nodes()
        self.pairs: Optional[Tuple[torch.Tensor, torch.Tensor]] = None
        if hetero:
            self.typed = check_typed_eids(edges, graph, "edge_dataloader edge ids")
            self.spans = type_spans(self.typed, graph, edges=True)
            ids = flatten(self.typed, self.spans)
        elif _PairSampler.given(edges):
            if exclude is not None:
                raise ValueError("exclude= takes edge ids of the graph, not node pairs. Pairs that are edges of "
                                 "the graph (PyG's training edge_label_index usually is) can be passed as ids: "
                                 "graph.edge_ids(src, dst), with exclude='self', or exclude='reverse_id' and "
                                 "reverse_eids=graph.edge_ids(v, u) for (u, v) = graph.edges(); held-out pairs "
                                 "that are not edges: exclude=None")
            self.pairs = _PairSampler.check(edges, n)
            ids = torch.arange(self.pairs[0].numel())
        else:
            if isinstance(edges, torch.Tensor) and edges.dim() == 2 and edges.shape[1] == 2:
                raise ValueError(f"edge_dataloader: node pairs go as a [2, E] tensor (PyG's edge_label_index) or "
                                 f"(src, dst); got shape {tuple(edges.shape)}: pass edges.t()")
            # Edge ids checked against the number of edges: DGL aborts in C++ otherwise.
            ids = check_seed_ids(edges, graph.num_edges(), "edge_dataloader edge ids", unit="edge")
        super().__init__(ids, batch_size, shuffle=shuffle, drop_last=drop_last, even=even, seed=seed)
        self.graph = graph
        self.reverse_eids = check_reverse_eids(graph, reverse_eids) if reverse_eids is not None else None
        if reverse_etypes is not None:
            reverse_etypes = check_reverse_etypes(graph, reverse_etypes)
        self.exclude, self.reverse_etypes = exclude, reverse_etypes
        self.negatives: Any = check_negatives(negatives)
        if self.pairs is not None and self.negatives is not None and not isinstance(self.negatives, PerEdgeUniform):
            raise ValueError("node pairs take negatives=k (an int); DGL's negative samplers need edge ids")
        if self.pairs is not None:
            self.edge_sampler: Any = _PairSampler(*self.pairs, sampler, self.negatives)
        else:
            self.edge_sampler = dgl.dataloading.as_edge_prediction_sampler(
                sampler, exclude=None if exclude is None else _CopiedExclusion(
                    graph, exclude, self.reverse_eids, reverse_etypes), negative_sampler=self.negatives)
        if self.spans is not None and isinstance(self.negatives, PerEdgeUniform):
            self.negatives.offsets = {etype: offset for etype, offset, _ in self.spans}
        self.sampler = sampler
        self.dataloader_kwargs = dataloader_kwargs
        on_epoch = _NegativeEpoch(self.negatives) if isinstance(self.negatives, PerEdgeUniform) else None
        self.sampling = BatchSampling(graph, self.edge_sampler, self.batch_size, drop_last, self.spans,
                                      on_epoch=on_epoch, **dataloader_kwargs)

    def sampled_formats(self) -> Set[str]:
        """The graph formats this loader's sampling reads (edge ids need the edge list too)."""
        return sampler_formats(self.edge_sampler) | ({"coo"} if self.pairs is None else set())

    @property
    def num_edges(self) -> int:
        """Seed edges (or pairs) this loader covers over all ranks."""
        return self.ids.numel()

    def sampled_batches(self, lean: bool = False) -> Iterator[Any]:
        if isinstance(self.negatives, PerEdgeUniform):
            self.negatives.seed, self.negatives.epoch = self.seed, self.epoch
        # Pairs go through DGL's loader too (positions as indices): it fills in prefetched features.
        return iterate_sampled(self, lean)


class _NegativeEpoch:
    """Sets the negative sampler's epoch in the process that samples (a worker's copy too)."""

    def __init__(self, negatives: PerEdgeUniform):
        self.negatives = negatives

    def __call__(self, epoch: int) -> None:
        self.negatives.epoch = epoch
