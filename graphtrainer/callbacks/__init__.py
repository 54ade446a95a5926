"""Callbacks: checkpointing, early stopping, progress bar, learning-rate monitoring."""
from .base import Callback
from .checkpoint import ModelCheckpoint
from .early_stopping import EarlyStopping
from .lr_monitor import LearningRateMonitor
from .progress import ProgressBar

__all__ = ["Callback", "ModelCheckpoint", "EarlyStopping", "LearningRateMonitor", "ProgressBar"]
