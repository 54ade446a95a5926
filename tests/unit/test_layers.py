"""The package's layout rules, checked: import layers and no import cycles (import-linter's
contracts in setup.cfg)."""
from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


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


# ---- sizes: small single-purpose modules, short functions ----------------------------------------
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60
#: A longer function says why in its docstring, in a sentence starting with these words.
EXEMPTION = "Long because"


def _modules() -> list:
    return sorted((ROOT / "graphtrainer").rglob("*.py"))


def long_functions(path: Path) -> list:
    """``(name, lines)`` of the functions in ``path`` over the limit whose docstring does not
    say why."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            lines = node.end_lineno - node.lineno + 1
            if lines > MAX_FUNCTION_LINES and EXEMPTION not in (ast.get_docstring(node) or ""):
                found.append((node.name, lines))
    return found


def test_no_module_over_400_lines():
    big = {str(p.relative_to(ROOT)): n for p in _modules()
           if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES}
    assert not big, f"modules over {MAX_MODULE_LINES} lines (split them by job): {big}"


@pytest.mark.parametrize("folder", ["tutorials", "benchmarks"])
def test_no_script_over_400_lines(folder):
    """The same limit for the scripts around the package: a tutorial's measured output lives
    in ``tutorials/results/``, not in its docstring; shared code goes to a helper module."""
    scripts = sorted((ROOT / folder).rglob("*.py"))
    assert scripts, f"no .py files under {folder}/"
    big = {str(p.relative_to(ROOT)): n for p in scripts
           if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES}
    assert not big, f"{folder}/ files over {MAX_MODULE_LINES} lines (move output or shared code out): {big}"


def test_no_function_over_60_lines_unless_its_docstring_says_why():
    offenders = {f"{p.relative_to(ROOT)}:{name}": n for p in _modules() for name, n in long_functions(p)}
    assert not offenders, (f"functions over {MAX_FUNCTION_LINES} lines without '{EXEMPTION} ...' in their "
                           f"docstring: {offenders}")


def test_the_size_check_sees_a_long_function(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    path = tmp_path / "m.py"
    path.write_text(f"def f():\n{body}\n\n\ndef g():\n    \"\"\"{EXEMPTION} it must.\"\"\"\n{body}\n")
    assert long_functions(path) == [("f", MAX_FUNCTION_LINES + 1)]
