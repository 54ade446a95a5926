"""The Trainer's configuration, the state of a run, and what a run hands back.

:class:`TrainerConfig` is built once from ``Trainer.__init__``'s arguments. :class:`RunState`
is updated by the rank runtime and read by callbacks and tasks (``trainer.state`` or the
properties of :class:`RunView`); rank 0's copy comes back in a :class:`RunResult`.
"""
from __future__ import annotations

import dataclasses
import datetime
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Protocol, Sequence, Set, Tuple, Union

import torch

BatchLimit = Union[None, int, float]


class RunLogger(Protocol):
    """What a run's logger does (``graphtrainer.loop.loggers.Logger`` and any user logger):
    every method is called on every rank; only rank 0's instance writes."""

    def log_hyperparams(self, params: Dict[str, Any]) -> None: ...

    def log_metrics(self, metrics: Dict[str, float], step: int) -> None: ...

    def finalize(self, status: str) -> None: ...


class SectionTimer(Protocol):
    """A rank's profiler as the state holds it (``graphtrainer.loop.profiler.Profiler``)."""

    enabled: bool

    def section(self, name: str) -> Any: ...


class RankPrecision(Protocol):
    """A rank's precision as the state holds it (``graphtrainer.loop.precision.Precision``)."""

    name: str

    def state_dict(self) -> Optional[Dict[str, Any]]: ...

    def load_state_dict(self, state: Optional[Dict[str, Any]]) -> None: ...


class ScheduledLR(Protocol):
    """A scheduler with how it steps (``graphtrainer.loop.optim.SchedulerConfig``)."""

    scheduler: Any
    interval: str
    frequency: int
    monitor: Optional[str]


class DistGraphOptionsLike(Protocol):
    """A DistDGL run's options (``graphtrainer.distdgl.cluster.DistGraphOptions``)."""

    part_config: str


@dataclass(frozen=True)
class TrainerConfig:
    """Every option of a :class:`~graphtrainer.Trainer` (see its docstring), checked."""

    device_ids: Tuple[int, ...]
    num_procs: int
    launcher: str
    max_epochs: int
    max_steps: int
    limit_train_batches: BatchLimit
    limit_val_batches: BatchLimit
    limit_test_batches: BatchLimit
    check_val_every_n_epoch: int
    seed: int
    threads_per_proc: Optional[int]
    default_root_dir: Path
    gradient_clip_val: Optional[float]
    accumulate_grad_batches: int
    log_every_n_steps: int
    backend: Optional[str]
    hang_timeout: Optional[float]
    timeout: Optional[datetime.timedelta]
    detect_anomaly: bool
    #: ``True`` (CSV), ``False``, or extra loggers besides the CSV one.
    logger: Union[bool, RunLogger, Sequence[RunLogger]]
    precision: str = "32"
    gradient_clip_algorithm: str = "norm"
    limit_predict_batches: BatchLimit = None
    fast_dev_run: int = 0
    val_check_interval: BatchLimit = None
    max_time: Optional[float] = None
    min_epochs: int = 0
    overfit_batches: BatchLimit = None
    profiler: Optional[str] = None
    ddp_kwargs: Dict[str, Any] = field(default_factory=dict)
    #: A DistDGL run (``distributed_graph=``): the partition, ip_config, servers per machine.
    distgraph: Optional["DistGraphOptionsLike"] = None
    #: How batches holding DGL graphs reach the device: "auto", "torch" or "dgl".
    block_type: str = "auto"
    #: Where node and edge loaders sample: "auto", "device" or "cpu" (:mod:`graphtrainer.data.device.mode`).
    sampling: str = "auto"
    #: Copy the next batch (torch blocks, default transfer, GPU) while the current one runs.
    prefetch_batches: bool = True
    #: Each rank's allocator setting (:data:`graphtrainer.launch.lean.ALLOCATORS`).
    allocator: str = "default"
    #: Each launched rank on its own cores (:mod:`graphtrainer.process.affinity`).
    pin_cpus: bool = True
    #: False, True or "warn" (:mod:`graphtrainer.data.determinism`).
    deterministic: Union[bool, str] = False


