"""The small fits the mid-epoch callback tests share: 64 samples, batch 8 (4 batches per rank and
epoch on 2 ranks, 8 on 1), validating after every second batch and at each epoch's end."""
from __future__ import annotations

from typing import Any, Iterable

from graphtrainer import Trainer


def mid_epoch_trainer(root: Any, epochs: int, callbacks: Iterable[Any], **kw: Any) -> Trainer:
    """A ``Trainer`` on 2 ranks (``num_procs=`` to change) with ``val_check_interval=2``."""
    kw.setdefault("num_procs", 2)
    kw.setdefault("val_check_interval", 2)
    return Trainer(max_epochs=epochs, seed=0, progress_bar=False, enable_model_summary=False,
                   default_root_dir=root, callbacks=list(callbacks), **kw)
