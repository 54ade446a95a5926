"""One-line explanations of what the command line refused, each naming the key's real path.

jsonargparse reports a problem inside a class given as ``class_path``/``init_args`` (a task, a
callback in ``trainer.callbacks``) as a multi-line "Does not validate against any of the Union
subtypes" report; :func:`explain_parse_error` turns it into one line such as
``unknown key 'trainer.callbacks[0].init_args.monitr' (did you mean 'monitor'?); ...``.
:func:`check_untyped` gives an argument without an annotation the type of its default.
"""
from __future__ import annotations

import ast
import difflib
import importlib
import inspect
import re
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ..loop.lightning_names import lightning_trainer_way


def import_class(path: str) -> Any:
    """The object ``"package.module.Name"`` names."""
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


_PARSER_KEY = re.compile(r'Parser key "([\w.]+)":')
_CLASS_PROBLEM = re.compile(r"Problem with given class_path '([\w.]+)':\s*\n(.*?)(?:\n\s*- |\n\s*Given value|\Z)", re.S)
_NOT_ACCEPTED = re.compile(r"Option '([\w.]+)' is not accepted")
_EXPECTED = re.compile(r'Parser key "([\w.]+)":\s*Expected a (.+?)\. Got value: (.*)')
_GIVEN = re.compile(r"Given value: (.*)\Z", re.S)
_UNKNOWN_OPTION = re.compile(r"does not accept option '([\w.]+)'")
_UNKNOWN_TOP = re.compile(r"unrecognized arguments: (\S+)")
_TYPE_NAME = re.compile(r"<class '(?:builtins\.)?([\w.]+)'>")


def explain_parse_error(err: BaseException, parsers: Sequence[Any],
                        list_index: Optional[Callable[[str], Optional[int]]] = None) -> str:
    """jsonargparse's refusal as one line naming the key's full path, with the index of the
    failing item of a list (``trainer.callbacks[1].init_args.monitr``), and the valid keys where
    it rejected an unknown one. ``list_index(key)`` gives the index of the item a flag set or
    appended (``--trainer.callbacks.patience``, ``--trainer.callbacks+=...``), None if none."""
    message = str(err).strip()
    problem = _CLASS_PROBLEM.search(message)
    key = _PARSER_KEY.search(message)
    if problem and key:
        class_path, reason = problem.group(1), problem.group(2).strip()
        given = _given(message)
        if isinstance(given, list):
            index, item = _failing_item(given, class_path, reason)
        else:  # one item: a flag set or appended it to a list, or the key holds one class
            index = list_index(key.group(1)) if list_index else None
            item = given if isinstance(given, dict) else None
        where = key.group(1) + (f"[{index}]" if index is not None else "")
        if item is not None and _malformed(item):
            return _malformed_problem(where, item)
        return _class_problem(where, class_path, reason)
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


#: The keys of a class given as ``class_path``/``init_args`` (``dict_kwargs``: jsonargparse's own).
_SPEC_KEYS = ("class_path", "init_args", "dict_kwargs")


def _given(message: str) -> Any:
    """The value jsonargparse reports as given: lists, dicts (its ``Namespace(...)`` as dicts),
    strings and numbers; ``_OPAQUE`` for what it cannot read (a ``NestedArg`` flag among them)."""
    given = _GIVEN.search(message)
    if not given:
        return _OPAQUE
    try:
        return _literal(ast.parse(given.group(1).strip(), mode="eval").body)
    except (SyntaxError, ValueError):
        return _OPAQUE


class _Checked(dict):
    """An item jsonargparse had already read as a ``Namespace`` (it reads a list's items in
    order, so the refused item comes after these)."""


def _literal(node: ast.AST) -> Any:
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Namespace" \
            and not node.args:
        return _Checked({kw.arg: _literal(kw.value) for kw in node.keywords if kw.arg is not None})
    if isinstance(node, ast.Dict):
        return {_literal(k) if k is not None else None: _literal(v) for k, v in zip(node.keys, node.values)}
    if isinstance(node, (ast.List, ast.Tuple)):
        return [_literal(item) for item in node.elts]
    try:
        return ast.literal_eval(node)
    except ValueError:  # a repr of something else (a path object, a NestedArg): not needed to find the item
        return _OPAQUE


_OPAQUE = object()


def _spec(item: Any) -> Tuple[Any, Dict[str, Any]]:
    """``(class_path, init_args)`` of a list item (a dict, or a class path alone)."""
    if isinstance(item, str):
        return item, {}
    if isinstance(item, dict):
        init = item.get("init_args")
        return item.get("class_path"), init if isinstance(init, dict) else {}
    return None, {}


def _malformed(item: Any) -> bool:
    """A dict that is not ``class_path`` plus ``init_args`` (a class's arguments beside its
    class_path, a misspelt ``init_args``, no class_path)."""
    return isinstance(item, dict) and (not isinstance(item.get("class_path"), str)
                                       or any(k not in _SPEC_KEYS for k in item))


def _failing_item(items: List[Any], class_path: str, reason: str) -> Tuple[Optional[int], Any]:
    """The index and item of ``items`` jsonargparse refused: the first of ``class_path`` (by
    class name: it reports ``EarlyStopping`` as ``graphtrainer.EarlyStopping``) not read yet
    that holds the refused option (or its refused value), else the first malformed one."""
    option = _NOT_ACCEPTED.search(reason)
    expected = _EXPECTED.search(reason)
    name = option.group(1) if option else expected.group(1) if expected else None
    candidates = [i for i, item in enumerate(items) if not _malformed(item)
                  and str(_spec(item)[0]).rsplit(".", 1)[-1] == class_path.rsplit(".", 1)[-1]]
    candidates = [i for i in candidates if not isinstance(items[i], _Checked)] or candidates
    if name is not None and len(candidates) > 1:
        holding = [i for i in candidates if name in _spec(items[i])[1]]
        if expected:  # the item whose value is the one refused
            got = expected.group(3).strip()
            holding = [i for i in holding if str(_spec(items[i])[1][name]) == got] or holding
        candidates = holding or candidates
    if not candidates:
        candidates = [i for i, item in enumerate(items) if _malformed(item)]
    return (candidates[0], items[candidates[0]]) if candidates else (None, None)


def _malformed_problem(where: str, item: Dict[Any, Any]) -> str:
    """An item given as something other than ``class_path`` and ``init_args``: the key that does
    not belong, with the key (or the init argument) it likely means."""
    class_path = item.get("class_path")
    params = (init_parameters(class_path) or []) if isinstance(class_path, str) else []
    holds = f"{where} holds class_path and init_args"
    if params:
        holds += f"; {class_path}.__init__ accepts {', '.join(params)} (under init_args)"
    extra = [k for k in item if k not in _SPEC_KEYS]
    if not extra:
        return f"{where}: no class_path; {holds}"
    close = difflib.get_close_matches(str(extra[0]), ["class_path", "init_args", *params], n=1)
    meant = (close[0] if close[0] in _SPEC_KEYS else f"init_args.{close[0]}") if close else None
    hint = f" (did you mean {meant!r}?)" if meant else ""
    return f"unknown key {where + '.' + str(extra[0])!r}{hint}; {holds}"


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
