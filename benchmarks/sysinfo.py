"""The machine a benchmark ran on: cores, load from other work during a run, versions."""
from __future__ import annotations

import os
import platform
import sys
import time
from typing import Any, Dict

from memory import machine_memory_mb


def available_cores() -> int:
    """Cores this process may run on (its affinity mask), as the trainer counts them."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _busy_cpu_s() -> float:
    """CPU seconds spent by every process on the machine since boot (all cores)."""
    with open("/proc/stat", encoding="ascii") as fh:
        fields = [int(x) for x in fh.readline().split()[1:]]
    # user nice system idle iowait irq softirq steal guest guest_nice; guest is inside user
    busy = fields[0] + fields[1] + fields[2] + fields[5] + fields[6] + (fields[7] if len(fields) > 7 else 0)
    return busy / os.sysconf("SC_CLK_TCK")


def _own_cpu_s() -> float:
    """CPU seconds of this process, its live descendants, and its reaped children (which
    include their own reaped descendants)."""
    import psutil

    me = psutil.Process()
    t = me.cpu_times()
    total = t.user + t.system + t.children_user + t.children_system
    for child in me.children(recursive=True):
        try:
            c = child.cpu_times()
            total += c.user + c.system
        except psutil.NoSuchProcess:
            pass
    return total


#: Above this many cores of other work during a run, its timings are marked as noisy.
NOISY_CORES = 0.25


def noise_note(other_cores: float) -> str:
    """'' for a quiet run, else a short warning for tables."""
    return "" if other_cores <= NOISY_CORES else f" (noisy: {other_cores:.2f} cores busy elsewhere)"


class LoadMeter:
    """``other_cores``: CPU time that processes *outside* this benchmark's process tree used
    during a run, per second of wall time (0 = quiet machine, 1 = one core busy elsewhere).
    Timings taken with ``other_cores`` well above 0 are skewed by that other work."""

    def __enter__(self) -> "LoadMeter":
        self._wall, self._busy, self._own = time.monotonic(), _busy_cpu_s(), _own_cpu_s()
        return self

    def __exit__(self, *exc: Any) -> None:
        wall = max(time.monotonic() - self._wall, 1e-6)
        other = (_busy_cpu_s() - self._busy) - (_own_cpu_s() - self._own)
        self.other_cores = round(max(0.0, other) / wall, 2)


def machine_info() -> Dict[str, Any]:
    """Cores, memory, platform, and the load when the benchmark started. Warns (stderr) when
    the machine is busy: timings then say more about the other work than about this one."""
    import psutil

    load = os.getloadavg()[0]
    cpus = available_cores()
    if load > 0.25 * cpus:
        print(f"[bench] WARNING: 1-minute load average {load:.2f} on {cpus} cores before starting: timings "
              "will be noisy (multi-threaded runs suffer most); memory figures are unaffected", file=sys.stderr,
              flush=True)
    model = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            model = next((l.split(":", 1)[1].strip() for l in fh if l.startswith("model name")), "")
    except OSError:
        pass
    return {
        "cpus": os.cpu_count(),
        "cores_available": available_cores(),
        "cpu_model": model,
        "ram_gib": round(machine_memory_mb() / 1024, 1),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "loadavg_start": [round(x, 2) for x in os.getloadavg()],
        "available_gib_start": round(psutil.virtual_memory().available / 2**30, 1),
    }


def versions() -> Dict[str, str]:
    import torch

    out = {"torch": torch.__version__}
    try:
        import dgl

        out["dgl"] = dgl.__version__
    except Exception:  # noqa: BLE001
        pass
    return out
