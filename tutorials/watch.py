"""Running several processes of a demo side by side (tutorial 6's torchrun "nodes",
tutorial 11's simulated machines): their output prefixed, and all of them ended when one
fails or time runs out."""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from typing import List, Optional, Sequence

#: After one process failed, seconds the others get to report the loss themselves.
PEER_REPORT_S = 5.0
#: Seconds a process gets after the stop signal before SIGKILL.
STOP_GRACE_S = 10.0


def relay_and_watch(procs: Sequence[subprocess.Popen], label: str, tag: str, timeout: float,
                    stop_signal: int = signal.SIGTERM) -> List[Optional[int]]:
    """Print every line of ``procs[i]`` (text pipes, each in a session of its own) as
    ``[<label> i] line``; wait until all exit, or one fails (then the others get
    :data:`PEER_REPORT_S`), or ``timeout`` passes. Processes still running are then sent
    ``stop_signal`` (their whole process group), and SIGKILL after :data:`STOP_GRACE_S`.
    Returns the exit codes."""

    def relay(index: int, proc: subprocess.Popen) -> None:
        for line in proc.stdout:
            print(f"[{label} {index}] {line}", end="", flush=True)

    relays = [threading.Thread(target=relay, args=(i, p), daemon=True) for i, p in enumerate(procs)]
    for thread in relays:
        thread.start()
    deadline = time.time() + timeout
    codes: List[Optional[int]] = [None] * len(procs)
    while time.time() < deadline and any(c is None for c in codes):
        codes = [p.poll() for p in procs]
        if any(c not in (None, 0) for c in codes):  # one failed: its peers would wait for it
            time.sleep(PEER_REPORT_S)
            break
        time.sleep(0.2)
    running = [i for i, p in enumerate(procs) if p.poll() is None]
    if running:
        why = "timeout" if time.time() >= deadline else "another one failed"
        print(f"[{tag}] ending {label}(s) {running}: {why}", flush=True)
        for sig, wait_s in ((stop_signal, STOP_GRACE_S), (signal.SIGKILL, STOP_GRACE_S)):
            for i in running:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(procs[i].pid, sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                stop_by = time.time() + wait_s
                for i in running:
                    procs[i].wait(timeout=max(0.1, stop_by - time.time()))
            running = [i for i in running if procs[i].poll() is None]
            if not running:
                break
    for thread in relays:
        thread.join(5)
    return [p.returncode for p in procs]
