"""Ranks that torchrun or Slurm started: no launcher of ours watches them, so each says for
itself what failed, where its peers can read it.

- A rank that fails on its own (an exception, a hang) writes its error into the process
  group's store (and torchrun's error file, its "Root Cause") before it exits.
- A rank whose error is only a lost peer (gloo's "Connection closed by peer") looks there
  for the cause, or for a peer on this machine whose process is gone, and raises a
  :class:`~graphtrainer.RankFailedError` naming that rank instead.
- ``Trainer(hang_timeout=...)``: a thread of each rank watches its own heartbeat; a rank
  without progress that long outside a collective reports itself hung, with its stack, and
  exits. After a stop signal (torchrun's agent passes SIGTERM on) the timeout shortens to
  :func:`graphtrainer.heartbeat.timeout_after_stop`, so the hang is named before the agent's
  grace period ends in a silent SIGKILL.
"""
from __future__ import annotations

import array
import faulthandler
import json
import os
import socket
import sys
import tempfile
import threading
import time
from typing import Any, Dict, Optional

from .. import heartbeat
from ..process import pids
from ..errors import RankFailedError
from .supervisor import HANG_POLL_S, _is_peer_loss, hang_preamble

_FAILURE = "graphtrainer/failure/{}"
_PID = "graphtrainer/pid/{}"
#: Seconds a rank that lost a peer looks for the peer's own report.
LOOK_S = 3.0


def _store() -> Any:
    try:
        from torch.distributed import distributed_c10d

        return distributed_c10d._get_default_store()
    except Exception:  # noqa: BLE001 - no group, or another torch's internals
        return None


def announce(rank: int) -> None:
    """Say where this rank runs (host and pid), so a peer can tell whether it is gone."""
    store = _store()
    if store is not None:
        store.set(_PID.format(rank), f"{socket.gethostname()} {os.getpid()}")


def attribute(err: BaseException, rank: int, world_size: int, traceback_text: str) -> Optional[RankFailedError]:
    """In a failed external rank's ``except`` block: record a failure of its own; for a lost
    peer, return the error naming the rank that caused it (None when none is found)."""
    store = _store()
    if store is None or isinstance(err, (RankFailedError, SystemExit, KeyboardInterrupt)):
        return None  # (a stop on a signal, Preempted, is no failure)
    if not _is_peer_loss(RankFailedError(rank, type(err).__name__, str(err))):
        _record(store, rank, type(err).__name__, str(err), traceback_text)
        _record_for_torchrun(f"{type(err).__name__}: {err}", traceback_text, time.time())
        return None
    cause = _find_cause(store, rank, world_size)
    if cause is None:
        return None
    blamed = RankFailedError(cause["rank"], cause["type"], f"{cause['message']} (rank {rank} stopped: it lost "
                             f"its connection to rank {cause['rank']})", cause.get("traceback", ""))
    # torchrun names the failure with the earliest time, in whole seconds: be the later one.
    while int(time.time()) <= int(cause["time"]):
        time.sleep(0.05)
    # (shown as the traceback in torchrun's report, should it pick this rank as the root cause)
    _record_for_torchrun(str(blamed), str(blamed), time.time())
    return blamed


def _record(store: Any, rank: int, error_type: str, message: str, traceback_text: str) -> None:
    record = {"rank": rank, "type": error_type, "message": message, "traceback": traceback_text[-20000:],
              "time": time.time()}
    try:
        store.set(_FAILURE.format(rank), json.dumps(record))
    except Exception:  # noqa: BLE001 - the store's host may be gone too
        pass


def _record_for_torchrun(message: str, traceback_text: str, when: float) -> None:
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    data = {"message": {"message": message, "extraInfo": {"py_callstack": traceback_text,
                                                          "timestamp": str(int(when))}}}
    try:
        with open(path, "w", encoding="utf-8") as fh:
            json.dump(data, fh)
    except OSError:
        pass


def _find_cause(store: Any, rank: int, world_size: int) -> Optional[Dict[str, Any]]:
    """Another rank's recorded failure (the earliest), else a peer on this machine whose
    process is gone without one (a rank records its failure before it exits)."""
    others = [r for r in range(world_size) if r != rank]
    deadline = time.monotonic() + LOOK_S
    while True:
        try:
            found = [json.loads(v) for v in (_peek(store, _FAILURE.format(o)) for o in others) if v is not None]
        except Exception:  # noqa: BLE001 - the store's host is gone: nothing more to learn there
            return None
        if found:
            return min(found, key=lambda r: r["time"])
        gone = _gone_peer(store, others)
        if gone is not None:
            if _peek(store, _FAILURE.format(gone["rank"])) is None:  # (it may have recorded just now)
                return gone
            continue
        if time.monotonic() > deadline:
            return None
        time.sleep(0.1)


def _peek(store: Any, key: str) -> Optional[bytes]:
    """``key``'s value, or None when it is not set, without waiting for it: a compare-and-set
    that changes nothing (c10d stores have no "exists" on every version)."""
    absent = b"\0graphtrainer-absent"
    value = store.compare_set(key, absent, absent)
    return None if value == absent else bytes(value)


def _gone_peer(store: Any, others: list) -> Optional[Dict[str, Any]]:
    host = socket.gethostname()
    for other in others:
        try:
            where = (_peek(store, _PID.format(other)) or b"").decode() if store is not None else ""
        except Exception:  # noqa: BLE001
            continue
        peer_host, _, pid = where.partition(" ")
        if peer_host == host and pid.isdigit() and not pids.alive(int(pid)):
            return {"rank": other, "type": "ProcessDied", "time": time.time(), "traceback": "",
                    "message": f"its process (pid {pid}) is gone without a Python exception: killed (SIGKILL, the "
                               "OOM killer) or crashed"}
    return None


class HangWatch:
    """This rank's hang watch (see the module docstring) until :meth:`stop`; idle without a timeout."""

    def __init__(self, rank: int, hang_timeout: Optional[float]):
        self.stopped = threading.Event()
        if hang_timeout is None:
            return
        board = array.array("d", [0.0] * heartbeat.FIELDS)
        board[0] = time.monotonic()
        heartbeat.attach(board, 0)
        threading.Thread(target=self._watch, args=(board, rank, hang_timeout), name="graphtrainer-hang-watch",
                         daemon=True).start()

    def stop(self) -> None:
        self.stopped.set()

    def _watch(self, board: Any, rank: int, timeout: float) -> None:
        while not self.stopped.wait(min(HANG_POLL_S, timeout / 4)):
            place = heartbeat.read_board(board, 1)[0]
            stop_asked = place.stop_s is not None  # (SIGTERM from torchrun's agent or the scheduler)
            if place.count == 0 or place.waiting or \
                    place.idle_s < (heartbeat.timeout_after_stop(place, timeout) if stop_asked else timeout):
                continue
            where = place.describe().replace("rank 0 ", f"rank {rank} ", 1)
            message = f"{hang_preamble(timeout, [place], stop_asked)}: {where}"
            stack = _own_stack()
            store = _store()
            if store is not None:
                _record(store, rank, "Hang", message, stack)
            # torchrun shows the callstack alone as the root cause: the message leads it
            _record_for_torchrun(f"Hang: {message}", f"Hang: {message}\n\n{stack}", time.time())
            print(f"rank {rank} failed: Hang: {message}\n\n--- stack of rank {rank} ---\n{stack}",
                  file=sys.stderr, flush=True)
            os._exit(1)


def _own_stack() -> str:
    with tempfile.TemporaryFile("w+") as fh:
        faulthandler.dump_traceback(file=fh, all_threads=True)
        fh.seek(0)
        return fh.read()
