"""Offline datasets (node classification, link prediction splits, graph classification)
and a synthetic graph generator.

:func:`load` reads real datasets from a local, read-only data folder and never
downloads. The folder is, in order: the ``root=`` argument, ``$GRAPHTRAINER_DATA``,
or ``<repo root>/../shared/datasets``. Its layout is described in that folder's
``README.md`` (``dgl/<name>_<hash>/`` for DGL's own loaders, ``raw/`` for the rest).

Processed caches go to the cache folder, never into the data folder: the ``cache=``
argument, ``$GRAPHTRAINER_CACHE``, ``$XDG_CACHE_HOME/graphtrainer``, or
``~/.cache/graphtrainer``.

:func:`synthetic` builds a reproducible, learnable graph of any size in memory.
:func:`link_split` makes the classic 85/5/10 link-prediction split of a graph;
:func:`minigc` and :func:`read_tu` give graph-classification datasets (generated locally,
or read from TU-format text files the user brings).
"""
from ._checks import PathLike
from .graph_sets import minigc, read_tu
from .hetero import cora_hetero, synthetic_hetero
from .known import CACHE_ENV, DATA_ENV, KNOWN, cache_dir, data_root, load
from .links import LinkSplit, link_split
from .synthetic import synthetic

__all__ = ["DATA_ENV", "CACHE_ENV", "KNOWN", "data_root", "cache_dir", "load", "synthetic",
           "LinkSplit", "link_split", "minigc", "read_tu", "cora_hetero", "synthetic_hetero", "PathLike"]
