"""``Trainer``: options, entry points, and handing the work to the right launcher."""
from __future__ import annotations

import datetime
import os
import shutil
import sys
import warnings
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Union

import torch

from . import distributed as gdist
from .callbacks.base import Callback
from .callbacks.progress import ProgressBar
from .launch import FORK_FALLBACK, check_main_guard, fork_blocker, launch
from .loop import run_rank
from .run_files import find_checkpoint, remove_if_unused
from .threads import available_cores

LAUNCHERS = ("auto", "fork", "spawn", "forkserver")


class Trainer:
    """Runs a :class:`~graphtrainer.GraphTask` on one or many processes.

    ``Trainer(gpus=4)`` starts 4 ranks, one per GPU, over nccl; ``Trainer(num_procs=2)``
    starts 2 CPU ranks over gloo; with neither, training runs in this process. Under
    torchrun or Slurm (``RANK``/``WORLD_SIZE`` or ``SLURM_PROCID``/``SLURM_NTASKS`` set) the
    ranks already exist: nothing is launched and each process runs its own rank.

    Args:
        gpus: number of GPUs, or a list of device indices (one rank each). Repeating an
            index puts several ranks on one GPU; they then talk over gloo.
        num_procs: CPU ranks when ``gpus`` is not given (default 1: no launch).
        launcher: ``"fork"`` (default on Linux: the graph is shared copy-on-write),
            ``"spawn"`` (graph and features moved to shared memory once),
            ``"forkserver"`` (ranks forked from a clean server that imported torch and
            dgl once; the graph in shared memory as with spawn; safe after CUDA use), or
            ``"auto"`` (fork, or forkserver where fork is unsafe).
        max_epochs, max_steps: stop after either (``max_steps=-1``: no step limit).
        limit_train_batches, limit_val_batches, limit_test_batches: batches per epoch and
            rank, as a count (int) or a fraction (float <= 1.0).
        check_val_every_n_epoch: validation frequency.
        seed: seeds the model build, each epoch's id permutation and every rank's
            generators (per epoch, from ``(seed, rank, epoch)``).
        threads_per_proc: intra-op threads per rank (default: cores // ranks, at least 1). In
            this process (one rank) and under torchrun or Slurm it applies when given;
            otherwise the process's setting stands (torchrun sets ``OMP_NUM_THREADS=1``
            when it starts several processes per node). DGL samples with these threads,
            and its multi-threaded sampling is not repeatable: one thread is.
        progress_bar: show a tqdm bar on rank 0 (only when stderr is a terminal).
        default_root_dir: runs go to ``<default_root_dir>/version_<n>``.
        callbacks: extra :class:`~graphtrainer.callbacks.Callback` objects.
        logger: True for a CSV logger, False for none, or a logger object.
        gradient_clip_val: clip the global gradient norm to this value.
        accumulate_grad_batches: step the optimizer every this many batches; the
            batches in between skip DDP's all-reduce (``no_sync``).
        log_every_n_steps: step rows in ``metrics.csv``.
        backend: force a ``torch.distributed`` backend (default nccl on GPU, gloo on CPU).
        hang_timeout: seconds a launched rank may make no progress (no batch fetched or
            stepped, no hook entered) before the run is ended with a :class:`RankFailedError`
            naming it, the hook and batch it was in, and its Python stack. Ranks waiting
            for it in a collective are not blamed. ``None`` turns the check off; raise it
            for hooks that legitimately run longer (a long ``setup``, a full-graph
            inference in ``on_validation_epoch_end``). Under torchrun or Slurm nothing
            watches the ranks from outside: ``timeout`` applies there.
        timeout: seconds (or a ``timedelta``) a collective may wait for its peers before
            the process group raises; default 10 minutes.
        detect_anomaly: stop at the first non-finite training loss (``FloatingPointError``
            naming rank, epoch, batch and step) and run backward under autograd's anomaly
            detection. Without it, the first non-finite loss of a run is reported once as
            a warning and training goes on.
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
    ):
        if launcher not in LAUNCHERS:
            raise ValueError(f"launcher={launcher!r}: choose one of {LAUNCHERS}")
        if max_epochs < 1 and max_steps <= 0:
            raise ValueError("max_epochs must be at least 1 (or set max_steps)")
        if check_val_every_n_epoch < 1:
            raise ValueError("check_val_every_n_epoch must be at least 1")
        if accumulate_grad_batches < 1:
            raise ValueError("accumulate_grad_batches must be at least 1")
        if num_procs is not None and num_procs < 1:
            raise ValueError(f"num_procs must be at least 1, got {num_procs}")
        if threads_per_proc is not None and threads_per_proc < 1:
            raise ValueError(f"threads_per_proc must be at least 1, got {threads_per_proc}")
        if hang_timeout is not None and not hang_timeout > 0:
            raise ValueError(f"hang_timeout={hang_timeout!r}: give seconds > 0, or None to turn the check off")
        if timeout is not None:
            seconds = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else timeout
            if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not seconds > 0:
                raise ValueError(f"timeout={timeout!r}: give seconds > 0 or a datetime.timedelta")
            timeout = datetime.timedelta(seconds=seconds)
        self.device_ids = self._parse_gpus(gpus, num_procs)
        self.num_procs = len(self.device_ids) if self.device_ids else (num_procs or 1)
        self.launcher = launcher
        self.max_epochs = max_epochs if max_epochs >= 1 else sys.maxsize
        self.max_steps = max_steps
        self.limit_train_batches = limit_train_batches
        self.limit_val_batches = limit_val_batches
        self.limit_test_batches = limit_test_batches
        self.check_val_every_n_epoch = check_val_every_n_epoch
        self.seed = seed
        self.threads_per_proc = threads_per_proc
        self.default_root_dir = Path(default_root_dir)
        self.gradient_clip_val = gradient_clip_val
        self.accumulate_grad_batches = accumulate_grad_batches
        self.log_every_n_steps = max(1, log_every_n_steps)
        self.backend = backend
        self.hang_timeout = hang_timeout
        self.timeout: Optional[datetime.timedelta] = timeout
        self.detect_anomaly = detect_anomaly
        self.callbacks: List[Callback] = list(callbacks or [])
        if progress_bar and not any(isinstance(c, ProgressBar) for c in self.callbacks):
            self.callbacks.append(ProgressBar())
        self._logger_option = logger
        self.logger: Any = None

        # Run state: in each rank during a run; copied back to the caller after it.
        self.rank = 0
        self.world_size = 1
        self.device = torch.device("cpu")
        self.current_epoch = 0
        self.global_step = 0
        self.history: List[Dict[str, float]] = []
        self.callback_metrics: Dict[str, float] = {}
        self.should_stop = False
        self.num_training_batches: Optional[int] = None
        self.last_loss: Optional[torch.Tensor] = None
        self.optimizers: List[torch.optim.Optimizer] = []
        self.lr_schedulers: List[Any] = []
        self.log_dir: Optional[Path] = None
        self._launched = False
        self._epoch_finished = False
        self._validated_this_epoch = False
        self._has_val_loader = False
        self._after_epoch: Optional[Callable[[Any, Any], None]] = None
        self._first_nonfinite: Optional[torch.Tensor] = None
        self._nonfinite_reported = False

    # ---- entry points -----------------------------------------------------------------
    def fit(self, task: Any, ckpt_path: Optional[str] = None) -> "Trainer":
        """Train ``task``; resume from ``ckpt_path`` ("last", "best" or a path) if given.

        Each call is a run of its own: it writes under a new ``version_<n>`` folder (never
        into the folder of the run it resumes from) and its callbacks start afresh (best
        score and path, top-k, early-stopping counters). The model's weights carry over
        from a previous ``fit`` of the same task, as in Lightning; resuming replaces them.

        After it returns, :attr:`history` holds one row of exactly reduced metrics per
        epoch, :attr:`log_dir` the run directory, and ``task.model`` the trained weights.
        """
        ckpt_path = self._resolve_ckpt(ckpt_path)  # before the reset: "best" may use this trainer's last run
        self._reset_run_state()
        self._absorb(task, self._run(task, "fit", ckpt_path))
        return self

    def validate(self, task: Any, ckpt_path: Optional[str] = None) -> Dict[str, float]:
        """Run ``validation_step`` over ``val_dataloader()`` on all ranks; exact reduced metrics."""
        return self._absorb(task, self._run(task, "validate", self._resolve_ckpt(ckpt_path)))["metrics"]

    def test(self, task: Any, ckpt_path: Optional[str] = None) -> Dict[str, float]:
        """Run ``test_step`` over ``test_dataloader()`` on all ranks; exact reduced metrics."""
        return self._absorb(task, self._run(task, "test", self._resolve_ckpt(ckpt_path)))["metrics"]

    def predict(self, task: Any, ckpt_path: Optional[str] = None) -> torch.Tensor:
        """``predict_step`` outputs for every id of ``predict_dataloader()``, once each, in the
        order the ids were given, whatever the number of ranks."""
        return self._absorb(task, self._run(task, "predict", self._resolve_ckpt(ckpt_path)))["predictions"]

    def save_checkpoint(self, path: Union[str, os.PathLike]) -> None:
        """Write a checkpoint of the running task. Must be called on all processes."""
        from .checkpoint import save_checkpoint

        save_checkpoint(self, self._task, path)

    # ---- launching ----------------------------------------------------------------------
    def _run(self, task: Any, stage: str, ckpt_path: Optional[str]) -> Dict[str, Any]:
        from .preflight import check_task, prepare_graphs, prepare_run_dir

        check_task(task, stage)
        external = gdist.detect_external_launch()
        if external is not None:
            if self.device_ids and len(self.device_ids) not in (1, external.world_size):
                warnings.warn(f"gpus={self.device_ids} is ignored under {external.source}: each of its "
                              f"{external.world_size} ranks uses the GPU of its local rank", stacklevel=3)
            self._launched = False
            if stage == "fit":
                self.log_dir = None
            return self._removing_unused_run_dir(stage, lambda: run_rank(external, self, task, stage, ckpt_path))
        if stage == "fit":
            # Made here, before any process starts, so an unwritable root fails early.
            self.log_dir = prepare_run_dir(self.default_root_dir)
        if self.num_procs == 1:
            self._launched = False
            return self._removing_unused_run_dir(stage, lambda: run_rank(gdist.RankInfo(), self, task, stage,
                                                                          ckpt_path))

        def launched() -> Dict[str, Any]:
            method = self._launch_method()
            prepare_graphs(task, method)
            self._launched = True
            threads = self.threads_per_proc or max(1, available_cores() // self.num_procs)
            return launch(run_rank, (self, task, stage, ckpt_path), self.num_procs, method, threads,
                          self.hang_timeout)

        return self._removing_unused_run_dir(stage, launched)

    def _removing_unused_run_dir(self, stage: str, run: Callable[[], Dict[str, Any]]) -> Dict[str, Any]:
        """``run()``; if a fit fails before anything worth keeping was written (no epoch row, no
        checkpoint), its run folder goes too, so failed starts leave no empty ``version_<n>``."""
        try:
            return run()
        except BaseException:
            if stage == "fit" and self.log_dir is not None and self.rank == 0:
                remove_if_unused(self.log_dir)
            raise

    def _launch_method(self) -> str:
        method = self.launcher
        if method == "auto":
            method = "fork" if sys.platform.startswith("linux") else "spawn"
        blocker = fork_blocker(uses_gpu=bool(self.device_ids)) if method == "fork" else None
        if blocker is not None:
            if self.launcher == "fork":
                raise RuntimeError(f"launcher='fork': {blocker}. Keep CUDA calls and training out of the "
                                   "code before fit (torch.cuda.device_count() is safe), or use "
                                   "launcher='forkserver'")
            warnings.warn(f"{blocker}: launching with {FORK_FALLBACK} instead of fork", stacklevel=4)
            method = FORK_FALLBACK
        if method in ("spawn", "forkserver"):
            check_main_guard(method)
        return method

    @staticmethod
    def _parse_gpus(gpus: Union[None, int, Sequence[int]], num_procs: Optional[int]) -> List[int]:
        if gpus is None or gpus == 0:
            return []
        if isinstance(gpus, bool) or not isinstance(gpus, (int, list, tuple)):
            raise ValueError(f"gpus={gpus!r}: give a number of GPUs or a list of device indices")
        ids = list(range(gpus)) if isinstance(gpus, int) else [int(g) for g in gpus]
        if any(i < 0 for i in ids):
            raise ValueError(f"gpus={gpus!r}: device indices must be >= 0")
        if num_procs is not None and num_procs != len(ids):
            raise ValueError(f"gpus={gpus!r} and num_procs={num_procs} disagree: with GPUs there is one rank "
                             "per listed device; drop num_procs")
        if gdist.detect_external_launch() is not None:
            return ids  # checked per rank against the local rank's device
        available = torch.cuda.device_count()  # NVML-based: unlike is_available(), safe before a fork
        if available == 0:
            raise ValueError(f"gpus={gpus!r} but no CUDA device is available: train on CPU processes "
                             f"with Trainer(num_procs={len(ids)}) instead")
        if max(ids) >= available:
            raise ValueError(f"gpus={gpus!r} asks for device {max(ids)} but only {available} CUDA "
                             "device(s) are visible")
        return ids

    def _device_and_backend(self, info: gdist.RankInfo) -> tuple:
        if not self.device_ids:
            return torch.device("cpu"), self.backend or "gloo"
        if info.source in ("torchrun", "slurm"):
            index = self._external_device_index(info)
            shared_gpu = False
        else:
            index = self.device_ids[info.local_rank]
            shared_gpu = len(set(self.device_ids)) < len(self.device_ids)
        # nccl refuses two ranks on one device; gloo handles it.
        backend = self.backend or ("gloo" if shared_gpu else "nccl")
        return torch.device("cuda", index), backend

    def _external_device_index(self, info: gdist.RankInfo) -> int:
        """The GPU of a rank that torchrun or Slurm started: the listed device of its local
        rank, else its local rank; device 0 when the rank sees just one GPU (Slurm's
        ``--gpus-per-task=1`` or a per-rank ``CUDA_VISIBLE_DEVICES``)."""
        visible = torch.cuda.device_count()
        if visible == 1:
            index = 0
        elif len(self.device_ids) > 1 and info.local_rank < len(self.device_ids):
            index = self.device_ids[info.local_rank]
        else:
            index = info.local_rank
        if index >= visible:
            raise RuntimeError(f"rank {info.rank} (local rank {info.local_rank}, started by {info.source}) "
                               f"needs GPU {index} but sees {visible}: start one process per visible GPU, "
                               "or give each process one GPU (CUDA_VISIBLE_DEVICES, --gpus-per-task=1)")
        return index

    # ---- per-rank state ---------------------------------------------------------------
    def _attach(self, info: gdist.RankInfo, device: torch.device, task: Any, stage: str) -> None:
        """Bind this rank's identity to the trainer and task; open the logger (collective)."""
        from .loggers import make_logger
        from .preflight import prepare_run_dir

        self.rank, self.world_size, self.device = info.rank, info.world_size, device
        self._task = task
        task.trainer, task.rank, task.world_size, task.device = self, info.rank, info.world_size, device
        if stage != "fit":
            return
        if self.log_dir is None:  # external launch: rank 0 numbers the run, the others learn it
            made = str(prepare_run_dir(self.default_root_dir)) if self.rank == 0 else None
            self.log_dir = Path(gdist.broadcast_object(made))
        self.logger = make_logger(self._logger_option, self.log_dir, self.rank)
        if self.logger is not None:
            self.logger.log_hyperparams(dict(getattr(task, "hparams", {})))

    def _resolve_ckpt(self, ckpt_path: Optional[str]) -> Optional[str]:
        """The file that ``ckpt_path`` ("last", "best" or a path) names; says which on rank 0."""
        if ckpt_path not in ("best", "last"):
            return ckpt_path
        from .callbacks.checkpoint import ModelCheckpoint

        ckpts = [c for c in self.callbacks if isinstance(c, ModelCheckpoint)]
        if not ckpts:
            raise ValueError(f"ckpt_path={ckpt_path!r} needs a ModelCheckpoint callback in this trainer "
                             "(none is configured): add one, or pass a file path")
        path = find_checkpoint(ckpt_path, ckpts[0], self.default_root_dir)
        if gdist.detect_external_launch() is None or gdist.get_rank() == 0:
            print(f"[graphtrainer] ckpt_path={ckpt_path!r}: using {path}", flush=True)
        return path
    def _reset_run_state(self) -> None:
        self.current_epoch, self.global_step = 0, 0
        self.history, self.callback_metrics = [], {}
        self.should_stop = False
        self._first_nonfinite, self._nonfinite_reported = None, False
        for cb in self.callbacks:
            cb.reset()

    def _result(self, task: Any, include_state: bool) -> Dict[str, Any]:
        """What rank 0 sends back to the caller."""
        out: Dict[str, Any] = {
            "history": list(self.history),
            "callback_metrics": dict(self.callback_metrics),
            "current_epoch": self.current_epoch,
            "global_step": self.global_step,
            "log_dir": str(self.log_dir) if self.log_dir else None,
            "callback_states": {cb.state_key: cb.state_dict() for cb in self.callbacks},
        }
        if include_state and self._launched:
            out["state_dict"] = {k: v.detach().cpu() for k, v in task.module.state_dict().items()}
        return out

    def _absorb(self, task: Any, result: Dict[str, Any]) -> Dict[str, Any]:
        """Bring a launched run's outcome into this process (a no-op for in-process runs)."""
        if not self._launched:
            return result
        self.history = result["history"]
        self.callback_metrics = result["callback_metrics"]
        self.current_epoch, self.global_step = result["current_epoch"], result["global_step"]
        if result.get("log_dir"):
            self.log_dir = Path(result["log_dir"])
        for cb in self.callbacks:
            if cb.state_key in result["callback_states"]:
                cb.load_state_dict(result["callback_states"][cb.state_key])
        if "state_dict" in result:
            if task.module is None:
                task.model = task.configure_model()
            task.module.load_state_dict(result["state_dict"])
        return result
