"""A tutorial's measured output lives in ``tutorials/results/<tutorial>.json``, not in its docstring.

That file holds, per tested set (``pinned``, ``newest``; see docs/stacks.md), the figures of
the ``--fast`` run that the tutorial's smoke test makes, with the command and the
environment they were recorded on, and a tolerance per figure. Each smoke test compares
its fresh figures with them (:func:`check_figures`): the tutorials are seeded, so on one
set a run repeats its numbers, and a figure that moves past its tolerance means the
tutorial's behaviour changed. ``GRAPHTRAINER_UPDATE_RESULTS=1`` makes the test rewrite its
set's figures instead (and say so), after a change that is meant to move them. The full
run's console output (the reference run a reader compares with) is
``tutorials/results/<tutorial>.txt``, named by the JSON file's ``reference`` entry.
"""
from __future__ import annotations

import datetime
import json
import math
import os
import platform
import warnings
from pathlib import Path
from typing import Any, Dict, Mapping

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "tutorials" / "results"
UPDATE_VAR = "GRAPHTRAINER_UPDATE_RESULTS"


def stack_name() -> str:
    """The tested set this run is on, as the suite names it (``GRAPHTRAINER_STACK``)."""
    return os.environ.get("GRAPHTRAINER_STACK", "pinned")


def figure(summary: Mapping[str, Any], key: str) -> Any:
    """``summary[a][b]`` for ``key`` ``"a.b"``."""
    value: Any = summary
    for part in key.split("."):
        value = value[part]
    return value


def environment() -> Dict[str, str]:
    import graphtrainer  # noqa: F401  (before dgl: the compatibility layer)
    import dgl
    import torch

    return {"stack": stack_name(), "python": platform.python_version(), "torch": torch.__version__,
            "dgl": dgl.__version__, "cpus": str(os.cpu_count()),
            "date": datetime.date.today().isoformat()}


def mismatches(recorded: Mapping[str, Any], fresh: Mapping[str, Any], tolerance: Mapping[str, float]) -> list:
    """``(key, recorded, fresh, tolerance)`` for each figure that moved past its tolerance
    (a figure missing on either side counts as moved)."""
    bad = []
    for key in sorted(set(recorded) | set(fresh)):
        tol = float(tolerance.get(key, 0.0))
        old, new = recorded.get(key), fresh.get(key)
        if isinstance(old, (int, float)) and isinstance(new, (int, float)):
            ok = math.isclose(float(old), float(new), rel_tol=0.0, abs_tol=tol + 1e-12)
        else:
            ok = old == new
        if not ok:
            bad.append((key, old, new, tol))
    return bad


def check_figures(tutorial: str, summary: Mapping[str, Any]) -> Dict[str, Any]:
    """Compare the fresh ``summary`` with ``tutorials/results/<tutorial>.json`` for this
    tested set: each figure the file gives a tolerance for (``"a.b"`` is ``summary[a][b]``),
    within it. With ``GRAPHTRAINER_UPDATE_RESULTS=1`` write them there instead. Returns the
    fresh figures."""
    path = RESULTS / f"{tutorial}.json"
    doc = json.loads(path.read_text())
    smoke = doc["smoke"]
    fresh = {k: figure(summary, k) for k in smoke["tolerance"]}
    stack = stack_name()
    if os.environ.get(UPDATE_VAR) == "1":
        smoke.setdefault("figures", {})[stack] = fresh
        smoke.setdefault("recorded_on", {})[stack] = environment()
        path.write_text(json.dumps(doc, indent=2) + "\n")
        warnings.warn(f"{UPDATE_VAR}=1: rewrote the {stack} figures of {path.relative_to(ROOT)}")
        return fresh
    recorded = smoke.get("figures", {}).get(stack)
    if recorded is None:
        warnings.warn(f"{path.relative_to(ROOT)} records no figures for the {stack!r} set: not compared "
                      f"(record them with {UPDATE_VAR}=1)")
        return fresh
    bad = mismatches(recorded, fresh, smoke["tolerance"])
    assert not bad, (
        f"{tutorial} --fast no longer gives the figures that {path.relative_to(ROOT)} records for the "
        f"{stack} set: " + "; ".join(f"{k}: recorded {o!r}, now {n!r} (tolerance {t})" for k, o, n, t in bad)
        + f". If the change is meant, rerun this test with {UPDATE_VAR}=1 and update the reference run "
          f"({doc['reference']['log']}) and tutorials/README.md.")
    return fresh
