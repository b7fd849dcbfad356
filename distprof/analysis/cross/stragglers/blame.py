"""Blame: how long the other ranks waited for a rank at collectives — each waiting rank's waits counted once.

At each instance the members wait for its **last arriver**: member w from its arrival until the last one arrived (or
until its own collective ended, if earlier). A rank's **blame** is, summed over the waiting ranks, the *union* of
those waiting intervals over the instances it arrived last at, per step: a waiting rank's bucket all-reduces that
overlap in time (DDP issues the next before the previous has finished) are one wait, not two. So a waiting rank's
blame never exceeds its time in collectives: two buckets and a 30 ms delay are 30 ms of waiting, not 60. The same
union gives each rank's own wait (``wait_ms_per_step``, for anyone), its wait for the named stragglers (what the
``exposed_comm`` finding nets out) and a host's blame (the waits of the other hosts' ranks for its ranks).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ...groupstats import RowKey, sort_within, unique_rows

if TYPE_CHECKING:
    from .instances import Table

__all__ = ["Waits", "union_ms", "waits"]

NS_PER_MS = 1e6


class Waits:
    """Every waiting interval: per interval the waiting rank, the rank it waited for (the last arriver), the step key
    and the interval [lo, hi) (int ns)."""

    def __init__(self, waiter: np.ndarray, culprit: np.ndarray, skey: np.ndarray, lo: np.ndarray, hi: np.ndarray):
        self.waiter, self.culprit, self.skey, self.lo, self.hi = waiter, culprit, skey, lo, hi

    def subset(self, keep: np.ndarray) -> Waits:
        return Waits(self.waiter[keep], self.culprit[keep], self.skey[keep], self.lo[keep], self.hi[keep])


def waits(t: Table, skey: np.ndarray) -> Waits:
    """The waiting intervals of a non-empty instance table (rows sorted by instance, arrival); `skey` per row."""
    inst = t["inst"]
    n_inst = int(inst.max()) + 1
    last_row = np.zeros(n_inst, np.int64)
    last_row[inst[t["is_last"]]] = np.flatnonzero(t["is_last"])
    lr = last_row[inst]
    lo = t["arrival_ns"]
    hi = np.minimum(t["arrival_ns"][lr], t["end_ns"])
    keep = ~t["is_last"] & (hi > lo)
    return Waits(t["rank"][keep], t["rank"][lr][keep], skey[keep], lo[keep], hi[keep])


def union_ms(keys: tuple[np.ndarray, ...], lo: np.ndarray, hi: np.ndarray) -> tuple[tuple[np.ndarray, ...], np.ndarray]:
    """Per distinct key tuple: the length of the union of its intervals [lo, hi) (ms). Returns (the distinct keys,
    one array per key column, and their lengths)."""
    if lo.size == 0:
        return tuple(np.zeros(0, np.int64) for _ in keys), np.zeros(0)
    t0 = int(lo.min())
    span = int(hi.max()) - t0 + 1
    uk, k, o = _sorted_by_key_and_start(keys, lo, t0, span)
    # in place where it can be: these run over every waiting interval (1.3 M at 1,024 LLM-shaped ranks, 11 MB each)
    ks = k * span
    run_max = hi[o]
    run_max -= t0
    run_max += ks  # a running max of the ends that restarts at each key
    np.maximum.accumulate(run_max, out=run_max)
    prev = np.empty_like(run_max)
    prev[0] = -1
    np.subtract(run_max[:-1], ks[1:], out=prev[1:])
    del run_max, ks
    prev[np.r_[True, k[1:] != k[:-1]]] = -1
    a = lo[o]
    a -= t0
    np.maximum(a, prev, out=prev)  # where the interval's new cover starts
    del a
    covered = hi[o]
    covered -= t0
    covered -= prev
    del prev, o
    np.maximum(covered, 0, out=covered)
    return uk, np.bincount(k, weights=covered, minlength=len(uk[0])) / NS_PER_MS


def _sorted_by_key_and_start(keys: tuple[np.ndarray, ...], lo: np.ndarray, t0: int,
                             span: int) -> tuple[tuple[np.ndarray, ...], np.ndarray, np.ndarray]:
    """The distinct key tuples, and the intervals' order by (key, start) with each one's key index in that order.
    One sort of ``packed key × span + start`` where that fits an int64 (where the distinct keys and the order each
    took a sort of 1.2 M waits); else the keys' own unique and a sort within them. Intervals of one key and start
    may come in either order: the union does not depend on it."""
    packed = RowKey.of(keys, room=span)  # the keys below are in [0, 2^62): int64 steps wrapping on the way cancel
    if packed is None:
        uk, kidx = unique_rows(keys)
        o = sort_within(kidx, lo)
        return uk, kidx[o], o
    key = packed.key(keys)
    key *= span
    key -= t0
    key += lo
    o = np.argsort(key)
    k = key[o]
    del key
    k //= span  # the packed key of each interval, in order
    new = np.empty(k.size, bool)
    new[0] = True
    np.not_equal(k[1:], k[:-1], out=new[1:])
    uk = packed.columns(k[new])
    np.cumsum(new, out=k)
    k -= 1
    return uk, k, o
