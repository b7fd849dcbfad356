"""Statistics per group of a labelled array, vectorised (one sort): what the straggler rule and the step graph's
replay both take; the rows of each group sorted by value; and the lookup of a steps-table column at (rank, step)
pairs."""

from __future__ import annotations

import numpy as np

__all__ = ["RowKey", "group_median", "rank_step_values", "sort_within", "unique_inverse", "unique_rows"]


def unique_rows(cols: tuple[np.ndarray, ...] | list[np.ndarray]) -> tuple[tuple[np.ndarray, ...], np.ndarray]:
    """The distinct rows of integer columns, sorted as ``np.unique(np.stack(cols, 1), axis=0)`` sorts them, and each
    row's index among them. The columns are packed into one int64 key where their ranges allow (one 1-D sort:
    ``axis=0`` sorts rows as opaque records, 0.45 s of a 128-rank report's 3.6 s), else left to ``axis=0``."""
    cols = [np.asarray(c).reshape(-1) for c in cols]
    if cols[0].size == 0:
        return tuple(np.zeros(0, np.int64) for _ in cols), np.zeros(0, np.int64)
    packed = RowKey.of(cols)
    if packed is None:
        uk, inv = np.unique(np.stack([c.astype(np.int64) for c in cols], axis=1), axis=0, return_inverse=True)
        return tuple(uk[:, j] for j in range(uk.shape[1])), inv.reshape(-1)
    key = packed.key(cols)
    uk, inv = unique_inverse(key)
    del key
    return packed.columns(uk), inv.reshape(-1)


class RowKey:
    """Rows of integer columns packed into one int64 each, in the rows' lexicographic order (the first column most
    significant): each column less its minimum, in mixed radix by the columns' spans."""

    def __init__(self, lows: list[int], spans: list[int]):
        self.lows, self.spans = lows, spans
        self.span = 1  # the packed keys lie in [0, span)
        for sp in spans:
            self.span *= sp

    @classmethod
    def of(cls, cols: list[np.ndarray], *, room: int = 1) -> RowKey | None:
        """The packing of non-empty 1-D integer (or integral float) `cols`; None where the keys times `room` would
        not fit below 2^62, or a value lies beyond ±2^62 (a uint64 minimum past int64 could not be subtracted; the
        in-place int64 steps of :meth:`key` may wrap on the way, and the exact key comes out all the same)."""
        lows, highs = [int(c.min()) for c in cols], [int(c.max()) for c in cols]
        if any(max(-lo, hi) >= 1 << 62 for lo, hi in zip(lows, highs)):
            return None
        out = cls(lows, [hi - lo + 1 for lo, hi in zip(lows, highs)])
        return out if out.span * room < 1 << 62 else None

    def key(self, cols: list[np.ndarray]) -> np.ndarray:
        """Each row's packed key (built in place, one column at a time: no int64 copy of a narrower column)."""
        key = np.zeros(cols[0].size, np.int64)
        for c, lo, sp in zip(cols, self.lows, self.spans):
            key *= sp
            key += _as_key_part(c)
            key -= lo
        return key

    def columns(self, key: np.ndarray) -> tuple[np.ndarray, ...]:
        """The columns of packed keys (int64)."""
        out = []
        for lo, sp in zip(reversed(self.lows), reversed(self.spans)):
            key, digit = np.divmod(key, sp)
            out.append(digit + lo)
        return tuple(reversed(out))


