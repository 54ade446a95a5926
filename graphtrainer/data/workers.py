"""Sampling a rank's batches with DGL, in the rank or in DGL's worker processes.

:class:`BatchSampling` turns one rank's share of seed ids into DGL batches through DGL's
own ``DataLoader`` (its feature prefetching, its worker processes), but feeds it a
map-style dataset of whole batches instead of a tensor of ids:

- Each batch is sampled after seeding DGL from ``(seed, rank, epoch, batch index)``, so
  what a batch samples does not depend on which process samples it: 0, 1 or 4 workers,
  persistent or not, give the same batches in the same order (a map-style dataset keeps
  torch's order; DGL's own id dataset interleaves its workers' chunks), where the rank samples
  with one thread, as DGL's workers do. With several threads in the rank DGL 2.1's draws differ
  from run to run (its threads number a block's new nodes in a race), and the loader warns,
  unless ``Trainer(deterministic=True)`` switched DGL's thread fixes on
  (:mod:`graphtrainer._compat.dgl_2_1_threads`): two threads then repeat (other batches than
  one thread's); with more, a batch also depends on the process's history, and the loader says so.
- The share lives in shared memory and is rewritten in place each epoch, so
  ``persistent_workers=True`` keeps the same worker processes across epochs and they
  still see each epoch's permutation.
- Every worker asks Linux to kill it when its rank dies (``PR_SET_PDEATHSIG``): a rank
  killed with SIGKILL or ended by the launcher leaves no sampling process behind.
"""
from __future__ import annotations

import copy
import warnings
from typing import Any, Dict, Iterator, Optional, Sequence, Tuple

import torch

from .._compat.dgl_2_1_threads import REPEATABLE_THREADS, thread_fixes_on
from ..process import affinity
from ..process.parent import die_with_parent
from .determinism import Mode, apply_mode, current_mode
from .hetero import split_flat

#: Keyword arguments of DGL's loader that graphtrainer sets itself.
_OWNED = ("batch_size", "shuffle", "drop_last", "use_ddp", "ddp_seed")


#: PyG loader arguments a PyG user may pass, with graphtrainer's way.
_PYG_NAMES = {
    "num_neighbors": "the sampler argument takes fanouts in DGL's order, the input layer first: PyG's "
                     "num_neighbors=[25, 10] is [10, 25]; per relation, num_neighbors={et: [25, 10]} is "
                     "[{et: 10}, {et: 25}]",
    "neg_sampling_ratio": "negatives=k: k uniform negatives per positive edge, a float too (0.5: PyG's binary "
                          "ratio), or edge_dataloader(..., batch_format='pyg', neg_sampling=NegativeSampling("
                          "'binary', amount))",
    "neg_sampling": "edge_dataloader(..., batch_format='pyg', neg_sampling='binary' or 'triplet') or "
                    "PygLoader(loader, neg_sampling=...); negatives=k: how many per positive edge",
    "edge_label_index": "pass the pairs as the edges argument, a (src, dst) tuple of tensors",
    "edge_label": "edge_dataloader(..., batch_format='pyg', edge_label=...) or PygLoader(loader, edge_label=...); "
                  "edge data of the graph reach the step by batch.input_id too (g.edata[key][batch.input_id])",
    "input_nodes": "pass the node ids as the ids argument ({ntype: ids} for PyG's (ntype, ids))",
}
#: node_dataloader's arguments that reach an edge loader's options, and why they do not apply there.
_NODE_ONLY = {
    "label_key": "node_dataloader's: link batches carry no y (edge_label: 1 for positive pairs, 0 for negatives); "
                 "node labels are g.ndata[key][batch.n_id]",
}


def check_loader_kwargs(kwargs: Dict[str, Any]) -> Dict[str, Any]:
    """``kwargs`` for DGL's ``DataLoader``, or a ``ValueError`` naming one graphtrainer owns
    (or PyG's name for one of graphtrainer's arguments)."""
    for name in kwargs:
        if name in _PYG_NAMES:
            raise ValueError(f"{name}= is PyG's loader argument; here: {_PYG_NAMES[name]}")
        if name in _NODE_ONLY:
            raise ValueError(f"{name}= is {_NODE_ONLY[name]}")
    owned = sorted(set(kwargs) & set(_OWNED))
    if owned:
        raise ValueError(f"{', '.join(owned)}: set by graphtrainer's loader from its own arguments "
                         "(batch_size, shuffle, drop_last, seed); the split between ranks is its own too")
    workers = kwargs.get("num_workers", 0)
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 0:
        raise ValueError(f"num_workers={workers!r}: give a number of sampling processes per rank, 0 or more")
    if kwargs.get("persistent_workers") and not workers:
        raise ValueError("persistent_workers=True needs num_workers > 0")
    return kwargs


def batch_seed(seed: int, rank: int, epoch: int, index: int) -> int:
    """The DGL seed of batch ``index`` of ``rank`` in ``epoch`` (a 31-bit mix of the four)."""
    x = (int(seed) * 1_000_003 + 7919 * (int(rank) + 1)) % 2**61
    x = (x * 6364136223846793005 + int(epoch) * 1442695040888963407 + int(index) + 1) % 2**64
    x ^= x >> 29
    return int(x % 2**31)


