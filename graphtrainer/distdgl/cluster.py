"""The machines of a DistDGL run: reading the partition and ip_config files, finding which
machine this is, and the ports the graph servers and the ranks use.

One partition per machine, each with ``num_servers`` graph servers (``ip_config`` line ``m``:
machine ``m``'s address and first server port; server ``i`` listens on port ``+ i``) and its
trainer ranks (DGL RPC to the servers, ``torch.distributed`` between them). DGL tells machines
apart by address: every line must differ (two ``127.0.0.1`` lines fail in ``rpc.cc:395``).
"""
from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import shutil
import socket
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterator, Optional, Tuple

from ..launch import leftovers
from ..launch.environment import free_port, master_port_from_env
from ..launch.placement import Placement

#: DGL's default server port when an ``ip_config`` line gives none.
DEFAULT_SERVER_PORT = 30050
#: Environment variable naming this machine's rank (else Slurm's ``SLURM_NODEID``, else
#: the line of ``ip_config`` that holds one of this machine's addresses).
MACHINE_RANK_ENV = "GRAPHTRAINER_MACHINE_RANK"


@dataclass(frozen=True)
class DistGraphOptions:
    """``Trainer(distributed_graph=..., ip_config=..., num_servers=..., machine_rank=...)``, checked."""

    part_config: str
    graph_name: str
    num_parts: int
    ip_config: Optional[str] = None
    num_servers: int = 1
    machine_rank: Optional[int] = None


def check_options(part_config: os.PathLike | str, ip_config: Optional[os.PathLike | str] = None,
                  num_servers: int = 1, machine_rank: Optional[int] = None) -> DistGraphOptions:
    """The options, or a ``ValueError``/``FileNotFoundError`` naming what is wrong and the fix."""
    path = Path(config_path(part_config))
    try:
        meta = json.loads(path.read_text())
        name, parts = str(meta["graph_name"]), int(meta["num_parts"])
    except (ValueError, KeyError, TypeError) as err:
        raise ValueError(f"distributed_graph={str(part_config)!r} is not a DGL partition config (a JSON file "
                         f"with graph_name and num_parts, as python -m graphtrainer.cli.partition writes): "
                         f"{err}") from None
    if isinstance(num_servers, bool) or not isinstance(num_servers, int) or num_servers < 1:
        raise ValueError(f"num_servers={num_servers!r}: give the number of graph servers per machine (>= 1)")
    if machine_rank is not None and (isinstance(machine_rank, bool) or not 0 <= int(machine_rank) < parts):
        raise ValueError(f"machine_rank={machine_rank!r}: the partition has {parts} part(s), one per machine, "
                         f"so the machine rank lies in [0, {parts})")
    ip_path = None
    if ip_config is not None:
        ip_path = str(Path(ip_config).expanduser().resolve())
        machines = read_ip_config(ip_path)
        if len(machines) != parts:
            raise ValueError(f"ip_config {ip_path} lists {len(machines)} machine(s) but {path.name} has {parts} "
                             f"partition(s): DistDGL runs one partition per machine. Partition again with "
                             f"--parts {len(machines)}, or list {parts} machines")
    elif parts != 1:
        raise ValueError(f"{path.name} has {parts} partitions, one per machine: pass ip_config= listing the "
                         f"{parts} machines' addresses (one line each), or partition with --parts 1 to train "
                         "on this machine alone")
    return DistGraphOptions(str(path), name, parts, ip_path, num_servers,
                            None if machine_rank is None else int(machine_rank))


