"""Splitting seed ids between ranks, and DGL block-sampling loaders built on that split.

DGL 2.1's ``DataLoader(use_ddp=True)`` gives each rank the same contiguous slice every
epoch, ignores ``ddp_seed`` and has no ``set_epoch``. :func:`shard_ids` replaces it: one
global permutation per epoch from ``(seed, epoch)``, identical on every rank, then a
strided split, so every id is seen once per epoch across the job.
"""
from __future__ import annotations

import math
import numbers
import sys
import warnings
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import torch

from . import distributed as gdist

EVEN_MODES = ("pad", "drop", "none")


def shard_ids(
    ids: torch.Tensor,
    rank: int,
    world_size: int,
    *,
    epoch: int = 0,
    seed: int = 0,
    shuffle: bool = True,
    even: str = "pad",
) -> torch.Tensor:
    """This rank's share of ``ids`` for one epoch.

    ``even`` says how shares are made equal in length:

    - ``"pad"``: repeat ids from the start of the permutation until every rank has
      ``ceil(n / world_size)``; no rank holds the same id twice.
    - ``"drop"``: drop the last ``n % world_size`` ids of the permutation.
    - ``"none"``: no padding, no dropping; shares differ in length by at most one and
      every id appears on exactly one rank (use this for evaluation).
    """
    if even not in EVEN_MODES:
        raise ValueError(f"even={even!r}: choose one of {EVEN_MODES}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside a world of {world_size}")
    n = ids.numel()
    if shuffle:
        gen = torch.Generator().manual_seed(int(seed) * 1_000_003 + int(epoch))
        order = ids[torch.randperm(n, generator=gen)]
    else:
        order = ids
    if even == "pad" and n > 0:
        total = math.ceil(n / world_size) * world_size
        reps = math.ceil(total / n)
        order = order.repeat(reps)[:total]
    elif even == "drop":
        order = order[: (n // world_size) * world_size]
    return order[rank::world_size]


def check_seed_ids(ids: Any, num_nodes: int, what: str = "seed ids", unit: str = "node") -> torch.Tensor:
    """``ids`` as a 1-D int64 tensor of ids in ``[0, num_nodes)``, or a ``ValueError`` saying
    what is wrong. ``unit`` names what they count ("node", or "edge" for edge ids).

    Boolean masks are turned into ids. DGL aborts the whole process from C++ on an
    out-of-range seed, so this check must run before any sampling.
    """
    if not isinstance(ids, torch.Tensor):
        try:
            ids = torch.as_tensor(ids)
        except Exception as err:  # noqa: BLE001
            raise ValueError(f"{what}: expected a tensor of {unit} ids, got {type(ids).__name__}") from err
    if ids.dtype == torch.bool:
        if ids.numel() != num_nodes:
            raise ValueError(f"{what}: a boolean mask must have one entry per {unit} "
                             f"({num_nodes}), got {ids.numel()}")
        ids = ids.nonzero(as_tuple=True)[0]
    if ids.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"{what}: dtype {ids.dtype} is not an integer id type; pass int64 {unit} "
                         "ids (e.g. mask.nonzero().squeeze(1)) or a boolean mask")
    if ids.dim() != 1:
        raise ValueError(f"{what}: expected a 1-D tensor of {unit} ids, got shape {tuple(ids.shape)}")
    if ids.numel() == 0:
        raise ValueError(f"{what}: the id set is empty")
    lo, hi = int(ids.min()), int(ids.max())
    if lo < 0 or hi >= num_nodes:
        raise ValueError(f"{what}: ids must lie in [0, {num_nodes}) for this graph, found "
                         f"min {lo} and max {hi}")
    return ids.to(torch.int64)


def check_loader(loader: Any, world_size: int, evaluation: bool = False) -> None:
    """A clear ``ValueError`` for a loader that would crash its process in C++ or cannot be
    split between ``world_size`` ranks. Run in each rank before the first batch.

    graphtrainer's loaders check their own ids when built and their split here. DGL's own
    ``DataLoader`` is checked too: node ids against the number of nodes, and for an edge
    loader (``as_edge_prediction_sampler``) edge ids against the number of edges and the
    reverse edge ids; DGL aborts on out-of-range ids, and 2.1's ``use_ddp`` split pads a
    rank short of half a share with uninitialised ids (tiny id sets), then segfaults.
    DGL's ``GraphDataLoader`` must have graphs, at least one per rank with ``use_ddp``.
    With ``evaluation``, a DGL loader whose ``use_ddp`` split pads with repeats gets a
    warning: those ids would be scored twice.
    """
    if isinstance(loader, ShardedLoader):
        loader.check_world(world_size)
        return
    dgl = sys.modules.get("dgl")
    if dgl is None:
        return
    if isinstance(loader, dgl.dataloading.GraphDataLoader):
        n = len(loader.dataset)
        if n == 0:
            raise ValueError("GraphDataLoader: the dataset has no graphs")
        if getattr(loader, "use_ddp", False) and n < world_size:
            raise ValueError(f"GraphDataLoader(use_ddp=True): {n} graphs cannot be split between "
                             f"{world_size} ranks; use fewer ranks")
        if evaluation and getattr(loader, "use_ddp", False):
            _warn_padded(n, world_size, "GraphDataLoader(use_ddp=True)", "self.graph_dataloader(...)")
        return
    if not isinstance(loader, dgl.dataloading.DataLoader):
        return
    ids, graph = getattr(loader, "indices", None), getattr(loader, "graph", None)
    if not isinstance(ids, torch.Tensor) or not isinstance(graph, dgl.DGLGraph) or len(graph.ntypes) != 1:
        return
    edge_sampler = getattr(loader, "graph_sampler", None)
    if isinstance(edge_sampler, dgl.dataloading.EdgePredictionSampler):
        check_seed_ids(ids, graph.num_edges(), "DataLoader edge ids", unit="edge")
        if getattr(edge_sampler, "reverse_eids", None) is not None:
            from .edge_loader import check_reverse_eids

            check_reverse_eids(graph, edge_sampler.reverse_eids)
    else:
        check_seed_ids(ids, graph.num_nodes(), "DataLoader indices")
    if evaluation and getattr(loader, "use_ddp", False) and not getattr(loader, "drop_last", False):
        _warn_padded(ids.numel(), world_size, "dgl.dataloading.DataLoader(use_ddp=True)",
                     "self.node_dataloader(...) or self.edge_dataloader(...)")
    if getattr(loader, "use_ddp", False) and not getattr(loader, "drop_last", False):
        n, share = ids.numel(), math.ceil(ids.numel() / world_size)
        if any(2 * min(share, n - r * share) < share for r in range(world_size)):
            raise ValueError(
                f"dgl.dataloading.DataLoader(use_ddp=True) cannot split {n} ids between {world_size} "
                "ranks: DGL 2.1 would pad a rank with uninitialised ids and crash. Use "
                "self.node_dataloader(...) or self.edge_dataloader(...) (any number of ids), "
                "drop_last=True, or fewer ranks."
            )


def _warn_padded(n: int, world_size: int, what: str, instead: str) -> None:
    extra = -n % world_size
    if extra:
        warnings.warn(f"{what} pads {n} evaluation ids to {n + extra} for {world_size} ranks: {extra} of them "
                      f"are scored twice and predictions are not in the given order. Use {instead}, which "
                      "scores each one exactly once.", UserWarning, stacklevel=3)


class ShardedLoader:
    """Base of graphtrainer's loaders: one global permutation of ``ids`` per epoch, an
    even split between ranks, and an exact split for evaluation.

    ``ids`` are what is split: node ids, edge ids, positions in a list of node pairs or
    indices of graphs in a dataset. Subclasses turn a share into batches in
    :meth:`__iter__`. Lazy and rank-agnostic until iterated: rank and world size are read
    from the process group when the share is computed (single process when there is
    none), so a loader can be built in the launching process and travel to the ranks.

    The trainer relies on three properties of every subclass: ``len`` is exact (so it
    can skip ``Join`` when ranks have as many batches), :meth:`for_evaluation` sees every
    id exactly once across ranks, and rank ``r`` of ``world`` then holds positions
    ``r, r + world, ...`` of ``ids`` in order (how predictions are put back in order).
    """

    #: On a heterograph: ``{type: ids}`` and the types' spans in the flat id space of
    #: ``ids`` (see :mod:`graphtrainer.hetero`); None otherwise.
    typed: Optional[Dict[Any, torch.Tensor]] = None
    spans: Optional[list] = None

    def __init__(self, ids: torch.Tensor, batch_size: int, *, shuffle: bool = True,
                 drop_last: bool = False, even: Optional[str] = None, seed: int = 0):
        if int(batch_size) <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        self.ids = ids
        self.batch_size = int(batch_size)
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.even = even if even is not None else ("drop" if drop_last else "pad")
        if self.even not in EVEN_MODES:
            raise ValueError(f"even={self.even!r}: choose one of {EVEN_MODES}")
        self.seed = seed
        self.epoch = 0
        self._share: Optional[tuple] = None  # (key, ids, share) of the last local_ids()

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch whose permutation the next iteration uses."""
        self.epoch = int(epoch)

    def for_evaluation(self) -> "ShardedLoader":
        """Each id exactly once across ranks, in the given order, nothing dropped."""
        self.shuffle, self.drop_last, self.even = False, False, "none"
        return self

    def local_ids(self) -> torch.Tensor:
        """The ids this rank iterates this epoch, in order (computed once per epoch: the
        trainer asks for ``len`` before iterating)."""
        rank, world = self.split_place()
        key = (rank, world, self.epoch, self.seed, self.shuffle, self.even)
        if self._share is not None and self._share[0] == key and self._share[1] is self.ids:
            return self._share[2]
        if self.typed is not None and self.shuffle and self.even != "none":
            from .hetero import typed_share  # several types: each permuted and split evenly

            share = typed_share(self.typed, self.spans, self.seed, self.epoch, rank, world, self.even)
            self._share = (key, self.ids, share)
            return share
        # A copy: the strided view would keep the whole epoch's permutation alive in every rank.
        share = shard_ids(self.ids, rank, world, epoch=self.epoch, seed=self.seed,
                          shuffle=self.shuffle, even=self.even).clone()
        if share.numel() == 0 and self.even == "drop":
            raise ValueError(
                f"{self.ids.numel()} seed ids cannot be split between {world} ranks with "
                "drop_last=True: every rank would get none. Use drop_last=False (pads with "
                "repeats) or fewer ranks."
            )
        self._share = (key, self.ids, share)
        return share

    def split_place(self) -> Tuple[int, int]:
        """``(place, count)``: who splits the ids and which share is this rank's (by default
        all ranks of the job)."""
        return gdist.get_rank(), gdist.get_world_size()

    def local_batches(self) -> List[torch.Tensor]:
        """This rank's share cut into batches of ``batch_size`` (the last one shorter unless
        ``drop_last``)."""
        share = self.local_ids()
        batches = list(torch.split(share, self.batch_size))
        if self.drop_last and batches and batches[-1].numel() < self.batch_size:
            batches.pop()
        return batches

    def __len__(self) -> int:
        n = self.local_ids().numel()
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)

    def check_world(self, world_size: int) -> None:
        """Raise ``ValueError`` when the ids cannot be split between ``world_size`` ranks."""

    def __iter__(self) -> Iterator[Any]:
        raise NotImplementedError


class NodeLoader(ShardedLoader):
    """Minibatches of DGL blocks over this rank's share of seed nodes.

    The trainer calls :meth:`set_epoch` before each epoch, and :meth:`for_evaluation`
    for validation, test and predict loaders, where every id must be seen exactly once.

    Yields DGL's ``(input_nodes, output_nodes, blocks)``. On a heterograph ``ids`` is
    ``{ntype: ids}`` and so are ``input_nodes`` and ``output_nodes`` (every given type is
    a key of ``output_nodes``, empty when a batch has none of it); ``batch_size`` counts
    seeds of all types together; each type is permuted and split evenly, and a rank's
    batches mix the types in proportion (see :mod:`graphtrainer.hetero`). Evaluation
    order, which predictions follow, is the dict's types one after the other.

    ``dataloader_kwargs`` go to DGL's ``DataLoader``: ``num_workers=k`` samples in ``k``
    worker processes per rank (``persistent_workers=True`` keeps them across epochs).
    Each batch is sampled from its own seed ``(seed, rank, epoch, batch)``, so the batches
    are the same with any number of workers (see :mod:`graphtrainer.workers`).
    """

    def __init__(
        self,
        graph: Any,
        ids: Any,
        sampler: Any,
        batch_size: int,
        *,
        shuffle: bool = True,
        drop_last: bool = False,
        even: Optional[str] = None,
        seed: int = 0,
        **dataloader_kwargs: Any,
    ):
        from .workers import BatchSampling

        if isinstance(ids, dict) or len(graph.ntypes) > 1:
            from .hetero import check_typed_ids, flatten, type_spans

            self.typed = check_typed_ids(ids, graph)
            self.spans = type_spans(self.typed, graph)
            flat = flatten(self.typed, self.spans)
        else:
            flat = check_seed_ids(ids, graph.num_nodes())
        super().__init__(flat, batch_size, shuffle=shuffle, drop_last=drop_last, even=even, seed=seed)
        self.graph = graph
        if getattr(sampler, "fanouts", None) is not None:
            check_fanouts(sampler.fanouts)
        self.sampler = sampler
        self.dataloader_kwargs = dataloader_kwargs
        self.sampling = BatchSampling(graph, sampler, self.batch_size, drop_last, self.spans, **dataloader_kwargs)

    @property
    def num_seeds(self) -> int:
        """Seed nodes (of all types) this loader covers over all ranks."""
        return self.ids.numel()

    def __iter__(self) -> Iterator[Any]:
        return iterate_sampled(self)


def iterate_sampled(loader: Any) -> Iterator[Any]:
    """A node or edge loader's batches this epoch: its share through its ``BatchSampling``."""
    share = loader.local_ids()
    if share.numel() == 0:
        return iter(())
    warn_unshared_formats(loader)
    return loader.sampling.iterate(share, loader.seed, gdist.get_rank(), loader.epoch)


