"""``ModelSummary``: the model's parameter counts, printed by rank 0 when ``fit`` starts."""
from __future__ import annotations

from typing import List, Tuple

from torch import nn

from .base import Callback
from ..state import RunView
from ..task import GraphTask


class ModelSummary(Callback):
    """Prints one row per module down to ``max_depth`` (name, type, parameters) and the trainable
    and total counts; on unless ``Trainer(enable_model_summary=False)``."""

    def __init__(self, max_depth: int = 1):
        self.max_depth = max_depth

    def on_fit_start(self, trainer: RunView, task: GraphTask) -> None:
        if trainer.rank == 0 and task.module is not None:
            print(summarize(task.module, self.max_depth), flush=True)


def summarize(model: nn.Module, max_depth: int = 1) -> str:
    rows: List[Tuple[str, str, int]] = []
    for name, module in model.named_modules():
        depth = 0 if not name else name.count(".") + 1
        if 0 < depth <= max_depth:
            rows.append((name, type(module).__name__, sum(p.numel() for p in module.parameters())))
    total = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    width = max([len(r[0]) for r in rows] + [4])
    kind = max([len(r[1]) for r in rows] + [4])
    lines = [f"{'name':<{width}}  {'type':<{kind}}  {'params':>12}"]
    lines += [f"{n:<{width}}  {t:<{kind}}  {p:>12,}" for n, t, p in rows]
    lines.append(f"{type(model).__name__}: {trainable:,} trainable of {total:,} parameters "
                 f"({4 * total / 2**20:.1f} MB in float32)")
    return "\n".join(lines)
