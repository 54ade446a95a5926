"""Several "machines" on one Linux box, to try (and test) a multi-machine DistDGL run.

DistDGL tells machines apart by IP address and shares a partition through ``/dev/shm``, so
each simulated machine is a network namespace with its own address and ``/dev/shm``, hanging
off one bridge in a namespace of its own. Machine ``m`` is ``127.100.0.<m+1>``, loopback
addresses routed over its link (``route_localnet``); this box's own network is untouched.
Needs root (or CAP_SYS_ADMIN and CAP_NET_ADMIN) and the ``ip`` tool.

::

    with SimulatedMachines(2) as machines:          # machines.addresses: 127.100.0.1, 127.100.0.2
        procs = [machines.popen(m, [sys.executable, "train.py"]) for m in range(2)]
        ...                                          # every process and namespace goes on exit
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
import uuid
from typing import Any, List, Optional, Sequence, Tuple

SUBNET = "127.100.0"
SHM = "/dev/shm"


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


def can_simulate() -> Tuple[bool, str]:
    """``(True, "")`` when namespaces can be made here, else ``(False, why)``."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return False, "simulated machines need root (network namespaces and mounts)"
    if shutil.which("ip") is None:
        return False, "simulated machines need the 'ip' tool (iproute2)"
    probe = f"gtprobe-{uuid.uuid4().hex[:6]}"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return False, f"cannot make a network namespace: {made.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return True, ""


class SimulatedMachines:
    """``count`` network namespaces joined by a bridge (a context manager; see the module doc)."""

    def __init__(self, count: int):
        if count < 1 or count > 200:
            raise ValueError(f"count={count}: simulate between 1 and 200 machines")
        self.count = count
        tag = uuid.uuid4().hex[:6]
        self.switch = f"gt{tag}-sw"
        self.names = [f"gt{tag}-m{m}" for m in range(count)]
        self.addresses = [f"{SUBNET}.{m + 1}" for m in range(count)]
        #: Each machine's /dev/shm: a folder of this box's /dev/shm, mounted over /dev/shm there.
        self.shm_dirs = [os.path.join(SHM, f"gt{tag}-m{m}") for m in range(count)]
        self.procs: List[subprocess.Popen] = []

    def __enter__(self) -> "SimulatedMachines":
        try:
            _ip("netns", "add", self.switch)
            _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
            _ip("-n", self.switch, "link", "set", "br0", "up")
            for m, name in enumerate(self.names):
                _ip("netns", "add", name)
                _ip("-n", name, "link", "set", "lo", "up")
                # lo keeps 127.0.0.1 alone, so the rest of 127/8 can live on the link.
                _ip("-n", name, "addr", "del", "127.0.0.1/8", "dev", "lo")
                _ip("-n", name, "addr", "add", "127.0.0.1/32", "dev", "lo")
                # One end in the machine, the other on the bridge.
                _ip("-n", name, "link", "add", "eth0", "type", "veth", "peer", "name", f"p{m}", "netns", self.switch)
                for key in ("all", "eth0"):
                    subprocess.run(["ip", "netns", "exec", name, "sysctl", "-qw",
                                    f"net.ipv4.conf.{key}.route_localnet=1"], check=True, timeout=30)
                _ip("-n", name, "addr", "add", f"{self.addresses[m]}/24", "dev", "eth0")
                _ip("-n", name, "link", "set", "eth0", "up")
                _ip("-n", self.switch, "link", "set", f"p{m}", "master", "br0")
                _ip("-n", self.switch, "link", "set", f"p{m}", "up")
                os.makedirs(self.shm_dirs[m], mode=0o1777)
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def ip_config(self, path: str, port: int = 30050) -> str:
        """Write DGL's ip_config for these machines to ``path``; return it."""
        with open(path, "w", encoding="ascii") as fh:
            fh.writelines(f"{address} {port}\n" for address in self.addresses)
        return path

    def popen(self, machine: int, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen:
        """Start ``argv`` on ``machine`` (its namespace and ``/dev/shm``), in a session of its own."""
        script = 'mount --bind "$0" /dev/shm && exec "$@"'  # in the mount namespace ip-netns-exec makes
        proc = subprocess.Popen(["ip", "netns", "exec", self.names[machine], "sh", "-c", script,
                                 self.shm_dirs[machine], *argv], start_new_session=True, **kwargs)
        self.procs.append(proc)
        return proc

    def pids(self) -> List[int]:
        """Processes still running in any of the namespaces."""
        found: List[int] = []
        for name in self.names + [self.switch]:
            out = _ip("netns", "pids", name, check=False).stdout.split()
            found += [int(p) for p in out]
        return found

    def close(self, wait_s: float = 5.0) -> None:
        """End every process in the namespaces (SIGTERM, then SIGKILL), then remove them."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for proc in self.procs:
                if proc.poll() is None:
                    try:
                        os.killpg(proc.pid, sig)
                    except ProcessLookupError:
                        pass
            for pid in self.pids():
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + wait_s
            while time.monotonic() < deadline and (self.pids() or any(p.poll() is None for p in self.procs)):
                time.sleep(0.1)
        for proc in self.procs:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        for name in self.names + [self.switch]:
            _ip("netns", "del", name, check=False)
        for folder in self.shm_dirs:
            shutil.rmtree(folder, ignore_errors=True)

    def existing(self) -> List[str]:
        """Which of this object's namespaces exist now (none after :meth:`close`)."""
        listed = _ip("netns", "list", check=False).stdout.split()
        return [n for n in self.names + [self.switch] if n in listed]


def wait_all(procs: Sequence[subprocess.Popen], timeout: float) -> Optional[int]:
    """Wait for every process; the first non-zero return code, or None when all succeeded.
    Raises ``TimeoutError`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    first_bad = None
    for proc in procs:
        try:
            code = proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            raise TimeoutError(f"machine processes still running after {timeout:.0f} s") from None
        if code != 0 and first_bad is None:
            first_bad = code
    return first_bad
