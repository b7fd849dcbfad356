"""Typed records with a JSON form: the contract between the analyses, the report and its renderers.

A record is a dataclass that also derives from :class:`Record`. Its JSON form is one object whose keys are its
fields, in order, each value made plain JSON (numpy scalars and arrays to Python values, NaN and ±inf to ``null``,
nested records to objects)::

    @dataclass
    class Row(Record):
        rank: int
        lateness_ms: float | None
        lam: float | None = json_key("lambda")   # a key that is not a Python name
        note: str | None = omit_if_none()       # left out of the JSON when None
        series: list = not_json()               # kept in memory only

    Row.from_json(Row(1, 2.5).to_json()) == Row(1, 2.5)

``from_json`` reads the type hints: nested records, ``list[...]``, ``dict[str, ...]`` and optional types are built
from them; plain values (numbers, strings, booleans) are kept as the JSON has them, so that a report read back writes
the same JSON. A key the record does not know is ignored (a newer writer); a required key that is missing, or a value
of the wrong shape, raises :class:`RecordError` naming where it is.

No dependency beyond numpy: every layer of distprof may use it.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from functools import lru_cache
from pathlib import PurePath
from typing import Any, Iterator, TypeVar

import numpy as np

__all__ = ["Record", "RecordError", "json_key", "jsonable", "not_json", "omit_if_none"]

R = TypeVar("R", bound="Record")


class RecordError(ValueError):
    """A JSON document does not have the shape a record needs (the message says where)."""


def json_key(key: str, **kw: Any) -> Any:
    """A field written under JSON key `key` (for keys that are not Python names, such as ``lambda``)."""
    kw.setdefault("default", None)
    return dataclasses.field(metadata={"key": key}, **kw)


def omit_if_none(**kw: Any) -> Any:
    """A field left out of the JSON when it is None (a key that only some records have)."""
    kw.setdefault("default", None)
    return dataclasses.field(metadata={"omit_none": True}, **kw)


def not_json(**kw: Any) -> Any:
    """A field kept in memory only: never written, and left at its default when read back."""
    return dataclasses.field(metadata={"json": False}, **kw)


def jsonable(x: Any) -> Any:
    """Plain JSON values: records and numpy values converted, NaN and ±inf become None, dict keys become str."""
    t = type(x)
    if t is str or t is int or t is bool or x is None:  # most values: at once, not after eight type tests
        return x
    if t is float:
        return x if math.isfinite(x) else None
    if isinstance(x, Record) or (hasattr(x, "to_json") and not isinstance(x, type)):
        return x.to_json()
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if isinstance(x, np.ndarray):
        return [jsonable(v) for v in x.tolist()]
    if isinstance(x, np.generic):
        x = x.item()
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, PurePath):
        return str(x)
    return x


@dataclasses.dataclass(frozen=True)
class _Spec:
    name: str
    key: str
    json: bool
    omit_none: bool
    required: bool


@lru_cache(maxsize=None)
def _specs(cls: type) -> tuple[_Spec, ...]:
    out = []
    for f in dataclasses.fields(cls):
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        out.append(_Spec(f.name, f.metadata.get("key", f.name), f.metadata.get("json", True),
                         bool(f.metadata.get("omit_none")), required))
    return tuple(out)


@lru_cache(maxsize=None)
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


class Record:
    """Base of the typed records (see the module docstring). Subclasses are dataclasses."""

    def to_json(self) -> dict[str, Any]:
        """The record as a JSON object (plain Python values only)."""
        return {key: jsonable(v) for key, v in self.json_fields()}

    def json_fields(self) -> Iterator[tuple[str, Any]]:
        """(key, value) of each entry of its JSON object, in order — the fields, then the derived keys — the values as
        they are (not yet converted): a writer that converts and writes one at a time never holds the whole document
        (render/json_renderer.py)."""
        for s in _specs(type(self)):
            if not s.json:
                continue
            v = getattr(self, s.name)
            if v is None and s.omit_none:
                continue
            yield s.key, v
        yield from self._json_extra().items()

    def _json_extra(self) -> dict[str, Any]:
        """Derived keys written after the fields (a subclass's computed properties); not read back."""
        return {}

    @classmethod
    def from_json(cls: type[R], doc: Any, where: str | None = None) -> R:
        """The record from its JSON object `doc`; `where` names it in errors (``stragglers[2]``)."""
        where = where or cls.__name__
        if not isinstance(doc, dict):
            raise RecordError(f"{where}: expected an object, got {type(doc).__name__}")
        hints = _hints(cls)
        kw: dict[str, Any] = {}
        for s in _specs(cls):
            if not s.json:
                continue
            if s.key not in doc:
                if s.required:
                    raise RecordError(f"{where}: missing key {s.key!r}")
                continue
            kw[s.name] = _value(hints[s.name], doc[s.key], f"{where}.{s.key}")
        return cls(**kw)


def _value(hint: Any, v: Any, where: str) -> Any:
    """`v` (a JSON value) as the type `hint` says: records and containers built, plain values kept as they are."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if v is None:
            return None
        return _value(args[0], v, where) if len(args) == 1 else v
    if v is None:
        return None
    if isinstance(hint, type) and hasattr(hint, "from_json"):
        return hint.from_json(v, where)
    if origin in (list, tuple):
        if not isinstance(v, list):
            raise RecordError(f"{where}: expected a list, got {type(v).__name__}")
        args = typing.get_args(hint)
        item = args[0] if args and (origin is list or (len(args) == 2 and args[1] is Ellipsis)) else Any
        out = [_value(item, x, f"{where}[{i}]") for i, x in enumerate(v)]
        return tuple(out) if origin is tuple else out
    if origin is dict:
        if not isinstance(v, dict):
            raise RecordError(f"{where}: expected an object, got {type(v).__name__}")
        kt, vt = (typing.get_args(hint) + (Any, Any))[:2]
        return {(int(k) if kt is int else k): _value(vt, x, f"{where}.{k}") for k, x in v.items()}
    if hint is np.ndarray:
        return np.asarray(v)
    return v
