"""Where this machine's ranks sit in a job that spans several machines."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class Placement:
    """Where this machine's ranks sit in a multi-machine job: rank ``first_rank + i`` is the
    ``i``-th started here; all rendezvous at ``master_addr:master_port``; gloo uses ``socket_ifname``."""

    first_rank: int
    world_size: int
    #: None: this machine alone, on the launcher's own loopback rendezvous.
    master_addr: Optional[str]
    master_port: int
    socket_ifname: Optional[str]
    machine: str  # "<machine rank> (<address>)", for error messages
