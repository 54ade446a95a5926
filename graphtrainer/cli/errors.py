"""One-line explanations of what the command line refused, each naming the key's real path.

jsonargparse reports a problem inside a class given as ``class_path``/``init_args`` (a task, a
callback in ``trainer.callbacks``) as a multi-line "Does not validate against any of the Union
subtypes" report; :func:`explain_parse_error` turns it into one line such as
``unknown key 'trainer.callbacks[0].init_args.monitr' (did you mean 'monitor'?); ...``.
:func:`check_untyped` gives an argument without an annotation the type of its default.
"""
from __future__ import annotations

import difflib
import importlib
import inspect
import re
from typing import Any, Callable, Dict, List, Optional, Sequence

from ..loop.lightning_names import lightning_trainer_way


def import_class(path: str) -> Any:
    """The object ``"package.module.Name"`` names."""
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


_PARSER_KEY = re.compile(r'Parser key "([\w.]+)":')
_CLASS_PROBLEM = re.compile(r"Problem with given class_path '([\w.]+)':\s*\n(.*?)(?:\n\s*- |\n\s*Given value|\Z)", re.S)
_NOT_ACCEPTED = re.compile(r"Option '([\w.]+)' is not accepted")
_EXPECTED = re.compile(r'Parser key "([\w.]+)":\s*Expected a (.+?)\. Got value: (.*)')
_ITEM_CLASS = re.compile(r"class_path'?\s*[:=]\s*'([\w.]+)'")
_GIVEN = re.compile(r"Given value: (.*)\Z", re.S)
_UNKNOWN_OPTION = re.compile(r"does not accept option '([\w.]+)'")
_UNKNOWN_TOP = re.compile(r"unrecognized arguments: (\S+)")
_TYPE_NAME = re.compile(r"<class '(?:builtins\.)?([\w.]+)'>")


def explain_parse_error(err: BaseException, parsers: Sequence[Any],
                        list_index: Optional[Callable[[str], Optional[int]]] = None) -> str:
    """jsonargparse's refusal as one line naming the key's full path (and the valid keys
    where it rejected an unknown one). ``list_index(key)`` gives the index a flag such as
    ``--trainer.callbacks.patience`` applies to (the last item of that list)."""
    message = str(err).strip()
    problem = _CLASS_PROBLEM.search(message)
    key = _PARSER_KEY.search(message)
    if problem and key:
        option = _NOT_ACCEPTED.search(problem.group(2)) or _EXPECTED.search(problem.group(2))
        where = key.group(1) + _index_of(message, problem.group(1), key.group(1),
                                         option.group(1) if option else None, list_index)
        return _class_problem(where, problem.group(1), problem.group(2).strip())
    match = _EXPECTED.search(message)
    if match:
        return _expected(*match.groups())
    match = _UNKNOWN_OPTION.search(message) or _UNKNOWN_TOP.search(message)
    if match:
        explained = _unknown_flag(match.group(1), parsers)
        if explained:
            return explained
    return one_line(message)


def one_line(message: str) -> str:
    """A multi-line message as one line (jsonargparse's reports, exception texts)."""
    return re.sub(r"\s*\n\s*", "; ", message.strip())


def _index_of(message: str, class_path: str, key: str, option: Optional[str],
              list_index: Optional[Callable[[str], Optional[int]]]) -> str:
    """``[i]`` when the failing class is item i of a list (``trainer.callbacks``), else ``""``."""
    given = _GIVEN.search(message)
    text = given.group(1).strip() if given else ""
    if text.startswith("NestedArg("):  # a --key.init_arg flag: it applies to the list's last item
        index = list_index(key) if list_index else None
        return f"[{index}]" if index is not None else ""
    if not text.startswith("["):
        return ""
    # Items are dicts or Namespace reprs: find each item's class_path in order.
    found = list(_ITEM_CLASS.finditer(text))
    segments = [(m.group(1), text[m.end():found[i + 1].start() if i + 1 < len(found) else len(text)])
                for i, m in enumerate(found)]
    matches = [i for i, (path, _) in enumerate(segments) if path == class_path]
    if len(matches) > 1 and option:  # the same class twice: the item holding the bad option
        matches = [i for i in matches if re.search(rf"\b{re.escape(option)}\b", segments[i][1])]
    return f"[{matches[0]}]" if len(matches) == 1 else ""


