"""DGL 2.1's CPU sampling made independent of OpenMP thread timing, for
``Trainer(deterministic=True)`` (or ``"warn"``). The wrappers go in right after ``import dgl``
(with the stream claim of :mod:`graphtrainer._compat.dgl_2_1_streams`) and pass every call
straight through unless :func:`set_thread_fixes` switched them on: they cost time (a pass over
each block's edges, a reseed of the team per sampling call), so only a deterministic run pays it.

With more than one OpenMP thread, a seeded DGL 2.1 sampler draws differently from run to run:

- Relabelling races. ``to_block`` (a concurrent hash map) and the fused neighbour sampler (a
  compare-and-swap on a node mapping) number a block's new source nodes in the order the
  threads happen to reach them. The next layer samples its rows in that order, each thread a
  fixed slice of rows with its own random stream, so every later draw follows the race
  (two threads are enough). Switched on, each block's new source nodes are renumbered by their
  first appearance along the block's edges, the order one thread gives; nodes and edges are DGL's.
- Threads started anew (three threads or more). ``dgl.seed`` seeds the engine of each thread
  in the team once. GNU OpenMP ends a team's surplus threads whenever a smaller team runs (a
  torch op or a DGL loop cut into fewer chunks than threads) and starts new ones for the next
  larger team: their engines are seeded from the OS, and they take DGL stream numbers in a
  race. Switched on, the calling thread's team is seeded right before each DGL sampling call,
  from the calling thread's own stream, its threads numbered in team order (:func:`seed_team`;
  every ``dgl.seed`` goes through it too). That makes a rerun of the same script draw the
  same, but not a batch a function of its seed alone: DGL's thread numbers only grow, so a
  new thread's stream depends on how many threads the process started before it (a resumed
  fit, a second fit, evaluation in between). Two threads have no such history: a team of one
  leaves the pool alone, so the second thread lives as long as its process.

With one thread neither applies and nothing is changed. The fixes wrap DGL's C entry points
in their Python modules; DGL's files are not touched.
"""
from __future__ import annotations

import functools
import sys
from typing import Any, Callable, List, Optional, Sequence

import torch

#: DGL's C sampling calls that draw from the OpenMP threads' engines, by Python module.
SAMPLING_CALLS = {
    "dgl.sampling.neighbor": ("_CAPI_DGLSampleNeighbors", "_CAPI_DGLSampleNeighborsEType",
                              "_CAPI_DGLSampleNeighborsBiased", "_CAPI_DGLSampleNeighborsFused"),
    "dgl.sampling.labor": ("_CAPI_DGLSampleLabors",),
    "dgl.sampling.randomwalks": ("_CAPI_DGLSamplingRandomWalk", "_CAPI_DGLSamplingRandomWalkWithRestart",
                                 "_CAPI_DGLSamplingRandomWalkWithStepwiseRestart"),
    "dgl.sampling.negative": ("_CAPI_DGLGlobalUniformNegativeSampling",),
}
_CPU = 1  # DGL's device type code for the CPU


#: The most OpenMP threads whose DGL draws depend on the seeds alone (with the fixes on).
REPEATABLE_THREADS = 2

_on = False  # read by every wrapper on every call: off, each passes its call straight through


def set_thread_fixes(on: bool) -> None:
    """Switch the fixes on or off in this process (a rank's runtime does, per run)."""
    global _on
    _on = bool(on)


def thread_fixes_on() -> bool:
    """Whether DGL's sampling calls in this process go through the fixes."""
    return _on


def _threads() -> int:
    return sys.modules["dgl"].utils.get_num_threads()


def seed_team(value: int) -> None:
    """Seed DGL in the calling thread and each thread of its OpenMP team, the team's threads
    taking their stream numbers in team order.

    The team grows one thread at a time, so at each step only its newest thread can be
    without a number, and it takes the next one alone (GNU OpenMP keeps a team's threads in
    their slots while teams grow). The caller's thread count is restored afterwards.
    """
    dgl = sys.modules["dgl"]
    set_seed = dgl.random._CAPI_SetSeed
    set_seed = getattr(set_seed, "__graphtrainer_wrapped__", set_seed)
    threads = _threads()
    try:
        for team in range(1, threads + 1):
            dgl.utils.set_num_threads(team)
            set_seed(value)
    finally:
        dgl.utils.set_num_threads(threads)


