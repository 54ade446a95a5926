"""How every tutorial script ends: a ``summary.json`` that its smoke test reads
(``tests/tutorials/test_tutorial_0N.py``) and, for tutorials 1-3, one ``RESULT`` line on stdout."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Dict, Optional


def write_summary(out_dir: "os.PathLike[str] | str", summary: Dict[str, Any]) -> Path:
    """``out_dir/summary.json`` (the folder is made if needed); returns its path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "summary.json"
    path.write_text(json.dumps(summary, indent=2))
    return path


def report(result: Dict[str, Any], out_dir: Optional[str] = None) -> None:
    """Write ``out_dir/summary.json`` when ``out_dir`` is given, then print ``RESULT <json>``
    and the total seconds (``result["seconds"]``)."""
    if out_dir:
        write_summary(out_dir, result)
    print("RESULT " + json.dumps(result), flush=True)
    print(f"total {result['seconds']:.1f} s", flush=True)
