"""The cross-rank dependency graph of each step, its replay, and its critical path.

    g = step_graph(run)                  # StepGraph: every rank's step as work segments joined at sync events
    rp = replay(g)                       # Replay: arrivals / ends / step ends, recomputed from the segments
    rp = replay(g, chain=True)           # ... each step starting at the rank's previous step's replayed end
    cp = critical_paths(g, rp)           # CriticalPaths: per step, which ranks' segments the path runs through

**Events.** The sync events of a rank's step, on the aligned clock: its member rows of the matched collectives
(``RunSummary.collectives``, every member of an instance) and its ends of the matched point-to-point pairs
(``RunSummary.p2p``). Each event has an arrival ``a`` (the rank entered it) and an end ``z``. Its **start** ``S`` is
when it could proceed: a collective member's is the latest arrival of all the instance's members; a receive's the
later of its own arrival and its sender's; a send's its own arrival (a send does not wait for its receiver). Its
**transfer** ``x = max(z − S, 0)`` is its time after it could proceed: the data moving. ``S − a`` is **waiting**.

**Segments.** Per (rank, step) the events in arrival order, each preceded by a **work** segment, and a tail after the
last: the rank's own time between sync points. A segment hangs off the previous event's end when it began after it
(``a ≥ z_prev``: the rank — or its communication thread — had to finish the previous event first); else, where it
began the instant an earlier event ended, off that event's end (it queued behind it on its communication lane: gloo
runs a rank's collectives on two worker threads, NCCL a process group's on its stream; the event just before it ran
on another lane); else off the previous event's arrival (it ran concurrently: an asynchronous bucket all-reduce under
backward); the first off the rank's step start. Gap ``g = a − anchor``; the tail likewise from the last event to the
step's end, off its end also when the step ended after the event could proceed (``≥ S``) but before its exec event
ended: the rank waited for it (gloo's worker thread closes the event after the main thread went on), so the wait is
not counted as work.

**Replay.** ``a = anchor + g``, ``S`` from the arrivals as above, ``z = S + x``, step end = anchor of the tail + tail.
A step's start: unchained, where it was measured to begin; **chained** (``replay(g, chain=True)``, what the what-ifs
use), a rank-step whose previous step of the same window is recorded starts at that step's replayed end (plus the
time measured between the two, ~0: a step begins at the next forward), so what a rank does after its last sync point
of one step — its optimizer, a callback, the next batch's fetch — delays its first arrival in the next; a window's
first step and the step after an unrecorded one start where they were measured to (``rs_prev``, ``rs_between``).
The graph is acyclic in time. Unchained, repeated relaxation over all events at once (numpy, no per-event loop)
reaches the fixed point in at most its depth passes — one for the measured segments, which it reproduces (up to clock
error: an event that ends before its last member arrived has ``x`` clipped to 0); a pass after the first recomputes
only the arrivals whose inputs the previous one moved, while they are few (the same values and passes). Chained, the depth is a whole
window's, so the replay computes each value once, level by level (:mod:`.schedule`); a graph with a cycle
(collectives in a different order on different ranks) is relaxed instead. A what-if (:mod:`.whatif`) changes the
segments and replays.

**Critical path** of a step: from the rank whose step ends last, back through its tail, the event it hangs off —
through its transfer to the member that arrived last (the one whose arrival set ``S``) — and that member's work
segment, and so on, to a rank's step start. It runs through work segments (of a rank) and transfers (of a
collective or pair); never through waiting. ``CriticalPaths`` holds per step the path's length and its time per rank
and kind, and one step's segments in order (for the report's view).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from ...record import Record
from ..groupstats import group_median, sort_within, unique_inverse
from ..narrow import index_dtype, narrow, narrow_concat
from .links import KIND_COLL, KIND_RECV, KIND_SEND, LINK_ARRIVAL, LINK_END, LINK_START
from .schedule import replay_scheduled, schedule

if TYPE_CHECKING:
    from ..types import RunSummary

log = logging.getLogger(__name__)

__all__ = ["StepGraph", "Replay", "CriticalPaths", "PathSegment", "step_graph", "replay", "critical_paths",
           "LINK_START", "LINK_ARRIVAL", "LINK_END", "KIND_COLL", "KIND_SEND", "KIND_RECV", "group_median"]

NS_PER_MS = 1e6
#: An arrival this little before the previous event's end still counts as after it (timestamp grain, clock error).
END_SLACK_NS = 50_000
#: Segments of at most this many steps are listed in the report's view (one step: the median one).
MAX_PATH_SEGMENTS = 400


@dataclass
class StepGraph:
    """Events (one row each, sorted by rank-step then arrival) and the per rank-step chains (times: float ns,
    relative to ``t0`` so differences stay exact)."""

    t0: int
    # rank-steps (sorted by rank, step): the run.steps rows that have a step
    rs_rank: np.ndarray
    rs_step: np.ndarray
    rs_start: np.ndarray
    rs_end: np.ndarray
    rs_tail: np.ndarray  # tail segment length (ns)
    rs_tail_link: np.ndarray  # LINK_* of the tail
    rs_last: np.ndarray  # index of the last event of the rank-step, −1 without events
    rs_prev: np.ndarray  # the rank's previous step in the same window when it is recorded (step − 1), else −1
    rs_between: np.ndarray  # start − that step's end (ns; 0 unchained): time between the two, kept as measured
    # events
    ev_rs: np.ndarray  # rank-step row
    ev_rank: np.ndarray
    ev_step: np.ndarray
    ev_kind: np.ndarray  # KIND_*
    ev_group: np.ndarray  # collective instance (coll), −1 for p2p
    ev_op: np.ndarray  # collective op name id (into names), −1 for p2p
    ev_pg: np.ndarray
    ev_partner: np.ndarray  # receive: its send's event (−1: sender not in the graph); else −1
    ev_arrival: np.ndarray
    ev_end: np.ndarray
    ev_gap: np.ndarray  # work segment before the event (ns)
    ev_link: np.ndarray  # LINK_* of that segment
    ev_prev: np.ndarray  # the event the segment hangs off (the previous one, or the one it queued behind), −1 first
    ev_transfer: np.ndarray  # x (ns)
    names: np.ndarray  # collective op names
    n_groups: int
    # the rank's wait for a CPU within each work segment and tail (ns, NaN unknown: no cpu/samples, p2p events;
    # None: unknown for every event, the run's ranks sampled none)
    ev_cpu_wait: np.ndarray | None = None
    rs_tail_cpu_wait: np.ndarray | None = None

    @property
    def n_events(self) -> int:
        return int(self.ev_rank.size)

    def with_segments(self, *, gap: np.ndarray | None = None, tail: np.ndarray | None = None,
                      transfer: np.ndarray | None = None, start: np.ndarray | None = None) -> "StepGraph":
        """The same graph with other segment lengths or unchained step starts (what-ifs); it shares the structure's
        cached orders."""
        other = replace(self, ev_gap=self.ev_gap if gap is None else gap,
                        rs_tail=self.rs_tail if tail is None else tail,
                        ev_transfer=self.ev_transfer if transfer is None else transfer,
                        rs_start=self.rs_start if start is None else start)
        for cache in ("_order", "_schedule"):
            if hasattr(self, cache):
                setattr(other, cache, getattr(self, cache))
        return other


@dataclass
class Replay:
    arrival: np.ndarray
    start: np.ndarray  # S
    end: np.ndarray  # z
    last_arriver: np.ndarray  # per event: the event whose arrival set its S
    rs_start: np.ndarray  # the measured start, or (chained) the previous rank-step's replayed end + the time between
    rs_end: np.ndarray
    converged: bool
    passes: int  # relaxation passes, or (scheduled) levels

    def step_ms(self, g: StepGraph) -> np.ndarray:
        """Replayed duration of each rank-step (ms)."""
        return (self.rs_end - self.rs_start) / NS_PER_MS


def _rank_steps(run: RunSummary) -> dict[str, np.ndarray]:
    st = run.steps
    o = np.lexsort((np.asarray(st["start_ns"]), np.asarray(st["step"]), np.asarray(st["rank"])))
    rank = np.asarray(st["rank"], np.int64)[o]
    step = np.asarray(st["step"], np.int64)[o]
    keep = np.r_[True, (rank[1:] != rank[:-1]) | (step[1:] != step[:-1])][:rank.size]  # a (rank, step) once
    nan = np.full(o.size, np.nan)
    window = np.asarray(st.get("window", np.zeros(o.size, np.int64)), np.int64)[o]
    return {"rank": rank[keep], "step": step[keep], "start": np.asarray(st["start_ns"], np.int64)[o][keep],
            "end": np.asarray(st["end_ns"], np.int64)[o][keep], "window": window[keep],
            "cw_start": np.asarray(st.get("cpu_wait_at_start_ns", nan), np.float64)[o][keep],
            "cw_end": np.asarray(st.get("cpu_wait_at_end_ns", nan), np.float64)[o][keep]}


def _chain(rs: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Each rank-step's previous step of the same rank and window when recorded (−1: none, the chain breaks), and
    the time between its end and this start (ns)."""
    r, s, w = rs["rank"], rs["step"], rs["window"]
    ok = np.r_[False, (r[1:] == r[:-1]) & (w[1:] == w[:-1]) & (s[1:] == s[:-1] + 1)] if r.size else np.zeros(0, bool)
    prev = np.where(ok, np.arange(r.size) - 1, -1)
    between = np.where(ok, (rs["start"] - rs["end"][np.maximum(prev, 0)]).astype(np.float64), 0.0) if r.size \
        else np.zeros(0)
    return prev, between


