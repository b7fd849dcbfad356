"""What every terminal page of distprof is made of: text safe to print, and the table, wrapping and colour helpers.

Names in a report come from traces and shards, and a name holding ``\x1b]0;TITLE\x07`` or ``\nVerdict: ...`` must
print as text, not retitle the terminal or forge a line. :func:`terminal_text` escapes control characters and
shortens a run of more than ``MAX_TOKEN`` non-blank characters in the middle; :func:`terminal_safe` returns a copy of
a record tree (a Report, a section, a list or dict of them) with every string in it, dict keys included, passed
through it — and every value as report.json holds it (non-finite floats None, numpy scalars plain), so that a report
prints the same whether built here or read back from its JSON.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
import textwrap
from typing import Any

import numpy as np

from ..analysis.names import display_name

__all__ = ["MAX_TOKEN", "WIDTH", "Style", "fmt", "name", "table", "terminal_safe", "terminal_text", "wrap"]

#: What a terminal would act on rather than print: C0 controls (newline, carriage return, escape, bell, ...), DEL, C1
#: controls (CSI, OSC, ...), bidirectional overrides/isolates and Unicode line/paragraph separators.
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
#: Longest run of non-blank characters printed whole (a path fits; a 10,000-character name does not).
MAX_TOKEN = 240
_LONG_TOKEN = re.compile(r"\S{%d,}" % (MAX_TOKEN + 1))
#: Width lines are wrapped to.
WIDTH = 116


def _escape(m: re.Match) -> str:
    c = m.group(0)
    return _ESCAPES.get(c) or (f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}")


def _shorten(m: re.Match) -> str:
    t = m.group(0)
    return t[: MAX_TOKEN // 2 - 1] + "…" + t[-(MAX_TOKEN // 2):]


def terminal_text(text: Any) -> str:
    """`text` safe to print on a terminal as one piece of a line: control characters escaped (``\\x1b``, ``\\n``),
    runs of more than MAX_TOKEN non-blank characters shortened in the middle."""
    s = str(text)
    if _UNSAFE.search(s):
        s = _UNSAFE.sub(_escape, s)
    if len(s) > MAX_TOKEN and _LONG_TOKEN.search(s):
        s = _LONG_TOKEN.sub(_shorten, s)
    return s


@functools.cache
def _init_fields(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls) if f.init)


def terminal_safe(x: Any) -> Any:
    """A copy of `x` — a record (a dataclass), a list, tuple or dict of them, or a plain value — with every string
    made terminal-safe (:func:`terminal_text`), dict keys included, and every number as report.json holds it
    (NaN and ±inf None, numpy scalars Python's). A record with nothing to change is returned as it is, and so is
    anything else (a numpy array, the step table: numbers only)."""
    t = type(x)
    if t is int or t is bool or x is None:  # most values: at once, not after five type tests
        return x
    if t is float:
        return x if math.isfinite(x) else None
    if isinstance(x, str):
        return terminal_text(x)
    if isinstance(x, dict):
        return {(terminal_text(k) if isinstance(k, str) else k): terminal_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [terminal_safe(v) for v in x]
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        names = _init_fields(type(x))
        old = [getattr(x, n) for n in names]
        new = [terminal_safe(v) for v in old]
        if all(a is b for a, b in zip(old, new)):
            return x  # nothing to make safe (most per-rank rows): no copy (16,384 ranks: 0.9 s of copies)
        return dataclasses.replace(x, **dict(zip(names, new)))
    if isinstance(x, np.generic):
        x = x.item()
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def name(x: Any, limit: int = 64) -> str:
    """A host, run id or device as a bounded name."""
    return display_name(str(x), limit)


def fmt(x: Any, spec: str = "{:.1f}", none: str = "-") -> str:
    """`x` formatted with `spec`, or `none` when it is None."""
    return none if x is None else spec.format(x)


def table(header: list[str], rows: list[list[str]], indent: str = "  ") -> list[str]:
    """Aligned columns: the first left-aligned, the others right-aligned; trailing blanks dropped."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]

    def line(cells: list[str]) -> str:
        return (indent + "  ".join(c.rjust(w) if i else c.ljust(w)
                                   for i, (c, w) in enumerate(zip(cells, widths)))).rstrip()

    return [line(header)] + [line(r) for r in rows]


def wrap(text: str, first: str, rest: str) -> list[str]:
    """`text` wrapped to WIDTH, the first line indented by `first`, the others by `rest` (words never broken)."""
    return textwrap.wrap(text, width=WIDTH, initial_indent=first, subsequent_indent=rest,
                         break_on_hyphens=False, break_long_words=False) or [first.rstrip()]


class Style:
    """ANSI bold and colours, or plain text when `color` is False."""

    def __init__(self, color: bool):
        self.color = color

    def _w(self, code: str, s: str) -> str:
        return f"\x1b[{code}m{s}\x1b[0m" if self.color else s

    def bold(self, s: str) -> str:
        return self._w("1", s)

    def red(self, s: str) -> str:
        return self._w("1;31", s)

    def dim(self, s: str) -> str:
        return self._w("2", s)

    def yellow(self, s: str) -> str:
        return self._w("33", s)
