"""Checking and normalising the Trainer options that take several forms, before any rank
starts: a bad value fails here, naming the option and what it accepts."""
from __future__ import annotations

import datetime
import numbers
import re
from typing import Any, List, Optional, Sequence, Union

import torch

from .launch.environment import detect_external_launch

#: ``Trainer(precision=...)`` values and what they mean.
PRECISIONS = {
    "32": "32", "32-true": "32", 32: "32",
    "bf16-mixed": "bf16-mixed", "bf16": "bf16-mixed",
    "16-mixed": "16-mixed", "16": "16-mixed", 16: "16-mixed",
}
GRADIENT_CLIP_ALGORITHMS = ("norm", "value")
PROFILERS = (None, "simple", "pytorch")


def block_type(value: str) -> str:
    """``Trainer(block_type=...)``: "auto", "torch" or "dgl"."""
    from .nn.transfer import check_block_type

    return check_block_type(value)


def sampling(value: str) -> str:
    """``Trainer(sampling=...)``: "auto", "device" or "cpu"."""
    from .data.device.mode import check_sampling

    return check_sampling(value)


def deterministic(value: Any) -> Union[bool, str]:
    """``Trainer(deterministic=...)``: True, False (or None) or "warn"."""
    from .data.determinism import check_mode

    return check_mode(value)


def precision(value: Union[str, int], uses_gpu: bool) -> str:
    """``"32"``, ``"bf16-mixed"`` or ``"16-mixed"``."""
    if value not in PRECISIONS:
        raise ValueError(f"precision={value!r}: choose one of '32' (or '32-true'), 'bf16-mixed', '16-mixed'")
    name = PRECISIONS[value]
    if name == "16-mixed" and not uses_gpu:
        raise ValueError("precision='16-mixed' needs GPUs: float16 autocast and its gradient scaler run on "
                         "CUDA only. On CPU ranks use precision='bf16-mixed'")
    return name


def max_time(value: Union[None, str, float, int, datetime.timedelta, dict]) -> Optional[float]:
    """Seconds from ``"DD:HH:MM:SS"``, a number of seconds, a ``timedelta`` or a dict of
    ``timedelta`` keywords (``{"hours": 12}``)."""
    if value is None:
        return None
    if isinstance(value, dict):
        value = datetime.timedelta(**value)
    if isinstance(value, datetime.timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, str):
        match = re.fullmatch(r"(\d+):(\d{1,2}):(\d{1,2}):(\d{1,2})", value.strip())
        if match is None:
            raise ValueError(f"max_time={value!r}: write it as 'DD:HH:MM:SS', e.g. '00:12:00:00' for 12 hours")
        days, hours, minutes, secs = (int(g) for g in match.groups())
        seconds = float(((days * 24 + hours) * 60 + minutes) * 60 + secs)
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    else:
        raise ValueError(f"max_time={value!r}: give 'DD:HH:MM:SS', seconds, a timedelta or a dict")
    if seconds <= 0:
        raise ValueError(f"max_time={value!r}: must be more than 0 seconds")
    return seconds


def val_check_interval(value: Union[None, int, float]) -> Union[None, int, float]:
    """Validation every ``value`` training batches (int) or fraction of an epoch (float)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"val_check_interval={value!r}: give a number of batches (int) or a fraction of "
                         "an epoch (float in (0, 1])")
    if isinstance(value, float) and not 0.0 < value <= 1.0:
        raise ValueError(f"val_check_interval={value!r}: a fraction must lie in (0, 1]; an int counts batches")
    if isinstance(value, int) and value < 1:
        raise ValueError(f"val_check_interval={value!r}: must be at least 1 batch")
    return value


def fast_dev_run(value: Union[bool, int]) -> int:
    """Batches per stage for a smoke run (0: off)."""
    if isinstance(value, bool):
        return 1 if value else 0
    if not isinstance(value, int) or value < 0:
        raise ValueError(f"fast_dev_run={value!r}: give True (1 batch) or a number of batches")
    return value


def flag(name: str, value: Any) -> bool:
    """A yes/no option: ``True`` or ``False`` only (a string such as ``"false"`` would be true)."""
    if not isinstance(value, bool):
        raise ValueError(f"{name}={value!r}: give True or False")
    return value


def choice(name: str, value: Any, allowed: tuple) -> Any:
    if value not in allowed:
        raise ValueError(f"{name}={value!r}: choose one of {allowed}")
    return value


def batch_count(name: str, value: Union[None, int, float]) -> Union[None, int, float]:
    """A batch limit: a count (int >= 0) or a fraction (float in [0, 1])."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 or (
            isinstance(value, float) and value > 1.0):
        raise ValueError(f"{name}={value!r}: give a number of batches (int) or a fraction (float in [0, 1])")
    if name == "limit_train_batches" and value == 0:
        # Lightning skips training then; here a fit that trains nothing is refused, not silent.
        raise ValueError("limit_train_batches=0 trains nothing: to only validate, call trainer.validate(task); "
                         "to train, give a positive number of batches or a fraction in (0, 1]")
    return value