def _rs_index(rs: dict[str, np.ndarray], rank: np.ndarray, step: np.ndarray) -> np.ndarray:
    """Row of (rank, step) among the rank-steps, −1 where the rank has no such step."""
    if rs["rank"].size == 0 or rank.size == 0:
        return np.full(rank.size, -1, np.int64)
    span = int(max(rs["step"].max(), step.max(), 0)) + 2
    key = rs["rank"] * span + rs["step"] + 1
    # in place, and the rows in 32 bits where they fit: this runs over every sync event (1.5 M at 1,024 LLM-shaped
    # ranks) while the unsorted events are held
    q = rank.astype(np.int64)
    q *= span
    q += np.clip(step, -1, span - 2)
    q += 1
    i = np.searchsorted(key, q).astype(index_dtype(key.size), copy=False)
    np.minimum(i, key.size - 1, out=i)
    miss = key[i] != q
    del q
    i[miss] = -1
    return i


def _sync_events(run: RunSummary) -> tuple[dict[str, np.ndarray], int, int]:
    """Every sync event of `run`, unsorted (the collective members, then the sends, then the receives), with the
    number of members and of pairs. Columns: rank, step, arrival, end, kind (KIND_*), group (collective instance,
    −1 for p2p), op, pg, pair (the p2p pair of a send / receive, −1 for collectives), cw_a / cw_z (the rank's wait
    for a CPU at the event's arrival / end, NaN unknown)."""
    m = run.collectives.members
    cr = run.collective_rows
    rows = np.asarray(m["row"], np.int64)
    c_step = np.asarray(cr["step"])[rows] if rows.size else np.zeros(0, np.int64)
    p = run.p2p
    nc, npp = rows.size, len(p)
    # a CPU-wait column no rank sampled is not in the rows (GPU ranks, imports): None, not a column of NaN (unknown
    # everywhere; 12 MB per column at 1,024 LLM-shaped ranks, and the graph's own column would be all NaN too)
    cw_a, cw_z = (np.r_[np.asarray(cr[c], np.float64)[rows], np.full(2 * npp, np.nan)] if c in cr else None
                  for c in ("cpu_wait_at_start_ns", "cpu_wait_at_end_ns"))
    del rows
    step = narrow_concat([c_step, p.send_step, p.recv_step])
    del c_step
    none = np.full(max(nc, 2 * npp), -1, np.int8)  # "no group / op / pair", cast as each column is made
    e = {  # ids in 32 bits where they fit (narrow.py), made so, not from an int64 copy: the unsorted columns are
        # held beside the sorting's temporaries (1,024 LLM-shaped ranks: 1.5 M events, 12 MB per int64 column)
        "rank": narrow_concat([m["rank"], p.src, p.dst]),
        "step": step,
        "arrival": np.r_[np.asarray(m["start_ns"], np.int64), np.asarray(p.send_start_ns, np.int64),
                         np.asarray(p.recv_start_ns, np.int64)],
        "end": np.r_[np.asarray(m["end_ns"], np.int64), np.asarray(p.send_end_ns, np.int64),
                     np.asarray(p.recv_end_ns, np.int64)],
        "kind": np.concatenate([np.full(nc, KIND_COLL, np.int8), np.full(npp, KIND_SEND, np.int8),
                                np.full(npp, KIND_RECV, np.int8)]),
        "group": narrow_concat([m["inst"], none[:2 * npp]]),
        "op": narrow_concat([m["op_id"], none[:2 * npp]]),
        "pg": narrow_concat([m["pg"], p.pg, p.pg]),
        "pair": narrow_concat([none[:nc], np.arange(npp), np.arange(npp)]),
        "cw_a": cw_a, "cw_z": cw_z,
    }
    return e, nc, npp


