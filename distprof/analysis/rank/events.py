"""Helpers over one rank's event arrays, shared by the per-rank measures: nesting (top-level and leaf ops, the
outermost op enclosing a call), gaps at the edges of step windows, membership in windows and interval sets, and the
heaviest names.
"""

from __future__ import annotations

import numpy as np

from ...storage.schema import KIND_CODE
from ..names import display_name
from . import intervals as iv

NS_PER_MS = 1e6
K_CPU_OP = KIND_CODE["cpu_op"]
K_ANNOT = KIND_CODE["user_annotation"]
K_KERNEL = KIND_CODE["kernel"]
K_CUDA_SYNC = KIND_CODE["cuda_sync"]


def top_level(ts: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Mask of events (sorted by start) not nested in an earlier one: start ≥ the running maximum of earlier ends."""
    if ts.size == 0:
        return np.zeros(0, bool)
    prev_end = np.maximum.accumulate(np.r_[np.iinfo(np.int64).min, end[:-1]])
    return ts >= prev_end


def edge_gaps(busy: iv.Intervals, ws: np.ndarray, we: np.ndarray) -> tuple[iv.Intervals, iv.Intervals]:
    """Per window [ws, we): (head, tail) - from ws to the first busy interval, and from the last one to we.

    A window with nothing busy is all head (its tail is empty)."""
    bs, be = busy.s, busy.e
    if bs.size == 0:
        return iv.union(ws, we), iv.empty()
    j = np.searchsorted(be, ws, side="right")  # first busy interval ending after ws
    first_s = np.where(j < bs.size, bs[np.minimum(j, bs.size - 1)], we)
    head_end = np.clip(first_s, ws, we)
    k = np.searchsorted(bs, we, side="left") - 1  # last busy interval starting before we
    last_e = np.where(k >= 0, be[np.maximum(k, 0)], ws)
    tail_start = np.clip(last_e, ws, we)
    head = iv.union(ws, head_end)
    return head, iv.subtract(iv.union(tail_start, we), head)


def boundary_gaps(busy: iv.Intervals, ws: np.ndarray, we: np.ndarray) -> iv.Intervals:
    """Per window [ws, we): the gaps from ws to the first busy interval and from the last one to we (normalised)."""
    return iv.union_all(*edge_gaps(busy, ws, we))


def starts_inside(starts: np.ndarray, sets: iv.Intervals) -> np.ndarray:
    """Mask: each start lies in a closed interval [s, e] of the normalised set."""
    if len(sets) == 0:
        return np.zeros(starts.size, bool)
    j = np.searchsorted(sets.s, starts, side="right") - 1
    return (j >= 0) & (sets.e[np.maximum(j, 0)] >= starts)


def in_windows(t: np.ndarray, ws: np.ndarray, we: np.ndarray) -> np.ndarray:
    """Mask: each time lies in one of the sorted, disjoint windows [ws, we)."""
    k = np.searchsorted(ws, t, side="right") - 1
    return (k >= 0) & (t < we[np.maximum(k, 0)])


def leaf_ops(ts: np.ndarray, end: np.ndarray, tid: np.ndarray) -> np.ndarray:
    """Mask of ops that enclose no other op of their thread (the op the thread is actually running)."""
    if ts.size == 0:
        return np.zeros(0, bool)
    o = np.lexsort((-end, ts, tid))  # by thread, start, longest first (a parent before a child starting with it)
    nxt_same = np.r_[tid[o][1:] == tid[o][:-1], False]
    nxt_ts = np.r_[ts[o][1:], 0]
    out = np.zeros(ts.size, bool)
    out[o] = ~(nxt_same & (nxt_ts < end[o]))
    return out


def outermost_op(op_ts, op_end, op_tid, op_nid, q_ts, q_end, q_tid) -> np.ndarray:
    """For each query interval, the name id of the top-level op of its thread that encloses it, else -1."""
    out = np.full(q_ts.size, -1, np.int64)
    for t in np.unique(q_tid).tolist():
        o = np.flatnonzero(op_tid == t)
        if o.size == 0:
            continue
        o = o[np.lexsort((-op_end[o], op_ts[o]))]
        o = o[top_level(op_ts[o], op_end[o])]
        q = np.flatnonzero(q_tid == t)
        j = np.searchsorted(op_ts[o], q_ts[q], side="right") - 1
        hit = (j >= 0) & (op_end[o][np.maximum(j, 0)] >= q_end[q])
        out[q[hit]] = op_nid[o][j[hit]]
    return out


def top_ids(nid: np.ndarray, weight: np.ndarray, k: int = 3) -> list[tuple[int, float]]:
    """The k ids with the largest total weight (> 0), as (id, total)."""
    if nid.size == 0:
        return []
    u, inv = np.unique(nid, return_inverse=True)
    tot = np.bincount(inv, weights=weight.astype(np.float64))
    top = np.argsort(-tot, kind="stable")[:k]
    return [(int(u[i]), float(tot[i])) for i in top if tot[i] > 0]


def op_label(names: np.ndarray, name_id: int) -> str:
    return display_name(str(names[name_id])) if name_id >= 0 else "(outside any op)"