def warn_unshared_formats(loader: Any) -> None:
    """In a launched rank (rank 0 speaks), warn when the loader's sampling reads a sparse
    format that was not built before launch (see :func:`graphtrainer.formats.warn_if_missing`)."""
    if gdist.get_world_size() > 1 and gdist.get_rank() == 0:
        from .formats import loader_formats, warn_if_missing

        warn_if_missing(loader.graph, loader_formats(loader), type(loader).__name__)



def default_sampler(graph: Any, fanouts: Sequence[int], feat_key: str = "feat", label_key: str = "label") -> Any:
    """A ``NeighborSampler`` that also gathers ``feat`` for input nodes and ``label`` for seeds.

    A fanout of -1 takes every neighbour.
    """
    import dgl

    fanouts = check_fanouts(fanouts)
    if len(graph.ntypes) > 1:
        # Per type: DGL would fail on a type without the feature.
        feats = {nt: [feat_key] for nt in graph.ntypes if feat_key in graph.nodes[nt].data} or None
        labels = {nt: [label_key] for nt in graph.ntypes if label_key and label_key in graph.nodes[nt].data} or None
        return dgl.dataloading.NeighborSampler(list(fanouts), prefetch_node_feats=feats, prefetch_labels=labels)
    feats = [feat_key] if feat_key in graph.ndata else None
    labels = [label_key] if label_key in graph.ndata else None
    return dgl.dataloading.NeighborSampler(list(fanouts), prefetch_node_feats=feats, prefetch_labels=labels)


