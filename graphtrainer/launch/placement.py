"""Where this machine's ranks sit in a job that spans several machines."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class Placement:
    """Where this machine's launched ranks sit in a job over several machines.

    Rank ``first_rank + i`` is the ``i``-th process started here; the ranks of all
    machines rendezvous at ``master_addr:master_port`` (rank 0's store, on machine 0),
    and gloo talks over ``socket_ifname``.
    """

    first_rank: int
    world_size: int
    #: None: this machine alone, on the launcher's own loopback rendezvous.
    master_addr: Optional[str]
    master_port: int
    socket_ifname: Optional[str]
    machine: str  # "<machine rank> (<address>)", for error messages