def _kept_order(run: RunSummary, rs: dict[str, np.ndarray], e: dict[str, np.ndarray],
                nc: int) -> tuple[np.ndarray, np.ndarray]:
    """The events that are nodes of the graph, as indices into `e` sorted by rank-step then arrival, and the
    rank-step row of each."""
    rsi = _rs_index(rs, e["rank"], e["step"])
    keep = rsi >= 0
    # a collective instance is a node of the graph only where all its members are in recorded steps
    if nc:
        group = e["group"]
        bad = np.bincount(group[:nc][~keep[:nc]], minlength=len(run.collectives)) > 0
        keep[:nc] &= ~bad[group[:nc]]
    if keep.all():  # every event is a node (the usual case): no selected copies of the columns to sort
        o = sort_within(rsi, e["arrival"])
    else:
        sel = np.flatnonzero(keep)
        o = sel[sort_within(rsi[sel], e["arrival"][sel])]
    return o, rsi[o]


def _partners(kind: np.ndarray, pair: np.ndarray, npp: int) -> np.ndarray:
    """Per event: a receive's send (both kept, matched by pair id), else −1."""
    partner = np.full(kind.size, -1, index_dtype(kind.size))
    if npp:
        send_at = np.full(npp, -1, np.int64)
        is_s = kind == KIND_SEND
        send_at[pair[is_s]] = np.flatnonzero(is_s)
        is_r = kind == KIND_RECV
        partner[is_r] = send_at[pair[is_r]]
    return partner


def _dense_groups(grp: np.ndarray) -> tuple[np.ndarray, int]:
    """Dense group ids of the kept collective instances (−1 for p2p), and how many there are."""
    member = grp >= 0
    ug, gi = unique_inverse(grp[member], narrow=True)
    gid = np.full(grp.size, -1, index_dtype(ug.size))
    gid[member] = gi
    return gid, int(ug.size)


def _work_segments(a: np.ndarray, z: np.ndarray, prev: np.ndarray, ev_rs: np.ndarray, start_rs: np.ndarray,
                   cw_start: np.ndarray, cw_a: np.ndarray | None,
                   cw_z: np.ndarray | None) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """The work segment before each event: what it hangs off (LINK_*), its length and the CPU wait within it (None
    where no event's CPU wait at its arrival is known: `cw_a` None)."""
    n = a.size
    # one float column over every event (1.5 M at 1,024 LLM-shaped ranks), filled by link kind and turned into the
    # gap in place: no candidate columns beside it
    p = np.maximum(prev, 0)
    anchor = z[p]  # the previous event's end ...
    link = np.full(n, LINK_ARRIVAL, np.int8)
    link[a >= anchor - END_SLACK_NS] = LINK_END
    start = prev < 0
    link[start] = LINK_START
    arrival = np.flatnonzero(link == LINK_ARRIVAL)
    lane = _lane_anchors(a, z, ev_rs, arrival)  # ... or an earlier event's end it queued behind ...
    queued = lane >= 0
    prev[arrival[queued]] = lane[queued]
    link[arrival[queued]] = LINK_END
    anchor[arrival[queued]] = z[lane[queued]]
    arrival = arrival[~queued]
    anchor[arrival] = a[p[arrival]]  # ... or its arrival, when this one came before that end
    del p, arrival, lane, queued
    anchor[start] = start_rs[ev_rs[start]]  # ... or the step's start, for its first event
    del start
    np.subtract(a, anchor, out=anchor)
    gap = np.maximum(anchor, 0.0, out=anchor)
    if cw_a is None:
        return link, gap, None
    if cw_z is None:
        cw_z = np.full(n, np.nan)
    pcz = np.where(prev >= 0, cw_z[np.maximum(prev, 0)], np.nan) if n else np.zeros(0)
    pca = np.where(prev >= 0, cw_a[np.maximum(prev, 0)], np.nan) if n else np.zeros(0)
    cw_anchor = np.where(link == LINK_START, cw_start[ev_rs] if n else 0.0,
                         np.where(link == LINK_END, pcz, pca))
    del pcz, pca
    ev_cpu_wait = np.clip(cw_a - cw_anchor, 0.0, gap) if n else np.zeros(0)
    return link, gap, ev_cpu_wait


