"""Old import paths and metric names (graphtrainer/_moved.py): each documented old path still
imports, warns with a DeprecationWarning that names the new path (at the user's line), and gives
the very object at the new path."""
from __future__ import annotations

import importlib
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import graphtrainer
from graphtrainer import _moved

ROOT = Path(graphtrainer.__file__).resolve().parent

#: (old module, name, new module): paths the README, docs, tutorials or docstrings once gave.
OLD_PATHS = [
    ("graphtrainer.metrics", "accuracy", "graphtrainer.evaluation.ranking"),
    ("graphtrainer.metrics", "roc_auc", "graphtrainer.evaluation.ranking"),
    ("graphtrainer.graph_loader", "PackedGraphs", "graphtrainer.data.graph_loader"),
    ("graphtrainer.graph_loader", "GraphLoader", "graphtrainer.data.graph_loader"),
    ("graphtrainer.inference", "layerwise", "graphtrainer.data.inference"),
    ("graphtrainer.edge_loader", "EdgeLoader", "graphtrainer.data.edge_loader"),
    ("graphtrainer.edge_loader", "PerEdgeUniform", "graphtrainer.data.edge_loader"),
    ("graphtrainer.sampling", "NodeLoader", "graphtrainer.data.node_loader"),
    ("graphtrainer.formats", "build_formats", "graphtrainer.data.formats"),
    ("graphtrainer.formats", "warn_if_missing", "graphtrainer.data.formats"),
    ("graphtrainer.distributed", "free_port", "graphtrainer.launch.environment"),
    ("graphtrainer.distributed", "detect_external_launch", "graphtrainer.launch.environment"),
    ("graphtrainer.distributed", "get_rank", "graphtrainer.comm"),
    ("graphtrainer.dist_graph", "PartitionedGraph", "graphtrainer.distdgl.graph"),
    ("graphtrainer.dist_loader", "DistNodeLoader", "graphtrainer.distdgl.loader"),
    ("graphtrainer.dist_loader", "DistEdgeLoader", "graphtrainer.distdgl.loader"),
    ("graphtrainer.dist_cluster", "resolve_cluster", "graphtrainer.distdgl.cluster"),
    ("graphtrainer.graph_servers", "main", "graphtrainer.distdgl.servers"),
    ("graphtrainer.hetero_data", "cora_hetero", "graphtrainer.datasets.hetero"),
    ("graphtrainer.loggers", "TensorBoardLogger", "graphtrainer.loop.loggers"),
    ("graphtrainer.ddp", "check_ddp_kwargs", "graphtrainer.loop.ddp"),
    ("graphtrainer.preemption", "AGREE_EVERY_S", "graphtrainer.loop.preemption"),
    ("graphtrainer.run_files", "remove_dead_partials", "graphtrainer.checkpoint.run_files"),
    ("graphtrainer.checkpoint_file", "CheckpointError", "graphtrainer.checkpoint.file"),
    ("graphtrainer.precision", "Precision", "graphtrainer.loop.precision"),
    ("graphtrainer.profiler", "Profiler", "graphtrainer.loop.profiler"),
    ("graphtrainer.lean", "import_rank_modules", "graphtrainer.launch.lean"),
    ("graphtrainer.shared_graph", "share_graph", "graphtrainer.launch.shared_graph"),
    ("graphtrainer.preflight", "prepare_graphs", "graphtrainer.launch.preflight"),
    ("graphtrainer.simulated_machines", "can_simulate", "graphtrainer.testing.simulated_machines"),
    ("graphtrainer.partition", "to_partition_ids", "graphtrainer.distdgl.partition"),
    # the top level keeps the facade and the bottom layer (issue 33)
    ("graphtrainer.ranking", "LinkScores", "graphtrainer.evaluation.ranking"),
    ("graphtrainer.ranking", "accuracy", "graphtrainer.evaluation.ranking"),
    ("graphtrainer.binned_auroc", "BinnedAUROC", "graphtrainer.evaluation.binned_auroc"),
    ("graphtrainer.mlflow_logger", "MLflowLogger", "graphtrainer.integrations.mlflow_logger"),
    ("graphtrainer.cli_errors", "explain_parse_error", "graphtrainer.cli.errors"),
    ("graphtrainer.partition", "main", "graphtrainer.cli.partition"),
    ("graphtrainer.pids", "alive", "graphtrainer.process.pids"),
    ("graphtrainer.affinity", "rank_cores", "graphtrainer.process.affinity"),
    ("graphtrainer.launch.leftovers", "die_with_parent", "graphtrainer.process.parent"),
]


def _forget(old: str) -> None:
    """As in a fresh process: the old path not imported yet (a module that is still there, whose
    names moved, stays: others hold it)."""
    if old not in _moved.MOVED:
        return
    sys.modules.pop(old, None)
    parent, _, child = old.rpartition(".")
    if child in vars(sys.modules[parent]):
        delattr(sys.modules[parent], child)


@pytest.mark.parametrize("old, name, new", OLD_PATHS, ids=[f"{o}.{n}" for o, n, _ in OLD_PATHS])
def test_an_old_path_imports_the_new_object_and_warns_naming_the_new_path(old, name, new):
    _forget(old)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        obj = getattr(importlib.import_module(old), name)
    assert obj is getattr(importlib.import_module(new), name)
    deprecations = [w for w in caught if issubclass(w.category, DeprecationWarning) and new in str(w.message)]
    assert len(deprecations) == 1, [str(w.message) for w in caught]
    assert old in str(deprecations[0].message) and _moved.REMOVED_IN in str(deprecations[0].message)


