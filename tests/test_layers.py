"""The package's layout rules, checked: import layers and no import cycles (import-linter's
contracts in setup.cfg)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _lint_imports() -> str:
    """The ``lint-imports`` beside this interpreter (the venv's), else the one on PATH."""
    here = Path(sys.executable).with_name("lint-imports")
    found = str(here) if here.exists() else shutil.which("lint-imports")
    if found is None:
        pytest.fail("lint-imports is not installed: pip install -r requirements/tested.txt (import-linter)")
    return found


def test_import_contracts_are_kept():
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([_lint_imports(), "--no-cache"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 broken" in proc.stdout and "Layers import downwards only KEPT" in proc.stdout
