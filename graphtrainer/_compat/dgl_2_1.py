"""Lets DGL 2.1 (the last DGL wheel for Linux on PyPI) import on a torch it was not built for.

``import dgl`` imports ``dgl.distributed``, which imports ``dgl.graphbolt``, which loads
``libgraphbolt_pytorch_<torch version>.so``. The wheel ships that library only for the
torch versions DGL was built against (2.0.0 to 2.2.1 for dgl 2.1.0), so on any later torch
``import dgl`` fails although DGL's core (graphs, sampling, ``dgl.nn``, DistDGL's classic
path) works. :func:`install` puts a placeholder ``dgl.graphbolt`` in ``sys.modules`` first;
everything GraphBolt offers then raises an ``ImportError`` that names the running torch,
the versions the installed DGL has GraphBolt for, and the fix. Nothing in the installed
``dgl`` package is changed. On a torch that DGL supports, nothing is done.

``dgl.utils`` prefers ``packaging`` and only falls back to ``setuptools.extern.packaging``
(gone from setuptools 71), so graphtrainer requires ``packaging`` instead of pinning
setuptools.
"""
from __future__ import annotations

import importlib.util
import os
import re
import sys
import types
import warnings
from typing import List, Optional, Tuple

import torch

#: DGL releases graphtrainer's test suite runs against.
TESTED_DGL = ("2.1.0",)
#: The tested set that needs no placeholder (requirements/tested.txt).
PINNED_STACK = "torch==2.2.1 dgl==2.1.0 torchdata==0.7.1 'numpy<2'"
MIN_TORCH = (2, 0)


def torch_release() -> str:
    """``torch.__version__`` without its local build tag (``2.15.0+cu132`` -> ``2.15.0``)."""
    return torch.__version__.split("+", maxsplit=1)[0]


def _dgl_dir() -> Optional[str]:
    try:
        spec = importlib.util.find_spec("dgl")
    except (ImportError, ValueError):  # a finder that refuses dgl: plain-torch use
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return list(spec.submodule_search_locations)[0]


def graphbolt_torch_versions(dgl_dir: str) -> List[str]:
    """The torch versions the installed DGL ships a GraphBolt library for."""
    folder = os.path.join(dgl_dir, "graphbolt")
    found = []
    for name in os.listdir(folder) if os.path.isdir(folder) else ():
        match = re.fullmatch(r"libgraphbolt_pytorch_(.+)\.so", name)
        if match:
            found.append(match.group(1))
    return sorted(found, key=lambda v: tuple(int(p) if p.isdigit() else 0 for p in v.split(".")))


def graphbolt_message(versions: List[str]) -> str:
    shipped = ", ".join(versions) if versions else "none"
    return (f"DGL's GraphBolt is not available on torch {torch_release()}: the installed dgl has "
            f"its C++ library only for torch {shipped}. graphtrainer loaded DGL without it, so "
            f"DGL's graphs, samplers, dgl.nn and DistDGL work, but GraphBolt (dgl.graphbolt) does "
            f"not. To use GraphBolt, install the pinned tested set: pip install {PINNED_STACK} "
            f"(requirements/tested.txt).")


class GraphBoltUnavailable(types.ModuleType):
    """Stands in for ``dgl.graphbolt`` when its library is missing for the running torch.

    The names DGL's own code checks with ``isinstance`` are classes that nothing can
    instantiate, so those checks answer False; every other public name raises ImportError.
    """

    def __init__(self, message: str) -> None:
        super().__init__("dgl.graphbolt", message)
        self.__graphtrainer_message__ = message
        for name in ("FusedCSCSamplingGraph", "SamplingGraph", "ItemSet", "ItemSetDict",
                     "MiniBatch", "Feature", "FeatureStore"):
            setattr(self, name, _unavailable_class(name, message))

    def __getattr__(self, name: str):
        if name.startswith("_"):  # the import system and inspect probe dunders
            raise AttributeError(name)
        raise ImportError(f"dgl.graphbolt.{name}: {self.__graphtrainer_message__}")


def _unavailable_class(name: str, message: str) -> type:
    def refuse(cls, *args, **kwargs):
        raise ImportError(f"dgl.graphbolt.{name}: {message}")
    return type(name, (), {"__new__": refuse, "__module__": "dgl.graphbolt"})


def graphbolt_available() -> bool:
    """True when ``dgl.graphbolt`` is DGL's own module (False for the placeholder or no dgl)."""
    module = sys.modules.get("dgl.graphbolt")
    return module is not None and not isinstance(module, GraphBoltUnavailable)


def major_minor(version: str) -> Tuple[int, ...]:
    """The first two numbers of a version string (``2.15.0+cu132`` -> ``(2, 15)``)."""
    return tuple(int(p) for p in re.findall(r"\d+", version)[:2])


def _check_torch() -> None:
    if major_minor(torch_release()) < MIN_TORCH:
        raise ImportError(f"graphtrainer needs torch >= 2.0; this is torch {torch.__version__}. "
                          f"Install a tested set: pip install {PINNED_STACK}, or the newest one "
                          f"in requirements/newest.txt.")


def _dgl_version(dgl_dir: str) -> Optional[str]:
    try:
        from importlib.metadata import version
        return version("dgl")
    except Exception:  # an unpacked or copied dgl without metadata: read its _ffi/libinfo
        path = os.path.join(dgl_dir, "_ffi", "libinfo.py")
        if os.path.exists(path):
            with open(path) as f:
                match = re.search(r'__version__ = "([^"]+)"', f.read())
            return match.group(1) if match else None
        return None


def install() -> None:
    """Make ``import dgl`` work on the running torch; a no-op where it already does.

    Called once by ``import graphtrainer``. A DGL that is already imported is left alone.
    """
    _check_torch()
    if "dgl" in sys.modules or "dgl.graphbolt" in sys.modules:
        return
    dgl_dir = _dgl_dir()
    if dgl_dir is None:
        return  # plain-torch tasks need no dgl; its users get DGL's own ImportError
    version = _dgl_version(dgl_dir)
    if version is not None and version.split("+")[0] not in TESTED_DGL:
        warnings.warn(f"graphtrainer is tested with dgl {', '.join(TESTED_DGL)}; this is dgl "
                      f"{version}. If DGL misbehaves, install a tested set: pip install "
                      f"{PINNED_STACK}.", stacklevel=3)
    versions = graphbolt_torch_versions(dgl_dir)
    if torch_release() not in versions:
        sys.modules["dgl.graphbolt"] = GraphBoltUnavailable(graphbolt_message(versions))
