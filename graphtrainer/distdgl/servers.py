"""This machine's DistDGL graph servers: started before the ranks, watched while they train,
gone when the run ends, however it ends.

Each server (``python -m graphtrainer.distdgl.servers``) loads the machine's partition into
shared memory and serves DGL's RPC until the ranks' client 0 shuts it down; on a failure or
Ctrl-C the launcher sends SIGTERM, then SIGKILL. A server that dies while the ranks train
ends the run with a :class:`~graphtrainer.RankFailedError` naming it and its log's end.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterator, List, Optional, Sequence, Set

from .cluster import Cluster, check_part_files
from ..errors import RankFailedError
from ..launch.supervisor import WatchedService
from ..launch import leftovers
from ..process import pids
from ..process.parent import die_with_parent

#: Seconds servers get to exit by themselves after a successful run (the ranks' client 0
#: has asked them to shut down), and after SIGTERM, before they are killed.
SHUTDOWN_WAIT_S = 15.0
TERMINATE_GRACE_S = 3.0
SHM_DIR = "/dev/shm"
#: Seconds a run waits for another DistDGL run on the machine, and for its servers to listen.
LOCK_WAIT_S = 900.0
READY_WAIT_S = 120.0
LOCK_NAME = "\0graphtrainer-distdgl-graph-servers"
#: Lines of a failed server's log quoted in the error.
LOG_TAIL_LINES = 15
#: The launching process's pid, as its servers see it (they end with it, even when it is gone early).
PARENT_ENV = "GRAPHTRAINER_SERVER_PARENT"
#: Seconds the launcher waits for the exit status of a server once a rank was killed by a signal:
#: DGL's client aborts (SIGABRT) when its server's socket closes, which the server does while it
#: exits, a moment before the kernel reports its death.
EXIT_NOTICE_S = 2.0


class GraphServer(WatchedService):
    """One graph server process of this machine.

    Its death ends the run, named as such (not as the ranks it takes down): a rank whose server
    died aborts (DGL's RPC client, on the closed socket) and may reach the launcher first. Once a
    rank of the run was killed by a signal, the server's death is waited for (up to
    :data:`EXIT_NOTICE_S`, once), so the watch does not name the cause before it could see it.
    """

    def __init__(self, cluster: Cluster, index: int, log_dir: Path):
        self.index = index
        self.ranks: Sequence[Any] = ()
        self.waited = False
        self.server_id = cluster.machine_rank * cluster.options.num_servers + index
        self.label = (f"graph server {self.server_id} on machine {cluster.describe()}, port "
                      f"{cluster.server_port(index)}")
        self.log_path = log_dir / f"server{self.server_id}.log"
        env = dict(os.environ, DGL_ROLE="server", DGL_SERVER_ID=str(self.server_id),
                   DGL_NUM_SERVER=str(cluster.options.num_servers), DGL_NUM_CLIENT=str(cluster.num_clients),
                   DGL_IP_CONFIG=cluster.ip_config_path, DGL_CONF_PATH=cluster.options.part_config,
                   DGL_DIST_MODE="distributed", DGLBACKEND="pytorch", PYTHONUNBUFFERED="1")
        env[PARENT_ENV] = str(os.getpid())
        # The checkout holding graphtrainer/: importable uninstalled.
        package_root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
        with open(self.log_path, "wb") as log:
            command = "from graphtrainer.distdgl.servers import main; main()"
            self.proc = subprocess.Popen([sys.executable, "-c", command],
                                         env=env,
                                         stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        self.label += f", pid {self.proc.pid}"

    def watch_ranks(self, procs: Sequence[Any]) -> None:
        self.ranks = procs

    def failure(self) -> Optional[RankFailedError]:
        code = self.proc.poll()
        if code is None and not self.waited and any((p.exitcode or 0) < 0 for p in self.ranks):
            self.waited = True
            pids.wait_ended(self.proc.pid, lambda: self.proc.poll() is not None, EXIT_NOTICE_S)
            code = self.proc.poll()
        if code is None or code == 0:  # running, or shut down when the ranks asked
            return None
        how = f"killed by signal {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
        return RankFailedError(-1, "GraphServerDied", f"{how} while the ranks needed it", self.log_tail(),
                               process=self.label)

    def log_tail(self) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-LOG_TAIL_LINES:])

    def stop(self, wait_s: float) -> None:
        """Let the server exit within ``wait_s``, then SIGTERM, then SIGKILL; reap it."""
        for sig, seconds in ((None, wait_s), (signal.SIGTERM, TERMINATE_GRACE_S), (signal.SIGKILL, 10.0)):
            if self.proc.poll() is not None:
                return
            if sig is not None:
                with contextlib.suppress(ProcessLookupError):
                    self.proc.send_signal(sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=seconds)


@contextlib.contextmanager
def graph_servers(cluster: Cluster) -> Iterator[List[GraphServer]]:
    """Start this machine's servers and wait until they listen; on leaving, stop them (after
    a clean exit within :data:`SHUTDOWN_WAIT_S`). No server, shared-memory segment or log
    folder outlives the block.

    One DistDGL run per machine at a time (a second waits): DGL names the features' shared
    memory after the key alone (``node~_N~feat-kvdata-``, ``dgl/distributed/kvstore.py:909``).
    """
    check_part_files(cluster.options.part_config, cluster.machine_rank)  # before any server loads it
    with _machine_lock(), _terminate_as_exit():
        leftovers.remove_dead_owners(("servers",))  # a killed run's segments: no other run holds the machine
        log_dir = Path(leftovers.owned_temp_dir("servers"))
        (log_dir / leftovers.GRAPH_NAME_FILE).write_text(cluster.options.graph_name)
        servers: List[GraphServer] = []
        clean = False
        shm_before = _shared_memory()
        try:
            for index in range(cluster.options.num_servers):
                servers.append(GraphServer(cluster, index, log_dir))
            _wait_listening(servers, cluster)
            yield servers
            clean = True
        finally:
            with leftovers.cleanup_first():  # a second Ctrl-C waits for it
                for server in servers:
                    server.stop(SHUTDOWN_WAIT_S if clean else 0.0)
                _remove_left_segments(shm_before, cluster.options.graph_name)  # ours: we hold the machine
                shutil.rmtree(log_dir, ignore_errors=True)


@contextlib.contextmanager
def _machine_lock() -> Iterator[None]:
    """Hold this machine's DistDGL lock: an abstract Unix socket, per network namespace
    (so per machine, simulated ones included), released when this process ends."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    deadline, told = time.monotonic() + LOCK_WAIT_S, False
    try:
        while True:
            try:
                sock.bind(LOCK_NAME)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"another DistDGL run has held this machine's graph servers for "
                                       f"{LOCK_WAIT_S:.0f} s; DGL's shared memory allows one run per machine "
                                       "at a time: let it finish, or run on other machines") from None
                if not told:
                    print("[graphtrainer] another DistDGL run is using this machine's graph servers (DGL's shared "
                          "memory allows one at a time): waiting for it to finish", file=sys.stderr, flush=True)
                    told = True
                time.sleep(0.5)
        yield
    finally:
        sock.close()


