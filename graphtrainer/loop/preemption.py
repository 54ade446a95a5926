"""Runs that survive preemption: SIGTERM (how schedulers stop jobs) or SIGUSR1 (Slurm's early
warning, ``#SBATCH --signal=USR1@90``) stops every rank at the next batch boundary, rank 0
writes ``last.ckpt`` holding the position in the epoch, and ``fit`` raises
:class:`~graphtrainer.Preempted` (a ``SystemExit`` with status 75, BSD's
"temporary failure, try again"). ``fit(task, ckpt_path="last")`` then resumes at the next
batch, and a run resumed so ends with the parameters and optimizer state of a run never
stopped.

Agreement: a signal may reach the ranks at different batches (or only some of them). Every
few optimizer steps (about :data:`AGREE_EVERY_S` of training) every rank starts one
all-reduce of a 2-number flag and reads it at the next step boundary, so no rank waits for
it and all stop at the same boundary, one step after the first exchange that saw the signal
(:class:`StopAgreement`). The flag also rides in the epoch's closing agreement
(:class:`~graphtrainer.loop.stopping.StopController`), so a signal after the last exchange
stops the run at the epoch's end; so does any signal in an epoch inside ``Join`` (ranks
with different numbers of batches), where no other collective may run.
The process exits with :data:`~graphtrainer.PREEMPTED_EXIT_CODE`. A signal before any rank
exists ends the fit so too, at once and without a checkpoint (:func:`before_ranks`).
"""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator, List, Optional, Sequence

import torch

from .. import comm as gdist
from ..checkpoint.content import save_checkpoint, set_rng_state
from ..errors import PREEMPTED_EXIT_CODE, Preempted
from ..launch import leftovers, stop_flag
from ..launch.environment import detect_external_launch
from .hooks import result

#: Set to 1 to requeue the Slurm job (``scontrol requeue $SLURM_JOB_ID``) after a preemption.
REQUEUE_ENV = "GRAPHTRAINER_SLURM_REQUEUE"

_received: dict = {"agreed": None}
#: While a fit trains, the stop signals set a flag the fit loop reads.
stop_signals = stop_flag.caught
requested = stop_flag.requested


def signal_flag() -> List[float]:
    """This rank's (signal, rank), or (0, -1): the maximum over ranks names a signal and the
    (highest) rank that received it."""
    mine = requested() or 0
    return [float(mine), float(gdist.get_rank() if mine else -1)]


def decode_signal(seen: Sequence[float]) -> bool:
    """Whether the agreed (maximum) :func:`signal_flag` names a signal; kept for :func:`describe`."""
    signum, rank = float(seen[0]), float(seen[1])
    _received["agreed"] = (int(signum), max(0, int(rank))) if signum > 0 else None
    return _received["agreed"] is not None


#: How often, in seconds of training, the ranks exchange their stop flags (one asynchronous
#: all-reduce each): a stop comes within about this long after the signal, and short steps
#: do not add a collective each (the loop's only one besides DDP's). 0: at every step.
#: ``benchmarks/overhead.py --stop-arm`` measures what the agreement costs.
AGREE_EVERY_S = 0.2
#: The most steps between two exchanges, however short the steps.
MAX_STEPS_BETWEEN = 1000


class StopAgreement:
    """Whether the ranks stop, agreed without a wait per step: every :attr:`every` step
    boundaries of an epoch outside ``Join`` every rank starts one all-reduce
    of its flag and reads it at the next boundary, so all ranks stop at the same boundary (with
    one process, at once). :attr:`every` is the same on every rank: it changes only through
    :meth:`agree_interval`, at the end of an epoch."""

    def __init__(self) -> None:
        self._pending: Optional[Any] = None
        #: Step boundaries between two exchanges (1 in the first epoch: no step time yet).
        self.every = 1
        self._countdown = 1
        self._first: Optional[float] = None
        self._last: Optional[float] = None
        self._boundaries = 0

    def start_epoch(self) -> None:
        """Count this epoch's boundaries afresh (every rank starts the epoch together)."""
        self._countdown, self._first, self._last, self._boundaries = self.every, None, None, 0

    def at_boundary(self) -> bool:
        """Whether to stop here. Must be called on all processes, outside ``Join``."""
        if not gdist.is_distributed():
            return requested() is not None and decode_signal(signal_flag())
        now = time.monotonic()
        self._first, self._last, self._boundaries = self._first or now, now, self._boundaries + 1
        if self.collect():
            return True
        self._countdown -= 1
        if self._countdown <= 0:
            self._countdown = self.every
            self._pending = gdist.start_all_reduce(torch.tensor(signal_flag()), "max")
        return False

    def proposal(self) -> float:
        """The interval this rank would use next epoch: :data:`AGREE_EVERY_S` in steps of this
        epoch's length (this epoch's interval when it measured no step)."""
        if AGREE_EVERY_S <= 0:
            return 1.0
        if self._boundaries < 2:
            return float(self.every)
        step_s = max((self._last - self._first) / (self._boundaries - 1), 1e-6)
        return float(max(1, min(MAX_STEPS_BETWEEN, int(AGREE_EVERY_S / step_s + 1e-6))))

    def agree_interval(self, smallest: float) -> None:
        """Use ``smallest`` (the smallest :meth:`proposal` over the ranks) from the next epoch
        on."""
        self.every = max(1, int(smallest))

    def collect(self) -> bool:
        """The answer of the exchange still running (False when none runs). Must be called on
        all processes before any other collective that follows the step loop."""
        if self._pending is None:
            return False
        finish, self._pending = self._pending, None
        return decode_signal(finish().tolist())