def check_part_files(part_config: str, part: int) -> None:
    """Refuse part ``part`` when a file is missing or its size differs from ``<name>.meta.json``
    (DGL would zero-fill a cut feature file's rows). Partitions without that record pass."""
    config = Path(part_config)
    meta_path = config.with_name(config.name[:-len(".json")] + ".meta.json")
    try:
        meta = json.loads(meta_path.read_text())
    except (OSError, ValueError):
        return
    folder = config.parent
    fix = (f"copy part {part} again from where it was made, or partition again (python -m "
           f"graphtrainer.cli.partition ... --out {folder} --overwrite)")
    files = {name: size for name, size in meta.get("files", {}).items() if name.startswith(f"part{part}/")}
    for name, size in files.items():
        path = folder / name
        found = path.stat().st_size if path.is_file() else None
        if found != size:
            what = "is missing" if found is None else f"has {found} bytes where {size} were written"
            raise ValueError(f"partition {config.name}: {path} {what}, so part {part} is damaged: {fix}")
    parts = meta.get("parts", [])
    if not files and part < len(parts) and "bytes" in parts[part]:  # recorded before per-file sizes
        part_dir = folder / f"part{part}"
        found = sum(f.stat().st_size for f in part_dir.rglob("*") if f.is_file())
        if found != parts[part]["bytes"]:
            raise ValueError(f"partition {config.name}: the files of {part_dir} hold {found} bytes where "
                             f"{parts[part]['bytes']} were written, so part {part} is damaged: {fix}")


def config_path(part_config: os.PathLike | str) -> str:
    """The partition config file ``part_config`` names (the file, or the folder holding one)."""
    path = Path(part_config).expanduser().resolve()
    if path.is_dir():
        found = [p for p in sorted(path.glob("*.json")) if not p.name.endswith(".meta.json")]
        if len(found) != 1:
            raise ValueError(f"{str(part_config)!r} is a folder: give its partition config file (<name>.json); "
                             f"found {[p.name for p in found] or 'none'}")
        path = found[0]
    if not path.is_file():
        raise FileNotFoundError(f"no partition config at {path}. Make one with: python -m graphtrainer.cli.partition "
                                "--dataset NAME --parts K --out DIR")
    return str(path)


def read_ip_config(path: str) -> Tuple[Tuple[str, int], ...]:
    """``(address, first server port)`` per machine from DGL's ip_config (``address [port]`` lines)."""
    try:
        text = Path(path).read_text()
    except OSError as err:
        raise FileNotFoundError(f"ip_config {path}: {err.strerror}. Write one line per machine: "
                                "'<address> [port]'") from None
    machines = []
    for number, line in enumerate(text.splitlines(), 1):
        fields = line.split()
        if not fields or fields[0].startswith("#"):
            continue
        try:
            socket.inet_aton(fields[0])
            port = int(fields[1]) if len(fields) > 1 else DEFAULT_SERVER_PORT
        except (OSError, ValueError):
            raise ValueError(f"ip_config {path} line {number}: {line.strip()!r} is not '<IPv4 address> [port]' "
                             "(DGL needs addresses, not host names)") from None
        machines.append((fields[0], port))
    if not machines:
        raise ValueError(f"ip_config {path} lists no machine: write one line per machine, '<address> [port]'")
    addresses = [m[0] for m in machines]
    repeated = sorted({a for a in addresses if addresses.count(a) > 1})
    if repeated:
        raise ValueError(f"ip_config {path} lists {repeated[0]} more than once: DGL tells machines apart by "
                         "address (its client fails with rpc.cc:395 'l_id < local_data_shape[0]'), so each "
                         "machine needs its own address")
    return tuple(machines)


def local_addresses() -> Dict[str, str]:
    """This machine's IPv4 addresses, each with its interface name."""
    found: Dict[str, str] = {}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for _, name in socket.if_nameindex():
            try:
                packed = fcntl.ioctl(sock.fileno(), 0x8915, struct.pack("256s", name[:15].encode()))  # SIOCGIFADDR
            except OSError:
                continue  # an interface without an IPv4 address
            found[socket.inet_ntoa(packed[20:24])] = name
    return found