@contextlib.contextmanager
def _terminate_as_exit() -> Iterator[None]:
    """SIGTERM (scancel, a time limit) unwinds like Ctrl-C, so the servers are stopped and
    their shared memory removed; Python's default would end this process on the spot."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield
        return

    def handler(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _wait_listening(servers: List[GraphServer], cluster: Cluster) -> None:
    """Until every server listens (ranks started earlier would wait DGL's 3 s retry step) or one
    failed, at most :data:`READY_WAIT_S`; from the socket table (a probe would count as a client)."""
    deadline = time.monotonic() + READY_WAIT_S
    ports = {cluster.server_port(s.index) for s in servers}
    while time.monotonic() < deadline:
        for server in servers:
            failure = server.failure()
            if failure is not None:
                raise failure
        if ports <= _listening_ports():
            return
        time.sleep(0.1)


def _listening_ports() -> Set[int]:
    found: Set[int] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 3 and fields[3] == "0A":  # LISTEN
                found.add(int(fields[1].rsplit(":", 1)[1], 16))
    return found


def _shared_memory() -> Set[str]:
    try:
        return set(os.listdir(SHM_DIR))
    except OSError:
        return set()


def _remove_left_segments(before: Set[str], graph_name: str) -> None:
    """Once the servers are gone, remove segments killed ones left since they started: the graph
    (named after it) and features (DGL's ``node~<type>~<key>-kvdata-``)."""
    for name in _shared_memory() - before:
        if name.startswith((graph_name, "node~", "edge~")):
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(SHM_DIR, name))


def main() -> None:
    """A server process: serve this machine's partition until the ranks shut it down."""
    parent = os.environ.get(PARENT_ENV)
    die_with_parent(int(parent) if parent else None)  # never outlive the launching process, even if it is killed
    import dgl  # here: the engine imports without DGL (plain-torch tasks)

    dgl.distributed.initialize(os.environ["DGL_IP_CONFIG"])  # DGL_ROLE=server: serves, then exits


if __name__ == "__main__":
    main()
