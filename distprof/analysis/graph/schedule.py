"""The chained replay of a step graph, computed level by level: each value once, in an order that respects every
dependency, all values of a level at once (numpy).

    sched = schedule(g)                  # Schedule, or None where the graph's dependencies form a cycle
    a, z, rs_start, rs_end = replay_scheduled(g, sched)

**Values and what each waits for** (:mod:`.critical_path` defines them): an event's arrival ``A = anchor + gap``
(anchor: its rank-step's start ``B``, the previous event's arrival, or the previous event's end ``Z``); a *sync
unit*'s start ``S`` — the latest arrival of its members (a collective instance: all members; a receive: itself and its
send; a send or an unmatched receive: itself) — and each member event's end ``Z = S + x``; a rank-step's end
``E = tail anchor + tail``; a chained rank-step's start ``B = E(previous rank-step) + between`` (else its measured
start).

**Levels.** Each value gets a level such that everything it reads has a lower level, or the same level and an earlier
phase (a level computes, in order: arrivals, unit starts and ends, rank-step ends, chained starts). They are found by
raising levels until every dependency holds (integer relaxation, numpy), starting from a guess built from the
structure of a window: the levels of one step on its own (raised from a lower bound, an arrival's position in its
rank-step + 1), repeated for each position in the chain of steps — where ranks' steps line up (every instance's
members at the same position) the guess already holds and one pass checks it.
A graph whose levels never settle has a cycle (collectives in a different order on different ranks, with no time
between them): :func:`schedule` returns None and the caller relaxes instead.

**Cost.** The schedule is computed once per graph and kept with it (a what-if graph with other segment lengths shares
it). A replay then computes each value once: levels × a few numpy calls, however many events a level holds. Levels
grow with the steps of a window times the sync events of a step (a rank's chain of dependencies runs through all of
them). A what-if replays from the first level whose inputs it changes (:func:`first_changed_row`,
:func:`replay_values` with the measured replay's values as its base): the levels before it are the measured
replay's, bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..narrow import narrow
from .links import LINK_END, LINK_START

if TYPE_CHECKING:
    from collections.abc import Callable

    from .critical_path import StepGraph

__all__ = ["Schedule", "schedule", "replay_scheduled", "replay_values", "first_changed_row"]

# where an anchor is: an event's arrival, an event's end (a unit's start, for levels), a rank-step's start
_AT_A, _AT_Z, _AT_B = 0, 1, 2


@dataclass
class Schedule:
    """The replay's order: per phase the items sorted by level, and each non-empty level's slice of them."""

    levels: int
    a_ev: np.ndarray  # events by level
    a_src: np.ndarray  # their anchors, as indices into the values [A | Z | B]
    u_mem: np.ndarray  # members of the units, unit by unit, units by level
    u_mstart: np.ndarray  # where each unit's members begin in u_mem (+ the end)
    u_ev: np.ndarray  # the events whose end each unit sets, unit by unit, units by level
    u_ecount: np.ndarray  # how many per unit
    e_rs: np.ndarray  # rank-steps by the level of their end
    e_src: np.ndarray  # their tail anchors, as indices into the values
    b_rs: np.ndarray  # chained rank-steps by the level of their start
    # per level: [start, stop) into a_ev, into the units, into u_ev (events), into e_rs, into b_rs
    bounds: list[tuple[int, int, int, int, int, int, int, int, int, int]]
    # the row of bounds that reads each input (a replay from a later row: :func:`first_changed_row`): per event, its
    # gap's (its arrival's) and its transfer's (its end's); per rank-step, its tail's (its end's), the time between
    # it and its previous step's (its chained start's), and its measured start's (the first reader of an unchained
    # start; len(bounds) where nothing reads it)
    row_gap: np.ndarray
    row_transfer: np.ndarray
    row_tail: np.ndarray
    row_between: np.ndarray
    row_start: np.ndarray


def _units(g: StepGraph) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """Each event's sync unit, and the (unit, member event) pairs: a collective's instance, a receive with its send,
    an event on its own."""
    n = g.n_events
    p2p = np.flatnonzero(g.ev_group < 0)
    unit = g.ev_group.copy()
    unit[p2p] = g.n_groups + np.arange(p2p.size)
    recv = p2p[g.ev_partner[p2p] >= 0]
    mem_unit = np.r_[unit, unit[recv]]
    mem_ev = np.r_[np.arange(n), g.ev_partner[recv]].astype(np.intp)  # indexes every settling pass: intp
    return unit, mem_unit, mem_ev, int(g.n_groups + p2p.size)


@dataclass
class _Deps:
    """The dependencies as index arrays: an anchor's kind and index, for levels (into [A | U | B]) and for values
    (into [A | Z | B])."""

    n: int
    nu: int
    nrs: int
    # (the build lets each array go once it has read it: None then)
    unit: np.ndarray | None
    mem_order: np.ndarray | None  # member pairs sorted by unit
    mem_ev: np.ndarray | None
    mem_bounds: np.ndarray | None
    a_lsrc: np.ndarray | None
    a_vsrc: np.ndarray | None
    e_lsrc: np.ndarray | None
    e_vsrc: np.ndarray | None
    e_from_b: np.ndarray  # the tail hangs off the rank-step's start (its end one level after it)
    chained: np.ndarray


def _deps(g: StepGraph) -> _Deps:
    n, nrs = g.n_events, g.rs_rank.size
    unit, mem_unit, mem_ev, nu = _units(g)
    o = narrow(np.argsort(mem_unit, kind="stable"))
    mu = mem_unit[o]
    del mem_unit
    bounds = np.flatnonzero(np.r_[True, mu[1:] != mu[:-1]]) if mu.size else np.zeros(0, np.int64)
    del mu
    prev = np.maximum(g.ev_prev, 0)
    link = g.ev_link
    a_kind = np.where(link == LINK_START, _AT_B, np.where(link == LINK_END, _AT_Z, _AT_A)).astype(np.int8)
    a_idx = np.where(link == LINK_START, g.ev_rs, prev)
    last = np.maximum(g.rs_last, 0)
    tl = g.rs_tail_link
    e_kind = np.where(tl == LINK_START, _AT_B, np.where(tl == LINK_END, _AT_Z, _AT_A))
    e_idx = np.where(tl == LINK_START, np.arange(nrs), last)
    return _Deps(
        n=n, nu=nu, nrs=nrs, unit=unit, mem_order=o, mem_ev=mem_ev[o], mem_bounds=bounds,
        # the levels' sources index every settling pass (intp); the values' are read once, by the build (32 bits)
        a_lsrc=_index(a_kind, a_idx, unit, n, nu, levels=True),
        a_vsrc=_index(a_kind, a_idx, unit, n, nu, levels=False),
        e_lsrc=_index(e_kind, e_idx, unit, n, nu, levels=True),
        e_vsrc=_index(e_kind, e_idx, unit, n, nu, levels=False),
        e_from_b=e_kind == _AT_B, chained=g.rs_prev >= 0)


def _index(kind: np.ndarray, idx: np.ndarray, unit: np.ndarray, n: int, nu: int, *, levels: bool) -> np.ndarray:
    """Anchors as indices into the levels [A | U | B] (intp: every settling pass indexes with them) or into the
    values [A | Z | B] (32 bits where they fit: read once, by the build). Filled by kind into one array."""
    out = idx.astype(np.int64)  # an arrival: the event itself
    at_z = kind == _AT_Z
    if at_z.any():  # idx is an event there (a rank-step elsewhere: it may exceed the events)
        out[at_z] = n + (unit[idx[at_z]] if levels else idx[at_z]).astype(np.int64)
    del at_z
    out[kind == _AT_B] += n + nu if levels else 2 * n
    return out.astype(np.intp, copy=False) if levels else narrow(out)


def _settle(d: _Deps, g: StepGraph, lv: np.ndarray, lv_e: np.ndarray, *, chain: bool,
            max_passes: int) -> tuple[np.ndarray, np.ndarray] | None:
    """Raise the levels [A | U | B] and of the ends until every dependency holds (None: they never settle).

    Each pass also closes every rank-step's chain of arrivals: an arrival is at least one level after the one
    before it in its rank-step (its anchor is that arrival, or that event's end, which its unit holds at or after
    the arrival), so a rise runs to the rank-step's end in the same pass (a running maximum) instead of one sync
    event per pass. The levels are the same as without it (:func:`_settle_every_hop`: the least levels meeting the
    dependencies, from the same start); the passes are those it takes a rise to cross between ranks (1,024
    LLM-shaped ranks: 426 passes over 1.5 M events became 13, 3.9 s -> 0.24 s)."""
    return _until_settled(d, g, lv, lv_e, chain, max_passes, _chain_closer(d, g))


def _settle_every_hop(d: _Deps, g: StepGraph, lv: np.ndarray, lv_e: np.ndarray, *, chain: bool,
                      max_passes: int) -> tuple[np.ndarray, np.ndarray] | None:
    """:func:`_settle` without closing the chains: each pass raises a value by what it reads only (the definition
    it is tested against)."""
    return _until_settled(d, g, lv, lv_e, chain, max_passes, None)


def _until_settled(d: _Deps, g: StepGraph, lv: np.ndarray, lv_e: np.ndarray, chain: bool, max_passes: int,
                   close: Callable[[np.ndarray], bool] | None) -> tuple[np.ndarray, np.ndarray] | None:
    """Passes until one changes nothing (the levels), or None after `max_passes`."""
    for _ in range(max_passes):
        lv, lv_e, changed = _pass(d, g, lv, lv_e, chain, close)
        if not changed:
            return lv, lv_e
    return None


def _pass(d: _Deps, g: StepGraph, lv: np.ndarray, lv_e: np.ndarray, chain: bool,
          close: Callable[[np.ndarray], bool] | None) -> tuple[np.ndarray, np.ndarray, bool]:
    """One pass over every value: arrivals from their anchors (chains closed when `close` is given), units from
    their members, ends, chained starts; and whether any level rose. Levels only rise (each value takes the maximum
    of what it holds and what it reads, an unchained start stays 0), so a pass that raised none changed nothing: no
    copy of the levels is kept to compare with (1,024 LLM-shaped ranks: 18 MB), and the arrivals are raised in
    place."""
    n, nu = d.n, d.nu
    changed = False
    if n:
        arr = lv[:n]
        got = lv[d.a_lsrc]
        got += 1
        if (got > arr).any():
            changed = True
            np.maximum(arr, got, out=arr)
        del got
        if close is not None:
            changed |= close(arr)
        if d.mem_ev.size:
            units = lv[n:n + nu]
            got = np.maximum.reduceat(lv[d.mem_ev], d.mem_bounds)
            if (got > units).any():
                changed = True
                np.maximum(units, got, out=units)
    new_e = np.maximum(lv_e, lv[d.e_lsrc] + d.e_from_b)
    changed |= not np.array_equal(new_e, lv_e)
    if chain:
        prev = np.maximum(g.rs_prev, 0)
        b = np.where(d.chained, np.maximum(lv[n + nu:], new_e[prev] if prev.size else 0), 0)
        changed |= not np.array_equal(b, lv[n + nu:])
        lv[n + nu:] = b
    return lv, new_e, changed


def _chain_closer(d: _Deps, g: StepGraph) -> Callable[[np.ndarray], bool] | None:
    """A function raising, in place, each arrival's level to at least one more than the one before it in its
    rank-step (a running maximum of level − position, per run of events each hanging off the one just before it),
    and saying whether it raised any; None where the events are not laid out rank-step by rank-step with each one's
    anchor before it (then passes close the chains). An event hanging off an earlier one (it queued behind that
    one's end) starts a run of its own: it does not wait for the event just before it."""
    n = d.n
    if not n:
        return None
    prev = g.ev_prev
    pos = np.arange(n)
    if not (np.array_equal(prev >= 0, np.r_[False, g.ev_rs[1:] == g.ev_rs[:-1]])
            and bool(np.all(prev[prev >= 0] < pos[prev >= 0]))):
        return None
    del pos
    off = np.zeros(0, np.int64)  # seg * big − pos: level − position, each rank-step lifted by its own `big`
    big = 0

    def close(a: np.ndarray) -> bool:
        nonlocal off, big
        need = int(a.max()) + n + 1  # above any spread of level − position: rank-steps never mix
        if need > big:  # made again only as the levels grow past it (doubling): most passes reuse it
            big = max(2 * big, need)
            off = (np.cumsum((prev < 0) | (prev != np.arange(n) - 1)) - 1).astype(np.int64)  # each event's run
            off *= big
            off -= np.arange(n)
        v = a + off
        np.maximum.accumulate(v, out=v)
        v -= off
        if not (v > a).any():
            return False
        np.maximum(a, v, out=a)
        return True

    return close


def _anchor_depth(g: StepGraph) -> np.ndarray:
    """Each event's depth in its rank-step's chain of anchors (1 for the first): its position + 1 where every event
    hangs off the one just before it, less where some queued behind an earlier one's end."""
    n = g.n_events
    first = np.flatnonzero(np.r_[True, g.ev_rs[1:] != g.ev_rs[:-1]])
    pos = np.arange(n) - np.repeat(first, np.diff(np.r_[first, n]))
    prev = g.ev_prev
    hop = np.flatnonzero((prev >= 0) & (prev != np.arange(n) - 1))
    if not hop.size:
        return pos + 1
    depth = np.ones(n, np.int64)
    order = np.argsort(pos, kind="stable")
    cuts = np.searchsorted(pos[order], np.arange(1, int(pos.max()) + 2))
    for lo, hi in zip(cuts[:-1].tolist(), cuts[1:].tolist()):  # position by position: an anchor is at an earlier one
        ev = order[lo:hi]
        depth[ev] = depth[prev[ev]] + 1
    return depth


def _chain_position(g: StepGraph) -> np.ndarray:
    """Each rank-step's position in its chain of consecutive steps (rank-steps are sorted by rank and step, so a
    chain is a run of rows)."""
    nrs = g.rs_rank.size
    head = np.where(g.rs_prev < 0, np.arange(nrs), 0)
    return np.arange(nrs) - np.maximum.accumulate(head) if nrs else np.zeros(0, np.int64)


def _levels(g: StepGraph, d: _Deps) -> tuple[np.ndarray, np.ndarray] | None:
    """Levels of [A | U | B] and of the ends for the chained graph (None: a cycle)."""
    n, nu, nrs = d.n, d.nu, d.nrs
    cap = n + nu + 2 * nrs + 2
    # from a lower bound of each arrival's level (its depth in its rank-step's chain of anchors: every arrival is one
    # level after its anchor, an earlier event's arrival or end): the same levels as from 0, in a few passes where
    # from 0 it took a step's depth of them (each over every value)
    lv = np.zeros(n + nu + nrs, np.int64)
    if n:
        lv[:n] = _anchor_depth(g)
    local = _settle(d, g, lv, np.zeros(nrs, np.int64), chain=False, max_passes=cap)
    if local is None:
        return None
    lv, lv_e = local
    if not d.chained.any():
        return lv, lv_e
    # the guess: one step's levels, repeated for each position of the chain
    span = int(max(lv.max(initial=0), lv_e.max(initial=0))) + 1
    pos = _chain_position(g)
    off_ev = pos[g.ev_rs] * span if n else np.zeros(0, np.int64)
    lv[:n] += off_ev
    lv[n + nu:] = np.where(d.chained, pos * span, 0)
    lv_e = lv_e + pos * span
    if d.mem_ev.size:
        lv[n:n + nu] = np.maximum.reduceat(lv[d.mem_ev], d.mem_bounds)
    return _settle(d, g, lv, lv_e, chain=True, max_passes=cap)


def _by_level(level: np.ndarray, top: int) -> tuple[np.ndarray, np.ndarray]:
    """Items sorted by level, and where each level 0..top begins (+ the end)."""
    o = np.argsort(level.astype(np.int16) if top < 2**15 else level, kind="stable")  # a radix sort for int16
    return o, np.r_[0, np.cumsum(np.bincount(level, minlength=top + 1))]


def schedule(g: StepGraph) -> Schedule | None:
    """The replay's order for `g` (kept with the graph: computed once); None when its dependencies form a cycle."""
    cached = getattr(g, "_schedule", False)
    if cached is not False:
        return cached
    d = _deps(g)
    got = _levels(g, d)
    sched = None
    if got is not None:
        d.a_lsrc = d.e_lsrc = None  # the levels' sources: read by the settling passes only
        orders = _orders(d, *got)
        del got  # the levels: read by the orders only
        sched = _assemble(d, orders)
    g._schedule = sched
    return sched


@dataclass
class _Orders:
    """The replay's orders from the levels, before the values' indices are gathered in them (:func:`_assemble`)."""

    a_ev: np.ndarray
    u_ord: np.ndarray
    e_rs: np.ndarray
    b_rs: np.ndarray
    bounds: list[tuple[int, int, int, int, int, int, int, int, int, int]]
    rows: dict[str, np.ndarray]


def _orders(d: _Deps, lv: np.ndarray, lv_e: np.ndarray) -> _Orders:
    """Items by level, each level's row of bounds, and the row each input is first read at."""
    n, nu = d.n, d.nu
    top = int(max(lv.max(initial=0), lv_e.max(initial=0)))
    a_ev, a_off = _by_level(lv[:n], top)
    u_ord, u_off = _by_level(lv[n:n + nu], top)
    ecount = np.bincount(d.unit, minlength=nu) if n else np.zeros(nu, np.int64)
    u_estart = np.r_[0, np.cumsum(ecount[u_ord])].astype(np.int64)
    del ecount
    e_rs, e_off = _by_level(lv_e, top)
    chained = np.flatnonzero(d.chained)
    bo, b_off = _by_level(lv[n + nu:][chained], top)
    bounds = []
    row_of = np.zeros(top + 1, np.int64)  # each level's row in bounds (an empty level: the next one's)
    for k in range(top + 1):
        row = (int(a_off[k]), int(a_off[k + 1]), int(u_off[k]), int(u_off[k + 1]), int(u_estart[u_off[k]]),
               int(u_estart[u_off[k + 1]]), int(e_off[k]), int(e_off[k + 1]), int(b_off[k]), int(b_off[k + 1]))
        row_of[k] = len(bounds)
        if row[0] < row[1] or row[2] < row[3] or row[6] < row[7] or row[8] < row[9]:
            bounds.append(row)
    # the rows each input is first read at (read once per what-if) in 32 bits where they fit
    rows = _rows(d, lv, lv_e, narrow(row_of), len(bounds))  # gathered from 32-bit rows: no int64 copy first
    return _Orders(a_ev=a_ev, u_ord=u_ord, e_rs=e_rs, b_rs=chained[bo], bounds=bounds, rows=rows)


def _assemble(d: _Deps, o: _Orders) -> Schedule:
    """The schedule: the values' indices gathered in the orders `o`. It consumes `d`: each dependency array is let
    go once gathered, so the schedule's arrays replace them instead of piling up beside them (1,024 LLM-shaped
    ranks: the build's peak over the graph 145 -> 102 MB traced). The replay's own index arrays are intp: numpy
    converts any other index dtype on every use, and the replay indexes with them level by level for every what-if
    (int32 there: the replays 1.5 x slower at 1,024 LLM-shaped ranks)."""
    n, nu = d.n, d.nu
    a_src = d.a_vsrc[o.a_ev].astype(np.intp)
    d.a_vsrc = None
    e_src = d.e_vsrc[o.e_rs].astype(np.intp)
    # the units' members, unit by unit in level order
    mcount = np.diff(np.r_[d.mem_bounds, d.mem_ev.size]) if nu else np.zeros(0, np.int64)
    u_mem = (d.mem_ev[_ranges(d.mem_bounds[o.u_ord], mcount[o.u_ord])] if nu else np.zeros(0, np.int64))
    d.mem_ev = d.mem_bounds = None
    u_mstart = np.r_[0, np.cumsum(mcount[o.u_ord])].astype(np.intp)
    del mcount
    # the events whose end each unit sets: the member pairs begin with (unit of e, e) for every event e
    ecount = np.bincount(d.unit, minlength=nu) if n else np.zeros(nu, np.int64)
    d.unit = None
    ev_by_unit = d.mem_order[d.mem_order < n]
    d.mem_order = None
    estart = np.r_[0, np.cumsum(ecount)][:-1] if nu else np.zeros(0, np.int64)
    u_ev = ev_by_unit[_ranges(estart[o.u_ord], ecount[o.u_ord])] if nu else np.zeros(0, np.int64)
    del ev_by_unit, estart
    return Schedule(levels=len(o.bounds), a_ev=o.a_ev, a_src=a_src, u_mem=u_mem.astype(np.intp, copy=False),
                    u_mstart=u_mstart, u_ev=u_ev.astype(np.intp, copy=False), u_ecount=ecount[o.u_ord],
                    e_rs=o.e_rs, e_src=e_src, b_rs=o.b_rs, bounds=o.bounds, **o.rows)


def _rows(d: _Deps, lv: np.ndarray, lv_e: np.ndarray, row_of: np.ndarray, nrows: int) -> dict[str, np.ndarray]:
    """The row of the schedule's bounds at which each input is first read (`row_of`: each level's row; `nrows`
    where nothing reads it)."""
    n, nu, nrs = d.n, d.nu, d.nrs
    row_a, row_e = row_of[lv[:n]], row_of[lv_e]
    # an unchained start is read by the arrivals and the tails anchored on it; a chained one is computed
    row_start = np.full(nrs, nrows, np.int64)
    from_b = d.a_vsrc >= 2 * n
    np.minimum.at(row_start, d.a_vsrc[from_b] - 2 * n, row_a[from_b])
    np.minimum.at(row_start, np.flatnonzero(d.e_from_b), row_e[d.e_from_b])
    row_start[d.chained] = nrows
    return {"row_gap": row_a, "row_transfer": row_of[lv[n:n + nu]][d.unit] if n else np.zeros(0, np.int64),
            "row_tail": row_e, "row_between": np.where(d.chained, row_of[lv[n + nu:]], nrows),
            "row_start": row_start}


def _ranges(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """The indices start, start+1, … (count of them) of each range, concatenated."""
    total = int(counts.sum())
    if total == 0:
        return np.zeros(0, np.int64)
    offs = np.r_[0, np.cumsum(counts)[:-1]]
    return np.repeat(starts - offs, counts) + np.arange(total)


def replay_scheduled(g: StepGraph, s: Schedule) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Arrivals, ends, rank-step starts and ends of the chained graph `g` in the order `s`."""
    n = g.n_events
    v, end = replay_values(g, s)
    return v[:n], v[n:2 * n], v[2 * n:], end


def first_changed_row(s: Schedule, g: StepGraph, other: StepGraph) -> int:
    """The first row of ``s.bounds`` that reads an input (a segment, a transfer, a tail, the time between steps, an
    unchained start) that differs between the graphs `g` and `other` (same structure); len(s.bounds) when none does.
    Every value of an earlier row is then the same in both replays, bit for bit."""
    first = len(s.bounds)
    for row, mine, theirs in ((s.row_gap, g.ev_gap, other.ev_gap), (s.row_transfer, g.ev_transfer, other.ev_transfer),
                              (s.row_tail, g.rs_tail, other.rs_tail), (s.row_between, g.rs_between, other.rs_between),
                              (s.row_start, g.rs_start, other.rs_start)):
        if mine is theirs or not mine.size:
            continue
        diff = _bits(mine) != _bits(theirs)
        if diff.any():
            first = min(first, int(row[diff].min()))
    return first


def _bits(x: np.ndarray) -> np.ndarray:
    """The float64 values' bit patterns (NaN and −0.0 compared as stored)."""
    return np.ascontiguousarray(x, np.float64).view(np.int64)


def replay_values(g: StepGraph, s: Schedule, *, base: tuple[np.ndarray, np.ndarray] | None = None,
                  from_row: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The values [A | Z | B] and the rank-step ends of the chained graph `g` in the order `s`. With `base` (the
    values and ends of a replay of a graph whose inputs read before row `from_row` are those of `g`:
    :func:`first_changed_row`), the rows before `from_row` are taken from it and only the rest is computed."""
    n, nrs = g.n_events, g.rs_rank.size
    if base is None or from_row <= 0:
        v = np.empty(2 * n + nrs)  # [A | Z | B]
        v[2 * n:] = g.rs_start
        end = np.empty(nrs)
        from_row = 0
    else:
        v, end = base[0].copy(), base[1].copy()
        heads = g.rs_prev < 0
        v[2 * n:][heads] = g.rs_start[heads]
    gap, x, tail = g.ev_gap, g.ev_transfer, g.rs_tail
    prev, between = g.rs_prev, g.rs_between
    for a0, a1, u0, u1, e0, e1, r0, r1, b0, b1 in s.bounds[from_row:]:
        if a0 < a1:
            ev = s.a_ev[a0:a1]
            v[ev] = v[s.a_src[a0:a1]] + gap[ev]
        if u0 < u1:
            m0 = s.u_mstart[u0]
            start = np.maximum.reduceat(v[s.u_mem[m0:s.u_mstart[u1]]], s.u_mstart[u0:u1] - m0)
            ev = s.u_ev[e0:e1]
            v[n + ev] = np.repeat(start, s.u_ecount[u0:u1]) + x[ev]
        if r0 < r1:
            rs = s.e_rs[r0:r1]
            end[rs] = v[s.e_src[r0:r1]] + tail[rs]
        if b0 < b1:
            rs = s.b_rs[b0:b1]
            v[2 * n + rs] = end[prev[rs]] + between[rs]
    return v, end
