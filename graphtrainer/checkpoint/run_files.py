"""Finding a run's files on disk (``ckpt_path="last"``/``"best"``), and removing a run
folder that a failed start left with nothing in it."""
from __future__ import annotations

import csv
import errno
import os
import re
import shutil
import sys
from pathlib import Path
from typing import Any, Iterable, List, Optional, Tuple

from .content import read_checkpoint
from .file import remove_stale_partials

_VERSION = re.compile(r"^version_(\d+)$")
_LAST = re.compile(r"^last(-v\d+)?\.ckpt$")
#: What a fit writes into its folder before its first epoch ends (config.yaml: the CLI writes it).
_START_FILES = {"hparams.yaml", "metrics.csv", "config.yaml"}


def prepare_run_dir(root: Path) -> Path:
    """Create and return ``root/version_<n>`` with the next free ``n``; clear error if unwritable."""
    root = Path(root)
    try:
        root.mkdir(parents=True, exist_ok=True)
        if not os.access(root, os.W_OK | os.X_OK):
            raise PermissionError(errno.EACCES, "not writable", str(root))
        taken = [int(p.name.split("_", 1)[1]) for p in root.glob("version_*")
                 if p.name.split("_", 1)[1].isdigit()]
        n = max(taken, default=-1) + 1
        while True:
            path = root / f"version_{n}"
            try:
                path.mkdir()
                return path
            except FileExistsError:
                n += 1
    except OSError as err:
        raise PermissionError(f"default_root_dir {root} cannot be written ({err.strerror or err}): "
                              "pass Trainer(default_root_dir=...) a writable directory") from err


def remove_dead_partials(root: Path, folders: Iterable[Path] = ()) -> List[str]:
    """Remove the partial checkpoint files (``.<name>.tmp-<host>-<pid>``) that writers killed
    outright left in ``root``'s runs and in ``folders``, saying what was removed."""
    removed: List[str] = []
    for folder in [d / "checkpoints" for d in run_dirs(Path(root))] + [Path(f) for f in folders]:
        if folder.is_dir():
            removed += remove_stale_partials(folder)
    if removed:
        print(f"[graphtrainer] removed partial checkpoint files of writers that no longer run: {', '.join(removed)}",
              file=sys.stderr, flush=True)
    return removed


def run_dirs(root: Path) -> List[Path]:
    """``root/version_<n>`` folders, newest (highest ``n``) first."""
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if p.is_dir() and (m := _VERSION.match(p.name))]
    return [p for _, p in sorted(found, reverse=True)]


def find_checkpoint(which: str, callback: Any, root: str | os.PathLike, missing_ok: bool = False,
                    run_dir: Optional[str | os.PathLike] = None) -> Optional[str]:
    """The file ``ckpt_path="last"`` or ``"best"`` means for ``callback`` (a ModelCheckpoint);
    None when there is none and ``missing_ok`` (a ``ValueError`` otherwise).

    This trainer's last fit answers first, else (a fresh process) the callback's explicit
    ``dirpath``, or the run folder ``run_dir`` when given, or the newest run under ``root`` with
    checkpoints. "last" is its newest ``last.ckpt`` (or ``last-v<n>.ckpt``, the version counter's) or else its
    newest checkpoint (``save_last=False``);
    "best" is read from the ModelCheckpoint state in its newest checkpoint.
    """
    known = callback.best_model_path if which == "best" else callback.last_model_path
    if known and Path(known).is_file():
        return str(known)
    folders = ([Path(callback.explicit_dirpath)] if callback.explicit_dirpath is not None
               else [Path(run_dir) / "checkpoints"] if run_dir is not None
               else [d / "checkpoints" for d in run_dirs(Path(root))])
    for folder in folders:
        path = _last_in(folder) if which == "last" else _best_in(folder, callback.state_key)
        if path is not None:
            return path
    if missing_ok:
        return None
    raise ValueError(f"ckpt_path={which!r}: {missing_checkpoint(callback, root, which, run_dir)}"
                     + (" (save one with ModelCheckpoint(save_last=True))" if which == "last" else
                        f" (none written by a ModelCheckpoint with {callback.state_key})")
                     + ": run fit first, or pass a file path")


