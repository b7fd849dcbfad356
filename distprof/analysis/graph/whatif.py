"""What-if estimates: replay the cross-rank step graph (:mod:`.critical_path`) with one change, and say how much
faster the step would be.

    from distprof.analysis import whatif
    r = whatif.estimate(run, whatif.Straggler(ranks=(3,)))     # WhatIf: measured / predicted step ms, gain
    r = whatif.estimate(run, whatif.FasterCollective("all_reduce", 2.0))
    table = whatif.standard(run, stragglers=find_stragglers(run))  # the report's what-if table

Changes (each optionally limited to some ``ranks``):

* :class:`Straggler` — the ranks' work at their peers' median: each work segment before a collective is compared
  with the median of the same segment (before the same instance) on the instance's other members, the tail after
  the last sync with the median of the other ranks' tails in that step; the rank's systematic excess (per segment
  position in the step, the median over steps of own − peers', where positive) is taken off each step's segment, so
  its step-to-step noise stays, as it would in a run without the delay (taking the peers' median itself would
  replace two noisy ranks by one, and the step, a maximum over ranks, would come out too short); so is a step's
  excess beyond that, less the rank's wait for a CPU in the segment (the capture's scheduler statistics: the machine
  holding it off is :class:`NoCpuWait`'s), when it stands out from the peers' step-to-step spread (3 robust standard
  deviations, at least 0.1 ms): a delay only some steps have. A peer's segment that is only a hand-over from the previous event's end, shorter than ``HANDOFF_NS``, is not counted: its
  communication thread was still busy, the work it did meanwhile is hidden in that wait. Segments before
  point-to-point events (pipeline stages do different work) are scaled by the ratio of the rank-step's new
  collective-and-tail work to its old one (in a pure pipeline: the peers' median work per step to its own).
  The replay then starts every
  collective at its new latest arrival: the waiting the straggler caused on the others goes too.
* :class:`OverlapComm` — exposed communication fully overlapped: every transfer (an event's time after its last
  member arrived) takes no step time; the collective still waits for its latest member.
* :class:`FasterCollective` — transfers of one collective op (and process group) N× faster.
* :class:`NoIdle` — each rank-step's idle time (``steps.idle_ms``: device idle on GPU ranks, the main thread in no
  op on CPU ranks) removed from its work segments.
* :class:`NoInputWait` — the rank's input wait (``measures.input_ms_per_step``: DataLoader fetches on the main
  thread) removed from its work segments.
* :class:`NoCpuWait` — the rank-step's wait for a CPU (``steps.cpu_wait_ms``: the stepping thread runnable but
  not running, from the capture's scheduler statistics) removed from its work segments.
* :class:`FasterOp` — one op name (``aten::mm``) N× faster: per rank-step its own time (``op_totals``) shrinks by
  (1 − 1/N), taken from the rank-step's work segments.

Time removed from a rank-step's work is taken from its segments in proportion to their length (the summaries keep
per-step totals, not where in the step the time fell); the replay decides what of it the step gains. The replay is
**chained** (:func:`.critical_path.replay`): a rank's time after its last sync point of one step delays its first
arrival in the next, so a delay anywhere in the iteration — before the forward (with steps cut at the forward, in the
previous step's tail), between forward and backward, in the optimizer, in a callback — gets its whole gain. The first
step of a window starts where the unrecorded step before it left the rank: it starts earlier by the rank's mean tail
change over the window, by no more than the rank was late into its first collective. The prediction is anchored on
the measurement: per step, gain = replayed with the measured segments − replayed with the change, the mean over ranks;
over steps the mean (a delay in some steps counts for its share); predicted = measured − gain. Step time of a run: per
step the mean over ranks of ``step_ms``, the mean over steps (:func:`step_time_ms`).

What the replay cannot see: ranks sharing CPU cores (on a 2-core machine a rank that stops sleeping takes CPU time
from its peers), and a changed op changing others (caches, clocks). docs/whatif.md has the measured accuracy.
"""

from __future__ import annotations

import itertools
import logging
from collections import defaultdict
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Iterable

import numpy as np