def _lane_anchors(a: np.ndarray, z: np.ndarray, ev_rs: np.ndarray, cand: np.ndarray) -> np.ndarray:
    """For each event of `cand` (each arrived before the previous event's end): the earlier event of its rank-step
    whose end it began at, within END_SLACK_NS either way, when there is one (else −1). A communication thread or
    stream runs its collectives in turn: gloo's two worker threads, a process group's NCCL stream. An event that
    starts the instant another one ends queued behind it, although it arrived during the event just before it (the
    other lane's): its work segment hangs off that end, not off the previous arrival, so a change that ends the
    event it waited for earlier starts it earlier too (else the wait stays in its segment as the rank's own work)."""
    out = np.full(cand.size, -1, np.int64)
    if not cand.size:
        return out
    n = z.size
    # each candidate's arrival (+ slack) sorted in among the ends of every event by rank-step: the last end before
    # it (ends first among equal values) is the latest that ends no later
    o = sort_within(np.r_[ev_rs, ev_rs[cand]], np.r_[z, a[cand] + END_SLACK_NS])
    last_end = np.maximum.accumulate(np.where(o < n, np.arange(o.size), -1))
    q = np.empty(cand.size, np.int64)
    q[o[o >= n] - n] = last_end[o >= n]
    j = np.where(q >= 0, o[np.maximum(q, 0)], 0)  # an event (an end's position), or 0 where none came before
    ok = (q >= 0) & (ev_rs[j] == ev_rs[cand]) & (j < cand - 1) & (z[j] >= a[cand] - END_SLACK_NS)
    out[ok] = j[ok]
    return out


def _set_tails(g: StepGraph, rs: dict[str, np.ndarray], s: np.ndarray, cw_a: np.ndarray | None,
               cw_z: np.ndarray | None) -> None:
    """Each rank-step's last event, and its tail: what it hangs off, its length and the CPU wait within it (`cw_a`,
    `cw_z`: per event, None where unknown for every event)."""
    n, a, z, ev_rs, start_rs, end_rs = g.n_events, g.ev_arrival, g.ev_end, g.ev_rs, g.rs_start, g.rs_end
    if n:
        is_last = np.r_[ev_rs[1:] != ev_rs[:-1], True]
        g.rs_last[ev_rs[is_last]] = np.flatnonzero(is_last)
    L = g.rs_last
    has = L >= 0
    lz = np.where(has, z[np.maximum(L, 0)] if n else 0.0, 0.0)
    la = np.where(has, a[np.maximum(L, 0)] if n else 0.0, 0.0)
    # the tail hangs off the last event's end when the step ended after it, or after the event could proceed (its
    # last member arrived): the rank had waited for it, and the exec event on the communication thread (gloo's
    # worker) ends a little after the main thread went on, so the tail is then 0, never the wait counted as work
    ls = np.where(has, s[np.maximum(L, 0)] if n else 0.0, 0.0)
    waited = (end_rs >= lz - END_SLACK_NS) | (has & (end_rs >= ls) & (g.ev_kind[np.maximum(L, 0)] == KIND_COLL)
                                              if n else False)
    g.rs_tail_link = np.where(~has, LINK_START, np.where(waited, LINK_END, LINK_ARRIVAL)).astype(np.int8)
    tail_anchor = np.where(g.rs_tail_link == LINK_START, start_rs, np.where(g.rs_tail_link == LINK_END, lz, la))
    g.rs_tail = np.maximum(end_rs - tail_anchor, 0.0)
    lcz = np.where(has, cw_z[np.maximum(L, 0)] if n and cw_z is not None else np.nan, np.nan)
    lca = np.where(has, cw_a[np.maximum(L, 0)] if n and cw_a is not None else np.nan, np.nan)
    tail_cw = np.where(g.rs_tail_link == LINK_START, rs["cw_start"], np.where(g.rs_tail_link == LINK_END, lcz, lca))
    g.rs_tail_cpu_wait = np.clip(rs["cw_end"] - tail_cw, 0.0, g.rs_tail)


