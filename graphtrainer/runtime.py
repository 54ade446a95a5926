"""The rank runtime: what one rank runs for one stage, from its process group to its result.

``Trainer`` validates options and launches; everything a rank does lives here and in
:mod:`~graphtrainer.fit_loop` and :mod:`~graphtrainer.eval_loop`. All control decisions
that could differ between ranks (stop training, which checkpoint is best) are reduced or
broadcast, so every rank runs the same epochs and reaches every collective.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Optional, Tuple

import torch

from . import dist_graph, heartbeat
from . import distributed as gdist
from . import formats
from .eval_loop import run_evaluation
from .fit_loop import run_fit
from .lean import apply_allocator
from .loggers import make_logger
from .precision import Precision
from .profiler import Profiler
from .rank import call_hook
from .run_files import prepare_run_dir
from .seeding import seed_all, warn_if_dgl_stream_moved
from .stages import EVALUATION
from .state import RunResult, RunState, TrainerConfig
from .threads import set_threads

if TYPE_CHECKING:
    from .dist_cluster import Cluster
    from .task import GraphTask
    from .trainer import Trainer


def run_rank(info: gdist.RankInfo, trainer: "Trainer", task: "GraphTask", stage: str,
             ckpt_path: Optional[str], cluster: Optional["Cluster"] = None) -> RunResult:
    """Entry point of one rank for ``stage`` ("fit", "validate", "test" or "predict");
    with ``cluster``, a rank of a DistDGL run."""
    config = trainer.config
    if info.source != "launcher" and config.threads_per_proc:
        set_threads(config.threads_per_proc)  # launched ranks get theirs from the launcher
    device, backend = device_and_backend(config, info)
    _use_device(device)
    if cluster is not None:
        with heartbeat.waiting("graph servers"):
            dist_graph.connect(cluster, info.local_rank)  # before the process group, as DGL requires
    gdist.init_process_group(info, backend, config.timeout)
    state = trainer.state
    state.rank, state.world_size, state.device = info.rank, info.world_size, device
    state.launched = info.source == "launcher"
    apply_allocator(config.allocator, launched=state.launched)
    formats.launched_from_prepared_graph = state.launched
    state.local_rank = info.local_rank
    state.precision = Precision(config.precision, device)
    state.profiler = Profiler(config.profiler == "simple" and stage == "fit")
    _attach(trainer, task, state, stage, shared_log_dir=cluster is not None)
    if cluster is not None:
        task.graph = dist_graph.open_graph(cluster)
    try:
        warn_if_dgl_stream_moved(info.rank)
        seed_all(config.seed)  # model build; evaluation's samplers (fit reseeds every epoch)
        if stage == "fit":
            result = run_fit(trainer, task, ckpt_path)
        else:
            result = run_evaluation(trainer, task, EVALUATION[stage], ckpt_path)
    except BaseException as err:
        call_hook(trainer, task, "on_exception", err, task_too=False)
        if state.logger is not None:
            state.logger.finalize("failed")
        raise  # no teardown of the group: peers may be stuck in a collective
    if state.logger is not None:
        state.logger.finalize("success")
    if cluster is not None:
        with heartbeat.waiting("graph servers"):
            dist_graph.disconnect()  # every rank, after success only: DGL's client barrier
    # The group is not torn down: a launched rank exits right after reporting (closing its
    # sockets), and tearing down first can block in gloo once a peer has exited; under
    # torchrun the group stays up for the process's next fit/test call.
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


def _attach(trainer: "Trainer", task: "GraphTask", state: RunState, stage: str,
            shared_log_dir: bool = False) -> None:
    """Bind this rank's identity to the task; for ``fit``, the run folder and logger
    (collective under torchrun/Slurm, where rank 0 numbers the run, and over several
    machines, where rank 0's launcher made it: ``shared_log_dir``)."""
    state.task = task
    task.trainer, task.rank, task.world_size, task.device = trainer, state.rank, state.world_size, state.device
    task.local_rank = state.local_rank
    if stage != "fit" or trainer.config.fast_dev_run:  # a smoke run writes nothing
        return
    if state.log_dir is None or shared_log_dir:  # rank 0 has or numbers the run, the others learn it
        made = str(state.log_dir or prepare_run_dir(trainer.config.default_root_dir)) if state.rank == 0 else None
        state.log_dir = Path(gdist.broadcast_object(made))
    state.logger = make_logger(trainer.config.logger, state.log_dir, state.rank)
    if state.logger is not None:
        state.logger.log_hyperparams(dict(getattr(task, "hparams", {})))
