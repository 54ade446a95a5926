"""Rank discovery, the process group, and the few collectives the framework uses.

Every collective here "must be called on all processes" of the group, in the same
order; each is a no-op (returning its input) when no process group is initialised,
so single-process runs share the same code path.
"""
from __future__ import annotations

import datetime
import os
import pickle
import random
import socket
from dataclasses import dataclass
from typing import Any, List, Optional

import torch
import torch.distributed as dist

from . import heartbeat

#: How long a collective may wait before the group reports an error (a stuck peer), unless
#: ``Trainer(timeout=...)`` says otherwise.
DEFAULT_TIMEOUT = datetime.timedelta(minutes=10)


@dataclass(frozen=True)
class RankInfo:
    """Where this process sits in the job."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    master_addr: str = "127.0.0.1"
    master_port: int = 0
    source: str = "single"  # "single", "launcher", "torchrun" or "slurm"
    #: Launched rank 0 only: the parent's socket, bound to master_addr:master_port, for the store.
    listen_fd: Optional[int] = None


def _int_env(name: str) -> Optional[int]:
    value = os.environ.get(name)
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError as err:
        raise ValueError(f"environment variable {name}={value!r} is not an integer") from err


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

    torchrun sets ``RANK``/``LOCAL_RANK``/``WORLD_SIZE``/``MASTER_ADDR``/``MASTER_PORT``;
    Slurm's ``srun`` sets ``SLURM_PROCID``/``SLURM_LOCALID``/``SLURM_NTASKS``. A Slurm job
    with one task (``python train.py`` inside ``sbatch``) is not an external launch: the
    trainer then launches its own ranks as usual.
    """
    rank, world = _int_env("RANK"), _int_env("WORLD_SIZE")
    if rank is not None and world is not None:
        if "MASTER_ADDR" not in os.environ or "MASTER_PORT" not in os.environ:
            raise RuntimeError(
                "RANK and WORLD_SIZE are set but MASTER_ADDR/MASTER_PORT are not: start the "
                "script with torchrun, or export MASTER_ADDR and MASTER_PORT on every rank."
            )
        return RankInfo(
            rank=rank,
            local_rank=_int_env("LOCAL_RANK") or 0,
            world_size=world,
            master_addr=os.environ["MASTER_ADDR"],
            master_port=int(os.environ["MASTER_PORT"]),
            source="torchrun",
        )
    ntasks = _int_env("SLURM_NTASKS")
    procid = _int_env("SLURM_PROCID")
    if ntasks is not None and procid is not None and ntasks > 1:
        addr = os.environ.get("MASTER_ADDR") or _first_slurm_host(
            os.environ.get("SLURM_STEP_NODELIST") or os.environ.get("SLURM_NODELIST", "127.0.0.1")
        )
        port = _int_env("MASTER_PORT")
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
    """A TCP port that is free on ``host`` right now, below the kernel's ephemeral range.

    The port is handed to a server that binds it later (a torchrun agent, a store). Ports
    in the ephemeral range are also given to outgoing connections as their source port,
    and a client that retries connecting to such a port before its server listens can even
    be connected to itself; either makes the server's bind fail. Below the range neither
    happens.
    """
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


def init_process_group(info: RankInfo, backend: str, timeout: Optional[datetime.timedelta] = None) -> None:
    """Join the group described by ``info``.

    A world of one started by this process needs no group. Under torchrun or Slurm the
    group is made even for one rank: the user's own code may expect it, and it runs the
    same collectives (nccl included) as a larger job.
    """
    if dist.is_initialized() or (info.world_size <= 1 and info.source in ("single", "launcher")):
        return
    timeout = timeout or DEFAULT_TIMEOUT
    with heartbeat.waiting("init_process_group"):
        _init_process_group(info, backend, timeout)


