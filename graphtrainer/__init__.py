"""graphtrainer: multi-process, multi-GPU training of DGL graph neural networks.

Subclass :class:`GraphTask`, then ``Trainer(num_procs=2).fit(task)`` (CPU, gloo) or
``Trainer(gpus=4).fit(task)`` (nccl).
"""
__version__ = "0.1.0"

from .seeding import install_dgl_stream_claim

install_dgl_stream_claim()  # keeps forked ranks' DGL sampling independent of the driver's history

from .callbacks import (Callback, EarlyStopping, LearningRateMonitor, ModelCheckpoint, ModelSummary,
                        PrintMetrics, ProgressBar)
from .checkpoint_file import CheckpointError
from .launch import RankFailedError
from .task import GraphTask
from .trainer import Trainer

__all__ = ["GraphTask", "Trainer", "GraphTaskCLI", "Callback", "ModelCheckpoint", "EarlyStopping",
           "LearningRateMonitor", "ModelSummary", "PrintMetrics", "ProgressBar", "RankFailedError", "CheckpointError",
           "__version__"]


def __getattr__(name: str):
    # The command line needs the optional jsonargparse ([cli] extra): imported on first use.
    if name == "GraphTaskCLI":
        from .cli import GraphTaskCLI, require_jsonargparse

        require_jsonargparse()  # ImportError naming the [cli] extra when it is missing
        return GraphTaskCLI
    raise AttributeError(f"module 'graphtrainer' has no attribute {name!r}")
