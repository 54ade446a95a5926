"""Old import paths and metric names that still work, with a ``DeprecationWarning`` naming the new one.

One table, :data:`MOVED`, maps each module path that once existed (or was documented) to where its
names live now. A module that moved whole is the new module under its old name as well
(``graphtrainer.inference`` *is* ``graphtrainer.data.inference``; importing it warns once). A
module that was split (``graphtrainer.metrics``) is a stand-in whose names are looked up in the new
modules in order; taking a name warns with that name's new path. Names that left a module that is
still there are listed in :data:`MOVED_NAMES` and served by that module's ``__getattr__``. Names
that go without a new home are listed in :data:`DEPRECATED` and warn from their own body.
:data:`RENAMED_METRICS` does the same for metric keys (``val_hits@20`` is ``val_pooled_hits@20``).

Policy (docs/api.md): an alias stays for the release it was added in and the next one
(:data:`REMOVED_IN`), then goes. To move a module, add one row to :data:`MOVED`; nothing else.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import re
import sys
import types
import warnings
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

#: The release in which the aliases below stop working.
REMOVED_IN = "0.3.0"

#: old module -> the module(s) its names live in now (first match wins for a split module).
MOVED: Dict[str, Tuple[str, ...]] = {
    # 0.1.0: the flat package became layers (loop/, launch/, data/, checkpoint/, distdgl/, testing/)
    "graphtrainer.batches": ("graphtrainer.loop.batches",),
    "graphtrainer.checkpoint_file": ("graphtrainer.checkpoint.file",),
    "graphtrainer.ddp": ("graphtrainer.loop.ddp",),
    "graphtrainer.dist_cluster": ("graphtrainer.distdgl.cluster",),
    "graphtrainer.dist_graph": ("graphtrainer.distdgl.graph",),
    "graphtrainer.dist_loader": ("graphtrainer.distdgl.loader",),
    "graphtrainer.distributed": ("graphtrainer.comm", "graphtrainer.launch.environment"),
    "graphtrainer.edge_loader": ("graphtrainer.data.edge_loader",),
    "graphtrainer.eval_loop": ("graphtrainer.loop.evaluate",),
    "graphtrainer.fit_loop": ("graphtrainer.loop.fit",),
    "graphtrainer.forkserver": ("graphtrainer.launch.forkserver",),
    "graphtrainer.formats": ("graphtrainer.data.formats",),
    "graphtrainer.graph_loader": ("graphtrainer.data.graph_loader",),
    "graphtrainer.graph_servers": ("graphtrainer.distdgl.servers",),
    "graphtrainer.hetero": ("graphtrainer.data.hetero",),
    "graphtrainer.hetero_data": ("graphtrainer.datasets.hetero",),
    "graphtrainer.inference": ("graphtrainer.data.inference",),
    "graphtrainer.job_failures": ("graphtrainer.distdgl.job_failures",),
    "graphtrainer.lean": ("graphtrainer.launch.lean",),
    "graphtrainer.loggers": ("graphtrainer.loop.loggers",),
    "graphtrainer.metrics": ("graphtrainer.evaluation.ranking", "graphtrainer.loop.metrics"),
    "graphtrainer.optim": ("graphtrainer.loop.optim",),
    "graphtrainer.precision": ("graphtrainer.loop.precision",),
    "graphtrainer.preemption": ("graphtrainer.loop.preemption",),
    "graphtrainer.preflight": ("graphtrainer.launch.preflight",),
    "graphtrainer.profiler": ("graphtrainer.loop.profiler",),
    "graphtrainer.rank": ("graphtrainer.loop.hooks",),
    "graphtrainer.run_files": ("graphtrainer.checkpoint.run_files",),
    "graphtrainer.runtime": ("graphtrainer.loop.runtime",),
    "graphtrainer.sampling": ("graphtrainer.data.node_loader", "graphtrainer.data.sharded_loader",
                              "graphtrainer.data.sharding", "graphtrainer.data.validation",
                              "graphtrainer.launch.preflight"),
    "graphtrainer.seeding": ("graphtrainer.loop.seeding",),
    "graphtrainer.shared_graph": ("graphtrainer.launch.shared_graph",),
    "graphtrainer.simulated_machines": ("graphtrainer.testing.simulated_machines",),
    "graphtrainer.stages": ("graphtrainer.loop.stages",),
    "graphtrainer.threads": ("graphtrainer.launch.threads",),
    "graphtrainer.workers": ("graphtrainer.data.workers",),
    # 0.1.0, later: the top level keeps the facade and the bottom layer; the rest went to named folders
    "graphtrainer.affinity": ("graphtrainer.process.affinity",),
    "graphtrainer.binned_auroc": ("graphtrainer.evaluation.binned_auroc",),
    "graphtrainer.cli_errors": ("graphtrainer.cli.errors",),
    "graphtrainer.mlflow_logger": ("graphtrainer.integrations.mlflow_logger",),
    "graphtrainer.partition": ("graphtrainer.cli.partition",),
    "graphtrainer.pids": ("graphtrainer.process.pids",),
    "graphtrainer.ranking": ("graphtrainer.evaluation.ranking",),
}

#: (module still there, name that left it) -> the module that has the name now.
MOVED_NAMES: Dict[Tuple[str, str], str] = {
    **{("graphtrainer.partition", name): "graphtrainer.distdgl.partition"
       for name in ("PartRow", "read_meta", "load_orig_ids", "to_partition_ids")},
    ("graphtrainer.launch.leftovers", "die_with_parent"): "graphtrainer.process.parent",
}

#: public name that goes without a new home -> what to use instead (its body calls :func:`deprecated`).
DEPRECATED: Dict[str, str] = {
    "graphtrainer.data.device.graph.data_bytes": "sum the tensors' nbytes, or call "
                                                 "graphtrainer.data.device.graph.bytes_to_copy for what a device "
                                                 "copy adds",
}

#: old metric key (a pattern) -> new key; ``prefix`` is whatever came before (``val_``, ``test_``).
RENAMED_METRICS: Sequence[Tuple["re.Pattern[str]", str]] = (
    (re.compile(r"^(?P<prefix>.*?)(?<!pooled_)(?<!per_edge_)hits@(?P<k>\d+)$"), "{prefix}pooled_hits@{k}"),
)


def _warn(old: str, new: str, what: str = "moved to", stacklevel: int = 3,
          category: type = DeprecationWarning) -> None:
    warnings.warn(f"{old} {what} {new}; the old name works until graphtrainer {REMOVED_IN} "
                  "(see docs/api.md)", category, stacklevel=stacklevel)


class _SplitModule(types.ModuleType):
    """Stands for a module whose names went to several modules: each name is looked up on use."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        for target in MOVED[self.__name__]:
            module = importlib.import_module(target)
            if hasattr(module, name):
                _warn(f"{self.__name__}.{name}", f"{target}.{name}")
                return getattr(module, name)
        raise AttributeError(f"module {self.__name__!r} has no attribute {name!r} (it was split into "
                             f"{', '.join(MOVED[self.__name__])}, none of which has it)")

    def __dir__(self) -> list:
        return sorted({n for t in MOVED[self.__name__] for n in dir(importlib.import_module(t))})


