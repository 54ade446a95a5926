"""``Trainer(deterministic=...)`` in one process: a rank (whatever started it) or one of its
DGL sampling workers.

``True`` turns on torch's deterministic algorithms (an op without a deterministic
implementation raises), sets ``CUBLAS_WORKSPACE_CONFIG`` when unset (cuBLAS reads it when
CUDA starts, so it is set before the rank touches its device) and switches on DGL's
thread fixes (:mod:`graphtrainer._compat.dgl_2_1_threads`), which make DGL's in-rank CPU
sampling repeatable at any thread count. ``"warn"`` does the same, but torch warns instead
of raising. ``False`` (the default) changes nothing: torch's settings stay as the task
leaves them and DGL's calls pass straight through.
"""
from __future__ import annotations

import contextlib
import os
from typing import Iterator, Union

import torch

from .._compat.dgl_2_1_threads import set_thread_fixes, thread_fixes_on

#: The values ``Trainer(deterministic=...)`` takes.
MODES = (False, True, "warn")
#: What Lightning sets for cuBLAS (one of the two settings NVIDIA documents as deterministic).
CUBLAS_WORKSPACE = ":4096:8"

Mode = Union[bool, str]
_mode: Mode = False  # this process's, for the sampling workers its loaders start


def check_mode(value: object) -> Mode:
    """``value`` if it is a mode (None: Lightning's default, here ``False``), else a ``ValueError`` naming them."""
    if value is None:
        return False
    if value is True or value is False or (isinstance(value, str) and value == "warn"):
        return value  # type: ignore[return-value]
    raise ValueError(f"deterministic={value!r}: give True (torch's deterministic algorithms, raising at an op that "
                     "has none, and DGL CPU sampling repeatable at any thread count), 'warn' (the same, but torch "
                     "warns instead of raising) or False (the default, also None as in Lightning: neither)")


def current_mode() -> Mode:
    """The mode this process runs with now."""
    return _mode


def apply_mode(mode: Mode) -> None:
    """Set ``mode`` in this process for good (a sampling worker); ``False`` changes nothing."""
    global _mode
    if mode is False:
        return
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)
    torch.use_deterministic_algorithms(True, warn_only=mode == "warn")
    torch.backends.cudnn.benchmark = False  # as Lightning: benchmarking picks kernels by timing
    set_thread_fixes(True)
    _mode = mode


@contextlib.contextmanager
def deterministic(mode: Mode) -> Iterator[None]:
    """``mode`` for the block (one rank's run), this process's settings put back afterwards:
    a run in the caller's process leaves a later one as it found it."""
    global _mode
    if mode is False:
        yield
        return
    before = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
              torch.backends.cudnn.benchmark, thread_fixes_on(), _mode)
    cublas = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    apply_mode(mode)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])
        torch.backends.cudnn.benchmark = before[2]
        set_thread_fixes(before[3])
        _mode = before[4]
        if cublas is None:  # (ranks started later would inherit it)
            os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)
        else:
            os.environ["CUBLAS_WORKSPACE_CONFIG"] = cublas