def resolve_named(which: str, callbacks: List[Any], root: str | os.PathLike, fresh_if_none: bool = False,
                  run_dir: Optional[str | os.PathLike] = None) -> Tuple[Optional[str], str]:
    """``(path, what was chosen in words)`` for ``ckpt_path="last"``/``"best"``: "best" from the first
    ``ModelCheckpoint``; "last" the newest ``last*.ckpt`` of any of them (as Lightning), else the first's newest
    checkpoint. With ``fresh_if_none``, "last" with none yet gives no path. ``run_dir``:
    look in that run folder only (not the newest run under ``root``)."""
    if not callbacks:
        raise ValueError(f"ckpt_path={which!r} needs a ModelCheckpoint callback in this trainer "
                         "(none is configured): add one, or pass a file path")
    lasts = [p for p in (find_checkpoint("last", cb, root, missing_ok=True, run_dir=run_dir) for cb in callbacks)
             if p and is_last_name(p)] if which == "last" else []
    # The callback keeping last.ckpt need not be the first (a monitored top-k one often is, in its own folder).
    path = (max(lasts, key=lambda p: Path(p).lstat().st_mtime) if lasts else
            find_checkpoint(which, callbacks[0], root, missing_ok=fresh_if_none and which == "last", run_dir=run_dir))
    said = (f"using {path}" if path else
            f"{missing_checkpoint(callbacks[0], root, run_dir=run_dir)} yet: starting from scratch")
    if path and which == "last" and not is_last_name(path):
        said = (f"no last.ckpt in {Path(path).parent} (ModelCheckpoint(save_last=True) keeps one): "
                f"using its newest checkpoint, {path}")
    return path, said


def missing_checkpoint(callback: Any, root: str | os.PathLike, which: str = "last",
                       run_dir: Optional[str | os.PathLike] = None) -> str:
    """"no <which> checkpoint found in <where ``callback``'s checkpoints are looked for>"."""
    where = (str(callback.explicit_dirpath) if callback.explicit_dirpath is not None
             else str(Path(run_dir) / "checkpoints") if run_dir is not None else f"{root}/version_*/checkpoints")
    return f"no {which} checkpoint found in {where}"


def is_last_name(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a ``last.ckpt``, or one the version counter named (``last-v1.ckpt``, ...)."""
    return bool(_LAST.match(Path(path).name))


def _last_version(path: Path) -> int:
    found = _LAST.match(path.name)
    return int(found.group(1)[2:]) if found and found.group(1) else 0


def _last_in(folder: Path) -> str | None:
    if not folder.is_dir():
        return None
    # The newest written (a link's own time: when save_last="link" pointed it there).
    lasts = sorted((p for p in folder.glob("last*.ckpt") if is_last_name(p) and p.is_file()),
                   key=lambda p: (p.lstat().st_mtime, _last_version(p)))
    if lasts:
        return str(lasts[-1])
    found = sorted(folder.glob("*.ckpt"), key=lambda p: (p.stat().st_mtime, p.name))
    return str(found[-1]) if found else None  # the newest, when no last.ckpt was kept


def _best_in(folder: Path, state_key: str) -> str | None:
    if not folder.is_dir():
        return None
    for newest in sorted(folder.glob("*.ckpt"), key=lambda p: p.stat().st_mtime, reverse=True):
        state = read_checkpoint(newest).get("callbacks", {}).get(state_key, {})
        best = state.get("best_model_path")
        if best and Path(best).is_file():
            return str(best)
    return None


def remove_if_unused(run_dir: Path) -> bool:
    """Remove ``run_dir`` if it holds only what a fit writes at its start (no metric row,
    no checkpoint, nothing the user put there). Returns whether it did."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return False
    for entry in run_dir.iterdir():
        if entry.is_dir():
            if entry.name != "checkpoints" or any(entry.iterdir()):
                return False
        elif entry.name not in _START_FILES or (entry.name == "metrics.csv" and _has_rows(entry)):
            return False
    shutil.rmtree(run_dir, ignore_errors=True)
    return True


def _has_rows(path: Path) -> bool:
    with open(path, newline="", encoding="utf-8") as fh:
        return sum(1 for _ in csv.reader(fh)) > 1
