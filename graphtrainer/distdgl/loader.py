"""Node and edge loaders on a DistDGL ``DistGraph``, with the guarantees of
:class:`~graphtrainer.data.node_loader.NodeLoader` (and ``EdgeLoader``) where DistDGL allows them.

Seed nodes are either a ``DistTensor`` boolean mask (``g.ndata["train_mask"]``): each machine
takes the masked nodes of its own partition (``node_split(mask, force_even=False)``, read
locally), permuted per epoch with ``(seed, epoch)`` and split evenly between its ranks, so
seeds, neighbourhoods and features are mostly local; machines may hold different counts (the
trainer then uses ``Join``) and predictions come back in ascending (partition) node id. Or a
tensor of partition ids or a plain mask: one global permutation split over all ranks, as
``NodeLoader``, at the cost of locality.

Each batch reads the sampler's ``prefetch_node_feats`` and ``prefetch_labels`` (a list of keys
or ``{ntype: keys}``, as DGL's samplers take them) and ``prefetch_edge_feats`` (every block's
edges, by the block's ``dgl.EID``; a list or ``{etype: keys}``) from the ``DistGraph`` (local
partition from shared memory, the rest over RPC), which DGL 2.1's ``DistNodeDataLoader`` and
``DistEdgeDataLoader`` do not do; batch i+1's pull runs in a thread while batch i trains.
Node batches skip ``DistNodeDataLoader``, whose ``DistDataLoader`` turns every seed into a
Python int and back (2.2 ms per 1,024-seed batch). Local seeds are sampled in the rank, seeded
per batch; servers sample remote seeds with their own generators, so a run over several
partitions is not bit-repeatable.

A graph in one partition holds every node and edge under the graph's own ids: node batches
are then sampled on the shared partition and features read in line (:func:`single_partition`),
saving 3.3 ms (sampling) and 2.8 ms (features) per 1,024-seed batch (``benchmarks/distgraph.py``).
"""
from __future__ import annotations

import itertools
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Iterator, Optional, Tuple

import torch

from .. import comm as gdist
from ..data.edge_loader import PerEdgeUniform, _PairSampler
from ..data.node_loader import check_fanouts, default_sampler
from ..data.prefetch import one_type_keys
from ..data.sharded_loader import ShardedLoader
from ..data.sharding import check_seed_ids
from ..data.workers import batch_seed
from .graph import is_dist_tensor, machine_share


