"""graphtrainer: multi-process, multi-GPU training of DGL graph neural networks.

Subclass :class:`GraphTask`, then ``Trainer(num_procs=2).fit(task)`` (CPU, gloo) or
``Trainer(gpus=4).fit(task)`` (nccl).
"""
from ._version import __version__
from .loop.seeding import install_dgl_stream_claim

install_dgl_stream_claim()  # noqa: E402 - keeps forked ranks' DGL sampling independent of the driver's history

from .callbacks import (Callback, EarlyStopping, LearningRateMonitor, ModelCheckpoint, ModelSummary,
                        PrintMetrics, ProgressBar)
from .checkpoint.file import CheckpointError
from .errors import RankFailedError
from .task import GraphTask
from .trainer import Trainer

__all__ = ["GraphTask", "Trainer", "Callback", "ModelCheckpoint", "EarlyStopping",
           "LearningRateMonitor", "ModelSummary", "PrintMetrics", "ProgressBar", "RankFailedError", "CheckpointError",
           "__version__"]
