"""Where each launched rank is, so the launcher can name a hung rank within seconds.

Each rank writes a few numbers into its row of a small shared-memory array whenever
it makes progress (a hook entered, a batch fetched or stepped) and marks itself
*waiting* while inside a collective (DDP's all-reduce in backward, the collectives DDP
runs itself before a forward and in its constructor, a barrier, a metric reduction). The launcher
reads the rows: a rank with no progress for ``hang_timeout``
seconds that is not waiting is stuck; ranks waiting in a collective are waiting for it
and are not blamed. A rank whose process is stopped (SIGSTOP, Ctrl-Z, a debugger) is blamed
whatever its row says. If every rank is waiting (collectives that do not match), the ranks
furthest behind are blamed. Writing a row costs a few stores; nothing is sent.

Inside ``backward`` a rank counts as waiting only once DDP has launched its last gradient
bucket's all-reduce (:mod:`graphtrainer.loop.ddp` marks it from DDP's communication hook):
until then it computes gradients (a gradient hook, a custom autograd function), and a rank
stuck there is the one to blame, not its peers waiting for its gradients.

A stop signal (:mod:`graphtrainer.launch.stop_flag`) is recorded in the row too: the run then
waits for a batch boundary, and a rank without progress never reaches one, so once a stop is
asked the timeout shortens (:func:`timeout_after_stop`).
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Any, Collection, Iterator, List, Optional

# Row layout: last progress (time.monotonic, the same clock in every process), waiting
# flag, place index, epoch, batch index (-1: none), progress count, the longest pause between
# two progress reports so far (outside collectives), when a stop signal came (0: none).
_T, _WAITING, _PLACE, _EPOCH, _BATCH, _COUNT, _LONGEST, _STOP = range(8)
FIELDS = 8
#: Once a stop is asked, a rank without progress (outside a collective) for this long, or for
#: :data:`STOP_PAUSE_FACTOR` times the longest pause it has had so far if that is longer, is hung.
STOP_HANG_MIN_S = 2.0
STOP_PAUSE_FACTOR = 2.0
#: Every place a rank reports, by index: the same table in the launcher and the ranks.
PLACES = (
    "start-up", "graphtrainer", "init_process_group", "setup", "configure_model", "configure_optimizers",
    "train_dataloader", "val_dataloader", "test_dataloader", "predict_dataloader", "on_fit_start",
    "on_train_epoch_start", "the training loader", "training_step", "backward", "optimizer step",
    "on_train_batch_end", "Join (uneven inputs)", "on_validation_epoch_start", "the validation loader",
    "validation_step", "on_validation_epoch_end", "on_test_epoch_start", "the test loader", "test_step",
    "on_test_epoch_end", "on_predict_epoch_start", "the predict loader", "predict_step",
    "on_predict_epoch_end", "on_train_epoch_end", "save_checkpoint", "on_save_checkpoint",
    "on_load_checkpoint", "on_fit_end", "teardown", "on_exception", "barrier", "all_reduce",
    "all_gather", "broadcast", "graph servers", "DDP's forward sync", "DDP's construction",
    "DDP's gradient all-reduce",
)
_INDEX = {name: i for i, name in enumerate(PLACES)}


def _place_id(name: str) -> int:
    return _INDEX.get(name, 1)  # unknown places count as framework code


@dataclass(frozen=True)
class RankPlace:
    """What one rank was last doing."""

    rank: int
    place: str
    epoch: int
    batch_idx: int
    waiting: bool
    idle_s: float
    count: int
    #: The longest pause between two of its progress reports so far, outside collectives.
    longest_s: float = 0.0
    #: Seconds since this rank received a stop signal (None: none received).
    stop_s: Optional[float] = None

    def describe(self) -> str:
        where = f"{'waiting in' if self.waiting else 'in'} {self.place}"
        if self.place != "start-up":
            where += f" (epoch {self.epoch}" + (f", batch {self.batch_idx})" if self.batch_idx >= 0 else ")")
        return f"rank {self.rank} {where} for {self.idle_s:.0f} s"


class _Writer:
    def __init__(self, row: Any):
        self.row = row
        self.epoch = 0

    def beat(self, place: str, batch_idx: int = -1, waiting: bool = False) -> None:
        row = self.row
        now = time.monotonic()
        if row[_COUNT] > 0 and row[_WAITING] == 0.0 and now - row[_T] > row[_LONGEST]:
            row[_LONGEST] = now - row[_T]
        row[_PLACE] = _place_id(place)
        row[_EPOCH] = self.epoch
        row[_BATCH] = batch_idx
        row[_WAITING] = 1.0 if waiting else 0.0
        row[_COUNT] += 1
        row[_T] = now


_writer: Optional[_Writer] = None


def attach(array: Any, rank: int) -> None:
    """Make this process write ``rank``'s row of ``array`` (a launcher's board)."""
    global _writer
    _writer = _Writer(memoryview(array).cast("B").cast("d")[rank * FIELDS:(rank + 1) * FIELDS])


def set_epoch(epoch: int) -> None:
    if _writer is not None:
        _writer.epoch = epoch


def beat(place: str, batch_idx: int = -1) -> None:
    """Record progress: this rank is now in ``place`` (a hook or a framework phase)."""
    if _writer is not None:
        _writer.beat(place, batch_idx)


def stop_requested() -> None:
    """Record that this rank received a stop signal (safe in a signal handler)."""
    if _writer is not None and _writer.row[_STOP] == 0.0:
        _writer.row[_STOP] = time.monotonic()


def waiting_from_now(what: str) -> None:
    """Mark this rank as waiting on its peers until its next :func:`beat`."""
    if _writer is not None:
        _writer.beat(what, int(_writer.row[_BATCH]), waiting=True)


@contextlib.contextmanager
def waiting(what: str) -> Iterator[None]:
    """Mark this rank as waiting on its peers (inside a collective) until the block ends."""
    if _writer is None:
        yield
        return
    row = _writer.row
    place, batch = PLACES[int(row[_PLACE])], int(row[_BATCH])
    _writer.beat(what, batch, waiting=True)
    try:
        yield
    finally:
        _writer.beat(place, batch)


def new_board(ctx: Any, world_size: int) -> Any:
    """A shared array for ``world_size`` rows, made by the launcher before starting ranks."""
    board = ctx.RawArray("d", world_size * FIELDS)
    now = time.monotonic()
    for rank in range(world_size):
        board[rank * FIELDS + _T] = now
        board[rank * FIELDS + _BATCH] = -1
    return board


def read_board(board: Any, world_size: int) -> List[RankPlace]:
    now = time.monotonic()
    places = []
    for rank in range(world_size):
        row = board[rank * FIELDS:(rank + 1) * FIELDS]
        index = int(row[_PLACE])
        places.append(RankPlace(rank=rank, place=PLACES[index] if 0 <= index < len(PLACES) else "graphtrainer",
                                epoch=int(row[_EPOCH]), batch_idx=int(row[_BATCH]),
                                waiting=row[_WAITING] > 0, idle_s=now - row[_T], count=int(row[_COUNT]),
                                longest_s=row[_LONGEST], stop_s=now - row[_STOP] if row[_STOP] > 0 else None))
    return places


#: Where a rank is between two batch boundaries of training: a stop waits for the next one.
BETWEEN_BOUNDARIES = frozenset({"the training loader", "training_step", "backward", "optimizer step",
                                "on_train_batch_end"})


def timeout_after_stop(place: RankPlace, timeout: float) -> float:
    """The hang timeout of a rank once a stop was asked. Between two batch boundaries of
    training (:data:`BETWEEN_BOUNDARIES`), where the stop waits for the next one, which comes
    within a step in a run that moves: :data:`STOP_HANG_MIN_S`, or :data:`STOP_PAUSE_FACTOR`
    times the longest pause the rank had so far if longer, at most ``timeout``. Elsewhere
    (validation, an epoch's end, a checkpoint being written) ``timeout``."""
    if place.place not in BETWEEN_BOUNDARIES:
        return timeout
    return min(timeout, max(STOP_HANG_MIN_S, STOP_PAUSE_FACTOR * place.longest_s))


def find_stuck(places: List[RankPlace], timeout: float, startup_timeout: float, running: List[int],
               stopped: Collection[int] = (), stop_asked: bool = False) -> Optional[List[RankPlace]]:
    """The ranks to blame for a hang, or None while the job still moves.

    ``running``: ranks whose process is alive and has not reported. ``stopped``: ranks whose
    process is stopped (they are blamed even inside a collective). ``stop_asked``: a stop
    signal reached the run (the launcher or any rank): see :func:`timeout_after_stop`.
    """
    live = [p for p in places if p.rank in running]
    stop_asked = stop_asked or any(p.stop_s is not None for p in live)

    def overdue(p: RankPlace, shortened: bool = False) -> bool:
        if p.count == 0:
            return p.idle_s >= startup_timeout
        return p.idle_s >= (timeout_after_stop(p, timeout) if shortened else timeout)

    stuck = [p for p in live if overdue(p, stop_asked) and (not p.waiting or p.rank in stopped)]
    if stuck:
        return stuck
    # Everyone waits: collectives that never match (or one slow to complete: no shortening).
    if live and all(overdue(p) for p in live):
        behind = min(p.count for p in live)
        return [p for p in live if p.count == behind]
    return None