def seeded_per_call(call: Callable) -> Callable:
    """``call``, run after seeding the caller's OpenMP team from the caller's own DGL stream."""
    @functools.wraps(call)
    def run(*args: Any) -> Any:
        if _on and _threads() > REPEATABLE_THREADS:  # two keep theirs: a team of one leaves the pool alone
            dgl = sys.modules["dgl"]
            seed_team(int(dgl.random.choice(1 << 31, 1)[0]))
        return call(*args)
    run.__graphtrainer_wrapped__ = call  # type: ignore[attr-defined]
    return run


def first_seen_order(sources: Sequence[torch.Tensor], num_nodes: int, fixed: int) -> Optional[torch.Tensor]:
    """Old local ids of ``num_nodes`` source nodes in canonical order: the first ``fixed`` (the
    destination nodes) where they are, the rest by first appearance in ``sources`` (each
    relation's source ids in edge id order, relations in order); None when that is their order."""
    src = sources[0] if len(sources) == 1 else torch.cat(sources)
    if src.dtype == torch.int32 and src.numel() and int(src.max()) >= num_nodes:
        # A block pointing past its nodes (DGL's fused sampler on an int32 graph, were its mapping
        # not made int32 by dgl_2_1_fused) is left as DGL made it.
        return None
    src = src.long()
    first = torch.full((num_nodes,), src.numel(), dtype=torch.int64)
    first.scatter_reduce_(0, src, torch.arange(src.numel()), "amin")
    # Distinct first positions: every source node past the destinations is on an edge.
    rest = torch.sort(first[fixed:], stable=True).indices
    if torch.equal(rest, torch.arange(rest.numel())):
        return None
    return torch.cat([torch.arange(fixed), rest + fixed])


def canonical_block(gidx: Any, fixed: List[int], csc: bool) -> Any:
    """``(graph index, order per node type)`` with the block's source nodes renumbered in
    canonical order; ``order`` is None per type already in it (and the index is ``gidx`` when
    all are). ``csc``: rebuild relations from CSC (the fused sampler's) rather than COO."""
    from dgl import heterograph_index, utils

    meta = gidx.metagraph
    ntypes, etypes = len(fixed), gidx.number_of_etypes()
    ends = [meta.find_edge(e) for e in range(etypes)]
    orders: List[Any] = []
    for t in range(ntypes):
        sources = [gidx.edges(e, "eid")[0] for e in range(etypes) if ends[e][0] == t]
        orders.append(first_seen_order(sources, gidx.num_nodes(t), fixed[t]) if sources else None)
    if all(o is None for o in orders):
        return gidx, orders
    rels = []
    for e, (s, d) in enumerate(ends):
        n_src, n_dst = gidx.num_nodes(s), gidx.num_nodes(d)
        if orders[s] is None:
            rels.append(gidx.get_relation_graph(e))
            continue
        new_id = torch.empty(n_src, dtype=torch.int64)
        new_id[orders[s]] = torch.arange(n_src)
        if csc:
            _, _, indptr, indices, data = gidx.adjacency_matrix_tensors(e, True, "csr")
            rels.append(heterograph_index.create_unitgraph_from_csr(
                2, n_src, n_dst, indptr, new_id[indices.long()].to(indices.dtype), data,
                ["coo", "csr", "csc"], transpose=True))
        else:
            src, dst, _ = gidx.edges(e, "eid")
            rels.append(heterograph_index.create_unitgraph_from_coo(
                2, n_src, n_dst, new_id[src.long()].to(src.dtype), dst, ["coo", "csr", "csc"]))
    counts = utils.toindex([gidx.num_nodes(t) for t in range(2 * ntypes)], "int64")
    return heterograph_index.create_heterograph_from_relations(meta, rels, counts), orders


def _reorder(ids: Sequence[Any], orders: List[Any]) -> List[Any]:
    from dgl import backend as F

    return [nd if o is None else F.to_dgl_nd(F.from_dgl_nd(nd)[o]) for nd, o in zip(ids, orders)]


def _racy(graph_index: Any) -> bool:
    return graph_index.ctx.device_type == _CPU and _threads() > 1


