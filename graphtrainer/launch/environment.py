"""Ranks that already exist (torchrun, Slurm): their layout and this process's rank
(:class:`ExistingRanks`); and a free port for a rendezvous this process hosts."""
from __future__ import annotations

import os
import random
import socket
from typing import Any, Optional, Sequence

from ..comm import RankInfo
from ..errors import LaunchEnvironmentError
from .base import Launcher, RankTarget


class ExistingRanks(Launcher):
    """This process is one rank of a job that torchrun or Slurm started: it runs here, and
    rank 0 numbers the run folder for all of them."""

    makes_run_dir = False
    run_dir_from_rank0 = True
    in_other_processes = False

    def __init__(self, info: RankInfo):
        self.info = info

    def run(self, target: RankTarget, args: Sequence[Any]) -> Any:
        return target(self.info, *args)


#: What torchrun sets for each rank: all of them make this process one rank of a job, some are refused.
TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def _int_env(name: str, low: Optional[int] = None, high: Optional[int] = None) -> Optional[int]:
    """``name``'s value as an integer in [low, high], None when unset or empty."""
    value = os.environ.get(name)
    if value is None or value == "":
        return None
    try:
        number = int(value)
    except ValueError:
        raise LaunchEnvironmentError(f"environment variable {name}={value!r} is not an integer (torchrun and srun "
                                     "set integers): correct it or unset it") from None
    if (low is not None and number < low) or (high is not None and number > high):
        bounds = f"{low} or more" if high is None else f"from {low} to {high}"
        raise LaunchEnvironmentError(f"environment variable {name}={value!r}: give a number {bounds}, or unset it")
    return number


def master_port_from_env() -> Optional[int]:
    """``MASTER_PORT`` as a TCP port number; None when unset."""
    return _int_env("MASTER_PORT", 1, 65535)


def _names(names: Sequence[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def _torchrun_layout() -> RankInfo:
    """The rank layout torchrun's variables give; refused, naming the fix, when some are missing."""
    given = [name for name in TORCHRUN_VARS if os.environ.get(name)]
    missing = [name for name in TORCHRUN_VARS if name not in given]
    if missing:  # (exported by hand, or a cluster's environment only half set up)
        raise LaunchEnvironmentError(
            f"{_names(given)} {'is' if len(given) == 1 else 'are'} set in the environment but {_names(missing)} "
            f"{'is' if len(missing) == 1 else 'are'} not: start the script with torchrun (python -m "
            f"torch.distributed.run), export all of {_names(TORCHRUN_VARS)} on every rank, or unset "
            f"{_names([n for n in given if n in ('RANK', 'WORLD_SIZE')])} to let the trainer start its own ranks")
    world = _int_env("WORLD_SIZE", 1)
    rank = _int_env("RANK", 0)
    assert rank is not None and world is not None
    if rank >= world:
        raise LaunchEnvironmentError(f"RANK={rank} with WORLD_SIZE={world}: ranks are numbered 0 to WORLD_SIZE-1 "
                                     f"(0 to {world - 1}); set RANK on each rank to its own number")
    port = master_port_from_env()
    assert port is not None
    return RankInfo(rank=rank, local_rank=_int_env("LOCAL_RANK", 0) or 0, world_size=world,
                    master_addr=os.environ["MASTER_ADDR"], master_port=port, source="torchrun")


def _first_slurm_host(nodelist: str) -> str:
    """First host of a Slurm node list such as ``node[03-05,09],gpu1`` (no scontrol needed)."""
    first = nodelist.split(",")[0]
    if "[" not in first:
        return first
    prefix, rest = first.split("[", 1)
    start = rest.split(",")[0].split("-")[0].rstrip("]")
    return prefix + start


def detect_external_launch() -> Optional[RankInfo]:
    """Rank layout set by torchrun or Slurm, or ``None`` when nothing started us.

    torchrun sets ``RANK``/``LOCAL_RANK``/``WORLD_SIZE``/``MASTER_ADDR``/``MASTER_PORT``; Slurm's
    ``srun`` ``SLURM_PROCID``/``SLURM_LOCALID``/``SLURM_NTASKS``. A one-task Slurm job (``python
    train.py`` in ``sbatch``) is not one: the trainer launches its own ranks. Raises
    :class:`~graphtrainer.errors.LaunchEnvironmentError` for a half-set environment (``RANK``
    or ``WORLD_SIZE`` without the other three of :data:`TORCHRUN_VARS`) or values no launcher sets.
    """
    if os.environ.get("RANK") or os.environ.get("WORLD_SIZE"):
        return _torchrun_layout()
    ntasks = _int_env("SLURM_NTASKS")
    procid = _int_env("SLURM_PROCID")
    if ntasks is not None and procid is not None and ntasks > 1:
        addr = os.environ.get("MASTER_ADDR") or _first_slurm_host(
            os.environ.get("SLURM_STEP_NODELIST") or os.environ.get("SLURM_NODELIST", "127.0.0.1")
        )
        port = master_port_from_env()
        if port is None:
            # Same on every task of the job, different between concurrent jobs, and below
            # the ephemeral range (32768 by default; see free_port).
            port = 15000 + (_int_env("SLURM_JOB_ID") or 0) % 17000
        return RankInfo(
            rank=procid,
            local_rank=_int_env("SLURM_LOCALID") or 0,
            world_size=ntasks,
            master_addr=addr,
            master_port=port,
            source="slurm",
        )
    return None


def one_process_per_machine() -> Optional[str]:
    """None when this process may act for its whole machine (a DistDGL launcher), else what
    says it is one of several ranks: torchrun's variables, or more Slurm tasks than nodes."""
    if _int_env("RANK") is not None and _int_env("WORLD_SIZE") is not None:
        return "RANK/WORLD_SIZE are set (torchrun starts one process per rank)"
    ntasks = _int_env("SLURM_NTASKS")
    nodes = _int_env("SLURM_NNODES") or _int_env("SLURM_JOB_NUM_NODES")
    if ntasks is not None and nodes is not None and ntasks > nodes:
        return f"Slurm started {ntasks} tasks on {nodes} node(s)"
    return None


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` now, below the ephemeral range: a server binds it later, and
    an ephemeral port might meanwhile serve as a source port (or a retrying client's own)."""
    start = _ephemeral_start()
    pick = random.SystemRandom()  # not the seeded global generators
    for _ in range(64):
        port = pick.randrange(max(1024, start - 12000), start)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:  # a crowded range: any free port
        sock.bind((host, 0))
        return sock.getsockname()[1]


def _ephemeral_start() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range", encoding="ascii") as fh:
            return int(fh.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default