@dataclass(frozen=True)
class Cluster:
    """One machine's view of a DistDGL run: what it starts and where everything listens."""

    options: DistGraphOptions
    machines: Tuple[Tuple[str, int], ...]
    machine_rank: int
    trainers_per_machine: int
    #: The ip_config file DGL reads (a written one when the run is on this machine alone).
    ip_config_path: str
    master_port: int

    @property
    def num_machines(self) -> int:
        return len(self.machines)

    @property
    def address(self) -> str:
        return self.machines[self.machine_rank][0]

    @property
    def world_size(self) -> int:
        return self.num_machines * self.trainers_per_machine

    @property
    def num_clients(self) -> int:
        """What every graph server waits for: all trainer ranks of all machines."""
        return self.world_size

    def describe(self) -> str:
        return f"{self.machine_rank} ({self.address})"

    def server_port(self, index: int) -> int:
        return self.machines[self.machine_rank][1] + index

    def placement(self) -> Placement:
        """Where this machine's ranks sit (on this machine alone: the launcher's own
        loopback rendezvous)."""
        if self.num_machines == 1:
            return Placement(0, self.world_size, None, 0, None, self.describe())
        return Placement(first_rank=self.machine_rank * self.trainers_per_machine, world_size=self.world_size,
                         master_addr=self.machines[0][0], master_port=self.master_port,
                         socket_ifname=local_addresses().get(self.address), machine=self.describe())


def resolve_cluster(options: DistGraphOptions, trainers_per_machine: int) -> Cluster:
    """This machine's :class:`Cluster`. Raises ``ValueError`` when it cannot tell which
    machine of ``ip_config`` this is."""
    if options.ip_config is None:
        # This machine alone: one loopback line on a free port, written by written_ip_config.
        return Cluster(options, (("127.0.0.1", free_port()),), 0, trainers_per_machine, "", 0)
    machines = read_ip_config(options.ip_config)
    rank = _machine_rank(options, machines)
    default_master = machines[0][1] + options.num_servers  # the port after machine 0's servers
    master_port = master_port_from_env() or default_master
    return Cluster(options, machines, rank, trainers_per_machine, options.ip_config, master_port)


@contextlib.contextmanager
def written_ip_config(cluster: Cluster) -> Iterator[Cluster]:
    """``cluster`` with an ip_config file DGL can read while inside (for this machine alone, one
    loopback line in a folder of the run's own, removed whatever ends the block)."""
    if cluster.options.ip_config is not None:
        yield cluster
        return
    folder = leftovers.owned_temp_dir("ipconfig")
    try:
        path = os.path.join(folder, "ip_config.txt")
        address, port = cluster.machines[0]
        with open(path, "w", encoding="ascii") as fh:
            fh.write(f"{address} {port}\n")
        yield dataclasses.replace(cluster, ip_config_path=path)
    finally:
        with leftovers.cleanup_first():
            shutil.rmtree(folder, ignore_errors=True)


def _machine_rank(options: DistGraphOptions, machines: Tuple[Tuple[str, int], ...]) -> int:
    if options.machine_rank is not None:
        return options.machine_rank
    for name in (MACHINE_RANK_ENV, "SLURM_NODEID"):
        value = os.environ.get(name)
        if value not in (None, ""):
            rank = int(value)
            if not 0 <= rank < len(machines):
                raise ValueError(f"{name}={value} but ip_config lists {len(machines)} machine(s)")
            return rank
    mine = local_addresses()
    matches = [m for m, (address, _) in enumerate(machines) if address in mine]
    if len(matches) == 1:
        return matches[0]
    if len(machines) == 1:
        return 0
    listed = ", ".join(a for a, _ in machines)
    raise ValueError(f"cannot tell which machine of ip_config this is: {len(matches)} of its addresses "
                     f"({listed}) belong to this machine ({', '.join(sorted(mine)) or 'none'}). Pass "
                     f"Trainer(machine_rank=...) or set {MACHINE_RANK_ENV}")
