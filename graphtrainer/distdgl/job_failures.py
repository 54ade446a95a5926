"""Telling the other machines of a job that this one failed.

Each machine's launcher watches only its own ranks; ranks elsewhere would learn of a failure
late (a gloo peer error, or an RPC hang found after ``hang_timeout``). So a failing machine's
launcher writes the failure into a ``TCPStore`` served by machine 0's launcher (the port after
the ranks' rendezvous; launchers outlive their ranks), which every launcher polls: the others
stop within a second or two, raising the original error with its machine and rank.
"""
from __future__ import annotations

import datetime
import json
import threading
import warnings
from typing import Any, Optional

KEY = "graphtrainer/failed"
COUNT = "graphtrainer/failures"  # add(COUNT, 0) reads without blocking (TCPStore has no check() here)
POLL_S = 0.25


class JobFailures:
    """A background connection to the job's store: :meth:`reported` reads another machine's
    failure, :meth:`report` writes this one's; without a store it does nothing, never blocking."""

    def __init__(self, host: str, port: int, serve: bool):
        import torch.distributed as dist

        self.host, self.port = host, port
        self._store: Any = None
        self._reported: Optional[dict] = None
        self._sent: Optional[dict] = None
        self._stop = threading.Event()
        if serve:  # machine 0's launcher
            try:
                self._store = dist.TCPStore(host, port, is_master=True, wait_for_workers=False,
                                            timeout=datetime.timedelta(seconds=30))
            except Exception as err:  # noqa: BLE001 - the run goes on; failures then surface later
                warnings.warn(f"cannot serve the machines' failure reports on {host}:{port} ({err}): a failure on "
                              "one machine will reach the others only through their own errors or hang_timeout")
                self._stop.set()
        self._thread = threading.Thread(target=self._run, name="graphtrainer-job-failures", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import torch.distributed as dist

        while not self._stop.is_set() and self._store is None:
            try:
                self._store = dist.TCPStore(self.host, self.port, is_master=False, wait_for_workers=False,
                                            timeout=datetime.timedelta(seconds=5))
            except Exception:  # noqa: BLE001 - not up yet: machine 0's launcher serves it
                self._stop.wait(POLL_S)
        while not self._stop.wait(POLL_S):
            try:
                if self._store.add(COUNT, 0) > 0:
                    self._reported = json.loads(self._store.get(KEY).decode())
                    return
            except Exception:  # noqa: BLE001 - the store went away with machine 0's launcher
                return

    @property
    def connected(self) -> bool:
        """True once this launcher can write and read reports."""
        return self._store is not None

    def reported(self) -> Optional[dict]:
        """``{"rank", "machine", "error_type", "message"}`` of a failure another machine wrote."""
        return self._reported if self._reported != self._sent else None

    def report(self, rank: int, machine: Optional[str], error_type: str, message: str) -> None:
        """Write this machine's failure for the others (first writer wins)."""
        if self._store is None or self._reported is not None or self._sent is not None:
            return
        failure = {"rank": rank, "machine": machine, "error_type": error_type, "message": message}
        payload = json.dumps(failure)
        try:
            if self._store.compare_set(KEY, "", payload).decode() == payload:  # the first report stands
                self._sent = failure
                self._store.add(COUNT, 1)
        except Exception:  # noqa: BLE001 - best effort: the store may be gone
            pass

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2 * POLL_S + 5)


def for_placement(placement: Any) -> Optional[JobFailures]:
    """The failure channel of a multi-machine job's ``Placement``; None on one machine."""
    if placement.master_addr is None:
        return None
    return JobFailures(placement.master_addr, placement.master_port + 1, serve=placement.first_rank == 0)
