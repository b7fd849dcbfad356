"""Interval sets on int64 nanosecond timelines: union, intersection, difference, measure — vectorised with numpy.

An interval set is an :class:`Intervals` pair of int64 arrays ``(s, e)`` of half-open intervals ``[s, e)``. Functions
that return a set always return a *normalised* set: sorted, pairwise disjoint, non-empty, and with touching intervals
merged. Functions documented as taking a normalised set (``intersect``, ``subtract``, ``measure_in_windows``) do not
check it; pass the result of :func:`union` or of another function here.

The union is HTA's ``merge_kernel_intervals`` idea: sort by start, a new group begins where a start lies after the
cumulative maximum of the previous ends. Binary operations sweep the boundaries of two normalised sets once.
The ``*_ref`` functions are slow pure-Python references used by the tests.
"""

from __future__ import annotations

import logging
from typing import Callable, NamedTuple

import numpy as np

logger = logging.getLogger(__name__)

__all__ = [
    "Intervals",
    "empty",
    "union",
    "union_all",
    "intersect",
    "subtract",
    "measure",
    "measure_in_windows",
    "union_ref",
    "intersect_ref",
    "subtract_ref",
    "measure_in_windows_ref",
]


class Intervals(NamedTuple):
    """Half-open intervals ``[s[i], e[i])`` in int64 ns."""

    s: np.ndarray
    e: np.ndarray

    def __len__(self) -> int:  # number of intervals
        return int(self.s.shape[0])

    @property
    def total(self) -> int:
        """Sum of lengths (the measure when the set is normalised)."""
        return int(np.sum(self.e - self.s)) if self.s.size else 0


def empty() -> Intervals:
    return Intervals(np.zeros(0, np.int64), np.zeros(0, np.int64))


def _as_i64(a) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(a), dtype=np.int64).reshape(-1)


def union(starts, ends) -> Intervals:
    """Normalised union of arbitrary (overlapping, unsorted) intervals ``[starts, ends)``; empty ones are dropped."""
    s = _as_i64(starts)
    e = _as_i64(ends)
    if s.shape != e.shape:
        raise ValueError(f"starts and ends differ in length ({s.size} vs {e.size})")
    keep = e > s
    s, e = s[keep], e[keep]
    if s.size == 0:
        return empty()
    order = np.argsort(s, kind="stable")
    s, e = s[order], e[order]
    reach = np.maximum.accumulate(e)
    new = np.empty(s.size, dtype=bool)
    new[0] = True
    new[1:] = s[1:] > reach[:-1]  # touching intervals (s == previous reach) merge
    first = np.flatnonzero(new)
    last = np.r_[first[1:] - 1, s.size - 1]
    return Intervals(s[first], reach[last])


def union_all(*sets: Intervals) -> Intervals:
    """Normalised union of several interval sets."""
    if not sets:
        return empty()
    return union(np.concatenate([x.s for x in sets]), np.concatenate([x.e for x in sets]))


def _sweep(a: Intervals, b: Intervals, keep: Callable[[np.ndarray], np.ndarray]) -> Intervals:
    """Segments where ``keep(state)`` holds, state = 1·[in a] + 2·[in b]; a and b normalised."""
    if len(a) == 0 and len(b) == 0:
        return empty()
    t = np.concatenate([a.s, a.e, b.s, b.e])
    d = np.concatenate(
        [
            np.ones(len(a), np.int8),
            -np.ones(len(a), np.int8),
            np.full(len(b), 2, np.int8),
            np.full(len(b), -2, np.int8),
        ]
    )
    order = np.argsort(t, kind="stable")
    t = t[order]
    state = np.cumsum(d[order], dtype=np.int64)
    # Several boundaries at one instant: the state after all of them holds from that instant on.
    last_at_t = np.r_[t[1:] != t[:-1], True]
    t, state = t[last_at_t], state[last_at_t]
    sel = keep(state[:-1])
    s, e = t[:-1][sel], t[1:][sel]
    if s.size == 0:
        return empty()
    brk = np.r_[True, s[1:] != e[:-1]]  # merge adjacent selected segments
    return Intervals(s[brk], e[np.r_[brk[1:], True]])


def intersect(a: Intervals, b: Intervals) -> Intervals:
    """a ∩ b (both normalised)."""
    if len(a) == 0 or len(b) == 0:
        return empty()
    return _sweep(a, b, lambda st: st == 3)


def subtract(a: Intervals, b: Intervals) -> Intervals:
    """a \\ b (both normalised)."""
    if len(a) == 0 or len(b) == 0:
        return a
    return _sweep(a, b, lambda st: st == 1)


def measure(a: Intervals) -> int:
    """Total length of a normalised set (use ``measure(union(s, e))`` for raw intervals)."""
    return a.total


def measure_in_windows(a: Intervals, wstart, wend) -> np.ndarray:
    """``|a ∩ [wstart[i], wend[i])|`` for every window i (a normalised; windows may overlap), as int64."""
    ws = _as_i64(wstart)
    we = _as_i64(wend)
    if ws.shape != we.shape:
        raise ValueError(f"window starts and ends differ in length ({ws.size} vs {we.size})")
    if len(a) == 0 or ws.size == 0:
        return np.zeros(ws.size, np.int64)
    we = np.maximum(we, ws)
    cum = np.concatenate([[0], np.cumsum(a.e - a.s)])

    def covered_before(t: np.ndarray) -> np.ndarray:  # |a ∩ (-inf, t)|
        i = np.searchsorted(a.s, t, side="right")  # intervals starting at or before t
        beyond = np.where(i > 0, np.clip(a.e[np.maximum(i - 1, 0)] - t, 0, None), 0)
        return cum[i] - beyond

    return covered_before(we) - covered_before(ws)


# --------------------------------------------------------------------------------------------------------------
# Slow references (plain Python), for tests.


def union_ref(starts, ends) -> Intervals:
    pairs = sorted((int(s), int(e)) for s, e in zip(starts, ends) if e > s)
    out: list[list[int]] = []
    for s, e in pairs:
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return Intervals(np.array([p[0] for p in out], np.int64), np.array([p[1] for p in out], np.int64))


def _pieces(a: Intervals, b: Intervals, want: Callable[[bool, bool], bool]) -> Intervals:
    cuts = sorted({int(x) for x in list(a.s) + list(a.e) + list(b.s) + list(b.e)})

    def inside(x: Intervals, lo: int, hi: int) -> bool:
        return any(s <= lo and hi <= e for s, e in zip(x.s, x.e))

    segs = [(lo, hi) for lo, hi in zip(cuts[:-1], cuts[1:]) if want(inside(a, lo, hi), inside(b, lo, hi))]
    return union_ref([p[0] for p in segs], [p[1] for p in segs])


def intersect_ref(a: Intervals, b: Intervals) -> Intervals:
    return _pieces(a, b, lambda x, y: x and y)


def subtract_ref(a: Intervals, b: Intervals) -> Intervals:
    return _pieces(a, b, lambda x, y: x and not y)


def measure_in_windows_ref(a: Intervals, wstart, wend) -> np.ndarray:
    out = []
    for lo, hi in zip(wstart, wend):
        out.append(sum(max(0, min(int(e), int(hi)) - max(int(s), int(lo))) for s, e in zip(a.s, a.e)))
    return np.array(out, np.int64)