def to_block_in_order(call: Callable) -> Callable:
    """DGL's C ``ToBlock`` with the source nodes it makes in canonical order."""
    @functools.wraps(call)
    def run(graph: Any, dst_nodes: Any, include_dst: bool, src_nodes: Any) -> Any:
        out = call(graph, dst_nodes, include_dst, src_nodes)
        if not _on or len(src_nodes) or not _racy(graph):  # given source nodes are kept as given
            return out
        gidx, induced_nodes, induced_edges = out
        fixed = [int(d.shape[0]) if include_dst else 0 for d in dst_nodes]
        gidx, orders = canonical_block(gidx, fixed, csc=False)
        return gidx, _reorder(induced_nodes, orders), induced_edges
    run.__graphtrainer_wrapped__ = call  # type: ignore[attr-defined]
    return run


def fused_in_order(call: Callable) -> Callable:
    """DGL's C fused neighbour sampler with the source nodes it makes in canonical order."""
    @functools.wraps(call)
    def run(graph: Any, nodes: Any, mapping: Any, fanouts: Any, edge_dir: str, *rest: Any) -> Any:
        if not _on or not _racy(graph):
            return call(graph, nodes, mapping, fanouts, edge_dir, *rest)
        if edge_dir != "in":  # its new nodes are on the destination side: sample with one thread
            dgl = sys.modules["dgl"]
            threads = _threads()
            dgl.utils.set_num_threads(1)
            try:
                return call(graph, nodes, mapping, fanouts, edge_dir, *rest)
            finally:
                dgl.utils.set_num_threads(threads)
        gidx, induced_nodes, induced_edges = call(graph, nodes, mapping, fanouts, edge_dir, *rest)
        fixed = _fused_seed_prefix(graph, nodes, fanouts)
        gidx, orders = canonical_block(gidx, fixed, csc=True)
        return gidx, _reorder(induced_nodes, orders), induced_edges
    run.__graphtrainer_wrapped__ = call  # type: ignore[attr-defined]
    return run


def _fused_seed_prefix(graph: Any, nodes: Any, fanouts: Any) -> List[int]:
    """Per node type, how many source nodes the fused sampler put first: that type's seeds,
    when some relation into it was sampled (DGL maps the seeds there), else none."""
    from dgl import backend as F

    counts = [int(n.shape[0]) for n in nodes]
    fanout = F.from_dgl_nd(fanouts).tolist()
    fixed = [0] * len(counts)
    for e in range(graph.number_of_etypes()):
        dst = graph.metagraph.find_edge(e)[1]
        if counts[dst] and fanout[e] != 0:
            fixed[dst] = counts[dst]
    return fixed


def install_thread_fixes() -> None:
    """Wrap DGL's C entry points (once). Switched on (:func:`set_thread_fixes`): ``dgl.seed``
    numbers the team in order, sampling calls seed their team first, ``ToBlock`` and the fused
    sampler number new source nodes canonically; off, each wrapper calls DGL's function alone."""
    random = sys.modules.get("dgl.random")
    set_seed = getattr(random, "_CAPI_SetSeed", None)
    if set_seed is not None and not hasattr(set_seed, "__graphtrainer_wrapped__"):
        def seed_in_team_order(value: int) -> None:
            if _on:
                seed_team(value)
            else:
                set_seed(value)
        seed_in_team_order.__graphtrainer_wrapped__ = set_seed  # type: ignore[attr-defined]
        random._CAPI_SetSeed = seed_in_team_order
    for module_name, names in SAMPLING_CALLS.items():
        module = sys.modules.get(module_name)
        for name in names:
            call = getattr(module, name, None)
            if call is not None and not hasattr(call, "__graphtrainer_wrapped__"):
                setattr(module, name, seeded_per_call(call))
    _wrap("dgl.transforms.to_block", "_CAPI_DGLToBlock", to_block_in_order)
    _wrap("dgl.sampling.neighbor", "_CAPI_DGLSampleNeighborsFused", fused_in_order)


def _wrap(module_name: str, name: str, wrapper: Callable) -> None:
    module = sys.modules.get(module_name)
    call = getattr(module, name, None)
    if call is not None and getattr(call, "__graphtrainer_relabel__", False) is False:
        wrapped = wrapper(call)
        wrapped.__graphtrainer_relabel__ = True  # type: ignore[attr-defined]
        setattr(module, name, wrapped)
