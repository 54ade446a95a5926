"""The process group and the few collectives the framework uses (the bottom layer).

Every collective here "must be called on all processes" of the group, in the same
order; each is a no-op (returning its input) when no process group is initialised,
so single-process runs share the same code path.
"""
from __future__ import annotations

import datetime
import os
import pickle
from dataclasses import dataclass
from typing import Any, Callable, List, Optional

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
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT")
    if info.source == "torchrun" and restart is not None:
        # Keys of one attempt only: after a restart, a store that outlived the last attempt
        # still holds the dead ranks' gloo addresses (torch 2.15: "Connection refused").
        agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"  # the agent serves it
        store = dist.TCPStore(info.master_addr, info.master_port, info.world_size,
                              is_master=not agent and info.rank == 0, timeout=timeout)
        dist.init_process_group(backend=backend, store=dist.PrefixStore(f"graphtrainer/attempt_{restart}/", store),
                                rank=info.rank, world_size=info.world_size, timeout=timeout)
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


def start_all_reduce(values: torch.Tensor, op: str = "sum") -> Callable[[], torch.Tensor]:
    """Start :func:`all_reduce` without waiting for it; the function returned waits and gives
    the result. Must be called on all processes, and the results read in the same order."""
    if not is_distributed():
        return lambda: values
    buf = values.to(_collective_device())
    work = dist.all_reduce(buf, op={"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}[op], async_op=True)

    def finish() -> torch.Tensor:
        with heartbeat.waiting("all_reduce"):
            work.wait()
        return buf.to(values.device)

    return finish


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