def check_fanouts(fanouts: Any) -> List[Any]:
    """``fanouts`` as a list, or a ``ValueError`` saying what is wrong (DGL would fail deep
    inside sampling, or abort the process, on an empty list or a negative fanout)."""
    try:
        fanouts = list(fanouts)
    except TypeError:
        raise ValueError(f"fanouts={fanouts!r}: give one fanout per layer, e.g. [10, 10]") from None
    if not fanouts:
        raise ValueError("fanouts=[]: give one fanout per GNN layer, e.g. [10, 10] for two layers")
    for layer, fanout in enumerate(fanouts):
        values = fanout.values() if isinstance(fanout, dict) else [fanout]
        for value in values:
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or (value < 1 and value != -1):
                raise ValueError(f"fanouts={fanouts!r}: layer {layer} has fanout {value!r}; each fanout must be "
                                 "a positive number of neighbours, or -1 for all of them")
    return fanouts


def prepare_graph(graph: Any, formats: Sequence[str] = ("csc",)) -> Any:
    """Build ``formats`` of ``graph`` once (default: CSC, what in-neighbour sampling reads),
    so forked ranks share them instead of each building its own; see :mod:`graphtrainer.formats`."""
    from .formats import build_formats

    return build_formats(graph, formats)


def find_graphs(obj: Any) -> List[Any]:
    """DGL graphs held by ``obj``'s attributes (one level, and inside lists, tuples and dicts)."""
    try:
        import dgl
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

