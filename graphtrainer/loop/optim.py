"""Normalising what ``configure_optimizers`` returns, and stepping schedulers."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import torch
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler, ReduceLROnPlateau

#: A learning-rate scheduler as ``configure_optimizers`` may give it: the scheduler, or
#: ``{"scheduler", "interval", "frequency", "monitor"}``.
SchedulerSpec = Union[LRScheduler, ReduceLROnPlateau, Dict[str, Any]]
#: ``{"optimizer": ..., "lr_scheduler": ..., "monitor": ...}``.
OptimizerDict = Dict[str, Any]
#: What ``GraphTask.configure_optimizers`` returns (see :func:`parse_optimizers`).
OptimizersSpec = Union[Optimizer, Sequence[Optimizer], Tuple[Sequence[Optimizer], Sequence[SchedulerSpec]],
                       OptimizerDict, Sequence[OptimizerDict]]


@dataclass
class SchedulerConfig:
    scheduler: Union[LRScheduler, ReduceLROnPlateau]
    interval: str = "epoch"  # "epoch" or "step"
    frequency: int = 1
    monitor: Optional[str] = None

    @property
    def is_plateau(self) -> bool:
        return isinstance(self.scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)


def parse_optimizers(value: OptimizersSpec) -> Tuple[List[torch.optim.Optimizer], List[SchedulerConfig]]:
    """Accepts an optimizer; a list of them; ``(optimizers, schedulers)``; or a dict
    ``{"optimizer": ..., "lr_scheduler": scheduler | {"scheduler", "interval", "frequency", "monitor"}}``
    (or a list of such dicts)."""
    if value is None:
        raise ValueError("configure_optimizers() returned None: return an optimizer, e.g. "
                         "torch.optim.Adam(self.model.parameters(), lr=1e-3)")
    if isinstance(value, torch.optim.Optimizer):
        return [value], []
    if isinstance(value, dict):
        value = [value]
    if isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], (list, tuple)):
        opts, scheds = list(value[0]), list(value[1])
        return _check_opts(opts), [_scheduler_config(s) for s in scheds]
    if isinstance(value, (list, tuple)):
        opts, scheds = [], []
        for item in value:
            if isinstance(item, dict):
                if "optimizer" not in item:
                    raise ValueError("configure_optimizers(): a dict must have an 'optimizer' key")
                opts.append(item["optimizer"])
                if item.get("lr_scheduler") is not None:
                    scheds.append(_scheduler_config(item["lr_scheduler"], item.get("monitor")))
            else:
                opts.append(item)
        return _check_opts(opts), scheds
    raise ValueError(f"configure_optimizers() returned {type(value).__name__}: return an optimizer, "
                     "(optimizers, schedulers), or a dict with 'optimizer' and 'lr_scheduler'")


def _check_opts(opts: List[Any]) -> List[torch.optim.Optimizer]:
    if not opts:
        raise ValueError("configure_optimizers() returned no optimizer")
    for opt in opts:
        if not isinstance(opt, torch.optim.Optimizer):
            raise ValueError(f"configure_optimizers(): {type(opt).__name__} is not a torch.optim.Optimizer")
    return opts


def _scheduler_config(value: Any, monitor: Optional[str] = None) -> SchedulerConfig:
    if isinstance(value, dict):
        if "scheduler" not in value:
            raise ValueError("configure_optimizers(): an lr_scheduler dict needs a 'scheduler' key")
        cfg = SchedulerConfig(value["scheduler"], value.get("interval", "epoch"),
                              int(value.get("frequency", 1)), value.get("monitor", monitor))
    else:
        cfg = SchedulerConfig(value, monitor=monitor)
    if cfg.interval not in ("epoch", "step"):
        raise ValueError(f"lr_scheduler interval {cfg.interval!r}: use 'epoch' or 'step'")
    if cfg.is_plateau and not cfg.monitor:
        raise ValueError("ReduceLROnPlateau needs a metric: return {'scheduler': ..., 'monitor': 'val_loss'}")
    return cfg


def step_schedulers(configs: List[SchedulerConfig], interval: str, count: int,
                    metrics: Dict[str, float]) -> None:
    """Step the schedulers of ``interval`` whose frequency divides ``count``."""
    for cfg in configs:
        if cfg.interval != interval or count % cfg.frequency != 0:
            continue
        if cfg.is_plateau:
            if cfg.monitor not in metrics:
                raise KeyError(f"ReduceLROnPlateau monitors {cfg.monitor!r}, which was not logged; "
                               f"logged metrics: {sorted(metrics)}")
            cfg.scheduler.step(metrics[cfg.monitor])
        else:
            cfg.scheduler.step()
