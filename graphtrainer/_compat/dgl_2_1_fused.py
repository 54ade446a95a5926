"""DGL 2.1's fused neighbour sampler on int32 graphs (installed with the stream claim of
:mod:`graphtrainer._compat.dgl_2_1_streams`, right after ``import dgl``).

``NeighborSampler`` runs ``sample_neighbors_fused`` on the CPU whenever DGL has more than one
thread. That function keeps a per-process node mapping (``mapping["__mapping<pid>"]``, one tensor
per node type) that DGL creates as int64, while its C++ reads and writes it as the graph's id
type. On an int32 graph the threads then use the wrong slots: blocks come back with edges past
their source nodes and source nodes of other batches, and training reads out of bounds (measured:
29 of 30 two-layer batches wrong on a 20k-node graph with 2 threads; a fit died with
``malloc(): unaligned tcache chunk detected``). Here the mapping is made in the graph's id type
before DGL's function runs; DGL's own code then keeps it as it should. int64 graphs are untouched.
"""
from __future__ import annotations

import functools
import inspect
import os
import sys
from typing import Any, Callable

import torch

_WRAPPED = "__graphtrainer_int32_mapping__"


def mapping_in_id_type(call: Callable) -> Callable:
    """``call`` (DGL's ``sample_neighbors_fused``), given a node mapping of the graph's id type."""
    signature = inspect.signature(call)

    @functools.wraps(call)
    def run(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(*args, **kwargs)
        g = bound.arguments["g"]
        if g.idtype == torch.int32:
            mapping = bound.arguments.get("mapping")
            if mapping is None:  # DGL would make a fresh int64 one for this call
                mapping = bound.arguments["mapping"] = {}
            key = "__mapping" + str(os.getpid())  # DGL's key: a forked process starts its own
            held = mapping.get(key)
            if held is None or len(held) != len(g.ntypes) or any(
                    m.dtype != torch.int32 or m.numel() != g.num_nodes(t) for m, t in zip(held, g.ntypes)):
                mapping[key] = [torch.full((g.num_nodes(t),), -1, dtype=torch.int32) for t in g.ntypes]
        return call(*bound.args, **bound.kwargs)

    setattr(run, _WRAPPED, call)
    return run


def install_fused_int32_fix() -> None:
    """Wrap ``sample_neighbors_fused`` where DGL exposes it (once): the function, its
    ``dgl.sampling`` export and the ``DGLGraph`` method."""
    neighbor = sys.modules.get("dgl.sampling.neighbor")
    call = getattr(neighbor, "sample_neighbors_fused", None)
    if call is None or hasattr(call, _WRAPPED):
        return
    fixed = mapping_in_id_type(call)
    neighbor.sample_neighbors_fused = fixed
    sampling = sys.modules.get("dgl.sampling")
    if getattr(sampling, "sample_neighbors_fused", None) is call:
        sampling.sample_neighbors_fused = fixed
    dgl = sys.modules["dgl"]
    dgl.DGLGraph.sample_neighbors_fused = fixed  # DGL aliased the function as a method at import
