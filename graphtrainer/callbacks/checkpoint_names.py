"""Checkpoint file names as Lightning's ``ModelCheckpoint`` writes them: ``{field}`` formatting,
``name=value`` insertion, ``-v<n>`` versions past files that exist."""
from __future__ import annotations

import os
import re
import warnings
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Set

__all__ = ["format_checkpoint_name", "free_checkpoint_path"]

_FIELD = re.compile(r"\{([A-Za-z_][\w/.]*)(:[^}]*)?\}")


def format_checkpoint_name(filename: str, metrics: Mapping[str, Any], auto_insert_metric_name: bool = True,
                           dirpath: Optional[Path] = None, ver: Optional[int] = None,
                           warned: Optional[Set[str]] = None) -> str:
    """``filename`` formatted with ``metrics``, ``-v<ver>`` appended when given, and ``.ckpt``; inside
    ``dirpath`` when given. ``{name}`` becomes ``name=value``, or ``value`` with
    ``auto_insert_metric_name=False``; a ``/`` becomes ``_``. A field not in ``metrics`` is written as
    0, as Lightning's, with a ``UserWarning`` naming it and the logged ones, once per name in
    ``warned`` (the names already warned about; None: always)."""

    def sub(match: "re.Match[str]") -> str:
        name, spec = match.group(1), match.group(2) or ""
        value: Any = metrics.get(name, 0)
        if name not in metrics and (warned is None or name not in warned):
            if warned is not None:
                warned.add(name)
            warnings.warn(f"ModelCheckpoint filename uses {{{name}}}, which was not logged: written as 0 (as "
                          f"Lightning); logged: {sorted(metrics)}. Log {name!r} with self.log, or drop it from "
                          "filename", UserWarning, stacklevel=4)
        text = format(value, spec[1:]) if spec else f"{value}"
        return f"{name}={text}" if auto_insert_metric_name else text

    name = _FIELD.sub(sub, filename).replace("/", "_")
    if ver is not None:
        name = f"{name}-v{ver}"
    return str(dirpath / f"{name}.ckpt") if dirpath is not None else f"{name}.ckpt"


def free_checkpoint_path(name: Callable[[Optional[int]], str], replaces: Optional[str], versioned: bool) -> str:
    """``name(None)``, or with the version counter (``versioned``) the first ``name(1)``, ``name(2)``, ...
    that is no file yet; a name that is ``replaces`` (the file this save replaces) is taken as it is."""
    path = name(None)
    version = 1
    while versioned and path != replaces and os.path.lexists(path):
        path = name(version)
        version += 1
    return path