class _DistSampled(ShardedLoader):
    """The split's scope (each machine's own items, or all ranks), sampling, features one batch ahead."""

    scope = "world"
    #: Node loaders also read the sampler's ``prefetch_labels`` for their seeds.
    seeds_are_nodes = True

    def split_place(self) -> Tuple[int, int]:
        return machine_share() if self.scope == "machine" else super().split_place()

    def prediction_keys(self) -> Optional[torch.Tensor]:
        """The ids of this rank's evaluation rows, which order the gathered predictions
        (ascending id) when each machine split its own items; None otherwise."""
        return self.local_ids() if self.scope == "machine" else None

    def _read_keys(self, graph: Any, sampler: Any) -> None:
        """The data keys each batch reads: the sampler's ``prefetch_node_feats`` (and
        ``prefetch_labels``, ``prefetch_edge_feats``) in any form DGL's samplers take
        (:func:`one_type_keys`), checked against the graph before the first batch."""
        name = type(sampler).__name__
        self.feat_keys = one_type_keys(getattr(sampler, "prefetch_node_feats", None), graph,
                                       what=f"{name}(prefetch_node_feats=)")
        self.label_keys = one_type_keys(getattr(sampler, "prefetch_labels", None), graph,
                                        what=f"{name}(prefetch_labels=)") if self.seeds_are_nodes else []
        self.edge_keys = one_type_keys(getattr(sampler, "prefetch_edge_feats", None), graph, edges=True,
                                       what=f"{name}(prefetch_edge_feats=)")

    def __iter__(self) -> Iterator[Any]:
        share = self.local_ids()
        if share.numel() == 0:
            return iter(())
        return self._with_features(self._sampled(share))

    def _sampled(self, share: torch.Tensor) -> Iterator[Any]:
        """This rank's batches of ``share``, sampled (no features yet)."""
        raise NotImplementedError

    def _seed_batch(self, index: int) -> None:
        import dgl

        dgl.seed(batch_seed(self.seed, gdist.get_rank(), self.epoch, index))  # the rank's own sampling repeats

    def _with_features(self, batches: Iterator[Any]) -> Iterator[Any]:
        """Each batch with its features, batch i+1's pull in a thread while batch i is used (in
        line when reads are local copies). Sampling stays in this thread and never overlaps a
        pull: DGL's RPC client is not made for two threads."""
        if not (self.feat_keys or self.label_keys or self.edge_keys):
            yield from batches
            return
        if self._reads_are_local():  # a memory copy: nothing to hide behind the step
            for batch in batches:
                yield _attach(batch, *self._pull(batch))
            return
        pool = ThreadPoolExecutor(1, thread_name_prefix="graphtrainer-pull", initializer=_one_dgl_thread)
        pending = None
        try:
            while True:
                ready = _attach(pending[0], *pending[1].result()) if pending is not None else None
                batch = next(batches, None)
                pending = (batch, pool.submit(self._pull, batch)) if batch is not None else None
                if ready is not None:
                    yield ready
                if pending is None:
                    return
        finally:
            if pending is not None:
                pending[1].cancel() or pending[1].exception()  # let a running pull finish before leaving
            pool.shutdown(wait=True)

    def _pull(self, batch: Any) -> Tuple[dict, dict, list]:
        """Source features of the first block, labels of the seeds, each block's edge data."""
        input_nodes, seeds = batch[0], batch[1]
        edges = [self._read_edges(block) for block in batch[-1]] if self.edge_keys else []
        return ({key: self._read(key, input_nodes) for key in self.feat_keys},
                {key: self._read(key, seeds) for key in self.label_keys}, edges)

    def _read_edges(self, block: Any) -> dict:
        """The sampler's edge data for ``block``'s edges, by their graph edge ids (``dgl.EID``)."""
        import dgl

        if dgl.EID not in block.edata:
            raise RuntimeError(f"a sampled block has no {dgl.EID!r} edge data, so prefetch_edge_feats="
                               f"{self.edge_keys} cannot be read for it: use a sampler whose blocks keep the "
                               "graph's edge ids (dgl.dataloading.NeighborSampler does)")
        eids = block.edata[dgl.EID]
        return {key: self._read(key, eids, edges=True) for key in self.edge_keys}

    def _reads_are_local(self) -> bool:
        return False

    def _read(self, key: str, ids: torch.Tensor, edges: bool = False) -> torch.Tensor:
        """Rows ``ids`` of node (``edges``: edge) data ``key`` (through the kvstore: local rows
        from shared memory, others over RPC)."""
        return (self.graph.edata if edges else self.graph.ndata)[key][ids]


def _attach(batch: Any, src: dict, dst: dict, edges: list) -> Any:
    blocks = batch[-1]
    for key, value in src.items():
        blocks[0].srcdata[key] = value
    for key, value in dst.items():
        blocks[-1].dstdata[key] = value
    for block, data in zip(blocks, edges):  # replaces DGL's LazyFeature markers where sample() set them
        for key, value in data.items():
            block.edata[key] = value
    return batch


def _one_dgl_thread() -> None:
    """The pull thread's own OpenMP team: one thread, beside the rank's training threads."""
    import dgl

    dgl.utils.set_num_threads(1)


