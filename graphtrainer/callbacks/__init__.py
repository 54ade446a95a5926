"""Callbacks: checkpointing, early stopping, progress bar, learning-rate monitoring, epoch lines,
model summary."""
from .base import Callback
from .checkpoint import ModelCheckpoint
from .early_stopping import EarlyStopping
from .lr_monitor import LearningRateMonitor
from .print_metrics import PrintMetrics
from .progress import ProgressBar
from .summary import ModelSummary

__all__ = ["Callback", "ModelCheckpoint", "EarlyStopping", "LearningRateMonitor", "ModelSummary",
           "PrintMetrics", "ProgressBar"]