def step_graph(run: RunSummary) -> StepGraph:
    """The dependency graph of every recorded step of `run` (see the module docstring)."""
    rs = _rank_steps(run)
    e, nc, npp = _sync_events(run)
    o, ev_rs = _kept_order(run, rs, e, nc)
    # each column once, in the graph's order (1,024 LLM-shaped ranks: the unsorted events, 117 MB, were held to the
    # end of the build and set its peak)
    for k in list(e):  # a column at a time, each unsorted one freed as its sorted copy is made
        e[k] = e[k][o] if e[k] is not None else None
    ev_rs = narrow(ev_rs)
    del o
    t0 = int(rs["start"].min()) if rs["start"].size else 0
    a = (e.pop("arrival") - t0).astype(np.float64)
    z = np.maximum(e.pop("end") - t0, a)  # float64, as `a` is
    n = a.size
    new_rs = np.r_[True, ev_rs[1:] != ev_rs[:-1]] if n else np.zeros(0, bool)
    prev = narrow(np.where(new_rs, -1, np.arange(n) - 1))
    del new_rs
    gid, n_groups = _dense_groups(e.pop("group"))
    start_rs = (rs["start"] - t0).astype(np.float64)
    end_rs = (rs["end"] - t0).astype(np.float64)
    cw_a, cw_z = e.pop("cw_a"), e.pop("cw_z")
    link, gap, ev_cpu_wait = _work_segments(a, z, prev, ev_rs, start_rs, rs["cw_start"], cw_a, cw_z)
    rs_prev, rs_between = _chain(rs)
    g = StepGraph(
        t0=t0, rs_rank=rs["rank"], rs_step=rs["step"], rs_start=start_rs, rs_end=end_rs,
        rs_tail=np.zeros(rs["rank"].size), rs_tail_link=np.zeros(rs["rank"].size, np.int8),
        rs_last=np.full(rs["rank"].size, -1, np.int64), rs_prev=rs_prev, rs_between=rs_between,
        ev_rs=ev_rs, ev_rank=e["rank"], ev_step=e["step"], ev_kind=e["kind"], ev_group=gid, ev_op=e["op"],
        ev_pg=e["pg"], ev_partner=_partners(e["kind"], e.pop("pair"), npp), ev_arrival=a, ev_end=z, ev_gap=gap,
        ev_link=link, ev_prev=prev, ev_transfer=np.zeros(n), names=np.asarray(run.names, dtype=object),
        n_groups=n_groups, ev_cpu_wait=ev_cpu_wait)
    del e
    s, _ = _starts(g, a, who=False)
    g.ev_transfer = np.maximum(z - s, 0.0)
    _set_tails(g, rs, s, cw_a, cw_z)
    return g


def _group_order(g: StepGraph) -> tuple[np.ndarray, np.ndarray]:
    """Collective events sorted by group, and where each group begins (computed once per graph)."""
    cached = getattr(g, "_order", None)
    if cached is None:
        # one stable sort of every event: p2p (group −1) first, then each group's members in event order
        order = np.argsort(g.ev_group, kind="stable")
        idx = order[np.count_nonzero(g.ev_group < 0):].astype(index_dtype(g.ev_group.size))
        del order
        gg = g.ev_group[idx]
        bounds = np.flatnonzero(np.r_[True, gg[1:] != gg[:-1]]) if idx.size else np.zeros(0, np.int64)
        cached = (idx, bounds)
        g._order = cached
    return cached


def _starts(g: StepGraph, a: np.ndarray, *, who: bool = True) -> tuple[np.ndarray, np.ndarray | None]:
    """S of every event from the arrivals `a`, and (`who`) the event whose arrival set it."""
    n = a.size
    s = a.copy()
    last = np.arange(n, dtype=index_dtype(n)) if who else None
    idx, bounds = _group_order(g)
    if idx.size:
        av = a[idx]
        latest = np.maximum.reduceat(av, bounds)
        counts = np.diff(np.r_[bounds, idx.size])
        if not who:  # the arrivals are read no more: not held beside the repeated maxima
            del av
        s[idx] = np.repeat(latest, counts)
        if who:
            gpos = np.repeat(np.arange(bounds.size), counts)
            hit = av == latest[gpos]
            first_hit = np.full(bounds.size, -1, np.int64)
            rev = np.flatnonzero(hit)[::-1]  # the first member (by group order) arriving at the latest time wins
            first_hit[gpos[rev]] = idx[rev]
            last[idx] = first_hit[gpos]
    rv = np.flatnonzero((g.ev_kind == KIND_RECV) & (g.ev_partner >= 0))
    if rv.size:
        snd = g.ev_partner[rv]
        if who:
            later = a[snd] > a[rv]
            last[rv[later]] = snd[later]
        s[rv] = np.maximum(a[rv], a[snd])
    return s, last


def replay(g: StepGraph, *, chain: bool = False, max_passes: int | None = None) -> Replay:
    """Arrivals, starts, ends and step ends from the segments (see the module docstring). Unchained, every rank-step
    starts where it was measured to; `chain`ed, a rank-step with a recorded previous step in its window starts at
    that step's replayed end (plus the time measured between them), so what a rank does after its last sync point of
    one step moves its arrivals in the next."""
    if chain and (g.rs_prev >= 0).any():
        sched = schedule(g)
        if sched is not None:
            a, _, rs_start, rs_end = replay_scheduled(g, sched)
            s, who = _starts(g, a)
            return Replay(arrival=a, start=s, end=s + g.ev_transfer, last_arriver=who, rs_start=rs_start,
                          rs_end=rs_end, converged=True, passes=sched.levels)
    return _relax(g, chain=chain, max_passes=max_passes)


def _tail_ends(g: StepGraph, a: np.ndarray, z: np.ndarray, rs_start: np.ndarray) -> np.ndarray:
    """Each rank-step's end: its tail's anchor + the tail."""
    if not g.n_events:
        return rs_start + g.rs_tail
    L = np.maximum(g.rs_last, 0)
    tl = g.rs_tail_link
    return np.where(tl == LINK_START, rs_start, np.where(tl == LINK_END, z[L], a[L])) + g.rs_tail