class _Loader(importlib.abc.Loader):
    def __init__(self) -> None:
        self._real_spec: Any = None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        targets = MOVED[spec.name]
        if len(targets) == 1:
            _warn(spec.name, targets[0])  # at the user's import line: warnings skips importlib's frames
            module = importlib.import_module(targets[0])  # the module itself, under its old name too
            self._real_spec = module.__spec__
            return module
        return _SplitModule(spec.name, f"Moved: the names of {spec.name} are now in {', '.join(targets)}.")

    def exec_module(self, module: types.ModuleType) -> None:
        """Nothing to run (an existing module or a stand-in); the import machinery has just set the
        old path as the module's ``__spec__``, which spawn, ``-m`` and reload read: put its own back."""
        if self._real_spec is not None:
            module.__spec__ = self._real_spec

    def get_code(self, fullname: str) -> Any:
        """The new module's code, for ``python -m <old path>`` (runpy asks the loader for it). A
        FutureWarning, which Python shows by default: the one reading it runs a command, not code."""
        targets = MOVED[fullname]
        if len(targets) > 1:
            raise ImportError(f"{fullname} was split into {', '.join(targets)}: run one of those")
        _warn(f"python -m {fullname}", f"python -m {targets[0]}", category=FutureWarning)
        # Run the new module as __main__ under its own name (its relative imports need its package).
        return compile(f"import runpy; runpy.run_module({targets[0]!r}, run_name='__main__', alter_sys=True)",
                       f"<{fullname} moved to {targets[0]}>", "exec")


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Any = None,
                  target: Any = None) -> Optional[importlib.machinery.ModuleSpec]:
        if fullname not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, _Loader())


def install() -> None:
    """Serve the old module paths (idempotent)."""
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.append(_Finder())  # last: a module that exists always wins


def moved_name(module: str, name: str) -> Any:
    """A name that left ``module`` (for its module-level ``__getattr__``); warns with the new path."""
    target = MOVED_NAMES.get((module, name))
    if target is None:
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    _warn(f"{module}.{name}", f"{target}.{name}", stacklevel=4)  # the user's line, past __getattr__
    return getattr(importlib.import_module(target), name)


def deprecated(name: str) -> None:
    """Warn that ``name`` (a :data:`DEPRECATED` key) goes, with what to use instead; called first
    in its body, so the warning points at the caller's line."""
    _warn(name, DEPRECATED[name], what="is deprecated (graphtrainer no longer uses it); instead:", stacklevel=4)


def renamed_metric(key: str) -> Optional[str]:
    """The key an old metric name ``key`` has now, or None when it was never renamed."""
    for pattern, new in RENAMED_METRICS:
        match = pattern.match(key)
        if match:
            return new.format(**match.groupdict())
    return None


class Metrics(Dict[str, float]):
    """A metrics dict (what ``validate``/``test`` return) in which an old key finds its new one,
    with a warning: ``trainer.test(task)["test_hits@20"]`` reads ``test_pooled_hits@20``."""

    def __missing__(self, key: str) -> float:
        new = renamed_metric(key) if isinstance(key, str) else None
        if new is None or new not in self:
            raise KeyError(key)
        _warn(f"metric {key!r}", repr(new), what="is now called")
        return self[new]


def _dump_as_a_dict() -> None:
    """YAML writes a :class:`Metrics` as the plain dict it is (its dumpers know exact types only)."""
    try:
        import yaml
    except ImportError:
        return
    for dumper in (yaml.SafeDumper, yaml.Dumper):
        dumper.add_representer(Metrics, yaml.SafeDumper.represent_dict)


_dump_as_a_dict()


def metric_key(key: str, metrics: Mapping[str, Any], who: str) -> str:
    """``key``, or its new name when only that one is in ``metrics`` (warning ``who`` asked for the old one)."""
    if key in metrics:
        return key
    new = renamed_metric(key)
    if new is not None and new in metrics:
        _warn(f"{who}: metric {key!r}", repr(new), what="is now called", stacklevel=4)
        return new
    return key