def _init_process_group(info: RankInfo, backend: str, timeout: datetime.timedelta) -> None:
    if info.source == "launcher":
        # Rank 0's store serves on the socket the parent bound to 127.0.0.1 (a tcp:// URL
        # would listen on every interface, on a port another process may take meanwhile).
        store = dist.TCPStore(info.master_addr, info.master_port, info.world_size, is_master=info.rank == 0,
                              timeout=timeout, master_listen_fd=info.listen_fd)
        dist.init_process_group(backend=backend, store=store, rank=info.rank, world_size=info.world_size,
                                timeout=timeout)
        return
    url = f"tcp://{info.master_addr}:{info.master_port}"
    dist.init_process_group(
        backend=backend, init_method=url, rank=info.rank, world_size=info.world_size, timeout=timeout
    )


def is_distributed() -> bool:
    """True when a process group is up (a world of one included, under torchrun)."""
    return dist.is_available() and dist.is_initialized()


def get_rank() -> int:
    return dist.get_rank() if is_distributed() else 0


def get_world_size() -> int:
    return dist.get_world_size() if is_distributed() else 1


def _collective_device() -> torch.device:
    """nccl reduces only CUDA tensors; gloo only CPU ones."""
    if is_distributed() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def barrier() -> None:
    """Wait for every rank. Must be called on all processes."""
    if is_distributed():
        with heartbeat.waiting("barrier"):
            if dist.get_backend() == "nccl":
                dist.barrier(device_ids=[torch.cuda.current_device()])
            else:
                dist.barrier()


def all_reduce(values: torch.Tensor, op: str = "sum") -> torch.Tensor:
    """Element-wise ``"sum"`` or ``"max"`` over ranks, returned on the input's device. Must be
    called on all processes."""
    if not is_distributed():
        return values
    buf = values.to(_collective_device())
    with heartbeat.waiting("all_reduce"):
        dist.all_reduce(buf, op={"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}[op])
    return buf.to(values.device)


def same_on_all_ranks(value: Optional[float]) -> bool:
    """Whether every rank passed the same number; ``None`` (cannot tell) makes it False
    everywhere. One 2-element all-reduce. Must be called on all processes."""
    unknown = float(2**52)
    mine = torch.tensor([unknown, unknown] if value is None else [float(value), -float(value)],
                        dtype=torch.float64)
    high, neg_low = all_reduce(mine, "max").tolist()
    return high == -neg_low


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """Rank ``src``'s ``obj`` on every rank. Must be called on all processes."""
    if not is_distributed():
        return obj
    box = [obj]
    with heartbeat.waiting("broadcast"):
        dist.broadcast_object_list(box, src=src, device=_collective_device())
    return box[0]


def all_gather_object(obj: Any) -> List[Any]:
    """Every rank's ``obj``, in rank order. Must be called on all processes."""
    if not is_distributed():
        return [obj]
    # gather_object on nccl needs the current device set, which the trainer does.
    payload = pickle.dumps(obj)
    sizes = all_gather_tensor(torch.tensor([len(payload)], dtype=torch.long))
    data = torch.frombuffer(bytearray(payload), dtype=torch.uint8) if payload else torch.empty(0, dtype=torch.uint8)
    gathered = all_gather_tensor(data)
    out, offset = [], 0
    for size in sizes.tolist():
        out.append(pickle.loads(gathered[offset : offset + size].numpy().tobytes()))
        offset += size
    return out


def all_gather_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """Concatenate every rank's ``tensor`` along dim 0, in rank order.

    Ranks may hold different lengths along dim 0 (other dims must agree). Must be
    called on all processes.
    """
    if not is_distributed():
        return tensor
    device = _collective_device()
    world = dist.get_world_size()
    local = tensor.detach().to(device).contiguous()
    length = torch.tensor([local.shape[0]], dtype=torch.long, device=device)
    lengths = [torch.zeros_like(length) for _ in range(world)]
    with heartbeat.waiting("all_gather"):
        dist.all_gather(lengths, length)
    sizes = [int(n.item()) for n in lengths]
    longest = max(sizes)
    padded = torch.zeros((longest,) + tuple(local.shape[1:]), dtype=local.dtype, device=device)
    padded[: local.shape[0]] = local
    parts = [torch.empty_like(padded) for _ in range(world)]
    with heartbeat.waiting("all_gather"):
        dist.all_gather(parts, padded)
    return torch.cat([p[:n] for p, n in zip(parts, sizes)]).to(tensor.device)
