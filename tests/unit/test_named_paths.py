"""Every dotted ``graphtrainer.x.y`` that the prose names resolves to something that exists now.

Where it looks: the docstrings and comments of ``graphtrainer/`` and ``tutorials/`` (``*.py``),
and the whole text of ``docs/*.md``, ``ARCHITECTURE.md``, ``README.md`` and ``tutorials/README.md``.

What resolves: the longest prefix that imports as a module, then each further part an attribute
of what came before (``graphtrainer.loop.fit.run_fit``, ``graphtrainer.Trainer.fit``; a class's
annotated fields count, for dataclass fields and attributes set in ``__init__``).

Old paths (graphtrainer/_moved.py's ``MOVED`` and ``MOVED_NAMES``) still import, with a warning,
but do not count: live text names the new place. They are allowed only in text about the moves:
``graphtrainer/_moved.py`` itself, the table of old paths that ends ``docs/api.md``, and any line
that says it speaks of an old name (the words old, moved, deprecated, renamed or formerly on the
same line). A name that resolves nowhere fails everywhere.
"""
from __future__ import annotations

import ast
import importlib
import io
import re
import tokenize
from pathlib import Path
from typing import Iterator, List, Optional, Tuple

import pytest

from graphtrainer import _moved

ROOT = Path(__file__).resolve().parents[2]
NAME = re.compile(r"(?<![\w/.])graphtrainer(?:\.[A-Za-z_]\w*)+")
ABOUT_MOVES = re.compile(r"\b(old|moved|deprecat\w*|renamed|formerly)\b", re.IGNORECASE)
#: (file, name): an old name left in a file for now (test_the_pending_lines_still_need_fixing says
#: when an entry can go). Empty: every file names the new places.
PENDING: set = set()


def _prose_of_python(text: str) -> Iterator[Tuple[int, str]]:
    """(line number, line) of each docstring and comment line of a Python source."""
    tree = ast.parse(text)
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = node.body[0] if node.body else None
            if isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant) and isinstance(doc.value.value, str):
                for offset, line in enumerate(doc.value.value.splitlines()):
                    yield doc.lineno + offset, line
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string


def prose(path: Path, text: Optional[str] = None) -> Iterator[Tuple[int, str]]:
    text = path.read_text() if text is None else text
    if path.suffix == ".py":
        yield from _prose_of_python(text)
        return
    yield from enumerate(text.splitlines(), start=1)


def _old_path(name: str) -> Optional[str]:
    """The old path (a MOVED module or a MOVED_NAMES name) that ``name`` goes through, if any."""
    parts = name.split(".")
    for i in range(2, len(parts) + 1):
        prefix = ".".join(parts[:i])
        if prefix in _moved.MOVED:
            return prefix
        if i < len(parts) and (prefix, parts[i]) in _moved.MOVED_NAMES:
            return f"{prefix}.{parts[i]}"
    return None


def _new_place(old: str) -> str:
    if old in _moved.MOVED:
        return ", ".join(_moved.MOVED[old])
    module, name = old.rsplit(".", 1)
    return f"{_moved.MOVED_NAMES[(module, name)]}.{name}"


def resolves(name: str) -> bool:
    """Whether ``name`` is a module, or an attribute path from the longest module prefix."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            if hasattr(obj, attr):
                obj = getattr(obj, attr)
            elif isinstance(obj, type) and any(attr in getattr(k, "__annotations__", {}) for k in obj.__mro__):
                return attr == parts[-1]  # an instance attribute: nothing further to walk
            else:
                return False
        return True
    return False


def problems(path: Path, text: Optional[str] = None, allow_old: bool = False) -> List[str]:
    """What is wrong with the names in ``path``'s prose (``text`` instead of the file, for tests)."""
    rel = path.relative_to(ROOT).as_posix() if path.is_absolute() else path.as_posix()
    found = []
    for lineno, line in prose(path, text):
        for name in NAME.findall(line):
            name = name.rstrip(".")
            if (rel, name) in PENDING:
                continue
            old = _old_path(name)
            if old is not None:
                if not (allow_old or ABOUT_MOVES.search(line)):
                    found.append(f"{rel}:{lineno}: {name} names the old path {old} (now {_new_place(old)})")
            elif not resolves(name):
                found.append(f"{rel}:{lineno}: {name} does not exist")
    return found


def _files() -> List[Tuple[Path, bool]]:
    py = sorted((ROOT / "graphtrainer").rglob("*.py")) + sorted((ROOT / "tutorials").glob("*.py"))
    md = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "ARCHITECTURE.md", ROOT / "README.md",
                                                  ROOT / "tutorials" / "README.md"]
    return [(p, p.name == "_moved.py") for p in py] + [(p, False) for p in md if p.exists()]


def test_every_named_graphtrainer_path_exists_at_its_new_place():
    found = []
    for path, allow_old in _files():
        if path == ROOT / "docs" / "api.md":  # the table of old paths closes the page: only it may name them
            text = path.read_text()
            live, _, table = text.partition("\n## Old paths that still work")
            found += problems(path, live) + problems(path, table, allow_old=True)
            continue
        found += problems(path, allow_old=allow_old)
    assert found == [], "\n".join(found)


def test_the_pending_lines_still_need_fixing():
    """An entry of PENDING whose name is gone from its file is removed from the list."""
    for rel, name in PENDING:
        assert name in (ROOT / rel).read_text(), f"{rel} no longer names {name}: drop it from PENDING"


def test_the_checker_catches_missing_and_old_names_and_passes_live_ones():
    fake = ROOT / "docs" / "fake.md"
    text = ("Train with graphtrainer.Trainer.fit and graphtrainer.loop.fit.run_fit.\n"
            "Scores: graphtrainer.evaluation.ranking.LinkScores; fields: graphtrainer.state.TrainerConfig.max_epochs.\n"
            "Missing: graphtrainer.no_such_module.thing and graphtrainer.comm.no_such_function.\n"
            "Stale: graphtrainer.ranking.accuracy and graphtrainer.partition.PartRow.\n"
            "The old path graphtrainer.ranking still imports.\n")
    found = problems(fake, text)
    assert [f.split(": ", 1)[1] for f in found] == [
        "graphtrainer.no_such_module.thing does not exist",
        "graphtrainer.comm.no_such_function does not exist",
        "graphtrainer.ranking.accuracy names the old path graphtrainer.ranking (now graphtrainer.evaluation.ranking)",
        "graphtrainer.partition.PartRow names the old path graphtrainer.partition (now graphtrainer.cli.partition)",
    ], found
    code = '"""See :mod:`graphtrainer.nowhere`."""\nx = "graphtrainer.nowhere"  # and graphtrainer.comm\n'
    assert problems(ROOT / "graphtrainer" / "fake.py", code) == ["graphtrainer/fake.py:1: graphtrainer.nowhere "
                                                                  "does not exist"]


@pytest.mark.parametrize("name", ["graphtrainer.models.SAGE", "graphtrainer.cli.GraphTaskCLI",
                                  "graphtrainer.GraphTask.training_step"])
def test_names_the_docs_lean_on_resolve(name):
    assert resolves(name) and _old_path(name) is None