def _relax(g: StepGraph, *, chain: bool, max_passes: int | None) -> Replay:
    """The replay by repeated relaxation of every value at once, from the measured ones: one pass when nothing
    changed (the measured graph), at most the graph's depth otherwise (chained: its depth over a whole window)."""
    n = g.n_events
    a = g.ev_arrival
    rs_start = g.rs_start
    chained = np.flatnonzero(g.rs_prev >= 0) if chain else np.zeros(0, np.int64)
    limit = max_passes if max_passes is not None else n + 2 + (2 * g.rs_rank.size if chained.size else 0)
    converged, passes = False, 0
    finite = all(np.isfinite(v).all() for v in (a, rs_start, g.ev_gap, g.ev_transfer))
    if not chained.size and n and limit > 0 and finite:
        a, converged, passes = _relax_frontier(g, limit)
    if passes < limit and not converged:  # the passes below replace `a`, never write into it
        prev = np.maximum(g.ev_prev, 0).astype(np.intp)  # indexes every pass: intp, not converted on each use
    while passes < limit and not converged:
        passes += 1
        s, _ = _starts(g, a, who=False)
        z = s + g.ev_transfer
        start_of = rs_start[g.ev_rs] if n else np.zeros(0)
        a_new = np.where(g.ev_link == LINK_START, start_of, np.where(g.ev_link == LINK_END, z[prev], a[prev])) + \
            g.ev_gap
        start_new = rs_start
        if chained.size:
            start_new = rs_start.copy()
            start_new[chained] = _tail_ends(g, a, z, rs_start)[g.rs_prev[chained]] + g.rs_between[chained]
        converged = np.array_equal(a_new, a) and np.array_equal(start_new, rs_start)
        a, rs_start = a_new, start_new
    if a is g.ev_arrival:  # no pass ran (max_passes 0): the replay's arrays are its own
        a = a.copy()
    if not converged:
        log.warning("critical path: the step graph did not settle in %d passes (collectives in a different order "
                    "on different ranks?); the replay uses the last pass", passes)
    s, who = _starts(g, a)
    z = s + g.ev_transfer
    return Replay(arrival=a, start=s, end=z, last_arriver=who, rs_start=rs_start,
                  rs_end=_tail_ends(g, a, z, rs_start), converged=converged, passes=passes)


#: A relaxation pass recomputes only the arrivals whose inputs moved when fewer than 1/FRONTIER_SHARE of them did.
FRONTIER_SHARE = 16


def _relax_frontier(g: StepGraph, limit: int) -> tuple[np.ndarray, bool, int]:
    """The unchained relaxation (every step from its measured start): the same passes, and the same arrivals after
    each, as relaxing every value at once, but a pass after the first recomputes only the arrivals whose inputs the
    previous pass changed (the next event after an arrival or a start that moved) when they are few — a deep step
    (hundreds of collectives) takes as many passes as before, each over the few values still moving. Finite values
    only.

    Memory (a row per event: 1.5 M at 1,024 LLM-shaped ranks): the arrays only the frontier's passes read (each
    event's dependents, a send's receive, the sets' slots) are made after the first pass, whose temporaries are gone by
    then, and hold 32-bit indices (they are read at the few moving events: converting those costs nothing)."""
    n = g.n_events
    prev = np.maximum(g.ev_prev, 0).astype(np.intp)  # indexes every full pass: intp, not converted on each use
    a, moved = _full_pass(g, g.ev_arrival, prev)
    passes = 1
    if not moved.size or passes >= limit:
        return a, moved.size == 0, passes
    link, gap, x = g.ev_link, g.ev_gap, g.ev_transfer
    it = index_dtype(n)
    # the events hanging off each event (its next one, and any that queued behind it), as spans of `hang`
    has = np.flatnonzero(g.ev_prev >= 0)
    hang = has[np.argsort(g.ev_prev[has], kind="stable")].astype(it)
    hang_lo = np.searchsorted(g.ev_prev[hang], np.arange(n)).astype(it)
    hang_hi = np.r_[hang_lo[1:], hang.size].astype(it)
    del has
    send_to = np.full(n, -1, it)  # a send's receive
    rv = np.flatnonzero((g.ev_kind == KIND_RECV) & (g.ev_partner >= 0))
    send_to[g.ev_partner[rv]] = rv
    del rv
    idx, bounds = _group_order(g)
    gend = np.r_[bounds[1:], idx.size] if idx.size else np.zeros(0, np.int64)
    ev_set = _Distinct(n)  # the passes' sets of events and of instances (groups), each without repeats
    grp_set = _Distinct(int(g.ev_group.max(initial=-1)) + 1)
    while moved.size and passes < limit:
        passes += 1
        if moved.size > n // FRONTIER_SHARE:  # many moving: a pass over all
            a, moved = _full_pass(g, a, prev)
            continue
        # the events whose start S may have moved: every member of a moved member's instance, a moved send's receive
        grp = grp_set.of(g.ev_group[moved][g.ev_group[moved] >= 0])
        s_moved = ev_set.of(np.r_[moved, idx[_spans(bounds[grp], gend[grp])], send_to[moved][send_to[moved] >= 0]])
        on_end = hang[_spans(hang_lo[s_moved], hang_hi[s_moved])]
        on_arrival = hang[_spans(hang_lo[moved], hang_hi[moved])]
        dep = ev_set.of(np.r_[on_end[link[on_end] == LINK_END], on_arrival[link[on_arrival] == LINK_ARRIVAL]])
        p = prev[dep]
        sp = _starts_at(g, a, p, idx, bounds, gend, grp_set)
        val = np.where(link[dep] == LINK_START, g.rs_start[g.ev_rs[dep]],
                       np.where(link[dep] == LINK_END, sp + x[p], a[p])) + gap[dep]
        moved = dep[val != a[dep]]
        a[dep] = val
    return a, moved.size == 0, passes