@dataclass
class RunState:
    """Where a run stands, on one rank. Public fields, updated by the rank runtime only
    (except ``should_stop``, which callbacks may set to end training after this epoch)."""

    #: This rank, its index on its machine, the number of ranks, and its device.
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    #: True when the ranks run in processes the trainer started.
    launched: bool = False
    #: Counters and metrics: see the :class:`RunView` properties of the same names.
    current_epoch: int = 0
    global_step: int = 0
    history: List[Dict[str, float]] = field(default_factory=list)
    callback_metrics: Dict[str, float] = field(default_factory=dict)
    #: The names in ``callback_metrics`` produced this epoch (its training, validation and
    #: epoch-end logs): the epoch's history row holds only these, and monitors act on them only,
    #: never on a value an earlier epoch's validation left.
    epoch_metric_names: Set[str] = field(default_factory=set)
    should_stop: bool = False
    #: A stop decided the same on every rank (``EarlyStopping``'s broadcast decision): after a
    #: mid-epoch validation it ends the epoch there.
    stop_agreed: bool = False
    #: True from the end of an epoch's work until the next epoch starts: a checkpoint
    #: written then resumes at the next epoch.
    epoch_finished: bool = False
    #: Training batches of ``current_epoch`` done when ``max_steps`` or an agreed stop ended it
    #: early, or while callbacks act after a mid-epoch validation (0: none), and this rank's
    #: generator states then: a checkpoint written meanwhile resumes at the next batch, as after
    #: a preemption.
    batches_done_in_epoch: int = 0
    rng_at_stop: Optional[Dict[str, Any]] = None
    #: Whether validation ran this epoch (``check_val_every_n_epoch``), and whether the
    #: task has a validation loader at all.
    validated_this_epoch: bool = False
    has_val_loader: bool = False
    #: The global step of this fit's last validation (mid-epoch or at an epoch's end; None before
    #: the first), the same on every rank. A validation runs once per step: an epoch ending at the
    #: step a mid-epoch validation just measured keeps its values, and a callback acting after
    #: validations judges each once (:class:`~graphtrainer.callbacks.EarlyStopping`).
    last_validation_step: Optional[int] = None
    #: Training batches this rank runs this epoch (None when the loader has no length).
    num_training_batches: Optional[int] = None
    #: The last training loss (detached).
    last_loss: Optional[torch.Tensor] = None
    optimizers: List[torch.optim.Optimizer] = field(default_factory=list)
    lr_schedulers: List[ScheduledLR] = field(default_factory=list)
    #: The run's folder (``fit`` only) and its logger (rank 0 only).
    log_dir: Optional[Path] = None
    logger: Optional[RunLogger] = None
    #: The task being run on this rank (what ``trainer.save_checkpoint`` saves).
    task: Any = None  # a GraphTask (task.py imports this module, so it is not named here)
    #: This rank's :class:`~graphtrainer.loop.precision.Precision` and
    #: :class:`~graphtrainer.loop.profiler.Profiler` during a run.
    precision: Optional[RankPrecision] = None
    profiler: Optional[SectionTimer] = None
    #: With ``profiler="simple"``: seconds per stage and hook of the last ``fit``, per rank.
    profile: Optional[List[Dict[str, float]]] = None

    def for_caller(self) -> "RunState":
        """A copy without what only lives in the rank (optimizers, logger, tensors)."""
        return dataclasses.replace(self, device=torch.device("cpu"), last_loss=None, optimizers=[],
                                   lr_schedulers=[], logger=None, task=None, precision=None, profiler=None,
                                   rng_at_stop=None,
                                   history=list(self.history),
                                   callback_metrics=dict(self.callback_metrics),
                                   epoch_metric_names=set(self.epoch_metric_names))

    def add_epoch_metrics(self, metrics: Dict[str, float]) -> None:
        """Values produced this epoch, into ``callback_metrics``."""
        self.callback_metrics.update(metrics)
        self.epoch_metric_names.update(metrics)

    def epoch_metrics(self) -> Dict[str, float]:
        """The values of ``callback_metrics`` produced this epoch."""
        return {k: v for k, v in self.callback_metrics.items() if k in self.epoch_metric_names}