class DistNodeLoader(_DistSampled):
    """Minibatches of DGL blocks over this rank's share of seed nodes of a ``DistGraph``: DGL's
    ``(input_nodes, output_nodes, blocks)`` with prefetched features, labels and edge data, as on
    one machine."""

    def __init__(self, graph: Any, ids: Any, sampler: Any, batch_size: int, *, shuffle: bool = True,
                 drop_last: bool = False, even: Any = None, seed: int = 0):
        _check_homogeneous(graph, "node_dataloader")
        if is_dist_tensor(ids):
            self.scope = "machine"
            flat = _machine_items(graph, ids, graph.num_nodes(), "node")
        else:
            flat = check_seed_ids(ids, graph.num_nodes())
        super().__init__(flat, batch_size, shuffle=shuffle, drop_last=drop_last, even=even, seed=seed)
        if getattr(sampler, "fanouts", None) is not None:
            check_fanouts(sampler.fanouts)
        self.graph, self.sampler = graph, sampler
        self._read_keys(graph, sampler)
        self._local: Any = None  # (shared graph or None,) once looked at, in the rank

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_local"] = None  # a rank's own view of its machine's shared memory
        return state

    @property
    def num_seeds(self) -> int:
        """Seeds this rank's machine (mask) or the whole job (ids) covers."""
        return self.ids.numel()

    def _local_graph(self) -> Any:
        if self._local is None:
            self._local = (single_partition(self.graph),)
        return self._local[0]

    def _reads_are_local(self) -> bool:
        return self._local_graph() is not None

    def _read(self, key: str, ids: torch.Tensor, edges: bool = False) -> torch.Tensor:
        if self._local_graph() is None:
            return super()._read(key, ids, edges)
        # The shared tensor, indexed by graph id. index_select copies whole rows; tensor[ids]
        # goes element by element (3x slower for 64-d float rows).
        return torch.index_select((self.graph.edata if edges else self.graph.ndata)[key].local_partition, 0, ids)

    def _sampled(self, share: torch.Tensor) -> Iterator[Any]:
        local = self._local_graph()
        graph = local if local is not None else self.graph
        for index, seeds in enumerate(self.local_batches()):
            self._seed_batch(index)
            yield self.sampler.sample_blocks(graph, seeds)