def unique_inverse(key: np.ndarray, *, narrow: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(key, return_inverse=True)`` for integer keys, holding less at once: one argsort and one sorted
    copy, the inverse made by one cumulative sum written through the sort order (``np.unique`` holds its int64
    cumulative sum, a shifted copy of it and the inverse together: over the 1.39 M instance rows of 1,024
    LLM-shaped ranks it set the straggler analysis's peak). With `narrow`, the inverse is int32 where the distinct
    values fit (int64 otherwise, as ``np.unique`` gives it: callers multiplying it into keys need the width)."""
    key = np.asarray(key).reshape(-1)
    if key.dtype.kind not in "iub":
        u, inv = np.unique(key, return_inverse=True)
        return u, inv.reshape(-1)
    if key.size == 0:
        return key.copy(), np.zeros(0, np.int64)
    dense = _dense_unique_inverse(key, narrow)
    if dense is not None:
        return dense
    perm = np.argsort(key)
    aux = key[perm]
    new = np.empty(aux.size, bool)
    new[0] = True
    np.not_equal(aux[1:], aux[:-1], out=new[1:])
    u = aux[new]
    del aux
    dt = np.int32 if narrow and u.size <= np.iinfo(np.int32).max else np.int64
    pos = np.cumsum(new, dtype=dt)
    del new
    pos -= 1
    inv = np.empty(key.size, dt)
    inv[perm] = pos
    return u, inv


#: Keys spanning at most this many values per key (plus DENSE_SLACK) are counted into a table of their span, not
#: sorted: what the straggler analysis's cells and blame keys are (ranks × steps, packed densely).
DENSE_SPAN_PER_KEY, DENSE_SLACK = 4, 1 << 16


def _dense_unique_inverse(key: np.ndarray, narrow: bool) -> tuple[np.ndarray, np.ndarray] | None:
    """:func:`unique_inverse` of integer keys whose span is small beside their count: a table over the span marks
    the values present, its cumulative sum (int32: no more memory than the sort's copies) numbers them — two passes,
    no sort (the straggler analysis's cells, 1.4 M rows over 5,120 values: 0.05 s sorted). None for a wider span
    (a table of 8 × the keys raised the straggler analysis's peak by 15 MB at 1,024 LLM-shaped ranks), or values
    beyond ±2^62."""
    lo, hi = int(key.min()), int(key.max())
    span = hi - lo + 1
    if span > DENSE_SPAN_PER_KEY * key.size + DENSE_SLACK or max(-lo, hi) >= 1 << 62:
        return None
    off = key.astype(np.intp)
    off -= lo
    present = np.zeros(span, bool)
    present[off] = True
    u = np.flatnonzero(present)
    number = np.cumsum(present, dtype=np.int32 if span <= np.iinfo(np.int32).max else np.int64)  # 4 B per value
    del present
    number -= 1
    inv = number[off]
    del number, off
    if not narrow or u.size > np.iinfo(np.int32).max:
        inv = inv.astype(np.int64, copy=False)
    u += lo
    return u.astype(key.dtype, copy=False), inv


def _as_key_part(c) -> np.ndarray:
    """A column as 1-D integers that add into an int64 key in place: signed integers and bools as they are (no
    copy), other dtypes (uint64, floats) as int64."""
    c = np.asarray(c).reshape(-1)
    return c if c.dtype.kind in "ib" or (c.dtype.kind == "u" and c.dtype.itemsize < 8) else c.astype(np.int64)


def sort_within(g: np.ndarray, v: np.ndarray, *, later_first: bool = False) -> np.ndarray:
    """The order ``np.lexsort((v, g))`` gives: the rows by integer group `g`, then by value `v` (NaN last), rows of
    equal value in index order — or, `later_first`, in reverse index order (``np.lexsort((-index, v, g))``).

    The same order from two unstable sorts of one key each, which numpy vectorises (x86-simd-sort), where
    ``lexsort``'s stable indirect sorts compare through the index: 0.12 s against 0.45 s for 1.4 M rows, and the
    straggler analysis sorts its instances' rows this way several times (1,024 LLM-shaped ranks, 1.2–1.4 M rows).
    Integer values make the key ``group * span + value`` themselves; other values, by their rank among the distinct
    values (a sort of its own), ``group * distinct + rank``. A run of rows with equal keys (equal values in one
    group) is then put in index order. Left to ``np.lexsort`` when `g` is not integer or the key would not fit an
    int64."""
    g, v = np.asarray(g).reshape(-1), np.asarray(v).reshape(-1)
    n = g.size
    if n < 2 or g.dtype.kind not in "iub" or v.dtype.kind not in "iubf":
        return _lexsort_within(g, v, later_first)
    g0 = int(g.min())
    key = _direct_key(g, v) if v.dtype.kind in "iub" else None
    if key is None:
        key = _rank_key(g, g0, v)
    if key is None:
        return _lexsort_within(g, v, later_first)
    o = np.argsort(key)
    ks = key[o]
    del key
    tie = ks[1:] == ks[:-1]
    if tie.any():  # each run of equal keys in index order (the runs are contiguous: reordered in place)
        pos = np.flatnonzero(np.r_[tie, False] | np.r_[False, tie])
        run = (np.cumsum(np.r_[True, ~tie]) - 1)[pos]
        sub = o[pos]
        o[pos] = sub[np.argsort(run * n + (n - 1 - sub if later_first else sub))]
    return o


def _direct_key(g: np.ndarray, v: np.ndarray) -> np.ndarray | None:
    """Integer values: the rows (group, value) packed as they are (:class:`RowKey`), where that fits an int64 (one
    sort: the values' own ranks need a sort of their own, 0.1 s per 1.4 M rows). None where it would not fit."""
    packed = RowKey.of([g, v])
    return None if packed is None else packed.key([g, v])


def _rank_key(g: np.ndarray, g0: int, v: np.ndarray) -> np.ndarray | None:
    """Any values: the key ``(group - g0) * distinct + (the value's rank among the distinct values)`` (equal values,
    NaNs among them, share one rank); None where it would not fit an int64."""
    n = g.size
    # each temporary is let go once read, and the key built in place: this runs over every instance row (1.4 M at
    # 1,024 LLM-shaped ranks, 11 MB an int64 column), several times per report
    ov = np.argsort(v)
    vs = v[ov]
    up = vs[1:] != vs[:-1]  # where the next distinct value starts
    if vs.dtype.kind == "f":
        up &= ~(np.isnan(vs[1:]) & np.isnan(vs[:-1]))  # NaNs compare unequal, and lexsort keeps them together
    del vs
    sorted_rank = np.empty(n, np.int64)
    sorted_rank[0] = 0
    np.cumsum(up, out=sorted_rank[1:])
    del up
    distinct = int(sorted_rank[-1]) + 1
    if (int(g.max()) - g0 + 1) * distinct >= 1 << 62:
        return None
    rank = np.empty(n, np.int64)
    rank[ov] = sorted_rank
    del ov, sorted_rank
    key = g.astype(np.int64)
    key -= g0
    key *= distinct
    key += rank
    return key


def _lexsort_within(g: np.ndarray, v: np.ndarray, later_first: bool) -> np.ndarray:
    """:func:`sort_within`'s order by ``np.lexsort`` itself."""
    return np.lexsort((-np.arange(g.size), v, g)) if later_first else np.lexsort((v, g))


def group_median(g: np.ndarray, v: np.ndarray, n_groups: int) -> np.ndarray:
    """Per-group median of v (NaN for empty groups); g in 0..n_groups−1."""
    o = sort_within(g, v)
    gs, vs = g[o], np.asarray(v, np.float64)[o]
    cnt = np.bincount(gs, minlength=n_groups)
    first = np.r_[0, np.cumsum(cnt)[:-1]]
    med = np.full(n_groups, np.nan)
    ok = cnt > 0
    lo = first[ok] + (cnt[ok] - 1) // 2
    hi = first[ok] + cnt[ok] // 2
    med[ok] = (vs[lo] + vs[hi]) / 2
    return med


def rank_step_values(steps: dict[str, np.ndarray], column: str, rank: np.ndarray, step: np.ndarray,
                     missing: float = np.nan) -> np.ndarray:
    """`column` of the steps-table row of each (rank, step) pair (one sort and a binary search); `missing` where the
    table has no such row, no such column, or the step is negative (no step)."""
    rank, step = np.asarray(rank, np.int64), np.asarray(step, np.int64)
    out = np.full(rank.size, missing, np.float64)
    if column not in steps or np.asarray(steps["step"]).size == 0 or rank.size == 0:
        return out
    srank, sstep = np.asarray(steps["rank"], np.int64), np.asarray(steps["step"], np.int64)
    span = int(max(int(sstep.max()), int(step.max()))) + 2
    key = srank * span + sstep + 1
    o = np.argsort(key, kind="stable")
    want = rank * span + np.where(step >= 0, step, -1) + 1
    i = np.clip(np.searchsorted(key[o], want), 0, key.size - 1)
    hit = (key[o][i] == want) & (step >= 0)
    out[hit] = np.asarray(steps[column], np.float64)[o][i[hit]]
    return out
