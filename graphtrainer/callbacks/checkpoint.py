"""``ModelCheckpoint``: save at epoch ends, after validations or every n optimizer steps; keep the best ``k``,
optionally ``last.ckpt``."""
from __future__ import annotations

import math
import os
import warnings
from pathlib import Path
from typing import Any, Dict, List, Literal, Mapping, Optional, Set, Tuple, Union

from .. import comm as gdist
from .._moved import metric_key
from ..checkpoint.content import save_checkpoint
from ..checkpoint.file import link_or_copy
from ..state import RunView
from ..task import GraphTask
from .base import Callback, acts_at_epoch_end, acts_mid_epoch, monitored_now, per_step_only
from .checkpoint_names import format_checkpoint_name, free_checkpoint_path


class ModelCheckpoint(Callback):
    """Checkpoint the run every ``every_n_epochs`` epochs, or every ``every_n_train_steps`` optimizer steps.

    With ``monitor``, keep the ``save_top_k`` best files by that reduced metric (``mode``
    "min" or "max"; a non-finite value is never best); without it, the most recent.
    ``save_top_k=-1`` keeps all, ``0`` none (with ``save_last`` only ``last.ckpt``).
    ``filename`` is formatted with ``epoch`` (0-based, as the checkpoint's ``"epoch"``),
    ``step`` and the logged metrics as ``name=value`` (``"{epoch}-{val_loss:.4f}"`` gives
    ``epoch=3-val_loss=0.4120.ckpt``), or as the value alone with
    ``auto_insert_metric_name=False`` (``"{epoch}"`` gives ``3.ckpt``); a ``/`` becomes ``_``; a field
    never logged is written as 0 with a warning, as Lightning's. A name
    that is already a file gets ``-v1``, ``-v2``, ... (``last.ckpt``: ``last-v1.ckpt``), except the file
    this save replaces (the newest without ``monitor``, the dropped k-th best with it), as Lightning's
    ``enable_version_counter``; False overwrites. ``dirpath`` defaults to the run's own
    ``<log_dir>/checkpoints``. A ``monitor`` never logged raises a ``KeyError`` naming the
    metrics that exist, at the first epoch end where it should be (as Lightning); an old
    name (``val_hits@20``) monitors its new one with a ``DeprecationWarning``. ``verbose=True``: rank 0
    prints what each save point wrote, kept or removed.

    ``save_weights_only=True`` writes only the model's weights and counters: such a file
    evaluates (``validate``/``test``/``predict``) but ``fit(ckpt_path=...)`` refuses it before any rank
    starts. ``save_last``:
    True writes ``last.ckpt`` at every save point; ``"link"`` makes it a relative symbolic link to the
    newest checkpoint this fit saved (a copy where links cannot be made, or before any), as Lightning's.

    Each ``fit`` starts with no best file and no top-k. Resuming from a checkpoint written into this
    same ``dirpath`` restores them; from another folder (an earlier run's own ``checkpoints``, another
    ``dirpath``) only :attr:`best_model_path` is restored, with a warning (as Lightning), so another
    run's files are never ranked or deleted.
    Rank 0 decides what to save and delete and broadcasts it; saving is collective. After
    ``fit``, :attr:`best_model_path`, :attr:`best_model_score` and :attr:`last_model_path`
    are set on the caller's side too.

    When it acts follows Lightning's ``save_on_train_epoch_end``: None (default) saves after
    each validation when ``val_check_interval`` validates mid-epoch (then also after the
    epoch's own validation), else at epoch ends; False after each validation only; True at epoch
    ends only. A checkpoint written after a mid-epoch validation resumes exactly at the next
    batch; with ``accumulate_grad_batches`` > 1 only validations at optimizer-step boundaries
    count (a checkpoint then would lose the partial accumulation).

    ``every_n_train_steps=N`` (Lightning's) saves instead each time ``global_step`` reaches a multiple
    of N, after that step's batch (and after a validation at that batch), and never at epoch ends
    otherwise; it excludes ``every_n_epochs`` (leave it None), as in Lightning. Every rank takes the
    same steps, so they agree without a collective. A checkpoint written so resumes exactly at the next
    batch. A save due at an epoch's last batch is written at that epoch's end (after its validation, so
    the file resumes at the next epoch), and so is one due after a batch some rank lacks (an epoch in
    ``Join``: uneven or unknown batch counts). With ``monitor`` a step save ranks on
    ``trainer.callback_metrics`` as they are then (as Lightning: the last validation's values, the
    last finished epoch's training means); before the monitored value is first logged the save waits
    until it is (a validation or the epoch's end), and raises the ``KeyError`` above if it is still
    missing at an epoch's end. ``train_time_interval`` is refused, and so is ``save_on_exception=True``
    (one rank's exception leaves the others unable to join a collective save: use ``save_last`` with
    ``every_n_train_steps``, or preemption's ``last.ckpt``). As Lightning's, it writes each global step
    once: a second save point at the same step (the epoch's end after an early stop or ``max_steps``
    right after a mid-epoch validation, which keeps that validation's values) saves neither a top-k
    file nor ``last.ckpt``.
    """

    after_reduction = True
    saves_checkpoints = True

    def __init__(self, dirpath: Optional[str | os.PathLike] = None, filename: Optional[str] = "{epoch}-{step}",
                 monitor: Optional[str] = None, mode: str = "min", save_top_k: int = 1,
                 save_last: Optional[Union[bool, Literal["link"]]] = False, every_n_epochs: Optional[int] = None,
                 save_on_train_epoch_end: Optional[bool] = None, every_n_train_steps: Optional[int] = None,
                 train_time_interval: Any = None, save_weights_only: bool = False,
                 auto_insert_metric_name: bool = True, enable_version_counter: bool = True, verbose: bool = False,
                 save_on_exception: bool = False):
        per_step_only("ModelCheckpoint", train_time_interval=train_time_interval)
        if mode not in ("min", "max"):
            raise ValueError(f"mode={mode!r}: use 'min' or 'max'")
        if save_top_k < -1:
            raise ValueError(f"save_top_k={save_top_k}: use -1 (all), 0 (none) or a positive count")
        if not (save_last is None or isinstance(save_last, bool) or save_last == "link"):
            raise ValueError(f"save_last={save_last!r}: use True (last.ckpt, a copy), 'link' (last.ckpt, a link to "
                             "the newest checkpoint) or False")
        if save_on_exception:
            raise ValueError("ModelCheckpoint(save_on_exception=True): when one rank raises, the others cannot "
                             "join the collective save (and its state may be mid-step), so graphtrainer does not "
                             "save on exceptions. Bound the lost work with every_n_train_steps=N and "
                             "save_last=True; a stop signal (SIGTERM, SIGUSR1) writes last.ckpt and resumes exactly")
        #: The folder given by the user, or None for the run's own ``checkpoints`` folder.
        self.explicit_dirpath = Path(dirpath) if dirpath is not None else None
        self.filename = filename or "{epoch}-{step}"  # None: Lightning's default
        self.monitor = monitor
        self.mode = mode
        self.save_top_k = save_top_k
        self.save_last = save_last
        #: Epochs between saves (0: none at epoch ends), steps between saves (0: none at steps).
        self.every_n_epochs, self.every_n_train_steps = _triggers(every_n_epochs, every_n_train_steps)
        self.save_on_train_epoch_end = save_on_train_epoch_end
        self.save_weights_only = save_weights_only
        self.auto_insert_metric_name = auto_insert_metric_name
        self.enable_version_counter = enable_version_counter
        self.verbose = verbose
        self.save_on_exception = False  # Lightning's attribute (True is refused above)
        self._warns = True  # False on ranks other than 0 (set in setup): one warning per run
        self.reset()

    def reset(self) -> None:
        #: Where this run's checkpoints go (known once the run has a folder).
        self.dirpath: Optional[Path] = self.explicit_dirpath
        self.best_k_models: Dict[str, float] = {}
        self.best_model_path = ""
        self.best_model_score: Optional[float] = None
        self.last_model_path = ""
        self._saved_order: List[str] = []
        # The fit's own record, never in state_dict (as Lightning's): a resumed fit has saved nothing yet.
        self._last_global_step_saved: Optional[int] = None
        self._newest_saved = ""  # the file save_last="link" points last.ckpt at
        self._next_step_save = self.every_n_train_steps  # the step the next step save is due at
        self._unlogged_fields: Set[str] = set()  # filename fields warned about (once each)

    def setup(self, trainer: RunView, task: GraphTask, stage: str) -> None:
        self._warns = trainer.rank == 0
        if stage == "fit" and self.dirpath is None:
            self.dirpath = Path(trainer.log_dir or trainer.default_root_dir) / "checkpoints"

    def on_train_start(self, trainer: RunView, task: GraphTask) -> None:
        self._schedule_after(trainer.global_step)  # a resumed fit: the next multiple after its step

    @property
    def state_key(self) -> str:
        every = f",every_n_epochs={self.every_n_epochs}" if self.every_n_epochs != 1 else ""  # 1: earlier files' key
        if self.every_n_train_steps:
            every += f",every_n_train_steps={self.every_n_train_steps}"
        return f"ModelCheckpoint{{monitor={self.monitor},mode={self.mode}{every}}}"

    def state_dict(self) -> Dict[str, Any]:
        return {"best_k_models": dict(self.best_k_models), "best_model_path": self.best_model_path,
                "best_model_score": self.best_model_score, "last_model_path": self.last_model_path,
                "saved_order": list(self._saved_order),
                "dirpath": str(self.dirpath) if self.dirpath else None}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        saved = state.get("dirpath")
        if self.dirpath is None and saved:
            self.dirpath = Path(saved)  # the caller's side taking in its run's result
        if saved is not None and self.dirpath is not None and Path(saved) != self.dirpath:
            # Another folder's files are not this run's to rank or delete; its best file is still worth
            # knowing (as Lightning, which restores best_model_path alone and says so).
            if self._warns:
                warnings.warn(f"ModelCheckpoint: the checkpoint was written into {saved}, not this run's dirpath "
                              f"{self.dirpath}: only best_model_path is restored (best_model_score, "
                              "best_k_models and last_model_path start afresh). Pass ModelCheckpoint(dirpath=...) "
                              "the same folder to restore them all", UserWarning, stacklevel=2)
            self.best_model_path = state.get("best_model_path", "")
            return
        self.best_k_models = dict(state.get("best_k_models", {}))
        self.best_model_path = state.get("best_model_path", "")
        self.best_model_score = state.get("best_model_score")
        self.last_model_path = state.get("last_model_path", "")
        self._saved_order = list(state.get("saved_order", []))

    def on_train_epoch_end(self, trainer: RunView, task: GraphTask) -> None:
        if self.every_n_train_steps:
            if self.step_save_due(trainer.global_step):  # due at the last batch, or after one some rank lacked
                self._save_step(trainer, task, at_epoch_end=True)
        elif acts_at_epoch_end(trainer, self.save_on_train_epoch_end):
            self._save(trainer, task)

    def on_mid_epoch_validation_end(self, trainer: RunView, task: GraphTask) -> None:
        if not self.every_n_train_steps and acts_mid_epoch(trainer, self.save_on_train_epoch_end):
            self._save(trainer, task)

    def step_save_due(self, global_step: int) -> bool:
        """Whether ``every_n_train_steps`` asks for a save at ``global_step`` (a multiple of it was reached
        and not saved yet). The same on every rank: the loop asks after each optimizer step."""
        return bool(self.every_n_train_steps) and global_step >= self._next_step_save

    def save_at_step(self, trainer: RunView, task: GraphTask) -> None:
        """The save :meth:`step_save_due` asked for, between training batches (the checkpoint resumes at
        the next batch). Collective; the loop calls it on every rank at the same batch."""
        self._save_step(trainer, task, at_epoch_end=False)

    def _schedule_after(self, step: int) -> None:
        if self.every_n_train_steps:
            self._next_step_save = (step // self.every_n_train_steps + 1) * self.every_n_train_steps

    def _save_step(self, trainer: RunView, task: GraphTask, at_epoch_end: bool) -> None:
        monitored = None
        if self.monitor:
            metrics, state = trainer.callback_metrics, trainer.state
            monitored = metric_key(self.monitor, metrics, "ModelCheckpoint(monitor=...)")
            if monitored not in metrics:
                if at_epoch_end and (state.validated_this_epoch or not state.has_val_loader):
                    raise KeyError(f"ModelCheckpoint monitors {self.monitor!r}, which was not logged by the end of "
                                   f"epoch {trainer.current_epoch}; logged metrics: {sorted(metrics)}")
                return  # not logged yet: saved once it is (after a validation or the epoch's end)
        if self._last_global_step_saved != trainer.global_step:
            self._write(trainer, task, monitored)
        self._schedule_after(trainer.global_step)

    def _save(self, trainer: RunView, task: GraphTask) -> None:
        if not self.every_n_epochs or (trainer.current_epoch + 1) % self.every_n_epochs != 0:
            return
        if self._last_global_step_saved == trainer.global_step:
            return  # this step's files are written (the epoch's end after a stop right after a validation)
        monitored = monitored_now(trainer, self.monitor, "ModelCheckpoint") if self.monitor else None
        if self.monitor and monitored is None:
            return  # not measured this epoch (no validation): neither saved nor ranked
        self._write(trainer, task, monitored)

    def _write(self, trainer: RunView, task: GraphTask, monitored: Optional[str]) -> None:
        """Rank 0's decision, broadcast; the files written, linked and deleted. Collective."""
        decision = gdist.broadcast_object(self._decide(trainer, monitored) if trainer.rank == 0 else None)
        self.load_state_dict(decision["state"])  # before saving: the file holds the state that includes it
        if decision["save"]:
            save_checkpoint(trainer, task, decision["save"], weights_only=self.save_weights_only)
            self._newest_saved = decision["save"]
        if self.save_last:
            self._save_last(trainer, task, decision["last"])
        saved = decision["save"] or self.save_last
        if saved:
            self._last_global_step_saved = trainer.global_step
        if saved and trainer.rank == 0 and callable(getattr(trainer.logger, "after_save_checkpoint", None)):
            trainer.logger.after_save_checkpoint(self)
        if trainer.rank == 0:
            for path in decision["delete"]:
                try:
                    os.remove(path)
                except FileNotFoundError:
                    pass
            if self.verbose:
                self._say(trainer, decision)

    def _say(self, trainer: RunView, decision: Mapping[str, Any]) -> None:
        """``verbose``: what this save point did, on rank 0 (as Lightning's ``verbose``)."""
        said = []
        score, top = decision["score"], "all" if self.save_top_k < 0 else str(self.save_top_k)
        if self.monitor and score is not None and self.save_top_k != 0:
            best = self.best_model_score
            said.append(f"{self.monitor!r} reached {score:.5g} (best {best:.5g}), saved {decision['save']} as top "
                        f"{top}" if decision["save"] else f"{self.monitor!r} was {score:.5g}, not in top {top}")
        elif decision["save"]:
            said.append(f"saved {decision['save']}")
        if self.save_last:
            said.append(f"last: {decision['last']}")
        if decision["delete"]:
            said.append(f"removed {', '.join(os.path.basename(p) for p in decision['delete'])}")
        if said:
            print(f"[graphtrainer] ModelCheckpoint: epoch {trainer.current_epoch}, step {trainer.global_step}: "
                  f"{'; '.join(said)}", flush=True)

    def _save_last(self, trainer: RunView, task: GraphTask, path: str) -> None:
        if self.save_last == "link" and self._newest_saved and self.save_top_k != 0:
            if trainer.rank == 0 and os.path.abspath(self._newest_saved) != os.path.abspath(path):
                link_or_copy(self._newest_saved, path)
            gdist.barrier()
        else:
            save_checkpoint(trainer, task, path, weights_only=self.save_weights_only)

    def _decide(self, trainer: RunView, monitored: Optional[str]) -> Dict[str, Any]:
        metrics = trainer.callback_metrics
        score = metrics.get(monitored) if monitored else None
        values = self._values(trainer)
        save: Optional[str] = None
        delete: List[str] = []
        best_k, order = dict(self.best_k_models), list(self._saved_order)
        if self.save_top_k != 0:
            if self.monitor is None:
                # As Lightning: the newest file is the one a repeated name replaces.
                save = self._free_path(values, replaces=order[-1] if order else None)
                order = [p for p in order if p != save] + [save]  # a name written again is one file
                if self.save_top_k > 0:
                    delete, order = order[:-self.save_top_k], order[-self.save_top_k:]
                best_k = {p: float("nan") for p in order}
            elif score is not None and math.isfinite(score):
                full = 0 < self.save_top_k <= len(best_k)
                if not full or self._better(score, self._worst(best_k)):
                    save = self._free_path(values, replaces=self._worst_path(best_k) if full else None)
                    best_k[save] = score
                    if 0 < self.save_top_k < len(best_k):
                        worst = self._worst_path(best_k)
                        delete.append(worst)
                        del best_k[worst]
        delete = [p for p in delete if p != save]
        state = self.state_dict()
        state["best_k_models"] = best_k
        state["saved_order"] = order
        if best_k:
            if self.monitor is None:
                state["best_model_path"], state["best_model_score"] = order[-1], None
            else:
                best = min(best_k, key=best_k.get) if self.mode == "min" else max(best_k, key=best_k.get)
                state["best_model_path"], state["best_model_score"] = best, best_k[best]
        last = self._free_path({}, replaces=self.last_model_path or None, filename="last") if self.save_last else ""
        if self.save_last:
            state["last_model_path"] = last
        return {"save": save, "delete": delete, "state": state, "last": last, "score": score}

    def _better(self, score: float, than: float) -> bool:
        return score < than if self.mode == "min" else score > than

    def _worst(self, best_k: Dict[str, float]) -> float:
        return max(best_k.values()) if self.mode == "min" else min(best_k.values())

    def _worst_path(self, best_k: Dict[str, float]) -> str:
        return max(best_k, key=best_k.get) if self.mode == "min" else min(best_k, key=best_k.get)

    def next_last_path(self) -> str:
        """Where ``last.ckpt`` goes next: this run's :attr:`last_model_path` once it has one, else
        ``last.ckpt`` or, with the version counter, the first ``last-v<n>.ckpt`` not yet in :attr:`dirpath`.
        Reads this process's file system: rank 0 decides."""
        return self._free_path({}, replaces=self.last_model_path or None, filename="last")

    def _values(self, trainer: RunView) -> Dict[str, Any]:
        return {"epoch": trainer.current_epoch, "step": trainer.global_step, **trainer.callback_metrics}

    def _free_path(self, values: Mapping[str, Any], replaces: Optional[str], filename: Optional[str] = None) -> str:
        """The formatted path, versioned past files that exist (unless it is ``replaces``, the file this save
        replaces, or the counter is off)."""
        return free_checkpoint_path(lambda ver: self.format_checkpoint_name(values, filename, ver=ver), replaces,
                                    self.enable_version_counter)

    def format_checkpoint_name(self, metrics: Mapping[str, Any], filename: Optional[str] = None,
                               ver: Optional[int] = None) -> str:
        """``filename`` (default: this callback's) formatted with ``metrics`` (``epoch``, ``step`` and logged
        values), ``-v<ver>`` appended when given, and ``.ckpt``; inside :attr:`dirpath` once known.
        ``{name}`` becomes ``name=value``, or ``value`` with ``auto_insert_metric_name=False``; a ``/``
        becomes ``_``. A field not in ``metrics`` is written as 0 (as Lightning), with a warning naming it
        and those that are, once per field and fit."""
        return format_checkpoint_name(filename or self.filename, metrics, self.auto_insert_metric_name, self.dirpath,
                                      ver, self._unlogged_fields)


def _triggers(every_n_epochs: Optional[int], every_n_train_steps: Optional[int]) -> Tuple[int, int]:
    """``(every_n_epochs, every_n_train_steps)`` as Lightning resolves them: neither set saves every epoch;
    steps set, epochs unset saves at steps only; both set (each at least 1) is refused."""
    for name, value in (("every_n_epochs", every_n_epochs), ("every_n_train_steps", every_n_train_steps)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise ValueError(f"ModelCheckpoint({name}={value!r}): use None or a count of at least 0 (0: never)")
    if every_n_train_steps and every_n_epochs:
        raise ValueError(f"ModelCheckpoint(every_n_train_steps={every_n_train_steps}, every_n_epochs="
                         f"{every_n_epochs}): use one, as Lightning's ModelCheckpoint takes them mutually exclusive "
                         "(leave every_n_epochs unset to save every n steps only); for both, use two ModelCheckpoint "
                         "callbacks")
    if every_n_epochs is None:
        every_n_epochs = 0 if every_n_train_steps else 1
    return every_n_epochs, every_n_train_steps or 0
