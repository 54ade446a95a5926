"""Running a tutorial script the way a user does, for the smoke tests tests/test_tutorial_0N.py."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, Dict

from launch_env import env_without_launch

ROOT = Path(__file__).resolve().parents[2]


def script(name: str) -> Path:
    return ROOT / "tutorials" / name


def tutorial_env(**extra: str) -> Dict[str, str]:
    # A launcher's variables would make the script's trainer act as one externally started rank.
    return env_without_launch(**{"PYTHONUNBUFFERED": "1", "DGLBACKEND": "pytorch", **extra})


def run(name: str, *args: str, timeout: float = 150, check: bool = True,
        env: Dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``python tutorials/<name> args...`` from the repository root; must succeed when ``check``."""
    proc = subprocess.run([sys.executable, str(script(name)), *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env=env if env is not None else tutorial_env())
    if check:
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def run_fast(name: str, out: Path, *args: str, timeout: float = 150, **env: str) -> Dict[str, Any]:
    """The ``--fast`` run, writing to ``out``; returns the ``summary.json`` it wrote."""
    run(name, "--fast", "--out", str(out), *args, timeout=timeout, env=tutorial_env(**env))
    return json.loads((out / "summary.json").read_text())


def load_module(name: str) -> ModuleType:
    """The tutorial imported as a module (its ``__main__`` block does not run)."""
    spec = importlib.util.spec_from_file_location(Path(name).stem.replace("-", "_"), script(name))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