_warned_threads: set = set()  # (threads, fixes on) already warned about in this process


def many_threads_warning(threads: int) -> str:
    """Why batches DGL samples with ``threads`` threads in the rank differ from run to run, and the fixes."""
    return (f"DGL samples this rank's batches on the CPU with {threads} threads. DGL 2.1 numbers a block's new "
            "nodes in the order its threads happen to reach them, and the next layer draws in that order, so one "
            "seed gives other batches from run to run (a resumed fit is not bit-identical to an uninterrupted "
            "one). For batches that depend on the seed alone: Trainer(threads_per_proc=1), num_workers=k in the "
            "loader (k processes sampling with one thread each), or Trainer(sampling='device') (torch's sampler "
            "draws alike at any thread count, on the CPU too); or Trainer(deterministic=True), which renumbers "
            "DGL's new nodes as one thread would and reseeds its threads, at a cost in sampling time")


def history_warning(threads: int) -> str:
    """What ``Trainer(deterministic=True)`` leaves of thread timing with ``threads`` threads (more than two)."""
    return (f"DGL samples this rank's batches on the CPU with {threads} threads. Under Trainer(deterministic=True) "
            "a rerun of the same script repeats its batches, but with more than "
            f"{REPEATABLE_THREADS} threads a batch also depends on what the process ran before (a resumed fit, a "
            "second fit, evaluation in between): OpenMP restarts surplus threads and DGL gives each new one a "
            "new random stream. For batches that depend on the seed alone: Trainer(threads_per_proc="
            f"{REPEATABLE_THREADS}) or 1, num_workers=k in the loader, or Trainer(sampling='device')")


def _warn_if_many_threads() -> None:
    """Warn once per process, thread count and mode where DGL samples in the rank with more
    threads than give repeatable batches."""
    import dgl

    threads, fixed = dgl.utils.get_num_threads(), thread_fixes_on()
    if threads > (REPEATABLE_THREADS if fixed else 1) and (threads, fixed) not in _warned_threads:
        _warned_threads.add((threads, fixed))
        message = history_warning(threads) if fixed else many_threads_warning(threads)
        warnings.warn(message, RuntimeWarning, stacklevel=5)


class _WorkerInit:
    """Runs in each sampling worker: die with the rank, run on the launcher's cores rather
    than the pinned rank's (a spawned worker; a forked one has them already), then the
    user's own init. The rank's ``Trainer(deterministic=...)`` mode goes with it: a worker
    started by spawn or forkserver does not inherit torch's setting."""

    def __init__(self, user_fn: Any = None, mode: Mode = False):
        self.user_fn, self.mode = user_fn, mode

    def __call__(self, worker_id: int) -> None:
        die_with_parent()
        affinity.release()
        apply_mode(self.mode)
        if self.user_fn is not None:
            self.user_fn(worker_id)


class _Batches(torch.utils.data.IterableDataset):
    """Batches ``(epoch, i, seeds)`` of the current share; worker ``w`` of ``W`` yields
    batches ``w, w + W, ...``, which torch's round-robin over workers puts back in order.
    ``share`` and ``state`` (epoch, number of ids) are shared with the workers and
    rewritten each epoch. Iterable, not indexable: DGL tries ``torch.tensor(indices)`` on
    whatever it is given, which on an indexable dataset would fetch its items."""

    device = torch.device("cpu")  # DGL asks where custom indices live

    def __init__(self, share: torch.Tensor, state: torch.Tensor, batch_size: int, num_batches: int,
                 types: Optional[Sequence[Tuple[str, int, int]]], idtype: torch.dtype = torch.int64):
        self.share, self.state, self.idtype = share, state, idtype
        self.batch_size, self.num_batches, self.types = batch_size, num_batches, types

    def __len__(self) -> int:
        return self.num_batches

    def __iter__(self) -> Iterator[Tuple[int, int, Any]]:
        info = torch.utils.data.get_worker_info()
        first, step = (info.id, info.num_workers) if info is not None else (0, 1)
        epoch, n = int(self.state[0]), int(self.state[1])
        for i in range(first, self.num_batches, step):
            ids = self.share[i * self.batch_size: min((i + 1) * self.batch_size, n)]
            # A copy (the share is rewritten next epoch), in the graph's id type: DGL refuses
            # int64 seeds on an int32 graph.
            ids = ids.clone() if ids.dtype == self.idtype else ids.to(self.idtype)
            if self.types is not None:
                ids = split_flat(ids, self.types)
            yield epoch, i, ids


class _SeededSampler:
    """DGL graph sampler that seeds DGL from the batch's key, then samples its seeds."""

    def __init__(self, inner: Any, seed: int, rank: int, on_epoch: Any = None):
        self.inner, self.seed, self.rank, self.on_epoch = inner, seed, rank, on_epoch
        self.output_device = getattr(inner, "output_device", None)

    def sample(self, g: Any, item: Tuple[int, int, Any]) -> Any:
        import dgl  # here: the engine imports without DGL (plain-torch tasks)

        epoch, index, seeds = item
        if self.on_epoch is not None:
            self.on_epoch(epoch)  # in the sampling process: a persistent worker's copy too
        dgl.seed(batch_seed(self.seed, self.rank, epoch, index))
        return self.inner.sample(g, seeds)