class DistEdgeLoader(_DistSampled):
    """Link-prediction batches over this rank's share of seed edges of a ``DistGraph``:
    DGL's ``DistEdgeDataLoader`` (its ``EdgeCollator``) with graphtrainer's negatives.

    ``edges``: edge ids split over all ranks, a ``DistTensor`` edge mask (each machine its own
    partition's), or held-out ``(src, dst)`` node pairs, in partition numbering
    (:func:`graphtrainer.distdgl.partition.to_partition_ids`). ``negatives=k`` as on one
    machine. ``exclude`` is refused: DGL 2.1's ``DistGraph.sample_neighbors`` ignores
    ``exclude_edges`` (``dist_graph.py:1417``).

    Yields ``(input_nodes, pair_graph, neg_pair_graph, blocks)`` (no ``neg_pair_graph``
    without negatives), features in ``blocks[0].srcdata``.
    """

    seeds_are_nodes = False

    def __init__(self, graph: Any, edges: Any, sampler: Any, batch_size: int, *, negatives: Any = 1,
                 exclude: Optional[str] = None, shuffle: bool = True, drop_last: bool = False, even: Any = None,
                 seed: int = 0):
        _check_homogeneous(graph, "edge_dataloader")
        if exclude is not None:
            raise ValueError(f"exclude={exclude!r} on a DistGraph: DGL 2.1's DistGraph.sample_neighbors ignores "
                             "exclude_edges, so the seed edges would stay in the sampled blocks unnoticed. Pass "
                             "exclude=None (and hold validation/test edges out of the partitioned graph, as "
                             "datasets.link_split does), or train this task on one machine")
        if not isinstance(negatives, int) and negatives is not None:
            raise ValueError("edge_dataloader on a DistGraph takes negatives=k (an int) or None")
        if isinstance(sampler, (list, tuple)):
            sampler = default_sampler(graph, sampler, label_key="")
        self.negatives = PerEdgeUniform(negatives) if negatives is not None else None
        self.pairs = None
        if is_dist_tensor(edges):
            self.scope = "machine"
            ids = _machine_items(graph, edges, graph.num_edges(), "edge")
        elif _PairSampler.given(edges):
            self.pairs = _PairSampler.check(edges, graph.num_nodes())
            ids = torch.arange(self.pairs[0].numel())
        else:
            ids = check_seed_ids(edges, graph.num_edges(), "edge_dataloader edge ids", unit="edge")
        super().__init__(ids, batch_size, shuffle=shuffle, drop_last=drop_last, even=even, seed=seed)
        self.graph, self.sampler = graph, sampler
        self._read_keys(graph, sampler)
        # Pairs (not edges of the graph): graphtrainer's pair sampler; edge ids: DGL's EdgeCollator.
        self.pair_sampler = _PairSampler(*self.pairs, sampler, self.negatives) if self.pairs is not None else None

    @property
    def num_edges(self) -> int:
        return self.ids.numel()

    def _sampled(self, share: torch.Tensor) -> Iterator[Any]:
        batches = iter(self._dgl_loader(share))
        for index in itertools.count():
            self._seed_batch(index)
            try:
                yield next(batches)
            except StopIteration:
                return

    def _dgl_loader(self, share: torch.Tensor) -> Any:
        import dgl

        if self.negatives is not None:
            self.negatives.seed, self.negatives.epoch = self.seed, self.epoch
        if self.pair_sampler is not None:  # positions in the pair list
            def collate(pos: Any) -> Any:
                return self.pair_sampler.sample(self.graph, torch.as_tensor(pos))

            return dgl.distributed.DistDataLoader(share, batch_size=self.batch_size, shuffle=False, collate_fn=collate,
                                                  drop_last=self.drop_last)
        return dgl.dataloading.DistEdgeDataLoader(self.graph, share, self.sampler, negative_sampler=self.negatives,
                                                  batch_size=self.batch_size, shuffle=False, drop_last=self.drop_last)


def single_partition(graph: Any) -> Any:
    """The graph partition this rank's machine shares in memory, when it is the whole graph
    under the graph's own node and edge ids (one partition, homogeneous); else None."""
    import dgl

    local = graph.local_partition
    if graph.get_partition_book().num_partitions() != 1 or local is None:
        return None
    if (local.num_nodes(), local.num_edges()) != (graph.num_nodes(), graph.num_edges()):
        return None
    nids, eids = local.ndata.get(dgl.NID), local.edata.get(dgl.EID)
    if nids is None or eids is None:
        return None
    if not (torch.equal(nids, torch.arange(nids.numel(), dtype=nids.dtype))
            and torch.equal(eids, torch.arange(eids.numel(), dtype=eids.dtype))):
        return None
    return local


def _check_homogeneous(graph: Any, what: str) -> None:
    if len(graph.ntypes) > 1 or len(graph.etypes) > 1:
        raise ValueError(f"{what} on a DistGraph supports homogeneous graphs only (DGL 2.1's distributed "
                         "loaders have no heterograph support)")


def _machine_items(graph: Any, mask: Any, total: int, unit: str) -> torch.Tensor:
    """The nodes (or edges) of this machine's partition that ``mask`` selects (a local read)."""
    book = graph.get_partition_book()
    if len(mask) != total:
        raise ValueError(f"the mask has {len(mask)} entries for {total} {unit}s; pass a {unit} mask such as "
                         f"g.{'n' if unit == 'node' else 'e'}data['train_mask']")
    local = book.partid2nids(book.partid) if unit == "node" else book.partid2eids(book.partid)
    return local[mask[local].bool()].to(torch.int64)
