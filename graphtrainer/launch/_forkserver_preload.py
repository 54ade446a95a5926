"""Imported by the fork server only (see :mod:`graphtrainer.launch.forkserver`): torch, dgl and
the engine, once (the package's ``__init__``, run first, brings the Trainer), then the collector
is told to leave those objects alone, so that ranks forked from the server keep sharing their
pages (a collection in a rank would otherwise write to every inherited object's page)."""
import atexit
import gc
import os

import torch  # noqa: F401

import graphtrainer.launch.local  # noqa: F401
from graphtrainer.launch.lean import import_rank_modules

import_rank_modules()

try:
    import dgl  # noqa: F401

    import graphtrainer.data.edge_loader  # noqa: F401
    import graphtrainer.data.node_loader  # noqa: F401
except ImportError:  # plain-torch tasks need no dgl
    pass

if os.environ.pop("GRAPHTRAINER_FORKSERVER", None) == "1":
    gc.collect()
    gc.freeze()
    # Released at the server's exit: a nanobind extension (triton's) reports frozen objects as leaked.
    atexit.register(gc.unfreeze)
