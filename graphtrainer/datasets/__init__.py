"""Offline datasets (node classification, link prediction splits, graph classification)
and a synthetic graph generator.

:func:`load` reads real datasets from a local, read-only data folder (``root=``,
``$GRAPHTRAINER_DATA`` or ``<repo root>/../shared/datasets``; layout in its ``README.md``) and
never downloads. Processed caches go to ``cache=``, ``$GRAPHTRAINER_CACHE``,
``$XDG_CACHE_HOME/graphtrainer`` or ``~/.cache/graphtrainer``.

:func:`synthetic` builds a reproducible, learnable graph of any size; :func:`link_split` the
classic 85/5/10 link-prediction split; :func:`minigc` and :func:`read_tu` graph-classification
datasets (generated, or read from TU-format files).
"""
from ._checks import PathLike
from .graph_sets import minigc, read_tu
from .hetero import cora_hetero, synthetic_hetero
from .known import CACHE_ENV, DATA_ENV, KNOWN, cache_dir, data_root, load
from .links import LinkSplit, link_split
from .synthetic import synthetic

__all__ = ["DATA_ENV", "CACHE_ENV", "KNOWN", "data_root", "cache_dir", "load", "synthetic",
           "LinkSplit", "link_split", "minigc", "read_tu", "cora_hetero", "synthetic_hetero", "PathLike"]