from ...record import Record, not_json
from ..groupstats import rank_step_values
from ..narrow import narrow
from .critical_path import (
    KIND_COLL,
    KIND_RECV,
    KIND_SEND,
    LINK_END,
    NS_PER_MS,
    StepGraph,
    _group_order,
    group_median,
    replay,
    step_graph,
)
from .schedule import Schedule, first_changed_row, replay_values, schedule

if TYPE_CHECKING:
    from ..cross.stragglers import Stragglers
    from ..types import RunSummary

log = logging.getLogger(__name__)

__all__ = ["Change", "Straggler", "OverlapComm", "FasterCollective", "NoIdle", "NoInputWait", "NoCpuWait", "FasterOp",
           "WhatIf",
           "Estimator", "Replayed", "estimator", "estimate", "general_changes", "reads_graph_only", "standard",
           "step_time_ms", "per_step_time_ms"]


@dataclass(frozen=True)
class Change:
    """A change to replay; ``ranks`` limits it (None: every rank)."""

    ranks: tuple[int, ...] | None = field(default=None, kw_only=True)

    def __post_init__(self) -> None:
        if self.ranks is not None:
            object.__setattr__(self, "ranks", tuple(int(r) for r in self.ranks))
        f = getattr(self, "factor", None)
        if f is not None and not (isinstance(f, (int, float)) and f > 0 and np.isfinite(f)):
            raise ValueError(f"{type(self).__name__}: factor {f!r} must be a positive finite number")

    def describe(self) -> str:  # pragma: no cover - every change overrides it
        raise NotImplementedError

    def _mask(self, ranks: np.ndarray) -> np.ndarray:
        return np.ones(ranks.size, bool) if self.ranks is None else np.isin(ranks, list(self.ranks))

    def _where(self) -> str:
        from ..names import rank_ranges

        return "" if self.ranks is None else f" on rank(s) {rank_ranges(sorted(self.ranks), sep=',')}"


@dataclass(frozen=True)
class Straggler(Change):
    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.ranks:
            raise ValueError("Straggler: name the straggling rank(s), e.g. Straggler(ranks=(3,))")

    def describe(self) -> str:
        from ..names import rank_ranges

        return f"rank(s) {rank_ranges(sorted(self.ranks or ()), sep=',')} at their peers' median"


@dataclass(frozen=True)
class OverlapComm(Change):
    def describe(self) -> str:
        return "exposed communication fully overlapped" + self._where()


@dataclass(frozen=True)
class FasterCollective(Change):
    op: str = "all_reduce"
    factor: float = 2.0
    pg: int | None = None

    def describe(self) -> str:
        return f"{self.op}{'' if self.pg is None else f' (group {self.pg})'} {self.factor:g}x faster" + self._where()


@dataclass(frozen=True)
class NoIdle(Change):
    def describe(self) -> str:
        return "idle time removed (an upper bound: nothing keeps the rank idle)" + self._where()


@dataclass(frozen=True)
class NoInputWait(Change):
    def describe(self) -> str:
        return "input waits removed" + self._where()


@dataclass(frozen=True)
class NoCpuWait(Change):
    def describe(self) -> str:
        return "waits for a CPU removed" + self._where()


@dataclass(frozen=True)
class FasterOp(Change):
    name: str = ""
    factor: float = 2.0

    def describe(self) -> str:
        return f"{self.name} {self.factor:g}x faster" + self._where()


@dataclass
class WhatIf(Record):
    """One change's estimate (ms; per step): a row of the report's ``whatif`` table."""

    change: str  # the change's kind
    description: str
    measured_step_ms: float | None
    predicted_step_ms: float | None
    gain_ms_per_step: float
    gain_pct: float | None
    per_step_gain_ms: np.ndarray = not_json(repr=False, default_factory=lambda: np.zeros(0))


def per_step_time_ms(run: RunSummary) -> tuple[np.ndarray, np.ndarray]:
    """(steps, step time of each: the mean over ranks of ``step_ms``)."""
    st = run.steps
    steps, si = np.unique(np.asarray(st["step"], np.int64), return_inverse=True)
    si = si.reshape(-1)
    tot = np.bincount(si, weights=np.asarray(st["step_ms"], np.float64), minlength=steps.size)
    return steps, tot / np.maximum(np.bincount(si, minlength=steps.size), 1)


