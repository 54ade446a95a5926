"""Node loaders: minibatches of DGL blocks over this rank's share of seed nodes, the default
neighbour sampler, and the fanout check."""
from __future__ import annotations

import copy
import numbers
from typing import Any, Iterator, List, Optional, Sequence, Set, Tuple

from .. import comm
from ..nn.pyg import GraphRows
from .formats import sampler_formats
from .hetero import check_typed_ids, flatten, type_spans
from .prefetch import per_type_prefetch
from .pyg_loader import check_batch_format, check_batch_keys, require_dgl_graph, resolve_batch_keys
from .sharded_loader import ShardedLoader
from .sharding import check_seed_ids
from .workers import BatchSampling, without_data


class SampledLoader(ShardedLoader):
    """A loader that samples neighbours: with DGL on the CPU (``self.sampling``), or on the
    rank's device once the trainer hands it a device sampling (``Trainer(sampling=...)``,
    see :mod:`graphtrainer.data.device.mode`)."""

    #: The device sampling in use (set in the rank), or None: DGL's, on the CPU.
    device_sampling: Any = None

    def use_device_sampling(self, batches: Any) -> None:
        self.device_sampling = batches

    @property
    def sampling_mode(self) -> str:
        """``"device"`` or ``"cpu"``: where the batches are sampled (what ``sampling="auto"`` chose)."""
        return "cpu" if self.device_sampling is None else "device"

    def __iter__(self) -> Iterator[Any]:
        return self.sampled_batches()

    def sampled_batches(self, lean: bool = False) -> Iterator[Any]:
        """This epoch's batches; ``lean``: their blocks gather no node or edge data (the structure
        and ids are the same): see :meth:`lean_batches`."""
        return iterate_sampled(self, lean)

    def lean_batches(self) -> Optional[Tuple[Iterator[Any], GraphRows]]:
        """This epoch's batches without gathered data, and where to read the rows a batch keeps
        (the graph, or the device's copy of its data): a PyG batch gathers only its own nodes'
        and edges' rows. None where the sampler's blocks may carry data of their own (a sampler
        that is not DGL's)."""
        if self.device_sampling is not None:
            return self.sampled_batches(lean=True), self.device_sampling.rows()
        if self._lean_sampling() is None:
            return None
        return self.sampled_batches(lean=True), GraphRows(self.graph.ndata, self.graph.edata)

    def _lean_sampling(self) -> Optional[BatchSampling]:
        """:attr:`sampling` with its sampler gathering nothing (made once per sampling)."""
        made = getattr(self, "_lean", None)
        if made is None or made[0] is not self.sampling:
            inner = without_data(self.sampling.graph_sampler)
            lean = None if inner is None else copy.copy(self.sampling)
            if lean is not None:
                lean.graph_sampler = inner
            made = self._lean = (self.sampling, lean)
        return made[1]


class NodeLoader(SampledLoader):
    """Minibatches of DGL blocks over this rank's share of seed nodes.

    Yields DGL's ``(input_nodes, output_nodes, blocks)``. On a heterograph ``ids``,
    ``input_nodes`` and ``output_nodes`` are ``{ntype: ids}`` (every given type a key of
    ``output_nodes``); ``batch_size`` counts all types together, each type split evenly and
    mixed in proportion (:mod:`graphtrainer.data.hetero`); evaluation order is the dict's.

    ``dataloader_kwargs`` go to DGL's ``DataLoader`` (``num_workers=k``,
    ``persistent_workers=True``); each batch is sampled from its own seed ``(seed, rank,
    epoch, batch)``, the same with any number of workers (:mod:`graphtrainer.data.workers`).
    With ``Trainer(sampling="device")`` (or ``"auto"`` on a GPU) the same batches are sampled
    on the device as torch blocks (:mod:`graphtrainer.data.device`; :attr:`sampling_mode`).
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
        if isinstance(ids, dict) or len(graph.ntypes) > 1:
            self.typed = check_typed_ids(ids, graph)
            self.spans = type_spans(self.typed, graph)
            flat = flatten(self.typed, self.spans)
        else:
            flat = check_seed_ids(ids, graph.num_nodes())
        super().__init__(flat, batch_size, shuffle=shuffle, drop_last=drop_last, even=even, seed=seed)
        self.graph = graph
        if not callable(getattr(sampler, "sample", None)):
            raise ValueError(f"node_dataloader: sampler must be a DGL block sampler (e.g. NeighborSampler) or a "
                             f"list of fanouts, one per layer ({{etype: k}} per layer on a heterograph), got "
                             f"{type(sampler).__name__}")
        if getattr(sampler, "fanouts", None) is not None:
            check_fanouts(sampler.fanouts)
        # A flat prefetch list on a heterograph: what the device sampler reads, in DGL's per-type form.
        self.sampler = sampler = per_type_prefetch(unfused_if_zero(sampler), graph)
        self.dataloader_kwargs = dataloader_kwargs
        self.sampling = BatchSampling(graph, sampler, self.batch_size, drop_last, self.spans, **dataloader_kwargs)

    def sampled_formats(self) -> Set[str]:
        """The graph formats this loader's sampling reads."""
        return sampler_formats(self.sampler)

    @property
    def num_seeds(self) -> int:
        """Seed nodes (of all types) this loader covers over all ranks."""
        return self.ids.numel()


