"""Planning the timeline of a RunSummary: which ranks, windows and steps go in, what the budget cuts, the tracks,
the origin and the counts — one rank's events read at a time (``analysis.summarize.merged.rank_merged``).
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from ..analysis.summarize.merged import rank_merged
from ..analysis.types import MergedRun
from ..errors import ConfigError
from ..progress import progress_enabled
from .timeline_cut import Cut, decide_cut, format_ranges
from .timeline_rank import enqueue_links, launch_links, track_key, tracks

__all__ = ["TimelinePlan", "plan_timeline", "DEFAULT_MAX_EVENTS", "BYTES_PER_EVENT", "select", "cells_of",
           "rank_masks", "step_keep", "kept_members"]

#: Default budget of trace events in one file (≈200 MB of JSON).
DEFAULT_MAX_EVENTS = 1_000_000
#: Rough JSON size of one trace event, for size estimates in messages.
BYTES_PER_EVENT = 200


@dataclass
class _RankCells:
    """What one rank adds to the timeline, per step unit (cell 0: outside every step; cell u + 1: unit u), before any
    cut: the counts behind the budget, the tracks, earliest times and windows of what a cell holds."""

    rank: int
    ev: np.ndarray  # selected events
    mem: np.ndarray  # selected memory samples
    st: np.ndarray  # selected step markers
    cost: np.ndarray  # trace events the cell needs (events, samples, markers, 2 per arrow end)
    keys: list[set[int]]  # track keys of the selected events
    windows: list[set[int]]  # windows of the selected events and markers
    t_min: np.ndarray  # earliest aligned time of a selected event / sample / marker (int64 max: none)
    n_keys: int  # distinct tracks of the selected events
    track_labels: list[tuple[int, str]]  # every selected track (key, label), in the timeline's track order
    enq_cells: np.ndarray  # (n, 2) cells of both ends of each enqueue link with both ends selected
    launch_cells: np.ndarray  # (n, 2) cells of (launch, device event) of each launch link, launch selected


@dataclass
class TimelinePlan:
    """What goes into the timeline of a RunSummary, rank by rank, and how it is laid out (:func:`plan_timeline`).

    A rank's kept rows follow from the selection and the cut (:meth:`keeps`); only a rank whose shortest events are
    dropped (cut stage ``short_events``) has its rows listed (``explicit``).
    """

    ranks: list[int]  # ranks with kept rows, written in this order
    windows: list[int]
    origin_ns: int
    tracks: dict[int, list[tuple[int, int, str]]]  # rank -> [(key, out_tid, name)], key = see track_key
    cut: Cut
    selection: dict[str, Any]
    units: list[int]  # step units (empty without a budget)
    sel_ranks: list[int]
    sel_windows: list[int]
    launch_flows: bool = False
    explicit: dict[int, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)  # rank -> ev, mem keep masks
    counts: dict[str, int] = field(default_factory=dict)  # slices, step_markers, memory_samples, flows, ...

    @property
    def n_metadata(self) -> int:
        return 2 * len(self.tracks) + 2 * sum(len(t) for t in self.tracks.values())

    @property
    def n_events(self) -> int:
        """Trace events written (metadata included)."""
        c = self.counts
        return (c["slices"] + c["memory_samples"] + c["step_markers"] + 2 * c["flows"] + 2 * c["enqueue_flows"]
                + 2 * c["launch_flows"] + self.n_metadata)

    def keep_cell(self, rank: int, cells: np.ndarray) -> np.ndarray:
        """Mask over rows in `cells` (0 = outside every step, u + 1 = unit u) kept by the cut, for `rank`."""
        if not self.cut.happened:
            return np.ones(len(cells), bool)
        if rank not in self.cut.ranks_kept:
            return np.zeros(len(cells), bool)
        if not self.units:
            return np.ones(len(cells), bool)
        kept = np.zeros(len(self.units) + 1, bool)
        kept[1:] = np.isin(np.asarray(self.units), self.cut.steps_kept)
        return kept[cells]


# ---- planning --------------------------------------------------------------------------------------------------------


def select(tab: dict[str, np.ndarray], sel_windows, steps, step_col: str = "step") -> np.ndarray:
    m = np.isin(tab["window"], sel_windows)
    if steps is not None:
        m &= (tab[step_col] >= steps[0]) & (tab[step_col] <= steps[1])
    return m


def cells_of(step: np.ndarray, units_a: np.ndarray) -> np.ndarray:
    """Cell of each row: u + 1 when its step is unit u, else 0 (outside every step, or no budget)."""
    ss = np.asarray(step, np.int64)
    if not units_a.size:
        return np.zeros(ss.size, np.int64)
    uu = np.searchsorted(units_a, ss)
    inside = uu < units_a.size
    inside[inside] = units_a[uu[inside]] == ss[inside]
    return np.where(inside, uu + 1, 0)


def _member_rows(run, rank: int, orig: np.ndarray) -> np.ndarray:
    """Rows (of the rank's MergedRun) of its members of matched collectives."""
    m = run.collectives.members
    cr = run.collective_rows
    mine = np.asarray(m["rank"]) == rank
    ev_row = np.asarray(cr["ev_row"], np.int64)[np.asarray(m["row"], np.int64)[mine]]
    pos = np.searchsorted(orig, ev_row)
    ok = (pos < orig.size) & (orig[np.minimum(pos, max(orig.size - 1, 0))] == ev_row) if orig.size else \
        np.zeros(ev_row.size, bool)
    return np.sort(pos[ok])


def p2p_rows_of(run, rank: int, orig: np.ndarray) -> np.ndarray:
    """Rows (of the rank's MergedRun) of its ends of matched point-to-point transfers, sorted."""
    pp = run.p2p
    ev_row = np.r_[np.asarray(pp.send_row, np.int64)[np.asarray(pp.src) == rank],
                   np.asarray(pp.recv_row, np.int64)[np.asarray(pp.dst) == rank]]
    ev_row = np.unique(ev_row[ev_row >= 0])
    if not orig.size or not ev_row.size:
        return np.zeros(0, np.int64)
    pos = np.searchsorted(orig, ev_row)
    ok = (pos < orig.size) & (orig[np.minimum(pos, orig.size - 1)] == ev_row)
    return np.sort(pos[ok])


def kept_p2p(run, plan: TimelinePlan) -> np.ndarray:
    """Mask over the matched point-to-point transfers whose two ends are both selected and kept."""
    pp = run.p2p
    keep = np.isin(np.asarray(pp.window), plan.sel_windows)
    for rank, step in ((pp.src, pp.send_step), (pp.dst, pp.recv_step)):
        rank, step = np.asarray(rank, np.int64), np.asarray(step, np.int64)
        keep &= np.isin(rank, plan.sel_ranks)
        if plan.cut.happened:
            keep &= np.isin(rank, plan.cut.ranks_kept)
        for sel in (run.steps_selection, plan.selection["steps"]):
            if sel is not None:
                keep &= (step >= sel[0]) & (step <= sel[1])
        if plan.units and plan.cut.happened:
            keep &= np.isin(step, plan.cut.steps_kept)
    return keep


def _rank_cells(run, rm: MergedRun, orig: np.ndarray, sel_windows, steps, units_a: np.ndarray,
                launch_flows: bool) -> _RankCells:
    ev, mem, st = rm.events, rm.memory, rm.steps
    ev_m, mem_m, st_m = select(ev, sel_windows, steps), select(mem, sel_windows, steps), select(st, sel_windows,
                                                                                                  steps)
    nc = units_a.size + 1
    ev_c, mem_c, st_c = cells_of(ev["step"], units_a), cells_of(mem["step"], units_a), cells_of(st["step"], units_a)

    def count(cells, mask):
        return np.bincount(cells[mask], minlength=nc).astype(np.int64)

    n_ev = len(ev["ts_ns"])
    r = _rank_of(rm)
    member = np.zeros(n_ev, bool)
    mrows = _member_rows(run, r, orig)
    member[mrows[ev_m[mrows]]] = True
    enq_src, enq_dst, _, _, _ = enqueue_links(rm)
    both = ev_m[enq_src] & ev_m[enq_dst]
    enq_src, enq_dst = enq_src[both], enq_dst[both]
    linked = np.zeros(n_ev, bool)
    linked[enq_dst] = True
    if launch_flows:
        l_src, l_dst = launch_links(rm, np.flatnonzero(ev_m))
        sel = ev_m[l_src]
        l_src, l_dst = l_src[sel], l_dst[sel]
    else:
        l_src = l_dst = np.zeros(0, np.int64)
    launched = np.zeros(n_ev, bool)
    launched[l_dst] = True
    ev_cnt, mem_cnt, st_cnt = count(ev_c, ev_m), count(mem_c, mem_m), count(st_c, st_m)
    cost = ev_cnt + mem_cnt + st_cnt + 2 * count(ev_c, member) + 2 * count(ev_c, linked) + 2 * count(ev_c, launched)
    keys_all = track_key(ev["device"], ev["tid"])
    keys = [set(np.unique(keys_all[ev_m & (ev_c == c)]).tolist()) for c in range(nc)]
    windows = [set(np.unique(ev["window"][ev_m & (ev_c == c)]).tolist())
               | set(np.unique(st["window"][st_m & (st_c == c)]).tolist()) for c in range(nc)]
    big = np.iinfo(np.int64).max
    t_min = np.full(nc, big, np.int64)
    for tab, mask, cells, col in ((ev, ev_m, ev_c, "ts_ns"), (mem, mem_m, mem_c, "ts_ns"), (st, st_m, st_c, "start_ns")):
        if mask.any():
            np.minimum.at(t_min, cells[mask], np.asarray(tab[col], np.int64)[mask])
    labels = [(k, label) for k, _, label in tracks(rm, np.flatnonzero(ev_m), [r])[r][1:]]
    return _RankCells(rank=r, ev=ev_cnt, mem=mem_cnt, st=st_cnt, cost=cost, keys=keys, windows=windows, t_min=t_min,
                      n_keys=len(np.unique(keys_all[ev_m])), track_labels=labels,
                      enq_cells=np.stack([ev_c[enq_src], ev_c[enq_dst]], axis=1) if enq_src.size
                      else np.zeros((0, 2), np.int64),
                      launch_cells=np.stack([ev_c[l_src], ev_c[l_dst]], axis=1) if l_src.size
                      else np.zeros((0, 2), np.int64))


def _windows_of(run) -> list[int]:
    return sorted({int(w) for s in run.ranks.values() for w in s.windows})


def plan_timeline(
    run,
    *,
    ranks: Sequence[int] | None = None,
    windows: Sequence[int] | None = None,
    steps: tuple[int, int] | None = None,
    max_events: int | None = DEFAULT_MAX_EVENTS,
    launch_flows: bool = False,
    progress: bool | None = None,
) -> TimelinePlan:
    """Select ranks, windows and inclusive global steps of a RunSummary and fit them into `max_events` (None/0: no
    limit). Reads one rank's events at a time.

    Arrows: collectives across ranks, and each collective's enqueue to its execution on the same rank (always);
    every launch to its device event when `launch_flows` (2 trace events per kernel, so off by default).

    Raises ConfigError when the selection names ranks or windows the run lacks, or keeps nothing.
    """
    sel_ranks, sel_windows = _selected_ranks(run, ranks), _selected_windows(run, windows)
    read = [r for r in sel_ranks if r in run.ranks]
    budget = None if not max_events or max_events <= 0 else int(max_events)
    units = _units(run, read, sel_windows, steps) if budget is not None else []
    units_a = np.asarray(units, np.int64)
    cells: dict[int, _RankCells] = {}
    for r in _bar(read, progress, "planning timeline"):
        rm, orig = rank_merged(run, r)
        cells[r] = _rank_cells(run, rm, orig, sel_windows, steps, units_a, launch_flows)
    if not any(c.ev.any() or c.st.any() for c in cells.values()):
        raise ConfigError("the selection (--ranks/--window/--steps) keeps no event; widen it")
    cut = Cut(budget=budget or 0, needed=0, stage="none", steps_selected=list(units), steps_kept=list(units),
              ranks_selected=list(sel_ranks), ranks_kept=list(sel_ranks))
    plan = TimelinePlan(ranks=[], windows=[], origin_ns=0, tracks={}, cut=cut, units=list(units),
                        sel_ranks=list(sel_ranks), sel_windows=list(sel_windows), launch_flows=bool(launch_flows),
                        selection={"ranks": None if ranks is None else list(sel_ranks),
                                   "windows": None if windows is None else list(sel_windows),
                                   "steps": None if steps is None else [int(steps[0]), int(steps[1])],
                                   "max_events": budget, "launch_flows": bool(launch_flows)})
    if budget is not None:
        _fit_budget(run, plan, cells, budget)
    _finish_plan(run, plan, cells)
    return plan


def _selected_ranks(run, ranks: Sequence[int] | None) -> list[int]:
    """The ranks of the selection, sorted (every rank of the run when None); ConfigError if the run lacks one."""
    return _selected("--ranks", "rank", sorted(int(r) for r in run.ranks_present), ranks)


def _selected_windows(run, windows: Sequence[int] | None) -> list[int]:
    """The windows of the selection, sorted (every window of the run when None); ConfigError if the run lacks one."""
    return _selected("--window", "window", _windows_of(run), windows)


def _selected(flag: str, noun: str, have: list[int], wanted: Sequence[int] | None) -> list[int]:
    """`wanted` sorted (`have` when None); ConfigError naming `flag` and what the run has if one is not in `have`."""
    sel = have if wanted is None else sorted({int(x) for x in wanted})
    absent = [x for x in sel if x not in have]
    if absent:
        raise ConfigError(f"{flag} {format_ranges(absent)}: not in this run (it has {noun}(s) "
                          f"{format_ranges(have)})")
    return sel


def _fit_budget(run, plan: TimelinePlan, cells: dict[int, _RankCells], budget: int) -> None:
    """Fills in ``plan.cut``: what the selection needs and, over `budget`, what is cut (with the rows of the one
    kept rank at cut stage ``short_events`` in ``plan.explicit``)."""
    cut, units, sel_ranks = plan.cut, plan.units, plan.sel_ranks
    # metadata: 2 per process, 2 per track (the tracks the selection would use, plus "steps")
    n_meta_est = 4 * len(sel_ranks) + 2 * sum(c.n_keys for c in cells.values())
    cost = np.stack([cells[r].cost if r in cells else np.zeros(len(units) + 1, np.int64) for r in sel_ranks])
    cut.needed = int(cost.sum()) + n_meta_est
    if cut.needed > budget:
        decide_cut(cut, cost, units, sel_ranks, budget - n_meta_est)
        if cut.stage == "short_events":
            r = cut.ranks_kept[0]
            rm, orig = rank_merged(run, r)
            plan.explicit[r] = _short_keep(run, plan, rm, orig, budget - n_meta_est)


def _units(run, ranks: list[int], sel_windows, steps) -> list[int]:
    """Step units of the selection: the steps the selected ranks recorded (an event's step is one of its rank's)."""
    return sorted({int(s) for s in run.steps["step"][_step_mask(run, ranks, sel_windows, steps)]})


def _step_mask(run, ranks, sel_windows, steps) -> np.ndarray:
    st = run.steps
    m = np.isin(st["rank"], ranks) & np.isin(st["window"], sel_windows)
    if steps is not None:
        m &= (st["step"] >= steps[0]) & (st["step"] <= steps[1])
    return m


def rank_masks(run, plan: TimelinePlan, rm: MergedRun, orig: np.ndarray):
    """Selected and kept rows of one rank: (ev_m, mem_m, st_m, ev_keep, mem_keep, st_keep, member, enqueue links,
    launch links) — links as (src, dst) before the keep."""
    ev, mem, st = rm.events, rm.memory, rm.steps
    steps = plan.selection["steps"]
    units_a = np.asarray(plan.units, np.int64)
    ev_m = select(ev, plan.sel_windows, steps)
    mem_m = select(mem, plan.sel_windows, steps)
    st_m = select(st, plan.sel_windows, steps)
    r = _rank_of(rm)
    ev_keep = ev_m & plan.keep_cell(r, cells_of(ev["step"], units_a))
    mem_keep = mem_m & plan.keep_cell(r, cells_of(mem["step"], units_a))
    st_keep = st_m & plan.keep_cell(r, cells_of(st["step"], units_a))
    n_ev = len(ev["ts_ns"])
    member = np.zeros(n_ev, bool)
    mrows = _member_rows(run, r, orig)
    member[mrows[ev_m[mrows]]] = True
    enq_src, enq_dst, enq_op, enq_group, enq_order = enqueue_links(rm)
    sel = ev_m[enq_src] & ev_m[enq_dst]
    enq = tuple(x[sel] for x in (enq_src, enq_dst, enq_op, enq_group, enq_order))
    if plan.launch_flows:
        l_src, l_dst = launch_links(rm, np.flatnonzero(ev_m))
        sel = ev_m[l_src]
        l_src, l_dst = l_src[sel], l_dst[sel]
    else:
        l_src = l_dst = np.zeros(0, np.int64)
    if r in plan.explicit:
        ev_keep, mem_keep = plan.explicit[r]
    return ev_m, mem_m, st_m, ev_keep, mem_keep, st_keep, member, enq, (l_src, l_dst)


def _rank_of(rm: MergedRun) -> int:
    for tab in (rm.events, rm.steps, rm.memory):
        if len(tab["rank"]):
            return int(tab["rank"][0])
    return int(rm.ranks_present[0]) if rm.ranks_present else 0


def _short_keep(run, plan: TimelinePlan, rm: MergedRun, orig: np.ndarray, room: int):
    """Cut stage ``short_events`` on the one kept rank: collectives and the ends of enqueue links stay (with their
    arrows); memory samples are thinned when they alone would fill half the room; then the longest events that fit.
    A kernel with a launch arrow costs 3 (its slice and the arrow)."""
    cut = plan.cut
    _, _, _, ev_keep, mem_keep, st_keep, member, enq, (l_src, l_dst) = rank_masks(run, plan, rm, orig)
    ev = rm.events
    n_ev = len(ev["ts_ns"])
    enq_end = np.zeros(n_ev, bool)
    enq_end[enq[0]] = enq_end[enq[1]] = True
    launched = np.zeros(n_ev, bool)
    launched[l_dst] = True
    protected = (member | enq_end) & ev_keep
    fixed = (int(st_keep.sum()) + int(protected.sum()) + 2 * int((member & ev_keep).sum())
             + 2 * int((ev_keep[enq[0]] & ev_keep[enq[1]]).sum()) + 2 * int((launched & protected).sum()))
    left = max(room - fixed, 0)
    n_mem = int(mem_keep.sum())
    mem_keep = mem_keep.copy()
    ev_keep = ev_keep.copy()
    if n_mem > left // 2:
        stride = max(1, math.ceil(n_mem / max(left // 2, 1)))
        rows = np.flatnonzero(mem_keep)
        mem_keep[:] = False
        mem_keep[rows[::stride]] = True
        cut.memory_stride = stride
    left -= int(mem_keep.sum())
    free = np.flatnonzero(ev_keep & ~protected)
    weight = 1 + 2 * launched[free].astype(np.int64)
    if int(weight.sum()) > left:
        dur = ev["dur_ns"][free]
        order = np.argsort(-dur, kind="stable")
        n_fit = int(np.searchsorted(np.cumsum(weight[order]), max(left, 0), side="right"))
        drop = free[order[n_fit:]]
        ev_keep[drop] = False
        cut.short_dropped = len(drop)
        kept = free[order[:n_fit]]
        cut.min_dur_ns = int(ev["dur_ns"][kept].min()) if len(kept) else 0
    return ev_keep, mem_keep


def _finish_plan(run, plan: TimelinePlan, cells: dict[int, _RankCells]) -> None:
    """Ranks, windows, origin, tracks and counts of what the cut keeps."""
    counts = {"slices": 0, "step_markers": 0, "memory_samples": 0, "flows": 0, "enqueue_flows": 0,
              "launch_flows": 0}
    big = np.iinfo(np.int64).max
    origin = big
    windows: set[int] = set()
    for r in plan.sel_ranks:
        c = cells.get(r)
        if c is None:
            continue
        kc = plan.keep_cell(r, np.arange(len(c.ev)))
        if r in plan.explicit:
            rm, orig = rank_merged(run, r)
            ev_keep, mem_keep = plan.explicit[r]
            st_keep = select(rm.steps, plan.sel_windows, plan.selection["steps"]) & plan.keep_cell(
                r, cells_of(rm.steps["step"], np.asarray(plan.units, np.int64)))
            n_ev, n_mem, n_st = int(ev_keep.sum()), int(mem_keep.sum()), int(st_keep.sum())
            times = [rm.events["ts_ns"][ev_keep], rm.memory["ts_ns"][mem_keep], rm.steps["start_ns"][st_keep]]
            t = min((int(x.min()) for x in times if len(x)), default=big)
            keys = set(np.unique(track_key(rm.events["device"][ev_keep], rm.events["tid"][ev_keep])).tolist())
            wins = {int(w) for w in rm.events["window"][ev_keep]} | {int(w) for w in rm.steps["window"][st_keep]}
            _, _, _, _, _, _, _, enq, (l_src, l_dst) = rank_masks(run, plan, rm, orig)
            counts["enqueue_flows"] += int((ev_keep[enq[0]] & ev_keep[enq[1]]).sum())
            counts["launch_flows"] += int((ev_keep[l_src] & ev_keep[l_dst]).sum())
            tracks_src = (rm, np.flatnonzero(ev_keep))
        else:
            n_ev, n_mem, n_st = int(c.ev[kc].sum()), int(c.mem[kc].sum()), int(c.st[kc].sum())
            t = int(c.t_min[kc].min()) if kc.any() else big
            keys = set().union(*(c.keys[i] for i in np.flatnonzero(kc))) if kc.any() else set()
            wins = set().union(*(c.windows[i] for i in np.flatnonzero(kc))) if kc.any() else set()
            counts["enqueue_flows"] += int((kc[c.enq_cells[:, 0]] & kc[c.enq_cells[:, 1]]).sum())
            counts["launch_flows"] += int((kc[c.launch_cells[:, 0]] & kc[c.launch_cells[:, 1]]).sum())
            tracks_src = None
        counts["slices"] += n_ev
        counts["memory_samples"] += n_mem
        counts["step_markers"] += n_st
        if n_ev or n_st:
            plan.ranks.append(r)
            windows |= wins
            origin = min(origin, t)
            if tracks_src is not None:
                plan.tracks[r] = tracks(tracks_src[0], tracks_src[1], [r])[r]
            else:
                plan.tracks[r] = [(-1, 1, "steps")] + [(k, i + 2, label) for i, (k, label) in
                                                       enumerate(x for x in c.track_labels if x[0] in keys)]
        elif n_mem:
            origin = min(origin, t)
    if not plan.ranks:
        raise ConfigError("the selection (--ranks/--window/--steps) keeps no event; widen it")
    counts["flows"] = _count_flows(run, plan)
    plan.counts = counts
    plan.windows = sorted(windows)
    plan.origin_ns = int(origin)


def kept_members(run, plan: TimelinePlan) -> np.ndarray:
    """Mask over the matched collectives' members: kept in the timeline (selected, not cut)."""
    m = run.collectives.members
    cr = run.collective_rows
    rows = np.asarray(m["row"], np.int64)
    step = np.asarray(cr["step"], np.int64)[rows]
    rank = np.asarray(m["rank"], np.int64)
    keep = np.isin(rank, plan.sel_ranks) & np.isin(np.asarray(m["window"]), plan.sel_windows)
    if plan.cut.happened:
        keep &= np.isin(rank, plan.cut.ranks_kept)
    sel_steps = plan.selection["steps"]
    if run.steps_selection is not None:
        keep &= (step >= run.steps_selection[0]) & (step <= run.steps_selection[1])
    if sel_steps is not None:
        keep &= (step >= sel_steps[0]) & (step <= sel_steps[1])
    if plan.units and plan.cut.happened:
        keep &= np.isin(step, plan.cut.steps_kept)
    return keep


def _count_flows(run, plan: TimelinePlan) -> int:
    keep = kept_members(run, plan)
    inst = np.asarray(run.collectives.members["inst"])[keep]
    n_p2p = int(kept_p2p(run, plan).sum())
    if not inst.size:
        return n_p2p
    return int(inst.size - np.unique(inst).size) + n_p2p


def _bar(items: Sequence[int], progress: bool | None, desc: str):
    if not progress_enabled(progress, len(items), 64):
        return items
    from tqdm import tqdm

    return tqdm(items, desc=desc, unit="rank", file=sys.stderr, leave=False)


def step_keep(run, plan: TimelinePlan) -> np.ndarray:
    """Rows of ``run.steps`` kept as step markers."""
    st = run.steps
    m = _step_mask(run, plan.sel_ranks, plan.sel_windows, plan.selection["steps"])
    keep = np.zeros(len(m), bool)
    units_a = np.asarray(plan.units, np.int64)
    for r in plan.ranks:
        rows = np.flatnonzero(m & (st["rank"] == r))
        keep[rows[plan.keep_cell(r, cells_of(st["step"][rows], units_a))]] = True
    return keep
