"""The rank runtime: what one rank runs for one stage, from its process group to its result.

``Trainer`` validates options and launches; everything a rank does lives here and in
:mod:`~graphtrainer.loop.fit` and :mod:`~graphtrainer.loop.evaluate`. All control decisions
that could differ between ranks (stop training, which checkpoint is best) are reduced or
broadcast, so every rank runs the same epochs and reaches every collective.
"""
from __future__ import annotations

import contextlib
import traceback
from pathlib import Path
from typing import Optional, Protocol, Tuple

import torch

from .. import comm as gdist
from ..process.parent import die_with_parent
from .._compat.dgl_2_1_streams import warn_if_dgl_stream_moved
from ..checkpoint.run_files import prepare_run_dir
from ..data.determinism import deterministic
from ..launch import external_failures, stop_flag
from ..launch.lean import apply_allocator
from ..launch.threads import set_threads
from ..state import RunResult, TrainerConfig
from .context import RankContext
from .evaluate import run_evaluation
from .fit import run_fit
from .hooks import call_hook
from .loggers import make_logger, trainer_settings
from .precision import Precision
from .profiler import Profiler
from .seeding import seed_all
from .stages import EVALUATION


class RankSession(Protocol):
    """Steps a launcher adds around a rank's run (a DistDGL rank joins its graph servers)."""

    def before_group(self, info: gdist.RankInfo) -> None:
        """Before the process group is made."""

    def attach(self, ctx: RankContext) -> None:
        """Once the rank knows its identity, before the stage runs."""

    def after_success(self) -> None:
        """After the stage succeeded (not after a failure: peers may be gone)."""


def run_rank(info: gdist.RankInfo, ctx: RankContext, stage: str, ckpt_path: Optional[str],
             session: Optional[RankSession] = None) -> RunResult:
    """Entry point of one rank for ``stage`` ("fit", "validate", "test" or "predict"), under
    ``Trainer(deterministic=...)``'s settings (set before the rank touches its device)."""
    with deterministic(ctx.config.deterministic):
        return _run_rank(info, ctx, stage, ckpt_path, session)


def _run_rank(info: gdist.RankInfo, ctx: RankContext, stage: str, ckpt_path: Optional[str],
              session: Optional[RankSession]) -> RunResult:
    config = ctx.config
    if stage != "fit":
        stop_flag.release()  # a launched rank kept a stop signal for a fit: here it ends the rank
    if info.source == "torchrun":
        die_with_parent()  # as launched ranks do: no rank trains on once torchrun's agent is gone
    if info.source != "launcher" and config.threads_per_proc:
        set_threads(config.threads_per_proc)  # launched ranks get theirs from the launcher
    device, backend = device_and_backend(config, info)
    _use_device(device)
    if session is not None:
        session.before_group(info)
    gdist.init_process_group(info, backend, config.timeout)
    external = info.source in ("torchrun", "slurm")  # no launcher of ours watches this rank
    if external:
        external_failures.announce(info.rank)
    state = ctx.state
    state.rank, state.world_size, state.device = info.rank, info.world_size, device
    state.launched = info.source == "launcher"
    apply_allocator(config.allocator, launched=state.launched)
    state.local_rank = info.local_rank
    state.precision = Precision(config.precision, device)
    state.profiler = Profiler(config.profiler == "simple" and stage == "fit")
    _attach(ctx, stage)
    if session is not None:
        session.attach(ctx)
    # No launcher of ours relays signals to an external rank: it routes them itself.
    with stop_flag.routed() if external else contextlib.nullcontext():
        result = _run_stage(ctx, stage, ckpt_path, info, external)
    if state.logger is not None:
        state.logger.finalize("success")
    if session is not None:
        session.after_success()
    # The group is not torn down: a launched rank exits right after reporting (closing its
    # sockets), and tearing down first can block in gloo once a peer has exited; under
    # torchrun the group stays up for the process's next fit/test call.
    return result


