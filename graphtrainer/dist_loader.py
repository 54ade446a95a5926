"""Node loaders on a DistDGL ``DistGraph``: DGL's ``DistNodeDataLoader`` over this rank's
share, with the guarantees of :class:`~graphtrainer.sampling.NodeLoader` where DistDGL
allows them.

Two ways to give the seed nodes:

- a ``DistTensor`` boolean mask (``g.ndata["train_mask"]``): each machine takes the masked
  nodes of its own partition (what ``dgl.distributed.node_split(mask, force_even=False)``
  gives it, read locally), so seeds, their neighbourhoods and features are mostly local.
  The machine's share is permuted every epoch with ``(seed, epoch)`` and split evenly
  between its ranks. Machines may hold different numbers of seeds (METIS balances the
  training nodes, not exactly): the trainer then uses ``Join``. Evaluation sees every
  masked node once; predictions come back in ascending (partition) node id.
- a tensor of node ids (partition ids) or a plain boolean mask: one global permutation
  per epoch, split over all ranks, exactly like ``NodeLoader`` (and in the given order
  for evaluation), at the cost of locality.

Features are never gathered whole: each batch reads the sampler's ``prefetch_node_feats``
for its input nodes and ``prefetch_labels`` for its seeds from the ``DistGraph`` (local
partition from shared memory, the rest over RPC), which DGL 2.1's
``DistNodeDataLoader`` does not do by itself. Sampling of local seeds runs in the rank
and is seeded per batch; the servers sample remote seeds with their own generators, so
a run over several partitions is not bit-repeatable.
"""
from __future__ import annotations

import itertools
from typing import Any, Iterator, Tuple

import torch

from . import distributed as gdist
from .dist_graph import is_dist_tensor, machine_share
from .sampling import ShardedLoader, check_fanouts, check_seed_ids
from .workers import batch_seed


class DistNodeLoader(ShardedLoader):
    """Minibatches of DGL blocks over this rank's share of seed nodes of a ``DistGraph``.

    Yields DGL's ``(input_nodes, output_nodes, blocks)`` with the prefetched features in
    ``blocks[0].srcdata`` and labels in ``blocks[-1].dstdata``, as on one machine.
    """

    def __init__(self, graph: Any, ids: Any, sampler: Any, batch_size: int, *, shuffle: bool = True,
                 drop_last: bool = False, even: Any = None, seed: int = 0):
        if len(graph.ntypes) > 1:
            raise ValueError("node_dataloader on a DistGraph supports homogeneous graphs only (DGL 2.1's "
                             "DistNodeDataLoader has no heterograph support)")
        if is_dist_tensor(ids):
            self.scope = "machine"
            flat = _machine_ids(graph, ids)
        else:
            self.scope = "world"
            flat = check_seed_ids(ids, graph.num_nodes())
        super().__init__(flat, batch_size, shuffle=shuffle, drop_last=drop_last, even=even, seed=seed)
        if getattr(sampler, "fanouts", None) is not None:
            check_fanouts(sampler.fanouts)
        self.graph, self.sampler = graph, sampler

    @property
    def num_seeds(self) -> int:
        """Seeds this rank's machine (mask) or the whole job (ids) covers."""
        return self.ids.numel()

    def split_place(self) -> Tuple[int, int]:
        return machine_share() if self.scope == "machine" else super().split_place()

    def prediction_keys(self) -> torch.Tensor | None:
        """The node ids of this rank's evaluation rows, which order the gathered
        predictions (ascending id) when each machine split its own seeds."""
        return self.local_ids() if self.scope == "machine" else None

    def __iter__(self) -> Iterator[Any]:
        import dgl

        share = self.local_ids()
        if share.numel() == 0:
            return iter(())
        loader = dgl.dataloading.DistNodeDataLoader(self.graph, share, self.sampler, batch_size=self.batch_size,
                                                    shuffle=False, drop_last=self.drop_last)
        return self._batches(loader)

    def _batches(self, loader: Any) -> Iterator[Any]:
        import dgl

        feats = list(getattr(self.sampler, "prefetch_node_feats", None) or [])
        labels = list(getattr(self.sampler, "prefetch_labels", None) or [])
        rank = gdist.get_rank()
        batches = iter(loader)
        for index in itertools.count():
            dgl.seed(batch_seed(self.seed, rank, self.epoch, index))  # the rank's own sampling repeats
            try:
                input_nodes, output_nodes, blocks = next(batches)
            except StopIteration:
                return
            for key in feats:
                blocks[0].srcdata[key] = self.graph.ndata[key][input_nodes]
            for key in labels:
                blocks[-1].dstdata[key] = self.graph.ndata[key][output_nodes]
            yield input_nodes, output_nodes, blocks


def _machine_ids(graph: Any, mask: Any) -> torch.Tensor:
    """The nodes of this machine's partition that ``mask`` selects (a local read)."""
    book = graph.get_partition_book()
    if len(mask) != graph.num_nodes():
        raise ValueError(f"node_dataloader: the mask has {len(mask)} entries for a graph of "
                         f"{graph.num_nodes()} nodes; pass a node mask such as g.ndata['train_mask']")
    local = book.partid2nids(book.partid)
    return local[mask[local].bool()].to(torch.int64)
