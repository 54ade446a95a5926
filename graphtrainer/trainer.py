"""``Trainer``: options, entry points, and handing the work to the right launcher."""
from __future__ import annotations

import datetime
import os
import sys
import warnings
from pathlib import Path
from typing import Any, Callable, Dict, List, Literal, Optional, Sequence, Union

import torch

from . import options
from .callbacks.base import Callback, check_callbacks
from .callbacks.checkpoint import ModelCheckpoint
from .callbacks.early_stopping import EarlyStopping
from .callbacks.progress import ProgressBar
from .callbacks.summary import ModelSummary
from .checkpoint.content import check_resumable_file, save_checkpoint
from .checkpoint.file import check_checkpoint_path
from .checkpoint.run_files import prepare_run_dir, remove_dead_partials, remove_if_unused, resolve_named
from .distdgl.cluster import check_options
from .distdgl.launcher import DistDGLLauncher, distgraph_options
from .errors import Preempted
from .launch import leftovers
from .launch.base import InProcess, Launcher
from .launch.environment import ExistingRanks, detect_external_launch
from .launch.lean import allocator_option
from .launch.local import LocalLauncher
from .loop import preemption
from .loop.ddp import check_ddp_kwargs
from .loop.loggers import absorb_logger_states, check_logger
from .loop.context import RankContext
from .loop.lightning_names import check_lightning_names, check_trainer_options
from .loop.runtime import run_rank
from .state import RunResult, RunState, RunView, TrainerConfig
from .nn.sparse_embedding import check_sparse_embeddings, check_sparse_training
from .task import GraphTask, check_task

LAUNCHERS = ("auto", "fork", "spawn", "forkserver")