def _full_pass(g: StepGraph, a: np.ndarray, prev: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every arrival recomputed from the arrivals `a` (a new array: `a` is not written), and the events whose
    arrival moved. Each value is its anchor (the previous event's arrival or end, or the rank-step's start) plus its
    gap, filled by anchor kind into one array (a select over three full-size candidates held 4 of them at once)."""
    link = g.ev_link
    new = a[prev]  # anchored on the previous arrival (LINK_ARRIVAL), replaced below where not
    at_end = np.flatnonzero(link == LINK_END)
    if at_end.size:
        s, _ = _starts(g, a, who=False)
        p = prev[at_end]
        new[at_end] = s[p] + g.ev_transfer[p]
        del s, p
    at_start = np.flatnonzero(link == LINK_START)
    new[at_start] = g.rs_start[g.ev_rs[at_start]]
    new += g.ev_gap
    return new, np.flatnonzero(new != a)


class _Distinct:
    """The distinct values of arrays of indices into 0..size−1, in no particular order (the relaxation's sets: a
    pass computes the same values whatever their order), each in time linear in the array's length: a slot per
    index remembers where it was last written."""

    def __init__(self, size: int) -> None:
        self._slot = np.zeros(max(size, 0), index_dtype(size))  # positions in a set: below `size`

    def of(self, v: np.ndarray, inverse: bool = False):
        """`v`'s distinct values (and, with `inverse`, each element's place among them)."""
        if v.size > np.iinfo(self._slot.dtype).max:  # positions past 32 bits
            self._slot = self._slot.astype(np.int64)
        pos = np.arange(v.size)
        self._slot[v] = pos  # the last position of each value wins
        keep = v[self._slot[v] == pos]
        if not inverse:
            return keep
        self._slot[keep] = np.arange(keep.size)
        return keep, self._slot[v]


def _spans(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """The indices lo..hi−1 of each span, concatenated."""
    cnt = hi - lo
    total = int(cnt.sum())
    if not total:
        return np.zeros(0, np.int64)
    return np.repeat(lo - np.r_[0, np.cumsum(cnt)[:-1]], cnt) + np.arange(total)


def _starts_at(g: StepGraph, a: np.ndarray, ev: np.ndarray, idx: np.ndarray, bounds: np.ndarray,
               gend: np.ndarray, grp_set: _Distinct) -> np.ndarray:
    """S of the events `ev` from the arrivals `a` (as :func:`_starts` computes it for every event)."""
    s = a[ev].copy()
    gi = g.ev_group[ev]
    coll = gi >= 0
    if coll.any():
        grp, inv = grp_set.of(gi[coll], inverse=True)
        lo, hi = bounds[grp], gend[grp]
        mem = _spans(lo, hi)
        latest = np.maximum.reduceat(a[idx[mem]], np.r_[0, np.cumsum(hi - lo)[:-1]])
        s[coll] = latest[inv.reshape(-1)]
    rv = (g.ev_kind[ev] == KIND_RECV) & (g.ev_partner[ev] >= 0)
    if rv.any():
        s[rv] = np.maximum(a[ev[rv]], a[g.ev_partner[ev[rv]]])
    return s


@dataclass
class PathSegment(Record):
    """One segment of a step's critical path: a rank's work, or a transfer of a collective or a send/recv."""

    rank: int
    kind: str  # "work" or "transfer"
    name: str  # "work", the collective op, or "send/recv"
    pg: int | None  # the transfer's process group (None for work)
    start_ms: float  # from the step's start on the path
    ms: float


@dataclass
class CriticalPaths:
    """Per step (``steps``): the path's length and, per (step, rank), the time it runs through the rank's work
    segments (``work_ms``, dense steps × ranks); per step the transfer time on it per collective op (``comm``)."""

    steps: np.ndarray
    ranks: np.ndarray
    length_ms: np.ndarray
    work_ms: np.ndarray  # (n_steps, n_ranks)
    transfer_ms: np.ndarray  # (n_steps,) transfers of collectives and pairs on the path
    comm: dict[tuple[int, str], np.ndarray]  # (pg, op) -> per step transfer ms on the path ("p2p" for pairs)
    end_rank: np.ndarray  # per step: the rank whose step ended last (where the path ends)
    segments: list[PathSegment]  # one step's path, in time order
    segments_step: int | None


def _walk_back(g: StepGraph, rp: Replay, last: np.ndarray, end_t: np.ndarray) -> tuple[np.ndarray, ...]:
    """The segments on every step's path, walked back from the rank-steps `last` (ending at `end_t`) for all steps
    at once: step index, rank-step row, kind (0 work, 1 transfer), event (−1: a tail off the step start), start and
    length (ns)."""
    ns = last.size
    # walk: state per step = (event, at) where at 0 = at the event's arrival, 1 = at its end; start from the tails
    segs: list[tuple[np.ndarray, ...]] = []

    def add(si, rsrow, kind, ev, t_from, t_to):
        d = t_to - t_from
        segs.append((si, rsrow, np.full(si.size, kind), ev, t_from, d))

    si_all = np.arange(ns)
    tl = g.rs_tail_link[last]
    ev = np.where(tl == LINK_START, -1, g.rs_last[last])
    at_end = tl == LINK_END
    L = np.maximum(ev, 0)
    t_anchor = np.where(tl == LINK_START, rp.rs_start[last],
                        np.where(at_end, rp.end[L] if g.n_events else 0.0, rp.arrival[L] if g.n_events else 0.0))
    add(si_all, last, 0, ev, t_anchor, end_t)
    cur_si, cur_ev, cur_end = si_all[ev >= 0], ev[ev >= 0], at_end[ev >= 0]
    hops = 0
    while cur_si.size and hops < 4 * g.n_events + 4:
        hops += 1
        # at an event's end: its transfer, then jump to the member that arrived last (at its arrival)
        e = cur_ev[cur_end]
        if e.size:
            add(cur_si[cur_end], g.ev_rs[e], 1, e, rp.start[e], rp.end[e])
        nxt_ev = np.where(cur_end, rp.last_arriver[cur_ev], cur_ev)
        # at an arrival: the work segment before it, then to what it hangs off
        e = nxt_ev
        link = g.ev_link[e]
        pv = g.ev_prev[e]
        anchor_t = np.where(link == LINK_START, rp.rs_start[g.ev_rs[e]],
                            np.where(link == LINK_END, rp.end[np.maximum(pv, 0)], rp.arrival[np.maximum(pv, 0)]))
        add(cur_si, g.ev_rs[e], 0, e, anchor_t, rp.arrival[e])
        go = link != LINK_START
        cur_si, cur_ev, cur_end = cur_si[go], pv[go], (link == LINK_END)[go]
    return tuple(np.concatenate(x) for x in zip(*segs))


def _comm_on_path(g: StepGraph, si: np.ndarray, evs: np.ndarray, d: np.ndarray,
                  ns: int) -> dict[tuple[int, str], np.ndarray]:
    """Per (pg, op) — (−1, "p2p") for pairs — the transfer ms per step of the path's transfer segments (`si`, `evs`,
    `d`)."""
    comm: dict[tuple[int, str], np.ndarray] = {}
    if not evs.size:
        return comm
    is_coll = g.ev_op[evs] >= 0
    keys = np.where(is_coll, g.ev_pg[evs].astype(np.int64) * (len(g.names) + 1) + g.ev_op[evs], -1)
    for k in np.unique(keys).tolist():
        sel = keys == k
        key = (-1, "p2p") if k < 0 else (int(k // (len(g.names) + 1)), str(g.names[int(k % (len(g.names) + 1))]))
        comm[key] = np.bincount(si[sel], weights=d[sel], minlength=ns)
    return comm


def _path_view(g: StepGraph, sel: np.ndarray, rsrow: np.ndarray, kinds: np.ndarray, evs: np.ndarray,
               t_from: np.ndarray, d: np.ndarray, t_start: float) -> list[PathSegment]:
    """The report's view of one step's path: its segments `sel` (in time order) from the step's start `t_start`."""
    view = []
    for i in sel.tolist():
        e = int(evs[i])
        if kinds[i] == 0:
            name = "work"
        elif g.ev_op[e] >= 0:
            name = str(g.names[int(g.ev_op[e])])
        else:
            name = "send/recv"
        view.append(PathSegment(rank=int(g.rs_rank[rsrow[i]]), kind="work" if kinds[i] == 0 else "transfer",
                                name=name, pg=None if kinds[i] == 0 else int(g.ev_pg[e]),
                                start_ms=float((t_from[i] - t_start) / NS_PER_MS), ms=float(d[i])))
    return view