def step_time_ms(run: RunSummary) -> float | None:
    """The run's step time: the mean over steps of the mean over ranks of ``step_ms`` (None without steps)."""
    _, t = per_step_time_ms(run)
    return float(np.mean(t)) if t.size else None


# ---- applying changes to the graph ---------------------------------------------------------------------------------
def _remove_work(g: StepGraph, remove_ms: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Take `remove_ms` (per rank-step) from each rank-step's work segments, in proportion to their length."""
    work = g.rs_tail + np.bincount(g.ev_rs, weights=g.ev_gap, minlength=g.rs_rank.size)
    cut = np.clip(np.asarray(remove_ms, np.float64) * NS_PER_MS, 0.0, work)
    keep = np.where(work > 0, 1.0 - cut / np.where(work > 0, work, 1.0), 1.0)
    return g.ev_gap * (keep[g.ev_rs] if g.n_events else 1.0), g.rs_tail * keep


#: A segment this short after the previous event's end is a hand-over (the event queued behind the previous one on
#: the communication thread or stream), not work.
HANDOFF_NS = 200_000


#: A row's excess beyond the systematic one is the rank's own (a delay only some steps have) when it exceeds the
#: peers' step-to-step spread by this many robust standard deviations ...
SPIKE_SIGMAS = 3.0
#: ... and this many ns (timestamps' grain; synthetic runs have no spread at all).
SPIKE_FLOOR_NS = 100_000


def _spread(v: np.ndarray, key: np.ndarray) -> float:
    """The step-to-step spread of `v` (ns): 1.4826 × the median absolute deviation of each row from its `key`'s
    median, pooled over the keys (a robust standard deviation); 0 without rows."""
    if v.size == 0:
        return 0.0
    _, k = np.unique(key, return_inverse=True)
    k = k.reshape(-1)
    med = group_median(k, v, int(k.max()) + 1)
    return 1.4826 * float(np.median(np.abs(v - med[k])))


def _less_excess(own: np.ndarray, ref: np.ndarray, key: np.ndarray, spread: float,
                 cpu_wait: np.ndarray | None) -> np.ndarray:
    """`own` less its excess over `ref` (NaN: no reference): per `key` the systematic excess (the median over its
    rows of own − ref, where positive), and in a row whose excess beyond that, less the row's wait for a CPU
    (`cpu_wait`, NaN/None unknown: 0), stands out from the peers' `spread` (SPIKE_SIGMAS, SPIKE_FLOOR_NS) that too —
    the rank's own extra work in that step, not the machine holding it off — never taking a row further below `ref`
    than the spread allows."""
    ok = np.isfinite(ref)
    if not ok.any():
        return own
    _, k = np.unique(key, return_inverse=True)
    k = k.reshape(-1)
    d = own - ref
    e = group_median(k[ok], d[ok], int(k.max()) + 1)
    e = np.where(np.isfinite(e), np.maximum(e, 0.0), 0.0)[k]
    thr = max(SPIKE_SIGMAS * spread, SPIKE_FLOOR_NS)
    with np.errstate(invalid="ignore"):
        resid = d - e - (0.0 if cpu_wait is None else np.nan_to_num(cpu_wait, nan=0.0))
        cut = e + np.where(ok & (resid > thr), resid, 0.0)
        cut = np.where(ok, np.minimum(cut, np.maximum(d + thr, 0.0)), cut)
    return np.maximum(own - cut, 0.0)


def _segment_orders(g: StepGraph) -> tuple[np.ndarray, np.ndarray]:
    """The events sorted by (collective instance, segment) and by (rank and position in the rank-step, segment):
    computed once per graph (kept with it), so each straggler's medians over its peers take a subset of them instead
    of sorting again."""
    cached = getattr(g, "_segment_orders", None)
    if cached is None:
        cached = (narrow(np.lexsort((g.ev_gap, g.ev_group))), narrow(np.lexsort((g.ev_gap, _position_key(g)))))
        g._segment_orders = cached
    return cached


def _position_key(g: StepGraph) -> np.ndarray:
    """Per event: its rank and its position in the rank-step, as one key."""
    first = np.r_[0, np.flatnonzero(g.ev_rs[1:] != g.ev_rs[:-1]) + 1] if g.n_events else np.zeros(0, np.int64)
    pos = np.arange(g.n_events) - np.repeat(first, np.diff(np.r_[first, g.n_events]))
    return g.ev_rank.astype(np.int64) * (int(pos.max(initial=0)) + 1) + pos


def _subset_medians(order: np.ndarray, sel: np.ndarray, key: np.ndarray, v: np.ndarray,
                    n_keys: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`group_median` of ``v[sel]`` by ``key[sel]`` from `order`, the rows sorted by (key, v): the same
    figures without a sort. Returns the medians — per key 0..n_keys−1 (NaN where a key has no row), or with n_keys
    None per key present, in key order — and the selected rows in sorted order with each one's index into them."""
    o = order[sel[order]]
    ks, vs = key[o], v[o]
    start = np.flatnonzero(np.r_[True, ks[1:] != ks[:-1]]) if o.size else np.zeros(0, np.int64)
    cnt = np.diff(np.r_[start, o.size])
    mid = (vs[start + (cnt - 1) // 2] + vs[start + cnt // 2]) / 2
    run = np.repeat(np.arange(start.size), cnt)
    if n_keys is None:
        return mid, o, run
    med = np.full(n_keys, np.nan)
    med[ks[start]] = mid
    return med, o, run


def _presorted_spread(order: np.ndarray, sel: np.ndarray, key: np.ndarray, v: np.ndarray) -> float:
    """:func:`_spread` of ``v[sel]`` by ``key[sel]`` from `order`, the rows sorted by (key, v)."""
    if not sel.any():
        return 0.0
    mid, o, run = _subset_medians(order, sel, key, v)
    med = np.empty(v.size)
    med[o] = mid[run]
    return 1.4826 * float(np.median(np.abs(v[sel] - med[sel])))


def _straggler(g: StepGraph, c: Change) -> StepGraph:
    who_ev = c._mask(g.ev_rank)
    who_rs = c._mask(g.rs_rank)
    gap, tail = g.ev_gap.copy(), g.rs_tail.copy()
    coll = g.ev_kind == KIND_COLL
    # a peer's segment that only hands its arrival over from the previous event's end (its communication thread or
    # stream was busy: the work it did meanwhile is hidden there) says nothing about how long the work takes
    handoff = (g.ev_link == LINK_END) & (g.ev_gap < HANDOFF_NS)
    peers = coll & ~who_ev & ~handoff
    by_group, by_pos = _segment_orders(g)
    med = _subset_medians(by_group, peers, g.ev_group, g.ev_gap, g.n_groups)[0] if g.n_groups else np.zeros(0)
    mine = np.flatnonzero(coll & who_ev)
    m = med[g.ev_group[mine]] if mine.size else np.zeros(0)
    # the rank's systematic excess per segment (its position in the rank-step), the median over steps of
    # (own − peers' median), is taken off every step's segment: its step-to-step noise stays, as it would
    key = _position_key(g)
    gap[mine] = _less_excess(g.ev_gap[mine], m, key[mine], _presorted_spread(by_pos, peers, key, g.ev_gap),
                             None if g.ev_cpu_wait is None else g.ev_cpu_wait[mine])
    steps, si = np.unique(g.rs_step, return_inverse=True)
    si = si.reshape(-1)
    tmed = group_median(si[~who_rs], g.rs_tail[~who_rs], steps.size) if (~who_rs).any() else \
        np.full(steps.size, np.nan)
    tail[who_rs] = _less_excess(g.rs_tail[who_rs], tmed[si[who_rs]], g.rs_rank[who_rs],
                                _spread(g.rs_tail[~who_rs], g.rs_rank[~who_rs]),
                                None if g.rs_tail_cpu_wait is None else g.rs_tail_cpu_wait[who_rs])
    # point-to-point segments: scaled by the rank-step's ratio of new to old (collective and tail) work
    p2p = who_ev & ((g.ev_kind == KIND_SEND) | (g.ev_kind == KIND_RECV))
    if p2p.any():
        old = g.rs_tail + np.bincount(g.ev_rs[coll], weights=g.ev_gap[coll], minlength=g.rs_rank.size)
        new = tail + np.bincount(g.ev_rs[coll], weights=gap[coll], minlength=g.rs_rank.size)
        ratio = np.where(old > 0, np.minimum(new / np.where(old > 0, old, 1.0), 1.0), 1.0)
        if not coll.any():  # a pure pipeline: the peers' median work per step against the rank's own
            w = np.bincount(g.ev_rs, weights=g.ev_gap, minlength=g.rs_rank.size) + g.rs_tail
            wmed = group_median(si[~who_rs], w[~who_rs], steps.size) if (~who_rs).any() else \
                np.full(steps.size, np.nan)
            r = wmed[si] / np.where(w > 0, w, 1.0)
            ratio = np.where(who_rs & np.isfinite(r), np.minimum(r, 1.0), 1.0)
            tail = np.where(who_rs, g.rs_tail * ratio, tail)
        gap[p2p] = g.ev_gap[p2p] * ratio[g.ev_rs[p2p]]
    return g.with_segments(gap=gap, tail=tail)


def _rank_step_values(run: RunSummary, g: StepGraph, column: str) -> np.ndarray:
    """A breakdown column of each rank-step of the graph (aligned steps table; 0 where absent or unknown)."""
    return np.nan_to_num(rank_step_values(run.steps, column, g.rs_rank, g.rs_step, missing=0.0), nan=0.0)


def _op_ms(run: RunSummary, g: StepGraph, name: str) -> np.ndarray:
    """Per rank-step of the graph: the own time of op `name` (op_totals), ms."""
    out = np.zeros(g.rs_rank.size)
    rows = {(int(r), int(s)): i for i, (r, s) in enumerate(zip(g.rs_rank.tolist(), g.rs_step.tolist()))}
    for r, s in run.ranks.items():
        hit = np.flatnonzero(np.asarray(s.op_names, dtype=object) == name)
        if not hit.size:
            continue
        sel = np.isin(s.op_totals["name"], hit)
        for step, ms in zip(s.op_totals["step"][sel].tolist(), s.op_totals["dur_ms"][sel].tolist()):
            i = rows.get((int(r), int(step)))
            if i is not None:
                out[i] += ms
    return out


def apply(run: RunSummary, g: StepGraph, c: Change) -> StepGraph:
    """The graph with change `c` applied to its segments."""
    if isinstance(c, Straggler):
        return _straggler(g, c)
    if isinstance(c, (OverlapComm, FasterCollective)):
        sel = c._mask(g.ev_rank)
        if isinstance(c, FasterCollective):
            ok_op = np.array([str(n) == c.op for n in g.names], bool)
            sel &= (g.ev_op >= 0) & ok_op[np.maximum(g.ev_op, 0)] if ok_op.size else np.zeros(g.n_events, bool)
            if c.pg is not None:
                sel &= g.ev_pg == c.pg
        x = g.ev_transfer.copy()
        x[sel] = 0.0 if isinstance(c, OverlapComm) else x[sel] / c.factor
        return g.with_segments(transfer=x)
    if isinstance(c, NoIdle):
        rm = _rank_step_values(run, g, "idle_ms")
    elif isinstance(c, NoCpuWait):
        rm = _rank_step_values(run, g, "cpu_wait_ms")
    elif isinstance(c, NoInputWait):
        per_rank = {r: s.measures.input.input_ms_per_step if s.measures is not None else 0.0
                    for r, s in run.ranks.items()}
        rm = np.array([per_rank.get(int(r), 0.0) for r in g.rs_rank.tolist()], np.float64) if per_rank else \
            np.zeros(g.rs_rank.size)
    elif isinstance(c, FasterOp):
        rm = _op_ms(run, g, c.name) * (1.0 - 1.0 / c.factor)
    else:
        raise TypeError(f"unknown what-if change {type(c).__name__}")
    gap, tail = _remove_work(g, np.where(c._mask(g.rs_rank), rm, 0.0))
    return g.with_segments(gap=gap, tail=tail)


def _lead_in(g: StepGraph, changed: StepGraph) -> StepGraph:
    """`changed` with the first step of each chain (a window's first recorded step, or the first after a gap)
    starting earlier by the rank's mean tail change over the chain — the step before it was not recorded, and its
    tail, the rank's time after its last sync point, which sets where its next step starts, is taken to change as the
    recorded ones do — but by no more than the rank was late into its first collective (after its earliest member):
    a rank late into every step from a delay before its forward gets its full gain there too, and one that was not
    late there gains nothing from starting earlier."""
    nrs = g.rs_rank.size
    if not nrs or not g.n_events:
        return changed
    head = np.maximum.accumulate(np.where(g.rs_prev < 0, np.arange(nrs), 0))  # each rank-step's chain (its head)
    cut = np.bincount(head, weights=g.rs_tail - changed.rs_tail, minlength=nrs) / \
        np.maximum(np.bincount(head, minlength=nrs), 1)
    if not np.any(cut > 0):
        return changed
    return changed.with_segments(start=g.rs_start - np.clip(cut, 0.0, _first_lateness(g)))


def _first_lateness(g: StepGraph) -> np.ndarray:
    """Per rank-step: how much later than the instance's earliest member it arrived at its first sync event, when
    that is a collective and the rank-step is the first of its chain (else 0)."""
    out = np.zeros(g.rs_rank.size)
    first = np.flatnonzero(np.r_[True, g.ev_rs[1:] != g.ev_rs[:-1]])
    first = first[(g.ev_group[first] >= 0) & (g.rs_prev[g.ev_rs[first]] < 0)]
    if first.size:
        idx, bounds = _group_order(g)  # the members, group by group (every group id has one: dense ids)
        earliest = np.minimum.reduceat(g.ev_arrival[idx], bounds)
        out[g.ev_rs[first]] = np.maximum(g.ev_arrival[first] - earliest[g.ev_group[first]], 0.0)
    return out


def reads_graph_only(c: Change) -> bool:
    """Whether applying `c` reads nothing of the run but its step graph (:func:`apply`): another MPI process that
    holds the graph and its measured replay (:meth:`Estimator.replayed`) can estimate it
    (analysis/report/parallel.py)."""
    return isinstance(c, (OverlapComm, FasterCollective))


def _kind(c: Change) -> str:
    return {Straggler: "straggler", OverlapComm: "overlap_comm", FasterCollective: "faster_collective",
            NoIdle: "no_idle", NoInputWait: "no_input_wait", NoCpuWait: "no_cpu_wait", FasterOp: "faster_op"}[type(c)]


@dataclass
class Replayed:
    """An estimator's measured chained replay, as another process holding the same graph takes it: the schedule
    (None: the graph has no chains, or they form a cycle), its values and ends, and each rank-step's duration."""

    schedule: Schedule | None
    values: tuple[np.ndarray, np.ndarray] | None
    base: np.ndarray


class Estimator:
    """The measured graph and its chained replay, computed once for many changes. A change's replay starts at the
    first level whose inputs it changes (the levels before it are the measured replay's: :mod:`.schedule`), and a
    change asked for again (the report's table and its findings often ask for the same one) is not replayed again.

    `replayed`: the measured replay of `graph` made elsewhere (:meth:`replayed`), instead of replaying it again; `run`
    may then be None, for the changes that read the graph alone (:func:`reads_graph_only`: their gains only)."""

    def __init__(self, run: RunSummary | None, graph: StepGraph | None = None, *, replayed: Replayed | None = None):
        self.run = run
        self.g = graph if graph is not None else step_graph(run)
        if replayed is not None:
            self._sched, self.base = replayed.schedule, replayed.base
            if replayed.values is not None:
                self._values = replayed.values
        else:
            self._sched = schedule(self.g) if (self.g.rs_prev >= 0).any() else None
            if self._sched is not None:
                self._values = replay_values(self.g, self._sched)
                self.base = self._step_ms(*self._values)
            else:
                self.base = replay(self.g, chain=True).step_ms(self.g)
        self.steps, self.si = np.unique(self.g.rs_step, return_inverse=True)
        self.si = self.si.reshape(-1)
        st, t = per_step_time_ms(run) if run is not None else (np.zeros(0, np.int64), np.zeros(0))
        self.measured = t[np.searchsorted(st, self.steps)] if st.size else np.zeros(0)
        self.n = np.maximum(np.bincount(self.si, minlength=self.steps.size), 1)
        self._gains: dict[tuple, np.ndarray] = {}
        self.replays = 0  # the changes replayed (not answered from an earlier one)

    def replayed(self) -> Replayed:
        """The measured replay, for an estimator of the same graph elsewhere (``Estimator(None, g, replayed=…)``)."""
        return Replayed(self._sched, self._values if self._sched is not None else None, self.base)

    def gains(self, changes: Iterable[Change]) -> list[np.ndarray]:
        """Each change's gain per step (ms; see :meth:`_gain`), to hand to :meth:`take_gains` elsewhere."""
        return [self._gain(c) for c in changes]

    def take_gains(self, changes: Iterable[Change], gains: Iterable[np.ndarray]) -> None:
        """The gains of `changes` computed by an estimator of the same graph elsewhere (:meth:`gains`): asked for
        here, they are not replayed again."""
        for c, gain in zip(changes, gains):
            self._gains.setdefault(_key(c), np.asarray(gain, dtype=np.float64))

    def _step_ms(self, v: np.ndarray, end: np.ndarray) -> np.ndarray:
        """Each rank-step's replayed duration (ms) from the values [A | Z | B] and the ends (Replay.step_ms)."""
        return (end - v[2 * self.g.n_events:]) / NS_PER_MS

    def _replayed_ms(self, changed: StepGraph) -> np.ndarray:
        """Each rank-step's duration in the chained replay of `changed` (ms): the same figures as a full replay."""
        if self._sched is None:
            return replay(changed, chain=True).step_ms(self.g)
        row = first_changed_row(self._sched, self.g, changed)
        if row >= len(self._sched.bounds):  # nothing the replay reads changed
            return self.base
        return self._step_ms(*replay_values(changed, self._sched, base=self._values, from_row=row))

    def _gain(self, c: Change) -> np.ndarray:
        """Per step: the mean over ranks of the measured replay's step less the changed one's (ms), replayed once per
        change."""
        key = _key(c)
        gain = self._gains.get(key)
        if gain is None:
            self.replays += 1
            changed = self._replayed_ms(_lead_in(self.g, apply(self.run, self.g, c)))
            gain = np.bincount(self.si, weights=self.base - changed, minlength=self.steps.size) / self.n
            self._gains[key] = gain
        return gain.copy()

    def estimate(self, c: Change) -> WhatIf:
        gain = self._gain(c)
        if not self.measured.size:
            return WhatIf(_kind(c), c.describe(), None, None, 0.0, None, gain)
        measured = float(np.mean(self.measured))
        g = float(np.mean(gain))
        return WhatIf(_kind(c), c.describe(), measured, measured - g, g,
                      100.0 * g / measured if measured > 0 else None, gain)


def estimator(run: RunSummary, graph: StepGraph | None = None) -> Estimator:
    """An :class:`Estimator` of `run`; with `graph`, the one kept with it (built once: the report's what-if table and
    its findings' gains then share the measured replay and every change's)."""
    if graph is None:
        return Estimator(run)
    est = getattr(graph, "_estimator", None)
    if est is None or est.run is not run:
        est = Estimator(run, graph)
        graph._estimator = est
    return est


def _key(c: Change) -> tuple:
    """What identifies a change's replay: its kind and fields, its ranks as a set."""
    ranks = None if c.ranks is None else tuple(sorted(set(c.ranks)))
    return (type(c), ranks, *(getattr(c, f.name) for f in fields(c) if f.name != "ranks"))


def estimate(run: RunSummary, change: Change, *, graph: StepGraph | None = None) -> WhatIf:
    """Predicted step time of `run` with `change` (see the module docstring)."""
    return estimator(run, graph).estimate(change)


def estimate_many(run: RunSummary, changes: Iterable[Change], *, graph: StepGraph | None = None) -> list[WhatIf]:
    b = estimator(run, graph)
    return [b.estimate(c) for c in changes]


#: Collectives given an "N x faster" row in the standard table (the heaviest on the critical path).
STANDARD_FACTOR = 2.0


def standard(run: RunSummary, *, stragglers: Stragglers | None = None, graph: StepGraph | None = None,
             top_ops: int = 1, general: list[Change] | None = None) -> list[WhatIf]:
    """The report's what-if table: named stragglers at their peers' median, communication overlapped, the heaviest
    collective op 2x faster, idle and input waits removed, the heaviest op 2x faster — largest gain first.
    `general`: :func:`general_changes` already made (the report makes them before the stragglers are known)."""
    b = estimator(run, graph)
    named = [int(d.rank) for d in (stragglers.ranks if stragglers is not None else []) if d.named]
    changes: list[Change] = [Straggler(ranks=tuple(named))] if named else []
    rows = [b.estimate(c) for c in changes + (general if general is not None else general_changes(run, b, top_ops))]
    rows.sort(key=lambda w: -(w.gain_ms_per_step or 0.0))
    return rows


def general_changes(run: RunSummary, b: Estimator, top_ops: int = 1) -> list[Change]:
    """The standard table's changes that do not depend on the straggler analysis: communication overlapped, the
    heaviest collective op 2x faster, idle and input waits removed, the heaviest ops 2x faster. (The report
    estimates them while another MPI process runs the straggler analysis: the estimator keeps each change's replay.)"""
    changes: list[Change] = []
    if b.g.n_events:
        changes.append(OverlapComm())
        coll = b.g.ev_op >= 0
        if coll.any():
            w = np.bincount(b.g.ev_op[coll], weights=b.g.ev_transfer[coll], minlength=len(b.g.names))
            changes.append(FasterCollective(op=str(b.g.names[int(np.argmax(w))]), factor=STANDARD_FACTOR))
    changes += [NoIdle(), NoInputWait()]
    for name in _heaviest_ops(run, top_ops):
        changes.append(FasterOp(name=name, factor=STANDARD_FACTOR))
    return changes


def _heaviest_ops(run: RunSummary, k: int) -> list[str]:
    """The op names with the most own time summed over ranks and steps, leaves preferred: ``aten::`` ops and
    kernels (a module's or an annotation's time includes its ops'). Ties in the order the names are first seen
    (rank by rank, in each rank's order of names)."""
    ids: defaultdict = defaultdict(itertools.count().__next__)  # a name -> its place in the arrays below
    tot, first = np.zeros(0), np.zeros(0, dtype=np.int64)  # per name: the sum, and when it was first seen (-1)
    aten = np.zeros(0, dtype=bool)
    seen = 0
    for s in run.ranks.values():
        if not s.op_totals["name"].size:
            continue
        gid = np.array([ids[n] for n in s.op_names.tolist()], dtype=np.int64)
        if len(ids) > tot.size:  # names not seen before: their arrays' room, and which are aten:: ops
            grow = len(ids) - tot.size
            tot, first = np.concatenate([tot, np.zeros(grow)]), np.concatenate([first, np.full(grow, -1)])
            aten = np.concatenate([aten, [str(n).startswith("aten::") for n in itertools.islice(ids, aten.size, None)]])
        kinds = np.array(s.op_kinds[:gid.size] + [""] * max(gid.size - len(s.op_kinds), 0), dtype=object)
        leaf = (kinds == "kernel") | aten[gid]
        w = np.bincount(s.op_totals["name"], weights=s.op_totals["dur_ms"], minlength=gid.size)[:gid.size]
        local = np.flatnonzero((w != 0) & leaf)
        g = gid[local]
        new = g[first[g] < 0]
        new = new[np.sort(np.unique(new, return_index=True)[1])]  # a name listed twice: seen at its first place
        first[new] = seen + np.arange(new.size)
        seen += new.size
        np.add.at(tot, g, w[local])  # one name twice in a rank's list: both added, as the loop over names did
    have = np.flatnonzero(first >= 0)
    order = have[np.lexsort((first[have], -tot[have]))][:k]
    names = list(ids)
    return [str(names[i]) for i in order.tolist()]
