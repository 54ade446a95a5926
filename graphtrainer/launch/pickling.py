"""Starting a rank process, and naming what could not be pickled when spawn cannot send it."""
from __future__ import annotations

import io
import pickle
from multiprocessing.reduction import ForkingPickler
from typing import Any, Optional, Sequence


def start_process(proc: Any, method: str, args: Sequence[Any]) -> None:
    """Start ``proc``; under spawn, name what could not be pickled."""
    try:
        proc.start()
    except (pickle.PicklingError, TypeError, AttributeError) as err:
        if method == "fork":
            raise
        culprit = _find_unpicklable(args)
        raise RuntimeError(
            f"launcher='{method}' must pickle the trainer and the task to send them to each rank, but "
            f"{culprit or 'something they hold'} cannot be pickled ({type(err).__name__}: {err}). Create "
            "such objects in setup() or configure_model(), which run in each rank, or use "
            "launcher='fork', which pickles nothing.") from err


def _find_unpicklable(args: Sequence[Any]) -> Optional[str]:
    """``task.<attr>`` (or ``trainer.<attr>`` of the rank context ``args[0]``, one level
    deeper where it helps) that fails to pickle."""
    context = args[0] if args else None
    for label, obj in (("task", getattr(context, "task", None)), ("trainer", context)):
        if obj is None or not hasattr(obj, "__dict__"):
            continue

        class _OwnerKept(ForkingPickler):
            # References back to the object searched (a metric store's owner, say) count as
            # picklable: the culprit is what fails on its own.
            def persistent_id(self, value: Any) -> Optional[str]:
                return "owner" if value is obj else None

        def fails(value: Any) -> bool:
            try:
                _OwnerKept(io.BytesIO()).dump(value)
                return False
            except Exception:  # noqa: BLE001 - any failure to pickle
                return True

        for name, value in vars(obj).items():
            if not fails(value):
                continue
            inner = vars(value).items() if hasattr(value, "__dict__") else ()
            deeper = next((f"{label}.{name}.{sub} ({type(v).__name__})" for sub, v in inner if fails(v)), None)
            return deeper or f"{label}.{name} ({type(value).__name__})"
    return None

