"""The one walk over a batch's containers: dicts, lists, tuples and namedtuples, at any depth.

Moving, pinning, converting and measuring a batch all need the same thing: reach the
tensors and graphs inside whatever nesting the loader or the user built, and rebuild that
nesting around the results. :func:`apply_to_leaves` maps, :func:`leaves` finds.

A *leaf* is what ``select`` matches: a type, a tuple of types, or a predicate. ``select`` is
asked before a container is opened, so a caller can stop at a container too (a DGL batch
tuple, say). Objects that are neither selected nor containers are kept as they are by
:func:`apply_to_leaves` and skipped by :func:`leaves`. Unlike Lightning Fabric's
``apply_to_collection``, dataclasses are not opened: graphtrainer's torch graphs are
dataclasses, and they move, pin and count as one.
"""
from __future__ import annotations

from collections import OrderedDict, defaultdict
from typing import Any, Callable, Iterator, Tuple, Type, Union

#: What a leaf is: a type, a tuple of types, or a predicate on an object.
Select = Union[Type[Any], Tuple[Type[Any], ...], Callable[[Any], bool]]


def _matcher(select: Select) -> Callable[[Any], bool]:
    if isinstance(select, type) or (isinstance(select, tuple) and all(isinstance(t, type) for t in select)):
        return lambda obj: isinstance(obj, select)
    if callable(select):
        return select
    raise TypeError(f"select={select!r}: give a type, a tuple of types or a predicate")


def _is_namedtuple(obj: Any) -> bool:
    return isinstance(obj, tuple) and hasattr(obj, "_fields")


def _rebuild(like: Any, items: Any) -> Any:
    """A container like ``like`` holding ``items`` (values for a list or tuple, ``(key, value)``
    pairs for a dict): namedtuples by position, a ``defaultdict`` with its factory, and other
    dict subclasses as plain dicts (their constructors may want other arguments)."""
    if isinstance(like, dict):
        if type(like) is defaultdict:
            return defaultdict(like.default_factory, items)
        return OrderedDict(items) if type(like) is OrderedDict else dict(items)
    if _is_namedtuple(like):
        return type(like)(*items)
    return type(like)(items)


def apply_to_leaves(data: Any, fn: Callable[[Any], Any], select: Select) -> Any:
    """``data`` with ``fn(leaf)`` in place of every leaf ``select`` matches; every dict, list,
    tuple and namedtuple on the way is rebuilt (OrderedDict and defaultdict kept, other dict
    subclasses as plain dicts), everything else is kept."""
    match = _matcher(select)

    def walk(obj: Any) -> Any:
        if match(obj):
            return fn(obj)
        if isinstance(obj, dict):
            return _rebuild(obj, [(k, walk(v)) for k, v in obj.items()])
        if isinstance(obj, (list, tuple)):
            return _rebuild(obj, [walk(v) for v in obj])
        return obj

    return walk(data)


def leaves(data: Any, select: Select) -> Iterator[Any]:
    """The leaves of ``data`` that ``select`` matches, depth first in the containers' order
    (a dict's values in its order), without looking inside a leaf."""
    match = _matcher(select)

    def walk(obj: Any) -> Iterator[Any]:
        if match(obj):
            yield obj
        elif isinstance(obj, dict):
            for value in obj.values():
                yield from walk(value)
        elif isinstance(obj, (list, tuple)):
            for value in obj:
                yield from walk(value)

    return walk(data)