@dataclass
class RunResult:
    """What rank 0 hands back to the caller of ``fit``/``validate``/``test``/``predict``."""

    state: RunState
    #: ``{callback.state_key: callback.state_dict()}`` at the end of the run.
    callback_states: Dict[str, Any]
    #: The trained weights, when the ranks ran in other processes (``fit`` only).
    state_dict: Optional[Dict[str, torch.Tensor]] = None
    #: The stage's reduced metrics (evaluation stages).
    metrics: Dict[str, float] = field(default_factory=dict)
    #: ``predict`` outputs, one row per id in the order given.
    predictions: Optional[torch.Tensor] = None
    #: Rank 0's logger states (``fit``), for the caller's logger objects (an MLflow ``run_id``).
    logger_states: Optional[Dict[str, Any]] = None


def callback_states(callbacks: Sequence[Any]) -> Dict[str, Any]:
    return {cb.state_key: cb.state_dict() for cb in callbacks}


class RunView:
    """A run as tasks and callbacks read it (their ``trainer``): the ``Trainer`` in the
    calling process, :class:`~graphtrainer.loop.context.RankContext` in each rank. Both
    hold ``config``, ``state`` and ``callbacks``; the properties read them."""

    config: TrainerConfig
    state: RunState
    callbacks: List[Any]

    def save_checkpoint(self, path: Union[str, os.PathLike], weights_only: bool = False) -> None:
        """Write a checkpoint of the running task (``weights_only``: only the model's weights, as
        Lightning's; such a file evaluates but cannot resume a fit). Must be called on all processes."""
        raise NotImplementedError

    @property
    def current_epoch(self) -> int:
        """The epoch running (0-based); after ``fit``, the epochs completed."""
        return self.state.current_epoch

    @property
    def global_step(self) -> int:
        """Optimizer steps taken."""
        return self.state.global_step

    @property
    def history(self) -> List[Dict[str, float]]:
        """One row of exactly reduced metrics per finished epoch of the last ``fit``."""
        return self.state.history

    @property
    def callback_metrics(self) -> Dict[str, float]:
        """The latest reduced value of every logged metric."""
        return self.state.callback_metrics

    @property
    def should_stop(self) -> bool:
        """Set it to True (on any rank) to stop training after this epoch."""
        return self.state.should_stop

    @should_stop.setter
    def should_stop(self, value: bool) -> None:
        self.state.should_stop = bool(value)

    @property
    def log_dir(self) -> Optional[Path]:
        """The folder of the last ``fit`` run (``<default_root_dir>/version_<n>``)."""
        return self.state.log_dir

    @property
    def rank(self) -> int:
        return self.state.rank

    @property
    def global_rank(self) -> int:
        """The rank (Lightning's name)."""
        return self.state.rank

    @property
    def local_rank(self) -> int:
        """The rank's number on its machine."""
        return self.state.local_rank

    @property
    def is_global_zero(self) -> bool:
        """True on rank 0 (Lightning's name)."""
        return self.state.rank == 0

    @property
    def world_size(self) -> int:
        return self.state.world_size

    @property
    def device(self) -> torch.device:
        return self.state.device

    @property
    def optimizers(self) -> List[torch.optim.Optimizer]:
        return self.state.optimizers

    @property
    def lr_schedulers(self) -> List[ScheduledLR]:
        return self.state.lr_schedulers

    @property
    def logger(self) -> Optional[RunLogger]:
        """This rank's logger during a ``fit`` (None off rank 0 or with ``logger=False``)."""
        return self.state.logger

    @property
    def num_training_batches(self) -> Optional[int]:
        return self.state.num_training_batches

    @property
    def last_loss(self) -> Optional[torch.Tensor]:
        return self.state.last_loss

    # A few options users read often (all are in :attr:`config`).
    @property
    def seed(self) -> int:
        return self.config.seed

    @property
    def num_procs(self) -> int:
        return self.config.num_procs

    @property
    def max_epochs(self) -> int:
        return self.config.max_epochs

    @property
    def default_root_dir(self) -> Path:
        return self.config.default_root_dir

    @property
    def threads_per_proc(self) -> Optional[int]:
        return self.config.threads_per_proc