def iterate_sampled(loader: Any, lean: bool = False) -> Iterator[Any]:
    """A node or edge loader's batches this epoch: its share through its ``BatchSampling`` (or
    device sampling); ``lean``: without gathered data (:meth:`SampledLoader.lean_batches`)."""
    share = loader.local_ids()
    if share.numel() == 0:
        return iter(())
    args = (share, loader.seed, comm.get_rank(), loader.epoch)
    if loader.device_sampling is not None:
        return loader.device_sampling.iterate(*args, gather=not lean)
    return (loader._lean_sampling() if lean else loader.sampling).iterate(*args)


def unfused_if_zero(sampler: Any) -> Any:
    """``sampler``, or a copy on DGL's unfused path when a fanout is 0: DGL 2.1's fused sampler
    (taken with more than one thread) then builds blocks with fewer source nodes than
    destinations (none for ``[0]``; ``{"buys": 0, ...}`` drops seeds of the other types)."""
    fanouts = getattr(sampler, "fanouts", None)
    if not getattr(sampler, "fused", False) or not fanouts:
        return sampler
    if any(0 in (f.values() if isinstance(f, dict) else [f]) for f in fanouts):
        sampler = copy.copy(sampler)
        sampler.fused = False
    return sampler


def default_sampler(graph: Any, fanouts: Sequence[int], feat_key: str = "feat", label_key: str = "label",
                    edge_key: Optional[str] = None) -> Any:
    """A ``NeighborSampler`` (fanout -1: every neighbour) gathering ``feat`` and seeds' ``label``
    (``edge_key``: also that edge data in every block), each where the graph has it."""
    import dgl  # here, not at the top: the engine imports without DGL for plain-torch tasks

    fanouts = check_fanouts(fanouts)
    require_dgl_graph(graph)
    feats: Any
    labels: Any
    if len(graph.ntypes) > 1:  # per type: DGL would fail on a type without the key
        feats = {nt: [feat_key] for nt in graph.ntypes if feat_key in graph.nodes[nt].data} or None
        labels = {nt: [label_key] for nt in graph.ntypes if label_key and label_key in graph.nodes[nt].data} or None
    else:
        feats = [feat_key] if feat_key in graph.ndata else None
        labels = [label_key] if label_key and label_key in graph.ndata else None
    edge_feats: Any = None
    if edge_key and len(graph.canonical_etypes) > 1:
        edge_feats = {et: [edge_key] for et in graph.canonical_etypes if edge_key in graph.edges[et].data} or None
    elif edge_key and edge_key in graph.edata:
        edge_feats = [edge_key]
    return dgl.dataloading.NeighborSampler(list(fanouts), prefetch_node_feats=feats, prefetch_labels=labels,
                                           prefetch_edge_feats=edge_feats)


def helper_sampler(graph: Any, sampler: Any, batch_format: str, feat_key: Optional[str] = None,
                   label_key: Optional[str] = None, edge_key: Optional[str] = None, labels: bool = True) -> Any:
    """The sampler of a task's loader helper: a list of fanouts becomes :func:`default_sampler`
    reading the keys named (``labels=False``: no seed labels, for link prediction). Keys named
    are checked against the graph; with DGL batches and a sampler object they would do nothing,
    so they are refused, naming where those keys go."""
    named = [f"{a}={k!r}" for a, k in (("feat_key", feat_key), ("label_key", label_key), ("edge_key", edge_key))
             if k is not None]
    fanouts = isinstance(sampler, (list, tuple))
    if check_batch_format(batch_format) == "dgl" and named and not fanouts:
        raise ValueError(f"{', '.join(named)}: with batch_format='dgl' and a sampler object these keys change "
                         "nothing (DGL's batches keep the graph's names). Fix: name the data in the sampler, "
                         "NeighborSampler(fanouts, prefetch_node_feats=[...], prefetch_labels=[...], "
                         "prefetch_edge_feats=[...]), or pass a list of fanouts; with batch_format='pyg' the keys "
                         "name what batches read as x, y and edge_attr")
    check_batch_keys(graph, feat_key, label_key, edge_key)
    if not fanouts:
        return sampler
    if batch_format == "pyg" and len(getattr(graph, "ntypes", ())) == 1:  # what its PyG batches read
        feat_key, label_key, _ = resolve_batch_keys(graph, feat_key, label_key, "")
    label = ("label" if label_key is None else label_key) if labels else ""
    return default_sampler(graph, sampler, "feat" if feat_key is None else feat_key, label, edge_key)


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
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < -1:
                raise ValueError(f"fanouts={fanouts!r}: layer {layer} has fanout {value!r}; each fanout must be "
                                 "a number of neighbours (0: none, as for a relation left out), or -1 for all")
    return fanouts