def critical_paths(g: StepGraph, rp: Replay, *, view_step: int | None = None) -> CriticalPaths:
    """The critical path of every step (see the module docstring), walked back for all steps at once."""
    steps, rs_si = np.unique(g.rs_step, return_inverse=True)
    rs_si = rs_si.reshape(-1)
    ranks, rs_ri = np.unique(g.rs_rank, return_inverse=True)
    rs_ri = rs_ri.reshape(-1)
    ns, nr = steps.size, ranks.size
    work = np.zeros((ns, nr))
    transfer = np.zeros(ns)
    if ns == 0:
        return CriticalPaths(steps, ranks, np.zeros(0), work, transfer, {}, np.zeros(0, np.int64), [], None)
    # the rank-step ending last in each step
    o = np.lexsort((rp.rs_end, rs_si))
    last = o[np.r_[rs_si[o][1:] != rs_si[o][:-1], True]]
    end_t = rp.rs_end[last]
    si, rsrow, kinds, evs, t_from, d = _walk_back(g, rp, last, end_t)
    d = np.maximum(d, 0.0) / NS_PER_MS
    w = kinds == 0
    np.add.at(work, (si[w], rs_ri[rsrow[w]]), d[w])
    tr = ~w
    np.add.at(transfer, si[tr], d[tr])
    comm = _comm_on_path(g, si[tr], evs[tr], d[tr], ns)
    start_t = np.full(ns, np.inf)
    np.minimum.at(start_t, si, t_from)
    length = (end_t - start_t) / NS_PER_MS
    # one step's path for the view: the step of median length
    vi = (int(np.searchsorted(steps, view_step)) if view_step is not None and view_step in steps
          else int(np.argsort(length, kind="stable")[(ns - 1) // 2]))
    sel = np.flatnonzero(si == vi)
    sel = sel[np.argsort(t_from[sel], kind="stable")][:MAX_PATH_SEGMENTS]
    view = _path_view(g, sel, rsrow, kinds, evs, t_from, d, start_t[vi])
    return CriticalPaths(steps, ranks, length, work, transfer, comm, g.rs_rank[last], view, int(steps[vi]))
