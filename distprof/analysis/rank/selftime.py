"""Each event's own work, and the part of it outside the events nested in it (its self work).

*Own work* of an event: its duration less the time the rank's main thread spent waiting for communication inside it
(a rank that reached a collective first and waited there for a late peer did no more work, although its
``FSDP::pre_forward`` lasted longer). *Self work*: its own work less the own work of the events directly nested in
it on its track (window, device, thread) — whatever their kind (an op, a user region, a collective's call). A
parent and its children then never count the same time twice: a sleep inside ``DistributedDataParallel.forward``,
itself inside a closure optimizer's ``Optimizer.step#AdamW.step``, is the forward's self work alone.

Vectorised per track: events in (start, longest first) order; an event's depth is the events begun before it less
those ended by its start; its parent is the latest earlier event one level up. Where a trace nests badly (an event
that outlasts its parent), a child counts in its parent for the part of its span inside the parent's. Events of
zero duration have no own work and hold none.
"""

from __future__ import annotations

import numpy as np

from . import intervals as iv

__all__ = ["own_work_ns", "self_work_ns"]


def own_work_ns(ts: np.ndarray, dur: np.ndarray, on_main: np.ndarray, wait: iv.Intervals) -> np.ndarray:
    """Per event: its duration less the main thread's wait for communication (`wait`) inside it (events of the
    main thread, `on_main`; the others' own work is their duration)."""
    ts, dur = np.asarray(ts, np.int64), np.asarray(dur, np.int64)
    waited = np.zeros(dur.size, np.int64)
    if len(wait) and on_main.any():
        waited[on_main] = iv.measure_in_windows(wait, ts[on_main], ts[on_main] + dur[on_main])
    return dur - waited


def _parents(start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """For events of one track sorted by (start, −end), all of positive duration: the position of each one's
    parent (−1 at the top)."""
    n = start.size
    pos = np.arange(n, dtype=np.int64)
    depth = pos - np.searchsorted(np.sort(end), start, side="right")  # begun before it, less ended by its start
    depth = np.maximum(depth, 0)
    key = depth * (n + 1) + pos
    keys = np.sort(key)
    parent = np.full(n, -1, np.int64)
    deep = np.flatnonzero(depth > 0)
    if deep.size:
        k = np.searchsorted(keys, (depth[deep] - 1) * (n + 1) + pos[deep]) - 1
        cand = keys[np.maximum(k, 0)]
        ok = (k >= 0) & (cand // (n + 1) == depth[deep] - 1)
        parent[deep[ok]] = cand[ok] % (n + 1)
    return parent


def self_work_ns(ts: np.ndarray, dur: np.ndarray, track: np.ndarray, own: np.ndarray) -> np.ndarray:
    """Per event: its own work (`own`) less its direct children's on its track (`track`: one integer per track),
    never below 0."""
    ts, dur = np.asarray(ts, np.int64), np.asarray(dur, np.int64)
    own = np.asarray(own, np.int64)
    out = np.maximum(own, 0).astype(np.int64)
    live = np.flatnonzero(dur > 0)
    if live.size < 2:
        return out
    order = live[np.lexsort((-(ts[live] + dur[live]), ts[live], np.asarray(track)[live]))]
    tr = np.asarray(track)[order]
    cuts = np.r_[0, np.flatnonzero(tr[1:] != tr[:-1]) + 1, order.size]
    held = np.zeros(ts.size, np.float64)
    for a, b in zip(cuts[:-1].tolist(), cuts[1:].tolist()):
        rows = order[a:b]
        s, e = ts[rows], ts[rows] + dur[rows]
        par = _parents(s, e)
        child = np.flatnonzero(par >= 0)
        if not child.size:
            continue
        p = par[child]
        inside = np.clip((np.minimum(e[child], e[p]) - s[child]) / (e[child] - s[child]), 0.0, 1.0)
        np.add.at(held, rows[p], np.maximum(own[rows[child]], 0) * inside)
    return np.maximum(out - np.rint(held).astype(np.int64), 0)