class BatchSampling:
    """DGL batches of one rank's share of seeds, sampled here or in worker processes.

    ``graph_sampler``: what DGL's loader would take (a block sampler, or an edge
    prediction sampler). ``types``: for a heterograph, ``(type, offset, count)`` spans that
    turn the flat ids of the share back into ``{type: ids}`` batches. ``dataloader_kwargs`` go
    to DGL's ``DataLoader`` (``num_workers``, ``persistent_workers``, ``device``, ...).
    ``on_epoch(epoch)``, when given, runs before each batch is sampled, in the process
    that samples it (e.g. to set a negative sampler's epoch).
    """

    def __init__(self, graph: Any, graph_sampler: Any, batch_size: int, drop_last: bool,
                 types: Optional[Sequence[Tuple[str, int, int]]] = None, on_epoch: Any = None,
                 **dataloader_kwargs: Any):
        self.on_epoch = on_epoch
        self.graph, self.graph_sampler = graph, graph_sampler
        self.batch_size, self.drop_last, self.types = batch_size, drop_last, types
        self.kwargs = check_loader_kwargs(dict(dataloader_kwargs))
        self._loader: Any = None
        self._key: Any = None

    def __getstate__(self) -> Dict[str, Any]:
        state = dict(self.__dict__)
        state["_loader"], state["_key"] = None, None  # worker processes are per rank
        return state

    def iterate(self, share: torch.Tensor, seed: int, rank: int, epoch: int) -> Iterator[Any]:
        """Batches of ``share`` (this rank's ids for ``epoch``), in order."""
        n = share.numel()
        num_batches = n // self.batch_size if self.drop_last else -(-n // self.batch_size)
        key = (n, num_batches, seed, rank, current_mode())
        if self._loader is None or self._key != key:
            self._loader, self._key = self._build(n, num_batches, seed, rank), key
        if not self.kwargs.get("num_workers") and getattr(self.graph, "device", torch.device("cpu")).type == "cpu":
            _warn_if_many_threads()
        dataset = self._loader.dataset
        dataset.share[:n].copy_(share)
        dataset.state[0], dataset.state[1] = epoch, n
        with warnings.catch_warnings():
            # DGL advises pinning workers to cores on every iteration. graphtrainer's ranks
            # already divide the cores (pin_cpus, threads_per_proc), and pinning a rank's
            # workers to "node 0's first cores" would stack every rank's workers on the
            # same cores: the advice is not followed, and not printed.
            warnings.filterwarnings("ignore", message=".*CPU affinity.*")
            return iter(self._loader)

    def _build(self, n: int, num_batches: int, seed: int, rank: int) -> Any:
        import dgl  # here: the engine imports without DGL (plain-torch tasks)

        kwargs = dict(self.kwargs)
        workers = kwargs.get("num_workers", 0)
        share = torch.empty(max(n, 1), dtype=torch.int64)
        state = torch.zeros(2, dtype=torch.int64)
        if workers:
            share.share_memory_()
            state.share_memory_()
            kwargs["worker_init_fn"] = _WorkerInit(kwargs.get("worker_init_fn"), current_mode())
        dataset = _Batches(share, state, self.batch_size, num_batches, self.types,
                           getattr(self.graph, "idtype", torch.int64))
        sampler = _SeededSampler(self.graph_sampler, seed, rank, self.on_epoch)
        return dgl.dataloading.DataLoader(self.graph, dataset, sampler,
                                          batch_size=1, shuffle=False, drop_last=False, **kwargs)



_PREFETCH = ("prefetch_node_feats", "prefetch_labels", "prefetch_edge_feats")


def without_data(sampler: Any) -> Any:
    """A copy of ``sampler`` that gathers no node or edge data into its blocks (DGL's lazy views
    still read any key on access), for batches that read the rows they keep themselves; None
    where that is not known to leave the structure as it was: a block sampler that is not DGL's
    own (its ``sample`` may set data of its own). Wrappers (DGL's edge prediction sampler,
    graphtrainer's pair sampler: ``wraps_block_sampler``) are copied around a copy of theirs."""
    import dgl  # here: the engine imports without DGL (plain-torch tasks)

    if type(sampler) is dgl.dataloading.EdgePredictionSampler or getattr(sampler, "wraps_block_sampler", False):
        inner = without_data(sampler.sampler)
        if inner is None:
            return None
        out = copy.copy(sampler)
        out.sampler = inner
    elif isinstance(sampler, dgl.dataloading.BlockSampler) and type(sampler).__module__.startswith("dgl."):
        out = copy.copy(sampler)
    else:
        return None
    for name in _PREFETCH:
        if hasattr(out, name):
            setattr(out, name, [])
    return out
