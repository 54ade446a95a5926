"""The evaluation stages as a type: which hooks, which loader, which batch limit."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional

from ..state import BatchLimit, TrainerConfig


@dataclass(frozen=True)
class Stage:
    """One way of running the model over a loader without training it."""

    #: The entry point: ``Trainer.validate``/``test``/``predict`` (and ``setup``'s argument).
    name: str
    #: The hooks' prefix: ``{hook}_step``, ``on_{hook}_epoch_start``, ``on_{hook}_epoch_end``.
    hook: str
    #: The task's method that returns the loader.
    loader_method: str
    #: The Trainer option that limits its batches, if any.
    limit_option: Optional[str]

    def loader(self, task: Any) -> Any:
        return getattr(task, self.loader_method)()

    def step(self, task: Any) -> Callable[[Any, int], Any]:
        return getattr(task, f"{self.hook}_step")

    def limit(self, config: TrainerConfig) -> BatchLimit:
        return getattr(config, self.limit_option) if self.limit_option else None

    @property
    def keeps_outputs(self) -> bool:
        return self.name == "predict"


VALIDATE = Stage("validate", "validation", "val_dataloader", "limit_val_batches")
TEST = Stage("test", "test", "test_dataloader", "limit_test_batches")
PREDICT = Stage("predict", "predict", "predict_dataloader", "limit_predict_batches")
EVALUATION: Dict[str, Stage] = {s.name: s for s in (VALIDATE, TEST, PREDICT)}