def _class_problem(where: str, class_path: str, reason: str) -> str:
    unknown = _NOT_ACCEPTED.search(reason)
    if unknown:
        name = unknown.group(1)
        valid = init_parameters(class_path)
        if valid is not None:
            return _unknown(f"{where}.init_args.{name}", name, valid, f"{class_path}.__init__ accepts")
    expected = _EXPECTED.search(reason)
    if expected:
        name, typ, got = expected.groups()
        return _expected(f"{where}.init_args.{name}", typ, got)
    if "has no attribute" in reason or "No module named" in reason:
        return f"{where}.class_path: cannot import {class_path!r} ({one_line(reason)})"
    return f"{where} ({class_path}): {one_line(reason)}"


def _expected(key: str, typ: str, got: str) -> str:
    names = _TYPE_NAME.findall(typ)
    wanted = " or ".join(names) if names else typ
    return f"{key}: expected {wanted}, got {got.strip()!r}"


def init_parameters(class_path: str) -> Optional[List[str]]:
    """The keyword names ``class_path``'s ``__init__`` accepts; None if it cannot be imported."""
    try:
        params = inspect.signature(import_class(class_path).__init__).parameters
    except Exception:  # the class cannot be imported: the caller says so another way
        return None
    return [p for p in params if p != "self" and params[p].kind not in (
        inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)]


def _unknown_flag(flag: str, parsers: Sequence[Any]) -> Optional[str]:
    parts = flag.lstrip("-").split("=", 1)[0].split(".")
    dests = {a.dest for p in parsers for a in p._actions if a.dest not in ("help", "==SUPPRESS==")}
    for i, part in enumerate(parts):  # the first part that is not a key where it stands
        prefix = ".".join(parts[:i]) + "." if i else ""
        valid = sorted({d[len(prefix):].split(".")[0] for d in dests if d.startswith(prefix)})
        if part not in valid:
            if not valid:
                return None
            group = prefix.rstrip(".")
            way = lightning_trainer_way(part) if group == "trainer" else None
            if way is not None:  # not a typo of a close name ("accelerator" is not "allocator")
                return f"trainer.{part} is Lightning's; graphtrainer: {way}"
            where = f"{group} accepts" if group else "valid top-level keys:"
            return _unknown(".".join(parts[:i + 1]), part, valid, where)
    return None


def _unknown(key: str, leaf: str, valid: Sequence[str], intro: str) -> str:
    close = difflib.get_close_matches(leaf, valid, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"unknown key {key!r}{hint}; {intro} {', '.join(valid)}"


def _accepts(default: Any, value: Any) -> bool:
    kind = type(default)
    if kind is bool or isinstance(value, bool):
        return isinstance(value, bool) and kind is bool
    if kind is float:
        return isinstance(value, (int, float))
    if kind in (list, tuple):
        return isinstance(value, (list, tuple))
    return isinstance(value, kind)


def check_untyped(cls: type, values: Dict[str, Any], where: str) -> Optional[str]:
    """Why ``values`` do not suit ``cls.__init__``'s arguments that have no annotation: such an
    argument takes the type of its default (None when all suit). A default of None says nothing."""
    try:
        params = inspect.signature(cls.__init__).parameters
    except (TypeError, ValueError):
        return None
    for name, param in params.items():
        if name not in values or param.annotation is not inspect.Parameter.empty:
            continue
        default, value = param.default, values[name]
        if default is inspect.Parameter.empty or default is None or value is None or value == default:
            continue
        if not _accepts(default, value):
            return (f"{where}.{name}: expected {type(default).__name__} (the type of its default {default!r}; "
                    f"{cls.__name__}.__init__ gives {name!r} no annotation), got {value!r}")
    return None