class Trainer(RunView):
    """Runs a :class:`~graphtrainer.GraphTask` on one or many processes.

    ``Trainer(gpus=4)`` starts 4 ranks, one per GPU, over nccl; ``Trainer(num_procs=2)`` 2 CPU
    ranks over gloo; with neither, training runs in this process. Under torchrun or Slurm
    (``RANK``/``WORLD_SIZE`` or ``SLURM_PROCID``/``SLURM_NTASKS``) each process runs its own rank.

    Args:
        gpus: number of GPUs, or a list of device indices (one rank each). Repeating an
            index puts several ranks on one GPU; they then talk over gloo.
        num_procs: CPU ranks when ``gpus`` is not given (default 1: no launch).
        launcher: ``"auto"`` (fork on Linux, or forkserver with a warning once CUDA or
            autograd ran in this process; spawn elsewhere), ``"fork"`` (the graph shared
            copy-on-write), ``"forkserver"`` (ranks forked from a clean server that imported
            torch and dgl once; safe after CUDA use) or ``"spawn"``; the last two move the
            graph to shared memory and need the entry point under ``if __name__ == "__main__":``.
        max_epochs, max_steps: stop after either (``max_steps=-1``: no step limit; 0 trains no
            step, as in Lightning).
        limit_train_batches, limit_val_batches, limit_test_batches, limit_predict_batches:
            batches per epoch and rank, as a count (int) or a fraction (float <= 1.0).
        check_val_every_n_epoch: validation frequency.
        seed: seeds the model build, each epoch's id permutation and every rank's
            generators (per epoch, from ``(seed, rank, epoch)``).
        threads_per_proc: intra-op threads per rank (default: cores // ranks, at least 1; in
            this process and under torchrun or Slurm only when given). DGL samples with
            these threads; with several, only ``deterministic=True`` makes its sampling repeatable.
        progress_bar: show a tqdm bar on rank 0 (only when stderr is a terminal).
        default_root_dir: runs go to ``<default_root_dir>/version_<n>``.
        callbacks: extra :class:`~graphtrainer.callbacks.Callback` objects.
        logger: True for a CSV logger, False for none, or Lightning-style loggers
            (:mod:`graphtrainer.loop.loggers`) to use beside the CSV logger.
        gradient_clip_val: clip the gradients to this value: their global norm
            (``gradient_clip_algorithm="norm"``) or each element (``"value"``).
        accumulate_grad_batches: step the optimizer every this many batches; the
            batches in between skip DDP's all-reduce (``no_sync``).
        log_every_n_steps: step rows in ``metrics.csv`` every this many optimizer steps (at least 1).
        backend: force a ``torch.distributed`` backend (default nccl on GPU, gloo on CPU).
        hang_timeout: seconds a launched rank may make no progress (no batch, no hook entered)
            before a :class:`RankFailedError` names it, its hook, batch and Python stack (ranks
            waiting for it in a collective are not blamed). ``None``: no check; raise it for
            long hooks (``setup``, full-graph inference). Under torchrun or Slurm: ``timeout``.
        timeout: seconds (or a ``timedelta``) a collective may wait for its peers before
            the process group raises; default 10 minutes.
        detect_anomaly: stop at the first non-finite training loss (``FloatingPointError``
            naming rank, epoch, batch and step), backward under autograd's anomaly detection;
            without it, the first non-finite loss is warned about once.
        precision: ``"32"``, ``"bf16-mixed"`` (bfloat16 autocast of the forward passes, also on
            CPU) or ``"16-mixed"`` (float16 autocast, checkpointed gradient scaler; GPUs only).
        fast_dev_run: True (or n) runs 1 (or n) batches of training, validation, test and
            predict in one epoch, and writes nothing: no run folder, logs or checkpoints.
        val_check_interval: also validate every this many training batches (int) or fraction
            of the epoch (float), exactly; only where every rank still has batches.
        max_time: stop at the first epoch end after this much training (``"DD:HH:MM:SS"``,
            seconds, a ``timedelta`` or a dict such as ``{"hours": 12}``).
        min_epochs: no stop (``EarlyStopping``, ``should_stop``) before this many epochs.
        overfit_batches: train and validate on the same first batches (int, or float fraction)
            every epoch: a check that the model can fit a little data.
        enable_model_summary: print the model's parameter counts on rank 0 at the start of
            ``fit`` (a :class:`~graphtrainer.callbacks.ModelSummary` callback).
        profiler: ``"simple"`` prints after ``fit`` each rank's wall time per hook and per stage of a training
            step; ``"pytorch"`` writes a ``torch.profiler`` trace of a few of rank 0's steps to ``<log_dir>/profile/``.
        find_unused_parameters: let DDP find, after each forward, the parameters that got no
            gradient (when not all take part in every loss, e.g. relations a batch may lack),
            walking the autograd graph every step; DDP may warn once per rank that it "did not
            find any unused parameters" (:mod:`graphtrainer.loop.ddp`). Where every step uses
            the same parameters, ``ddp_kwargs={"static_graph": True}`` avoids both.
        ddp_kwargs: further ``DistributedDataParallel`` arguments (the trainer sets the module and devices
            itself), e.g. ``{"gradient_as_bucket_view": True, "static_graph": True}``.
        distributed_graph: a partition config (``parts/cora.json``, or its folder) made by
            ``python -m graphtrainer.cli.partition``: on each machine ``fit`` starts its graph
            servers and ``num_procs`` (or ``gpus``) ranks, whose ``task.graph`` is the
            ``DistGraph``. Not needed when ``task.graph`` is a
            :class:`~graphtrainer.distdgl.graph.PartitionedGraph`.
        ip_config: for several machines, DGL's ip_config file (``<address> [port]`` per
            machine, one partition each, the same file everywhere); else this machine alone.
        num_servers: graph servers per machine (more serve more ranks' sampling requests).
        machine_rank: which line of ``ip_config`` this machine is; by default
            ``$GRAPHTRAINER_MACHINE_RANK``, else Slurm's ``$SLURM_NODEID``, else the line
            holding one of this machine's addresses.
        block_type: how batches holding DGL graphs reach the device: ``"auto"`` (DGL graphs
            where DGL can move them, else :class:`graphtrainer.nn.TorchBlock`), ``"torch"`` or ``"dgl"``.
        sampling: where node and edge loaders sample: ``"auto"``, ``"device"`` (refusing what
            it cannot sample) or ``"cpu"`` (DGL); see :mod:`graphtrainer.data.device.mode`.
        prefetch_batches: with torch blocks on a GPU and the default transfer, copy each batch
            (pinned, side CUDA stream) one batch ahead, overlapping the step before it.
        allocator: each rank's glibc allocator (:mod:`graphtrainer.launch.lean`): ``"default"``
            (no cost), ``"lean"`` (about half a rank's private memory for 1.37x the epoch
            time) or ``"glibc"`` (untouched).
        deterministic: ``True``: every rank (and DGL sampling worker) runs torch's deterministic algorithms
            (an op without one raises; ``CUBLAS_WORKSPACE_CONFIG`` set if unset) and samples with DGL on
            the CPU repeatably at any thread count, at a cost (:mod:`graphtrainer.data.determinism`);
            ``"warn"``: the same, torch warning instead of raising; ``False`` (or None, Lightning's default): neither.
        pin_cpus: pin each rank this trainer launches to its own ``threads_per_proc`` cores of
            the launching process's affinity mask (wrapping round; sampling workers keep the
            whole mask; torchrun and Slurm ranks are left alone). See :mod:`graphtrainer.process.affinity`.
    """

    def __init__(
        self,
        gpus: Union[None, int, Sequence[int]] = None,
        num_procs: Optional[int] = None,
        launcher: str = "auto",
        max_epochs: int = 10,
        max_steps: int = -1,
        limit_train_batches: Union[None, int, float] = None,
        limit_val_batches: Union[None, int, float] = None,
        limit_test_batches: Union[None, int, float] = None,
        check_val_every_n_epoch: int = 1,
        seed: int = 0,
        threads_per_proc: Optional[int] = None,
        progress_bar: bool = True,
        default_root_dir: Union[str, os.PathLike] = "runs",
        callbacks: Optional[Sequence[Callback]] = None,
        logger: Any = True,
        gradient_clip_val: Optional[float] = None,
        accumulate_grad_batches: int = 1,
        log_every_n_steps: int = 50,
        backend: Optional[str] = None,
        hang_timeout: Optional[float] = 300.0,
        timeout: Union[None, float, datetime.timedelta] = None,
        detect_anomaly: bool = False,
        precision: Union[str, int] = "32",
        gradient_clip_algorithm: str = "norm",
        limit_predict_batches: Union[None, int, float] = None,
        fast_dev_run: Union[bool, int] = False,
        val_check_interval: Union[None, int, float] = None,
        max_time: Union[None, str, float, datetime.timedelta, Dict[str, int]] = None,
        min_epochs: int = 0,
        overfit_batches: Union[None, int, float] = None,
        enable_model_summary: bool = True,
        profiler: Optional[str] = None,
        find_unused_parameters: bool = False,
        ddp_kwargs: Optional[Dict[str, Any]] = None,
        distributed_graph: Union[None, str, os.PathLike] = None,
        ip_config: Union[None, str, os.PathLike] = None,
        num_servers: int = 1,
        machine_rank: Optional[int] = None,
        block_type: str = "auto",
        sampling: str = "auto",
        prefetch_batches: bool = True,
        allocator: str = "default",
        pin_cpus: bool = True,
        deterministic: Optional[Union[bool, Literal["warn"]]] = False,
        **lightning_options: Any,
    ):
        """Options: see the class docstring. Long because it takes and checks every option (as Lightning), and
        refuses Lightning's arguments graphtrainer does not take, naming its way."""
        check_trainer_options(lightning_options)
        if launcher not in LAUNCHERS:
            raise ValueError(f"launcher={launcher!r}: choose one of {LAUNCHERS}")
        options.max_steps(max_steps, max_epochs)
        options.at_least_one(check_val_every_n_epoch=options.check_val_every_n_epoch(check_val_every_n_epoch),
                             accumulate_grad_batches=accumulate_grad_batches, num_procs=num_procs,
                             threads_per_proc=threads_per_proc, log_every_n_steps=log_every_n_steps)
        if hang_timeout is not None and not hang_timeout > 0:
            raise ValueError(f"hang_timeout={hang_timeout!r}: give seconds > 0, or None to turn the check off")
        timeout = options.timeout(timeout)
        device_ids = options.gpus(gpus, num_procs)
        for name, value in (("limit_train_batches", limit_train_batches), ("limit_val_batches", limit_val_batches),
                            ("limit_test_batches", limit_test_batches),
                            ("limit_predict_batches", limit_predict_batches), ("overfit_batches", overfit_batches)):
            options.batch_count(name, value)
        if min_epochs < 0:
            raise ValueError(f"min_epochs={min_epochs}: must be >= 0")
        check_logger(logger)
        dev_batches = options.fast_dev_run(fast_dev_run)
        if dev_batches:  # a smoke run: n batches of everything, one epoch, nothing written
            max_epochs, max_steps, logger = 1, dev_batches, False
            limit_train_batches = limit_val_batches = limit_test_batches = limit_predict_batches = dev_batches
        if overfit_batches:
            limit_train_batches = limit_val_batches = overfit_batches
        #: Every option, checked, frozen.
        self.config = TrainerConfig(
            device_ids=tuple(device_ids), num_procs=len(device_ids) if device_ids else (num_procs or 1),
            launcher=launcher, max_epochs=max_epochs if max_epochs >= 1 else sys.maxsize, max_steps=max_steps,
            limit_train_batches=limit_train_batches, limit_val_batches=limit_val_batches,
            limit_test_batches=limit_test_batches, check_val_every_n_epoch=check_val_every_n_epoch, seed=seed,
            threads_per_proc=threads_per_proc, default_root_dir=Path(default_root_dir),
            gradient_clip_val=gradient_clip_val, accumulate_grad_batches=accumulate_grad_batches,
            log_every_n_steps=log_every_n_steps, backend=backend, hang_timeout=hang_timeout,
            timeout=timeout, detect_anomaly=detect_anomaly, logger=logger,
            precision=options.precision(precision, uses_gpu=bool(device_ids)),
            gradient_clip_algorithm=options.choice("gradient_clip_algorithm", gradient_clip_algorithm,
                                                   options.GRADIENT_CLIP_ALGORITHMS),
            limit_predict_batches=limit_predict_batches, fast_dev_run=dev_batches,
            val_check_interval=options.val_check_interval(val_check_interval),
            max_time=options.max_time(max_time), min_epochs=min_epochs, overfit_batches=overfit_batches,
            profiler=options.choice("profiler", profiler, options.PROFILERS),
            ddp_kwargs=check_ddp_kwargs(find_unused_parameters, ddp_kwargs),
            distgraph=None if distributed_graph is None else check_options(distributed_graph, ip_config, num_servers,
                                                                           machine_rank),
            block_type=options.block_type(block_type), sampling=options.sampling(sampling),
            prefetch_batches=bool(prefetch_batches),
            allocator=allocator_option(allocator), pin_cpus=options.flag("pin_cpus", pin_cpus),
            deterministic=options.deterministic(deterministic))
        self._dist_args = (ip_config, num_servers, machine_rank)  # for a task holding a PartitionedGraph
        self.callbacks: List[Callback] = list(callbacks or [])
        check_callbacks(self.callbacks)
        if progress_bar and not any(isinstance(c, ProgressBar) for c in self.callbacks):
            self.callbacks.append(ProgressBar())
        if enable_model_summary and not any(isinstance(c, ModelSummary) for c in self.callbacks):
            self.callbacks.insert(0, ModelSummary())
        #: The state of the current (or last) run; see :class:`~graphtrainer.state.RunState`.
        self.state = RunState()
        self._ran_task: Optional[GraphTask] = None  # the task of the last run in other processes

    @property
    def checkpoint_callbacks(self) -> List[ModelCheckpoint]:
        """The trainer's :class:`ModelCheckpoint` callbacks."""
        return [cb for cb in self.callbacks if isinstance(cb, ModelCheckpoint)]

    @property
    def checkpoint_callback(self) -> Optional[ModelCheckpoint]:
        """The first :class:`ModelCheckpoint` callback, or None."""
        found = self.checkpoint_callbacks
        return found[0] if found else None

    @property
    def active_callbacks(self) -> List[Callback]:
        """The callbacks that run: all but checkpointing and early stopping in a ``fast_dev_run``."""
        if not self.config.fast_dev_run:
            return self.callbacks
        return [cb for cb in self.callbacks if not isinstance(cb, (ModelCheckpoint, EarlyStopping))]

    # ---- entry points -----------------------------------------------------------------
    def fit(self, task: GraphTask, ckpt_path: Optional[str] = None) -> "Trainer":
        """Train ``task``; resume from ``ckpt_path`` ("last", "best" or a path) if given.

        Each call is a run of its own, in a new ``version_<n>`` folder, with callbacks afresh
        (best score, top-k, early-stopping counters); the weights carry over from a previous
        ``fit``, as in Lightning, unless resuming replaces them. Afterwards :attr:`history`
        holds one exactly reduced row per epoch and :attr:`log_dir` the run directory.
        """
        with preemption.before_ranks():  # a stop signal from here until a rank exists: Preempted at once
            # Before the reset: "best" may use this trainer's last run; "last" with none yet starts afresh.
            ckpt_path = check_resumable_file(self._resolve_ckpt(ckpt_path, fresh_if_none=True))  # before any rank
            self.state = RunState()
            for cb in self.callbacks:
                cb.reset()
            self._run(task, "fit", ckpt_path)
        return self

    def validate(self, task: GraphTask, ckpt_path: Optional[str] = None) -> Dict[str, float]:
        """Run ``validation_step`` over ``val_dataloader()`` on all ranks; exact reduced metrics."""
        return self._run(task, "validate", self._resolve_ckpt(ckpt_path)).metrics

    def test(self, task: GraphTask, ckpt_path: Optional[str] = None) -> Dict[str, float]:
        """Run ``test_step`` over ``test_dataloader()`` on all ranks; exact reduced metrics."""
        return self._run(task, "test", self._resolve_ckpt(ckpt_path)).metrics

    def predict(self, task: GraphTask, ckpt_path: Optional[str] = None) -> torch.Tensor:
        """``predict_step`` outputs for every id of ``predict_dataloader()``, once each, in the
        order the ids were given, whatever the number of ranks."""
        return self._run(task, "predict", self._resolve_ckpt(ckpt_path)).predictions

    def save_checkpoint(self, path: Union[str, os.PathLike], weights_only: bool = False) -> None:
        """Write a checkpoint of the running task (``weights_only``: only the model's weights, as
        Lightning's; such a file evaluates but cannot resume a fit). Must be called on all processes.
        After a fit whose ranks ran in other processes, this process holds rank 0's weights only, so
        only ``weights_only=True`` is taken there."""
        if self.state.task is None and (self._ran_task is None or not weights_only):
            raise RuntimeError("save_checkpoint(path) outside a run: after a fit in other processes, this process "
                               "holds the trained weights, not the optimizer and random states a resumable "
                               "checkpoint needs. Use save_checkpoint(path, weights_only=True) after fit (it "
                               "evaluates; fit cannot resume from it), ModelCheckpoint(save_last=True)'s "
                               "last_model_path, or call save_checkpoint from a hook or callback during fit")
        task = self.state.task if self.state.task is not None else self._ran_task
        save_checkpoint(self, task, path, weights_only=weights_only)

    # ---- launching ----------------------------------------------------------------------
    def _run(self, task: GraphTask, stage: str, ckpt_path: Optional[str]) -> RunResult:
        """Run ``stage`` through :meth:`_launcher`'s launcher; bring rank 0's result here."""
        check_task(task, stage)
        external = detect_external_launch()
        check_lightning_names(task, self.callbacks, warn=external is None or external.rank == 0)
        check_sparse_embeddings(task)
        if stage == "fit":
            check_sparse_training(task)
        launcher = self._launcher(task)
        ctx = self._context(task)
        ctx.run_dir_from_rank0 = launcher.run_dir_from_rank0

        def run() -> RunResult:
            if stage == "fit" and not self.config.fast_dev_run and launcher.makes_run_dir:
                own_folders = [cb.explicit_dirpath for cb in self.callbacks if getattr(cb, "explicit_dirpath", None)]
                remove_dead_partials(self.config.default_root_dir, own_folders)  # of writers killed outright
                with leftovers.stop_signals_held():  # recorded before a stop signal acts, so a preemption removes it
                    self.state.log_dir = prepare_run_dir(self.config.default_root_dir)  # an unwritable root fails here
            try:
                result = launcher.run(run_rank, (ctx, stage, ckpt_path))
            except Preempted as stop:  # still raised, but the trainer shows what ran (as Lightning's)
                if launcher.in_other_processes and stop.result is not None:
                    self._absorb(task, stop.result)
                raise
            if launcher.in_other_processes:
                self._absorb(task, result)
            return result

        return self._guarded(stage, run)

    def _launcher(self, task: GraphTask) -> Launcher:
        """One machine of a DistDGL run; this process's rank under torchrun or Slurm; one
        rank here; or ranks started here."""
        config = self.config
        distgraph = distgraph_options(config, task, self._dist_args)
        if distgraph is not None:
            return DistDGLLauncher(config, task, distgraph)
        external = detect_external_launch()
        if external is not None:
            if config.device_ids and len(config.device_ids) not in (1, external.world_size):
                warnings.warn(f"gpus={list(config.device_ids)} is ignored under {external.source}: each of its "
                              f"{external.world_size} ranks uses the GPU of its local rank", stacklevel=4)
            return ExistingRanks(external)
        if config.num_procs == 1:
            return InProcess()
        return LocalLauncher(config, task)

    def _context(self, task: GraphTask) -> RankContext:
        """What the ranks run with: the options, this run's state, the callbacks, the task."""
        return RankContext(self.config, self.state, self.callbacks, self.active_callbacks, task)

    def _guarded(self, stage: str, run: Callable[[], RunResult]) -> RunResult:
        """``run()``; a fit that fails before writing an epoch row or checkpoint removes its folder."""
        try:
            return run()
        except BaseException:
            if stage == "fit" and self.state.log_dir is not None and self.state.rank == 0:
                remove_if_unused(self.state.log_dir)
            raise

    def _absorb(self, task: GraphTask, result: RunResult) -> None:
        """Bring a launched run's outcome into this process."""
        self.state = result.state
        self._ran_task = task  # for save_checkpoint(path, weights_only=True) after the run
        task.trainer = self  # as Lightning's model.trainer: task.current_epoch/global_step read the run
        for cb in self.callbacks:
            if cb.state_key in result.callback_states:
                cb.load_state_dict(result.callback_states[cb.state_key])
        absorb_logger_states(self.config.logger, result.logger_states)  # e.g. MLflow's run_id
        if result.state_dict is not None:
            if task.module is None:
                task.model = task.configure_model()
            task.module.load_state_dict(result.state_dict)

    def _resolve_ckpt(self, ckpt_path: Optional[str], fresh_if_none: bool = False,
                      run_dir: Optional[str | os.PathLike] = None) -> Optional[str]:
        """The file that ``ckpt_path`` ("last", "best" or a path) names; says which on rank 0. ``fresh_if_none``
        (fit): "last" with no checkpoint yet means a fresh start, so one command line serves the first start and
        every restart after a preemption. ``run_dir``: "last"/"best" of that run folder, not of the newest run."""
        if ckpt_path not in ("best", "last"):
            if ckpt_path is not None:  # here, before any rank starts, not in every rank after loading data
                check_checkpoint_path(ckpt_path)
            return ckpt_path
        path, said = resolve_named(ckpt_path, self.checkpoint_callbacks, self.default_root_dir, fresh_if_none, run_dir)
        external = detect_external_launch()  # the process group may not exist yet: its rank says who prints
        if external is None or external.rank == 0:
            print(f"[graphtrainer] ckpt_path={ckpt_path!r}: {said}", flush=True)
        return path