def describe() -> str:
    """The agreed stop, in words: "SIGTERM (received by rank 1)"."""
    signum, rank = _received.get("agreed") or (requested() or signal.SIGTERM, 0)
    return f"{signal.Signals(signum).name} (received by rank {rank})"


class MidEpochResume:
    """Resuming from a checkpoint :func:`stop_run` wrote mid-epoch: the batches of that epoch
    already trained are fetched and skipped (so the sampler's random stream is where it was),
    then each rank's generators are set as they were at the stop."""

    def __init__(self, batches_done: int, rngs: Optional[list]):
        self.batches_done, self.rngs = batches_done, rngs

    @classmethod
    def of(cls, checkpoint: Optional[dict], world_size: int) -> Optional["MidEpochResume"]:
        """The resume ``checkpoint`` asks for, or None (none, or written at an epoch's end)."""
        done = int((checkpoint or {}).get("batches_done_in_epoch") or 0)
        if not done:
            return None
        rngs = checkpoint.get("rng_states") or []
        return cls(done, rngs if len(rngs) == world_size else None)

    def skips(self, batch_idx: int, rank: int) -> bool:
        """Whether batch ``batch_idx`` was trained before the stop; at the first one that was
        not, this rank's generators are restored."""
        if batch_idx < self.batches_done:
            return True
        if self.rngs is not None:
            set_rng_state(self.rngs[rank])
            self.rngs = None
        self.batches_done = -1  # (only the first epoch after the resume)
        return False

    def finish(self, rank: int) -> None:
        """At the end of the resumed epoch: a stop after its last batch skipped every batch,
        and the generators are set as they were at the stop only now. Returns None, the
        resume done."""
        if self.rngs is not None:
            set_rng_state(self.rngs[rank])
            self.rngs = None
        return None


def requeue_if_asked() -> Optional[str]:
    """Under Slurm with :data:`REQUEUE_ENV` set to 1: requeue this job; returns what was done."""
    job = os.environ.get("SLURM_JOB_ID")
    if os.environ.get(REQUEUE_ENV) != "1" or not job:
        return None
    try:
        out = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as err:
        print(f"[graphtrainer] scontrol requeue {job} failed: {err}", file=sys.stderr)
        return None
    if out.returncode != 0:
        print(f"[graphtrainer] scontrol requeue {job} failed: {out.stderr.strip()}", file=sys.stderr)
        return None
    return f"Slurm job {job} requeued"


@contextlib.contextmanager
def before_ranks() -> Iterator[None]:
    """Around a fit in the process that starts its ranks or is its one rank (not a torchrun or
    Slurm rank: no launcher of ours): a stop signal before any rank exists raises
    :class:`~graphtrainer.Preempted` at once (:func:`graphtrainer.launch.leftovers.preempts_before_ranks`),
    said on stderr as :func:`stop_run` says it, and the Slurm job requeued as :func:`requeue_if_asked` asks."""
    try:
        with leftovers.preempts_before_ranks(detect_external_launch() is None):
            yield
    except Preempted as stop:
        if leftovers.preempted_before_ranks() is not None and stop.checkpoint is None and stop.result is None:
            done = requeue_if_asked()
            stop.message += f"; {done}" if done else ""
            print(f"[graphtrainer] {stop.message}", file=sys.stderr, flush=True)  # for the job's log
        raise


def stop_run(ctx: Any, batches_done: int) -> None:
    """Every rank agreed to stop: rank 0 writes ``last.ckpt`` holding the position in the epoch
    (``batches_done`` of ``ctx.state.current_epoch``; 0: at the start of that epoch), then every
    rank raises :class:`~graphtrainer.Preempted`. Must be called on all processes."""
    state = ctx.state
    path = _checkpoint_path(ctx)
    save_checkpoint(ctx, ctx.task, path, extra={"batches_done_in_epoch": batches_done})
    where = (f"at epoch {state.current_epoch} after batch {batches_done - 1}" if batches_done else
             f"at the end of epoch {state.current_epoch - 1}")
    message = (f"fit stopped by {describe()} {where} (step {state.global_step}); checkpoint {path}. Resume with "
               f"fit(task, ckpt_path='last') (command line: --ckpt_path last); the process exits with status "
               f"{PREEMPTED_EXIT_CODE}")
    if state.rank == 0:
        done = requeue_if_asked()
        if done:
            message += f"; {done}"
        print(f"[graphtrainer] {message}", file=sys.stderr, flush=True)  # for the job's log and requeue scripts
    raise Preempted(message, str(path), result(ctx, with_weights=True))  # the caller's Trainer shows what ran


def _checkpoint_path(ctx: Any) -> Path:
    """Where ``ckpt_path="last"`` finds it: the next ``last.ckpt`` of the ModelCheckpoint that keeps one, else
    of the first (``last-v1.ckpt`` beside an earlier run's, as its version counter names it; rank 0 decides),
    else the run's. Collective."""
    owners = [cb for cb in ctx.callbacks if hasattr(cb, "last_model_path") and cb.dirpath]
    # The one that keeps last.ckpt: its file is replaced, not a last-v1.ckpt left beside it by another.
    owner = next((cb for cb in owners if getattr(cb, "save_last", False)), owners[0] if owners else None)
    if owner is not None and callable(getattr(owner, "next_last_path", None)):
        path = gdist.broadcast_object(owner.next_last_path() if ctx.state.rank == 0 else None)
        owner.last_model_path = path  # in the file's callback state: the resumed run writes this file again
        return Path(path)
    if owner is not None:
        return Path(owner.dirpath) / "last.ckpt"
    folder = ctx.state.log_dir / "checkpoints" if ctx.state.log_dir else Path("checkpoints")
    return Path(folder) / "last.ckpt"
