"""Write docs/api.md, the API reference, from the code: ``python scripts/api_reference.py``.

Every public module of graphtrainer (no ``_`` in its path), each public class and function
(its ``__all__``, or else the classes and functions it defines) with the path to import it from
and the first paragraph of its docstring; a name re-exported by a package is listed once, under
the package (the shorter import). Then the old paths that still work (graphtrainer/_moved.py).
``--check`` exits 1, writing nothing, when the committed page differs from the code
(tests/unit/test_api_reference.py runs the same comparison).
"""
from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
import sys
from pathlib import Path
from typing import Any, Dict, List, Tuple

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "api.md"
#: Listed first, in this order: the packages users import from; then every other module by name.
FIRST = ["graphtrainer", "graphtrainer.callbacks", "graphtrainer.nn", "graphtrainer.datasets"]

HEADER = """# API reference

Where every public class and function lives: import it from the module of its section. A name
that a package re-exports is listed once, under the package. Written from the code by
`scripts/api_reference.py` (run it after changing a public name; `tests/unit/test_api_reference.py`
fails while this page and the code disagree).

## Deprecation policy

A public name that moves (module reorganised, metric renamed) keeps working at its old path for
the release it moved in and the next one: importing it (or, for a module that was split, taking a
name from it) gives a `DeprecationWarning` that names the new path, and a callback or a metrics
dict asked for an old metric name uses the new one with a `DeprecationWarning`. The release after
that removes the alias. A public name that goes without a new home warns the same way, naming
the release that removes it and what to use instead. The table at the end of this page lists
every alias and deprecated name in force (`graphtrainer/_moved.py` holds them: one table to
extend when a module moves).
"""


def public_modules() -> List[str]:
    import graphtrainer

    found = ["graphtrainer"]
    for info in pkgutil.walk_packages(graphtrainer.__path__, "graphtrainer."):
        if not any(part.startswith("_") for part in info.name.split(".")):
            found.append(info.name)
    return FIRST + sorted(set(found) - set(FIRST))


def public_names(module: Any) -> List[Tuple[str, Any]]:
    names = getattr(module, "__all__", None)
    if names is None:
        names = [n for n, obj in vars(module).items() if not n.startswith("_")
                 and (inspect.isclass(obj) or inspect.isfunction(obj)) and obj.__module__ == module.__name__]
    return [(n, getattr(module, n)) for n in sorted(names, key=str.lower)]


def summary(obj: Any) -> str:
    if not (inspect.isclass(obj) or inspect.isfunction(obj)):
        plain = isinstance(obj, (int, float, str)) and len(repr(obj)) < 40
        return f"`{obj!r}`" if plain else f"a `{type(obj).__name__}`"
    doc = inspect.getdoc(obj) or "—"
    first = " ".join(doc.split("\n\n")[0].split())
    first = re.sub(r":\w+:`~?([^`]+)`", r"`\1`", first).replace("``", "`").replace("|", "\\|")
    parts = re.split(r"(`[^`]*`)", first)  # < and > outside code spans would read as HTML
    first = "".join(p if p.startswith("`") else p.replace("<", "&lt;").replace(">", "&gt;") for p in parts)
    return first if len(first) <= 200 else first[:197].rsplit(" ", 1)[0] + " ..."


def kind(obj: Any) -> str:
    return "class" if inspect.isclass(obj) else "function" if inspect.isfunction(obj) else "constant"


def sections() -> Dict[str, List[Tuple[str, str, str]]]:
    """``{module: [(name, kind, summary)]}``; each object once, at its first (shortest) module."""
    seen: set = set()
    out: Dict[str, List[Tuple[str, str, str]]] = {}
    for name in public_modules():
        rows = []
        for attr, obj in public_names(importlib.import_module(name)):
            key = id(obj) if inspect.isclass(obj) or inspect.isfunction(obj) else (name, attr)
            if key not in seen:
                seen.add(key)
                rows.append((attr, kind(obj), summary(obj)))
        if rows:
            out[name] = rows
    return out


def moved_rows() -> List[str]:
    from graphtrainer import _moved

    rows = [f"| `{old}` | {', '.join(f'`{n}`' for n in new)} |" for old, new in sorted(_moved.MOVED.items())]
    rows += [f"| `{mod}.{name}` | `{new}.{name}` |" for (mod, name), new in sorted(_moved.MOVED_NAMES.items())]
    rows += ["| metric `<prefix>hits@K` (`val_hits@20`) | `<prefix>pooled_hits@K` (`val_pooled_hits@20`) |"]
    rows += [f"| `{old}` | none (deprecated): {instead} |" for old, instead in sorted(_moved.DEPRECATED.items())]
    return rows


def render() -> str:
    lines = [HEADER]
    for module, rows in sections().items():
        lines += [f"## `{module}`", "", "| name | kind | summary |", "|---|---|---|"]
        lines += [f"| `{name}` | {k} | {text} |" for name, k, text in rows]
        lines.append("")
    from graphtrainer._moved import REMOVED_IN

    lines += ["## Old paths that still work", "",
              f"Each works, with a `DeprecationWarning`, until graphtrainer {REMOVED_IN}.", "",
              "| old | now |", "|---|---|"] + moved_rows()
    return "\n".join(lines) + "\n"


def main(argv: List[str]) -> int:
    text = render()
    if "--check" in argv:
        same = PAGE.is_file() and PAGE.read_text(encoding="utf-8") == text
        print("docs/api.md is up to date" if same else
              "docs/api.md is out of date: run python scripts/api_reference.py")
        return 0 if same else 1
    PAGE.write_text(text, encoding="utf-8")
    print(f"wrote {PAGE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main(sys.argv[1:]))