def check_val_every_n_epoch(value: Optional[int]) -> int:
    """``check_val_every_n_epoch``: a count >= 1. Lightning's None (validate by
    ``val_check_interval`` alone, counting batches across epochs) is not supported."""
    if value is None:
        raise ValueError("check_val_every_n_epoch=None (validate by val_check_interval alone, across epochs) is "
                         "not supported: use check_val_every_n_epoch=1 with val_check_interval=N to validate every "
                         "N training batches within each epoch (and at its end)")
    return value


def gpus(gpus: Union[None, int, Sequence[int]], num_procs: Optional[int]) -> List[int]:
    """Device indices from ``gpus=`` (a count or a list), checked against the devices here
    (under torchrun or Slurm, per rank against its local rank's device instead)."""
    if gpus is None or gpus == 0:
        return []
    if isinstance(gpus, bool) or not isinstance(gpus, (int, list, tuple)):
        raise ValueError(f"gpus={gpus!r}: give a number of GPUs or a list of device indices")
    ids = list(range(gpus)) if isinstance(gpus, int) else [int(g) for g in gpus]
    if any(i < 0 for i in ids):
        raise ValueError(f"gpus={gpus!r}: device indices must be >= 0")
    if num_procs is not None and num_procs != len(ids):
        raise ValueError(f"gpus={gpus!r} and num_procs={num_procs} disagree: with GPUs there is one rank "
                         "per listed device; drop num_procs")
    if detect_external_launch() is not None:
        return ids  # checked per rank against the local rank's device
    available = torch.cuda.device_count()  # NVML-based: unlike is_available(), safe before a fork
    if available == 0:
        raise ValueError(f"gpus={gpus!r} but no CUDA device is available: train on CPU processes "
                         f"with Trainer(num_procs={len(ids)}) instead")
    if max(ids) >= available:
        raise ValueError(f"gpus={gpus!r} asks for device {max(ids)} but only {available} CUDA "
                         "device(s) are visible")
    return ids


def max_steps(value: int, max_epochs: int) -> None:
    """``max_steps``: -1 (no step limit) or a number of optimizer steps, 0 training none (as Lightning)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < -1:
        raise ValueError(f"max_steps={value!r}: give a number of optimizer steps >= 0 (0 trains none), "
                         "or -1 for no step limit")
    if max_epochs < 1 and value == -1:
        raise ValueError(f"max_epochs must be at least 1 (or set max_steps): max_epochs={max_epochs} with "
                         "max_steps=-1 sets no limit")


def at_least_one(**counts: Optional[int]) -> None:
    """Each count given must be at least 1 (None: not set)."""
    for name, value in counts.items():
        if value is not None and value < 1:
            raise ValueError(f"{name} must be at least 1, got {value}")


def timeout(value: Union[None, float, datetime.timedelta]) -> Optional[datetime.timedelta]:
    """``Trainer(timeout=...)`` for the process group: seconds > 0 or a timedelta."""
    if value is None:
        return None
    seconds = value.total_seconds() if isinstance(value, datetime.timedelta) else value
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not seconds > 0:
        raise ValueError(f"timeout={value!r}: give seconds > 0 or a datetime.timedelta")
    return datetime.timedelta(seconds=seconds)
