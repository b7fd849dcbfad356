"""report.json: a Report as JSON (format in docs/report-format.md), written atomically.

The text is ``Report.to_json()`` dumped with ``indent=1``, strict JSON (no NaN) and non-ASCII kept as it is. The
same functions write ``distprof diff``'s document, which is plain JSON already (``RunDiff.to_dict()``).
"""

from __future__ import annotations

import functools
import json
import logging
import math
import os
from json.encoder import encode_basestring
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

import numpy as np

from ..atomic import atomic_write
from ..record import Record, jsonable

if TYPE_CHECKING:
    from ..analysis.report.model import Report

logger = logging.getLogger(__name__)

__all__ = ["iter_json", "render_json", "write_json"]


#: Rows of a step table converted at a time while writing (each row is ~30 keys; 16k ranks × 5 steps whole was
#: ≈ 600 MB of objects for 74 MB of text).
ROWS_PER_PART = 2048


def _dumps(doc: Any) -> str:
    return json.dumps(doc, indent=1, allow_nan=False, ensure_ascii=False)


def _scalar_text(x: Any) -> str | None:
    """A plain JSON scalar's text as ``json.dumps`` writes it; None for anything else (containers, subclasses,
    non-finite floats: json's own encoder takes them, and raises where it does)."""
    t = type(x)
    if t is str:
        return encode_basestring(x)
    if t is int:
        return int.__repr__(x)
    if t is float:
        return float.__repr__(x) if math.isfinite(x) else None
    if x is None:
        return "null"
    if x is True:
        return "true"
    if x is False:
        return "false"
    return None


@functools.lru_cache(maxsize=4096)
def _key_text(key: str) -> str:
    return encode_basestring(key) + ": "


def _text(x: Any, depth: int) -> str:
    """The text of ``json.dumps(x, indent=1, allow_nan=False, ensure_ascii=False)`` as it reads `depth` levels deep
    (:func:`_nested` applied `depth` times), made by joining its items' texts: json's own encoder takes its
    pure-Python path whenever it indents (a generator per container, a yield per token), 3-5 x slower on the
    report's per-rank lists (at 1,024 ranks, 16 k values each)."""
    s = _scalar_text(x)
    if s is not None:
        return s
    t = type(x)
    if t is list or t is tuple:
        if not x:
            return "[]"
        nl = "\n" + " " * (depth + 1)
        return "[" + nl + ("," + nl).join([_text(v, depth + 1) for v in x]) + "\n" + " " * depth + "]"
    if t is dict and all(type(k) is str for k in x):
        if not x:
            return "{}"
        nl = "\n" + " " * (depth + 1)
        return ("{" + nl + ("," + nl).join([_key_text(k) + _text(v, depth + 1) for k, v in x.items()])
                + "\n" + " " * depth + "}")
    return _dumps(x).replace("\n", "\n" + " " * depth)  # anything else: json's own (and its errors)


def _nested(text: str) -> str:
    """`text` (a value dumped at indent 1) as it reads one level deeper: JSON text holds no raw newline inside a
    string, so every newline starts an indented line."""
    return text.replace("\n", "\n ")


#: A non-finite float's text in a column dumped by json's C encoder (allow_nan), which report.json writes as null.
_NON_FINITE = {"NaN", "Infinity", "-Infinity"}


def _column_text(values: np.ndarray) -> list[str]:
    """Each value of a numeric column as JSON text, as ``json.dumps`` writes it (ints and floats by their repr,
    booleans as true/false), non-finite floats as null: one call of json's C encoder for the column."""
    text = json.dumps(values.tolist())[1:-1].split(", ")
    if values.dtype.kind == "f" and not np.isfinite(values).all():
        text = ["null" if t in _NON_FINITE else t for t in text]
    return text


def _record_rows_text(rows: np.ndarray) -> str:
    """The rows of a numeric record array as report.json writes a list of one object per row, two levels deep: the
    same text as dumping their dicts with ``indent=1`` (tests hold it so), made a column at a time (json's own
    encoder takes the pure-Python path whenever it indents: 5.4 s for a 16,384-rank report, most of it this table)."""
    keys = [json.dumps(str(c), ensure_ascii=False).replace("%", "%%") for c in rows.dtype.names]
    template = "{\n   " + ",\n   ".join(f"{k}: %s" for k in keys) + "\n  }"
    columns = [_column_text(rows[c]) for c in rows.dtype.names]
    return ",\n  ".join([template % r for r in zip(*columns)])


def iter_json(report: Report | dict[str, Any]) -> Iterator[str]:
    """The text of :func:`render_json`, a top-level key at a time and a step table a part at a time, so that
    writing a report never holds the whole document (report.json's per-rank, per-step rows) in memory."""
    if not isinstance(report, Record):
        yield _dumps(report) + "\n"
        return
    items = list(report.json_fields())
    if not items:
        yield "{}\n"
        return
    for i, (key, v) in enumerate(items):
        yield ("{\n " if i == 0 else ",\n ") + _dumps(str(key)) + ": "
        if isinstance(getattr(v, "rows", None), np.ndarray) and v.rows.dtype.names and len(v):
            yield "["  # a record table (the step table): its rows' text made column by column
            for j, lo in enumerate(range(0, len(v), ROWS_PER_PART)):
                yield ("\n  " if j == 0 else ",\n  ") + _record_rows_text(v.rows[lo:lo + ROWS_PER_PART])
            yield "\n ]"
        elif hasattr(v, "json_parts") and len(v):
            yield "["
            for j, part in enumerate(v.json_parts(ROWS_PER_PART)):
                body = _dumps(part)  # "[\n {...},\n {...}\n]": its rows, one level deeper than a list of its own
                yield ("\n  " if j == 0 else ",\n  ") + _nested(body[3:-2])
            yield "\n ]"
        else:
            yield _text(jsonable(v), 1)
    yield "\n}\n"


def render_json(report: Report | dict[str, Any], *, indent: int | None = 1) -> str:
    """The report (or a plain JSON document) as JSON text (strict JSON: no NaN)."""
    if indent == 1:
        return "".join(iter_json(report))
    doc = report.to_json() if isinstance(report, Record) else report
    return json.dumps(doc, indent=indent, allow_nan=False, ensure_ascii=False) + "\n"


def write_json(report: Report | dict[str, Any], path: str | os.PathLike) -> Path:
    """Write the report to `path` (temporary file + rename, so a reader never sees half a file), a part at a time."""
    path = Path(path)
    n = 0
    with atomic_write(path) as fh:
        for text in iter_json(report):
            data = text.encode("utf-8")
            fh.write(data)
            n += len(data)
    logger.info("wrote %s (%d bytes)", path, n)
    return path
