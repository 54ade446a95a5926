"""The environment variables by which a launcher (torchrun, Slurm's srun) makes a process one
rank of a job, and an environment without them for the processes the tests start.

A stray ``RANK``/``WORLD_SIZE`` would turn the trainer into an externally launched rank that
waits for peers which never come, so tests start from an environment without them.
"""
from __future__ import annotations

import os
from typing import Dict

#: What torchrun sets (and what the trainer reads first).
TORCHRUN_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
#: What srun sets, read when the torchrun variables are absent.
SLURM_VARS = ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS")
LAUNCH_VARS = TORCHRUN_VARS + SLURM_VARS


def env_without_launch(*also_drop: str, **extra: str) -> Dict[str, str]:
    """A copy of ``os.environ`` without :data:`LAUNCH_VARS` nor ``also_drop``, then ``extra`` set.

    A name in ``also_drop`` ending in ``*`` drops every variable starting with the rest
    (``"SLURM_*"``).
    """
    prefixes = tuple(name[:-1] for name in also_drop if name.endswith("*"))
    names = set(LAUNCH_VARS) | {name for name in also_drop if not name.endswith("*")}
    env = {k: v for k, v in os.environ.items() if k not in names and not (prefixes and k.startswith(prefixes))}
    env.update(extra)
    return env


def launchers(*names: str) -> list:
    """Parameters for a test run with each launcher in ``names``: the first in the quick suite,
    the others (each a few seconds more of interpreter start-up) in the slow one only."""
    import pytest

    return [names[0]] + [pytest.param(name, marks=pytest.mark.slow) for name in names[1:]]