def test_the_warning_points_at_the_line_that_imports():
    _forget("graphtrainer.inference")
    _forget("graphtrainer.metrics")
    with pytest.warns(DeprecationWarning, match=r"graphtrainer\.inference moved to graphtrainer\.data\.inference") \
            as whole:
        from graphtrainer.inference import layerwise  # noqa: F401
    with pytest.warns(DeprecationWarning, match=r"graphtrainer\.metrics\.accuracy moved to "
                                                r"graphtrainer\.evaluation\.ranking\.accuracy") as split:
        from graphtrainer.metrics import accuracy  # noqa: F401
    assert {Path(w.filename).name for w in [*whole, *split]} == {Path(__file__).name}


def test_a_module_that_moved_whole_is_the_new_module_and_keeps_its_own_spec():
    _forget("graphtrainer.inference")
    with pytest.warns(DeprecationWarning):
        old = importlib.import_module("graphtrainer.inference")
    new = importlib.import_module("graphtrainer.data.inference")
    assert old is new and new.__spec__.name == new.__name__ == "graphtrainer.data.inference"


def test_a_name_the_split_module_never_had_fails_naming_where_it_was_split():
    with pytest.raises(ImportError, match=r"no_such_name"):
        from graphtrainer.metrics import no_such_name  # noqa: F401
    with pytest.raises(AttributeError, match=r"split into graphtrainer\.evaluation\.ranking, "
                                                 r"graphtrainer\.loop\.metrics"):
        importlib.import_module("graphtrainer.metrics").no_such_name


def test_every_row_of_the_table_is_gone_from_the_package_and_points_at_modules_that_exist():
    for old, targets in _moved.MOVED.items():
        rel = Path(*old.split(".")[1:])
        assert not (ROOT / rel).with_suffix(".py").exists() and not (ROOT / rel).is_dir(), \
            f"{old} exists again: its alias would hide nothing, remove the row"
        for target in targets:
            importlib.import_module(target)
    for (module, name), target in _moved.MOVED_NAMES.items():
        assert name not in vars(importlib.import_module(module)), f"{module}.{name} is there again"
        assert hasattr(importlib.import_module(target), name)


@pytest.mark.slow  # 3 s or more on 2 cores: a fresh interpreter
def test_python_dash_m_on_an_old_path_runs_the_new_module_and_says_so():
    """``python -m graphtrainer.partition`` (the documented command before the move) still runs."""
    proc = subprocess.run([sys.executable, "-m", "graphtrainer.partition", "--help"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "usage: python -m graphtrainer.cli.partition" in proc.stdout
    assert "FutureWarning: python -m graphtrainer.partition moved to python -m graphtrainer.cli.partition" \
        in proc.stderr and _moved.REMOVED_IN in proc.stderr


def test_old_metric_names_read_their_new_ones_with_a_warning():
    metrics = _moved.Metrics({"test_pooled_hits@20": 0.5, "test_per_edge_hits@20": 0.25, "test_mrr": 0.4})
    with pytest.warns(DeprecationWarning, match=r"'test_hits@20' is now called 'test_pooled_hits@20'"):
        assert metrics["test_hits@20"] == 0.5
    assert _moved.renamed_metric("val_hits@50") == "val_pooled_hits@50"
    assert _moved.renamed_metric("hits@1") == "pooled_hits@1"
    for key in ("val_pooled_hits@20", "val_per_edge_hits@20", "val_mrr", "val_loss"):
        assert _moved.renamed_metric(key) is None
    with pytest.raises(KeyError, match="test_nope"):
        metrics["test_nope"]
    # Still a plain dict to everything else: equality, JSON, YAML, pickling.
    import json
    import pickle

    import yaml

    plain = {"test_pooled_hits@20": 0.5, "test_per_edge_hits@20": 0.25, "test_mrr": 0.4}
    assert metrics == plain and json.loads(json.dumps(metrics)) == plain
    assert yaml.safe_load(yaml.safe_dump(metrics)) == plain == yaml.safe_load(yaml.dump(metrics))
    assert pickle.loads(pickle.dumps(metrics)) == plain


def test_a_deprecated_name_keeps_working_and_warns_naming_its_removal():
    """``graphtrainer.data.device.graph.data_bytes`` (public, unused): same bytes as before, with a
    ``DeprecationWarning`` at the caller's line naming the release that removes it."""
    import dgl
    import torch

    from graphtrainer.data.device import graph as device_graph

    g = dgl.heterograph({("user", "buys", "item"): (torch.tensor([0, 1]), torch.tensor([1, 0]))})
    g.nodes["user"].data["feat"] = torch.zeros(2, 3)
    g.edges["buys"].data["w"] = torch.zeros(2, dtype=torch.float64)
    with pytest.warns(DeprecationWarning) as caught:
        total = device_graph.data_bytes(g, {"user": ("feat",)}, {("user", "buys", "item"): ("w",)})
    assert total == 2 * 3 * 4 + 2 * 8
    message = str(caught[0].message)
    assert "graphtrainer.data.device.graph.data_bytes is deprecated" in message and _moved.REMOVED_IN in message
    assert Path(caught[0].filename).name == Path(__file__).name
    assert _moved.REMOVED_IN in device_graph.data_bytes.__doc__
