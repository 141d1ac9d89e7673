"""The codec between xover's frozen records and JSON-shaped data. Pure.

:func:`encode` is :func:`dataclasses.asdict`; :func:`decode` is its inverse, led by the record's type hints
(nested records, ``X | None``, ``tuple[X, ...]`` and fixed tuples, floats that JSON wrote as integers). The
store (:mod:`xover.results.store`) reads its provenance and configurations back with it, and the stored
artifacts (advise's record, the tuning stage's search) with the same function.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from typing import Any, TypeVar

T = TypeVar("T")


def encode(record: Any) -> dict[str, Any]:
    """A frozen record as JSON-shaped data (tuples become lists once serialised)."""
    return dataclasses.asdict(record)


@functools.cache
def _hints(tp: type) -> dict[str, Any]:
    return typing.get_type_hints(tp)


def decode(tp: type[T], value: Any) -> T:
    """JSON-shaped data back into the typed frozen record of type ``tp`` it came from. A field missing from
    the data takes its default; a key the record does not have is ignored."""
    return typing.cast(T, _decode(tp, value))


def _decode(tp: Any, value: Any) -> Any:
    if dataclasses.is_dataclass(tp):
        hints = _hints(typing.cast(type, tp))
        fields = {f.name: _decode(hints[f.name], value[f.name]) for f in dataclasses.fields(tp) if f.name in value}
        return typing.cast(Any, tp)(**fields)
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None:
            return None
        return _decode(next(a for a in args if a is not type(None)), value)
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_decode(args[0], v) for v in value)
        return tuple(_decode(a, v) for a, v in zip(args, value))
    if tp is float:
        return float(value)
    return value