def _run_stage(ctx: RankContext, stage: str, ckpt_path: Optional[str], info: gdist.RankInfo,
               external: bool) -> RunResult:
    """The stage itself; a failure goes to the hooks and the logger and, in an external rank
    that lost a peer, is replaced by the error naming that peer."""
    config, state = ctx.config, ctx.state
    hang_watch = external_failures.HangWatch(info.rank, config.hang_timeout if external else None)
    try:
        # The device sampler draws from torch's generator, never DGL's streams.
        warn_if_dgl_stream_moved(info.rank, bool(config.deterministic) and config.sampling != "device")
        seed_all(config.seed)  # model build; evaluation's samplers (fit reseeds every epoch)
        if stage == "fit":
            result = run_fit(ctx, ckpt_path)
        else:
            result = run_evaluation(ctx, EVALUATION[stage], ckpt_path)
    except BaseException as err:
        stop_flag.hold()  # a stop signal from here on waits for the report below
        call_hook(ctx, "on_exception", err, task_too=False)
        if state.logger is not None:
            state.logger.finalize("failed")
        blamed = external_failures.attribute(err, info.rank, info.world_size, traceback.format_exc()) \
            if external else None
        if blamed is not None:
            raise blamed from None  # the peer that caused it, not this rank's lost connection
        raise  # no teardown of the group: peers may be stuck in a collective
    finally:
        hang_watch.stop()
    return result


def device_and_backend(config: TrainerConfig, info: gdist.RankInfo) -> Tuple[torch.device, str]:
    """This rank's device and its process group's backend."""
    if not config.device_ids:
        return torch.device("cpu"), config.backend or "gloo"
    if info.source in ("torchrun", "slurm"):
        index = _external_device_index(config, info)
        shared_gpu = False
    else:
        index = config.device_ids[info.local_rank]
        shared_gpu = len(set(config.device_ids)) < len(config.device_ids)
    # nccl refuses two ranks on one device; gloo handles it.
    backend = config.backend or ("gloo" if shared_gpu else "nccl")
    return torch.device("cuda", index), backend


def _external_device_index(config: TrainerConfig, info: gdist.RankInfo) -> int:
    """The GPU of a rank that torchrun or Slurm started: the listed device of its local
    rank, else its local rank; device 0 when the rank sees just one GPU (Slurm's
    ``--gpus-per-task=1`` or a per-rank ``CUDA_VISIBLE_DEVICES``)."""
    visible = torch.cuda.device_count()
    if visible == 1:
        index = 0
    elif len(config.device_ids) > 1 and info.local_rank < len(config.device_ids):
        index = config.device_ids[info.local_rank]
    else:
        index = info.local_rank
    if index >= visible:
        raise RuntimeError(f"rank {info.rank} (local rank {info.local_rank}, started by {info.source}) "
                           f"needs GPU {index} but sees {visible}: start one process per visible GPU, "
                           "or give each process one GPU (CUDA_VISIBLE_DEVICES, --gpus-per-task=1)")
    return index


def _use_device(device: torch.device) -> None:
    if device.type != "cuda":
        return
    try:
        torch.cuda.set_device(device)  # before any other CUDA work, so nccl uses this GPU
    except RuntimeError as err:
        if "forked subprocess" not in str(err):
            raise
        raise RuntimeError("this rank was forked from a process that had already used CUDA, so it "
                           "cannot use the GPU: use launcher='spawn', or keep CUDA calls out of the "
                           "code before fit") from err


def _attach(ctx: RankContext, stage: str) -> None:
    """Bind this rank's identity and logging to the task; for ``fit``, the run folder and
    logger (collective where the ranks learn the folder from rank 0, see
    :attr:`RankContext.run_dir_from_rank0`; rank 0 makes it when no launcher did)."""
    state, task = ctx.state, ctx.task
    state.task = task
    task.trainer, task.rank, task.world_size, task.device = ctx, state.rank, state.world_size, state.device
    task.local_rank = state.local_rank
    task.step_log = ctx.step_log
    if stage != "fit" or ctx.config.fast_dev_run:  # a smoke run writes nothing
        return
    if state.log_dir is None or ctx.run_dir_from_rank0:  # rank 0 has or numbers the run, the others learn it
        made = str(state.log_dir or prepare_run_dir(ctx.config.default_root_dir)) if state.rank == 0 else None
        state.log_dir = Path(gdist.broadcast_object(made))
    state.logger = make_logger(ctx.config.logger, state.log_dir, state.rank)
    if state.logger is not None:
        state.logger.log_hyperparams(dict(getattr(task, "hparams", {})), trainer_settings(ctx.config))
