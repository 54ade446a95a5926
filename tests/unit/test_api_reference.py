"""docs/api.md, the API reference: written from the code by scripts/api_reference.py, up to date,
complete (every name of graphtrainer.__all__ and of each public subpackage's __all__, under a
module it imports from), and every docs snippet imports the graphtrainer names it uses."""
from __future__ import annotations

import ast
import builtins
import importlib
import pkgutil
import re
import sys
import textwrap
from pathlib import Path

import pytest

import graphtrainer

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import api_reference  # noqa: E402

sys.path.insert(0, str(ROOT / "tests" / "integration"))
from test_docs import BLOCKS  # noqa: E402

PAGE = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")


def test_the_committed_page_is_what_the_generator_writes_today():
    assert PAGE == api_reference.render(), "docs/api.md is out of date: run python scripts/api_reference.py"


def _sections() -> dict:
    """``{module: set of names}`` as the page lists them."""
    out, module = {}, None
    for line in PAGE.splitlines():
        if line.startswith("## `"):
            module = line[4:-1]
            out[module] = set()
        elif module and (m := re.match(r"^\| `([^`]+)` \|", line)):
            out[module].add(m.group(1))
    return out


def test_every_name_in_each_all_appears_under_a_module_it_imports_from():
    packages = ["graphtrainer"] + [i.name for i in pkgutil.walk_packages(graphtrainer.__path__, "graphtrainer.")
                                   if i.ispkg and not any(p.startswith("_") for p in i.name.split("."))]
    sections = _sections()
    missing = []
    for package in packages:
        module = importlib.import_module(package)
        for name in getattr(module, "__all__", []):
            obj = getattr(module, name)
            homes = [m for m, names in sections.items() if name in names
                     and getattr(importlib.import_module(m), name, None) is obj]
            if not homes:
                missing.append(f"{package}.{name}")
    assert missing == []
    assert {"graphtrainer", "graphtrainer.nn", "graphtrainer.datasets", "graphtrainer.integrations.mlflow_logger",
            "graphtrainer.evaluation.ranking", "graphtrainer.data.inference"} <= set(sections)
    assert "accuracy" in sections["graphtrainer.evaluation.ranking"] and "MLflowLogger" in sections["graphtrainer.integrations.mlflow_logger"]


def test_the_page_lists_every_old_path_that_still_works():
    from graphtrainer import _moved

    assert all(f"| `{old}` |" in PAGE for old in _moved.MOVED)
    assert "## Deprecation policy" in PAGE and _moved.REMOVED_IN in PAGE


def _bound_and_used(code: str) -> tuple:
    code = textwrap.dedent(code)
    try:
        tree = ast.parse(code)
    except SyntaxError:  # an excerpt from inside a function or class, or cut mid-call
        try:
            tree = ast.parse("if True:\n" + textwrap.indent(code, "    "))
        except SyntaxError:
            return _bound_and_used_by_words(code)
    bound = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            bound |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            bound.add(node.id)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
    used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    return bound, used


def _bound_and_used_by_words(code: str) -> tuple:
    """The same sets, roughly, for a block Python cannot parse: every word is a use."""
    bound = set(re.findall(r"\b(\w+)\s*=(?!=)", code)) | set(re.findall(r"\b(?:def|class)\s+(\w+)", code))
    for names in re.findall(r"^\s*(?:from\s+\S+\s+)?import\s+([\w, ]+)", code, re.M):
        bound |= {n.split(" as ")[-1].strip() for n in names.split(",")}
    return bound, set(re.findall(r"\b[A-Za-z_]\w*\b", code))


def test_every_docs_snippet_imports_the_graphtrainer_names_it_uses():
    """A block taken from a file may rely on an earlier block of the page taken from the same file
    (its import lines); any other block imports what it uses."""
    public = {name for names in _sections().values() for name in names} - set(dir(builtins))
    unimported = []
    imported_from: dict = {}
    for block in BLOCKS:
        bound, used = _bound_and_used(block.code)
        key = (block.page, block.source) if block.kind == "from" else None
        earlier = imported_from.get(key, set()) if key else set()
        unimported += [f"{block.name}: {n}" for n in sorted((used & public) - bound - earlier)]
        if key:
            imported_from[key] = earlier | bound
    assert unimported == []


@pytest.mark.parametrize("code, expected", [("accuracy(logits, y)\n", {"accuracy"}),
                                            ("from graphtrainer.evaluation.ranking import accuracy\naccuracy(a, b)\n", set())])
def test_the_snippet_check_sees_a_name_used_without_its_import(code, expected):
    bound, used = _bound_and_used(code)
    assert (used & {"accuracy"}) - bound == expected
