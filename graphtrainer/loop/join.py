"""Epochs whose ranks have different numbers of batches: ``Join`` while they train, then the
optimizer state of the rank that stepped longest for the others."""
from __future__ import annotations

import contextlib
import sys
from typing import Any, Callable, ContextManager, Iterator, Optional

import torch
from torch.distributed.algorithms.join import Join
from torch.nn.parallel import DistributedDataParallel as DDP

from .. import comm as gdist
from .. import heartbeat
from ..checkpoint.content import _to_cpu
from ..state import RunState


class UnevenInputs:
    """Ranks with different batch counts in an epoch: ``Join`` while they train, then the
    state of the rank that stepped longest for the others.

    ``Join`` costs two extra all-reduces per step, so it is entered only when the ranks'
    batch counts differ or cannot be trusted (agreed at the previous epoch's end:
    :class:`~graphtrainer.loop.stopping.StopController`). Only DDP's own all-reduce may run
    inside it: metrics are reduced after it.
    """

    def __init__(self, ddp: Optional[DDP], state: RunState):
        self.ddp, self.state = ddp, state

    @contextlib.contextmanager
    def epoch(self, joining: bool, section: Callable[[str], ContextManager[Any]]) -> Iterator[None]:
        """The epoch's training, inside ``Join`` when ``joining``; leaving it waits for the
        ranks with more batches (timed as ``section("join")``). Collective."""
        if not joining:
            yield
            return
        join = Join([self.ddp])
        join.__enter__()
        try:
            yield
        except BaseException:
            join.__exit__(*sys.exc_info())  # Join re-raises without waiting for the others
            raise
        heartbeat.waiting_from_now("Join (uneven inputs)")
        with section("join"):
            join.__exit__(None, None, None)
            self._sync_after_join()

    def _sync_after_join(self) -> None:
        """Give ranks that ran out of batches early the optimizer and scheduler state, and the
        step count, of the ranks that stepped longest. Collective.

        DDP's join hook re-syncs only the parameters; without this, an early rank's stale
        momentum or learning rate makes its parameters drift from the next step on.
        """
        state = self.state
        steps = gdist.all_gather_tensor(torch.tensor([state.global_step])).tolist()
        if len(set(steps)) == 1:
            return
        # The rank DDP took the final parameters from: the highest of those still running last.
        src = max(range(len(steps)), key=lambda r: (steps[r], r))
        payload = None
        if state.rank == src:
            payload = (_to_cpu([opt.state_dict() for opt in state.optimizers]),
                       [cfg.scheduler.state_dict() for cfg in state.lr_schedulers])
        opt_states, sched_states = gdist.broadcast_object(payload, src=src)
        if state.rank != src:
            for opt, opt_state in zip(state.optimizers, opt_states):
                opt.load_state_dict(opt_state)
            for cfg, sched_state in zip(state.lr_schedulers, sched_states):
                cfg.scheduler.load_state_dict(sched_state)
        state.global_step = steps[src]
