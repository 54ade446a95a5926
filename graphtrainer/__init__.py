"""graphtrainer: multi-process, multi-GPU training of DGL graph neural networks.

Subclass :class:`GraphTask`, then ``Trainer(num_procs=2).fit(task)`` (CPU, gloo) or
``Trainer(gpus=4).fit(task)`` (nccl).
"""
from ._version import __version__
from ._compat import install as _install_compat

_install_compat()  # before any import of dgl: lets DGL 2.1 load on a torch it was not built for

from ._compat.dgl_2_1_streams import install_dgl_stream_claim  # noqa: E402

install_dgl_stream_claim()  # keeps forked ranks' DGL sampling independent of the driver's history

from ._moved import install as _install_moved  # noqa: E402

_install_moved()  # old import paths (graphtrainer.metrics, graphtrainer.inference, ...) warn and work

from .callbacks import (Callback, EarlyStopping, LearningRateMonitor, ModelCheckpoint, ModelSummary,
                        PrintMetrics, ProgressBar)
from .checkpoint.file import CheckpointError
from .errors import PREEMPTED_EXIT_CODE, LaunchEnvironmentError, Preempted, RankFailedError
from .task import GraphTask
from .trainer import Trainer

__all__ = ["GraphTask", "Trainer", "GraphTaskCLI", "Callback", "ModelCheckpoint", "EarlyStopping",
           "LearningRateMonitor", "ModelSummary", "PrintMetrics", "ProgressBar", "RankFailedError", "CheckpointError",
           "Preempted", "PREEMPTED_EXIT_CODE", "LaunchEnvironmentError",
           "__version__"]


def __getattr__(name: str):
    # The command line sits above the engine and needs the optional jsonargparse ([cli] extra):
    # loaded on first use only, so `import graphtrainer` (and the engine) never imports it.
    if name == "GraphTaskCLI":
        import importlib

        cli = importlib.import_module("graphtrainer.cli")
        cli.require_jsonargparse()  # ImportError naming the [cli] extra when it is missing
        return cli.GraphTaskCLI
    raise AttributeError(f"module 'graphtrainer' has no attribute {name!r}")
