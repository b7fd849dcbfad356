"""The merged timeline: one Chrome trace-event JSON for every rank of a run, on the aligned clock.

    plan = plan_timeline(run, ranks=[0, 1], max_events=1_000_000)   # what goes in, what is cut (pure)
    for ev in iter_trace_events(run, plan): ...                     # the trace events, as dicts (pure)
    write_timeline(run, plan, "merged.json.gz")                     # JSON (gzipped for .gz), tmp + rename

Layout (Perfetto UI and chrome://tracing):

* one process per rank, ``pid = rank + 1`` (pid 0 is special in Perfetto), named ``rank 3 · host``, sorted by rank;
* per rank, tracks (``tid`` 1, 2, … per rank): ``steps`` (one slice per ``steps`` row, named ``step N``), then the
  main thread, communication workers, device streams, other threads; their names come from the ``threads`` table and
  carry the OS thread id (``python3 [31441] main``) or stream (``device 0 stream 7``);
* events as complete events (``ph`` "X"; "i" for instants) with ``cat`` = Kineto kind and ``args`` step, category,
  flops, device, correlation where they mean something; exec collectives also carry op, pg, seq, bytes, their arrival
  order and ``late_ms`` (arrival minus the median of the other ranks' arrivals, as in the straggler analysis);
* memory as one counter track per rank and device (``ph`` "C", ``allocated_MiB``);
* flow arrows (``ph`` "s" → "f", ``bp`` "e", unique ids) chaining the instances of each collective across ranks in
  arrival order (``matching.match_run``): the last arrow ends at the rank everyone waited for;
* flow arrows ``cat`` "enqueue" (named after the op) on one rank, from each collective's enqueue on the calling thread
  (``c10d::allreduce_``) to its execution (``gloo:all_reduce`` on the worker thread, or the NCCL kernel on its stream,
  found through the launch's correlation id): :func:`enqueue_links`;
* with ``launch_flows``, ``cat`` "launch" arrows from every runtime launch to its device event (Kineto's ``ac2g``).

Times: ``ts``/``dur`` are µs since ``origin_ns`` (the earliest time shown, aligned epoch ns) with the ns kept as
decimals; ``otherData.distprof`` records the origin, run id, selection, clock model and what was cut. Durations are
scaled by the host's clock drift (as aligned starts are), so nesting survives the alignment.

Budget: by default at most :data:`DEFAULT_MAX_EVENTS` trace events (≈200 B of JSON each, under chrome://tracing's
≈256 MB). When the selection needs more: keep the first whole steps (all ranks) that fit; else the first step with the
first ranks that fit; else, in one rank's step, drop the shortest events (memory samples are thinned evenly when they
alone would fill half the budget). :class:`Cut` says what was kept and the selections that show the rest.
"""

from __future__ import annotations

import gzip
import logging
import math
import os
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np

from ..analysis.matching import match_run
from ..analysis.model import MergedRun
from ..analysis.names import rank_ranges
from ..analysis.stragglers import collective_instances
from ..atomic import atomic_write
from ..errors import ConfigError
from ..progress import progress_enabled
from ..storage import schema

log = logging.getLogger(__name__)

__all__ = ["DEFAULT_MAX_EVENTS", "BYTES_PER_EVENT", "Cut", "TimelinePlan", "plan_timeline", "iter_trace_events",
           "timeline_metadata", "write_timeline", "read_timeline", "format_ranges", "enqueue_links", "launch_links"]

#: Default budget of trace events in one file (≈200 MB of JSON).
DEFAULT_MAX_EVENTS = 1_000_000
#: Rough JSON size of one trace event, for size estimates in messages.
BYTES_PER_EVENT = 200
#: Trace events from this many on get a progress bar while writing (when stderr is a terminal).
PROGRESS_MIN_EVENTS = 200_000
#: gzip level: 1 is ≈2.5× faster than 6 for a file ≈40 % larger (../shared/docs/hdf5-storage-facts.md §4).
GZIP_LEVEL = 3
_CHUNK = 50_000
_ROLE_ORDER = {schema.THREAD_MAIN: 0, schema.THREAD_COMM: 1, schema.THREAD_STREAM: 2, schema.THREAD_OTHER: 3}


@dataclass
class Cut:
    """What the budget removed from the selection, and how to get the rest."""

    budget: int
    needed: int  # trace events the whole selection needs (upper bound: flows counted as 2 per collective member)
    stage: str  # "none", "steps", "ranks", "short_events"
    steps_selected: list[int] = field(default_factory=list)
    steps_kept: list[int] = field(default_factory=list)
    ranks_selected: list[int] = field(default_factory=list)
    ranks_kept: list[int] = field(default_factory=list)
    outside_steps_dropped: int = 0  # events/samples outside every step, dropped with the cut
    short_dropped: int = 0  # events dropped as the shortest
    min_dur_ns: int = 0  # shortest event kept when short events were dropped
    memory_stride: int = 1  # every k-th memory sample kept
    #: selections that show the rest, each {"steps": (a, b) | None, "ranks": [..] | None}; all of it with
    #: ``max_events = needed``.
    rest: list[dict[str, Any]] = field(default_factory=list)

    @property
    def happened(self) -> bool:
        return self.stage != "none"

    def describe(self) -> str:
        """One plain sentence on what was cut (empty when nothing was)."""
        if not self.happened:
            return ""
        parts = [f"the selection needs ~{self.needed:,} trace events, over the budget of {self.budget:,}"]
        if self.stage == "steps":
            parts.append(f"kept steps {_span(self.steps_kept)} ({len(self.steps_kept)} of {len(self.steps_selected)}"
                         f" steps, all {len(self.ranks_kept)} ranks)")
        else:
            parts.append(f"kept step {_span(self.steps_kept)} of {_span(self.steps_selected)}" if self.steps_kept
                         else "kept no step boundaries (the run has no steps)")
            parts[-1] += f" on rank(s) {format_ranges(self.ranks_kept)} of {format_ranges(self.ranks_selected)}"
        if self.outside_steps_dropped:
            parts.append(f"dropped {self.outside_steps_dropped:,} events/samples outside every step")
        if self.short_dropped:
            parts.append(f"dropped the {self.short_dropped:,} shortest events (kept those >= "
                         f"{self.min_dur_ns / 1e3:g} µs)")
        if self.memory_stride > 1:
            parts.append(f"kept 1 memory sample in {self.memory_stride}")
        return "; ".join(parts)

    def flags(self, selection: dict[str, Any]) -> tuple[list[str], str]:
        """Command-line flags (after ``distprof timeline RUN_DIR -o FILE``) for each part of the rest, and for all of
        the selection in one file. `selection` is :attr:`TimelinePlan.selection`."""

        def fmt(ranks, steps, max_events) -> str:
            out = []
            if selection.get("windows"):
                out += ["--window", format_ranges(selection["windows"])]
            if ranks:
                out += ["--ranks", format_ranges(ranks)]
            if steps:
                out += ["--steps", f"{steps[0]}:{steps[1]}"]
            out += ["--max-events", str(max_events)]
            if selection.get("launch_flows"):
                out.append("--launch-flows")
            return " ".join(out)

        rest = [fmt(r.get("ranks") or selection.get("ranks"), r.get("steps") or selection.get("steps"), self.budget)
                for r in self.rest]
        return rest, fmt(selection.get("ranks"), selection.get("steps"), self.needed)

    def to_dict(self, selection: dict[str, Any] | None = None) -> dict[str, Any]:
        rest_flags, all_flags = self.flags(selection or {})
        return {
            "stage": self.stage, "budget": self.budget, "needed": self.needed, "text": self.describe(),
            "steps_selected": _span(self.steps_selected), "steps_kept": _span(self.steps_kept),
            "ranks_selected": format_ranges(self.ranks_selected), "ranks_kept": format_ranges(self.ranks_kept),
            "outside_steps_dropped": self.outside_steps_dropped, "short_dropped": self.short_dropped,
            "min_dur_ns": self.min_dur_ns, "memory_stride": self.memory_stride,
            "rest_flags": rest_flags, "all_flags": all_flags,
        }


@dataclass
class TimelinePlan:
    """Which rows of a MergedRun go into the timeline, and how they are laid out. Built by :func:`plan_timeline`."""

    ev_rows: np.ndarray  # kept rows of run.events
    ev_dur_ns: np.ndarray  # their durations on the aligned clock, nesting repaired (see _nested_ends)
    mem_rows: np.ndarray  # kept rows of run.memory
    step_rows: np.ndarray  # kept rows of run.steps
    flow_src: np.ndarray  # events row where each flow starts
    flow_dst: np.ndarray  # events row where it ends
    flow_op: np.ndarray  # op name id of each flow
    ranks: list[int]
    windows: list[int]
    origin_ns: int
    tracks: dict[int, list[tuple[int, int, str]]]  # rank -> [(key, out_tid, name)], key = see _track_key
    cut: Cut
    selection: dict[str, Any]
    coll_args: dict[int, dict[str, Any]]  # events row -> extra args of an exec collective
    comm_args: dict[int, dict[str, Any]]  # events row -> op/pg/bytes of other communication rows
    enq_src: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # enqueue row of each enqueue flow
    enq_dst: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # exec row it ends at
    enq_op: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # op name id
    launch_src: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # launch row (``--launch-flows``)
    launch_dst: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # device row it launched

    @property
    def n_metadata(self) -> int:
        return 2 * len(self.tracks) + 2 * sum(len(t) for t in self.tracks.values())

    @property
    def n_events(self) -> int:
        """Trace events written (metadata included)."""
        return (len(self.ev_rows) + len(self.mem_rows) + len(self.step_rows) + 2 * len(self.flow_src)
                + 2 * len(self.enq_src) + 2 * len(self.launch_src) + self.n_metadata)


# ---- planning --------------------------------------------------------------------------------------------------------


def plan_timeline(
    run: MergedRun,
    *,
    ranks: Sequence[int] | None = None,
    windows: Sequence[int] | None = None,
    steps: tuple[int, int] | None = None,
    max_events: int | None = DEFAULT_MAX_EVENTS,
    launch_flows: bool = False,
) -> TimelinePlan:
    """Select rows of `run` (ranks, windows, inclusive global steps) and fit them into `max_events` (None/0: no limit).

    Arrows: collectives across ranks, and each collective's enqueue to its execution on the same rank (always);
    every launch to its device event when `launch_flows` (2 trace events per kernel, so off by default).

    Raises ConfigError when the selection names ranks or windows the run lacks, or keeps nothing.
    """
    ev, mem, st = run.events, run.memory, run.steps
    run_ranks = sorted(int(r) for r in run.ranks_present)
    sel_ranks = run_ranks if ranks is None else sorted({int(r) for r in ranks})
    absent = [r for r in sel_ranks if r not in run_ranks]
    if absent:
        raise ConfigError(f"--ranks {format_ranges(absent)}: not in this run (it has rank(s) {format_ranges(run_ranks)})")
    run_windows = sorted({int(w) for w in np.concatenate([ev["window"], st["window"], mem["window"]])})
    sel_windows = run_windows if windows is None else sorted({int(w) for w in windows})
    absent = [w for w in sel_windows if w not in run_windows]
    if absent:
        raise ConfigError(f"--window {format_ranges(absent)}: not in this run (it has window(s) {format_ranges(run_windows)})")

    def select(tab, step_col="step"):
        m = np.isin(tab["rank"], sel_ranks) & np.isin(tab["window"], sel_windows)
        if steps is not None:
            m &= (tab[step_col] >= steps[0]) & (tab[step_col] <= steps[1])
        return m

    ev_m, mem_m, st_m = select(ev), select(mem), select(st)
    if not ev_m.any() and not st_m.any():
        raise ConfigError("the selection (--ranks/--window/--steps) keeps no event; widen it")

    # Collectives: members of matched exec instances, chained in arrival order (flows), on the selected rows.
    coll = match_run(run)
    m = coll.members
    m_row = np.asarray(m["row"], np.int64)
    m_keep = ev_m[m_row] if len(m_row) else np.zeros(0, bool)
    comm_member = np.zeros(len(ev["ts_ns"]), bool)
    comm_member[m_row[m_keep]] = True
    # Same-rank links: enqueue -> exec of each collective; launch -> kernel when asked. A link is drawn when both
    # of its ends are kept; its 2 trace events are charged to the cell of its end.
    n_ev = len(ev["ts_ns"])
    enq_src, enq_dst, enq_op = enqueue_links(run)
    sel = ev_m[enq_src] & ev_m[enq_dst]
    enq_src, enq_dst, enq_op = enq_src[sel], enq_dst[sel], enq_op[sel]
    enq_end = np.zeros(n_ev, bool)
    enq_end[enq_src] = enq_end[enq_dst] = True
    if launch_flows:
        l_src, l_dst = launch_links(run, np.flatnonzero(ev_m))
        sel = ev_m[l_src]
        l_src, l_dst = l_src[sel], l_dst[sel]
    else:
        l_src = l_dst = np.zeros(0, np.int64)
    launched = np.zeros(n_ev, bool)
    launched[l_dst] = True

    # Cost per (rank, step): events, memory samples, step markers, 2 flow events per collective member.
    budget = None if not max_events or max_events <= 0 else int(max_events)
    units = sorted({int(s) for s in st["step"][st_m]} | {int(s) for s in ev["step"][ev_m] if s >= 0}
                   ) if budget is not None else []
    # metadata: 2 per process, 2 per track (the tracks the selection would use, plus "steps")
    sel_keys = np.unique(np.stack([ev["rank"][ev_m].astype(np.int64),
                                   _track_key(ev["device"][ev_m], ev["tid"][ev_m])]), axis=1)
    n_meta_est = 4 * len(sel_ranks) + 2 * sel_keys.shape[1]
    cut = Cut(budget=budget or 0, needed=0, stage="none", steps_selected=units, steps_kept=list(units),
              ranks_selected=list(sel_ranks), ranks_kept=list(sel_ranks))
    ev_keep, mem_keep, st_keep = ev_m.copy(), mem_m.copy(), st_m.copy()
    if budget is not None:
        units_a = np.asarray(units, np.int64)
        ranks_a = np.asarray(sel_ranks, np.int64)

        def cells(tab, mask):
            """Rows of `tab` under `mask` counted per (selected rank, step unit); unit 0 = outside every step."""
            out = np.zeros((len(sel_ranks), len(units) + 1), np.int64)
            if not mask.any():
                return out
            rr = np.searchsorted(ranks_a, tab["rank"][mask])
            ss = tab["step"][mask].astype(np.int64)
            uu = np.searchsorted(units_a, ss)
            inside = uu < len(units)
            inside[inside] = units_a[uu[inside]] == ss[inside]
            np.add.at(out, (rr, np.where(inside, uu + 1, 0)), 1)
            return out

        cost = cells(ev, ev_m) + cells(mem, mem_m) + cells(st, st_m)
        cost += 2 * cells(ev, comm_member)
        linked = np.zeros(n_ev, bool)
        linked[enq_dst] = True
        cost += 2 * cells(ev, linked) + 2 * cells(ev, launched)
        needed = int(cost.sum()) + n_meta_est
        cut.needed = needed
        room = budget - n_meta_est
        if needed > budget:
            ev_keep, mem_keep, st_keep = _cut(run, cut, cost, units, sel_ranks, room, ev_m, mem_m, st_m,
                                              comm_member, enq_end, (enq_src, enq_dst), launched)

    ev_rows = np.flatnonzero(ev_keep)
    ev_dur = _aligned_durations(run, ev_rows)
    mem_rows = np.flatnonzero(mem_keep)
    step_rows = np.flatnonzero(st_keep)

    # Flows between kept members of one instance, consecutive in arrival order.
    keep_m = ev_keep[m_row] if len(m_row) else np.zeros(0, bool)
    inst, start = np.asarray(m["inst"])[keep_m], np.asarray(m["start_ns"])[keep_m]
    rows_k, rank_k = m_row[keep_m], np.asarray(m["rank"])[keep_m]
    o = np.lexsort((rank_k, start, inst))
    inst, rows_k = inst[o], rows_k[o]
    link = np.flatnonzero(inst[1:] == inst[:-1]) if len(inst) > 1 else np.zeros(0, np.int64)
    flow_src, flow_dst = rows_k[link], rows_k[link + 1]
    flow_op = np.asarray(m["op_id"])[keep_m][o][link]
    both = ev_keep[enq_src] & ev_keep[enq_dst]
    enq_src, enq_dst, enq_op = enq_src[both], enq_dst[both], enq_op[both]
    both = ev_keep[l_src] & ev_keep[l_dst]
    l_src, l_dst = l_src[both], l_dst[both]

    ranks_out = sorted({int(r) for r in ev["rank"][ev_rows]} | {int(r) for r in st["rank"][step_rows]})
    if not ranks_out:
        raise ConfigError("the selection (--ranks/--window/--steps) keeps no event; widen it")
    times = [ev["ts_ns"][ev_rows], mem["ts_ns"][mem_rows], st["start_ns"][step_rows]]
    origin = int(min(int(t.min()) for t in times if len(t)))
    kept_windows = sorted({int(w) for w in ev["window"][ev_rows]} | {int(w) for w in st["window"][step_rows]})
    plan = TimelinePlan(
        ev_rows=ev_rows, ev_dur_ns=ev_dur, mem_rows=mem_rows, step_rows=step_rows, flow_src=flow_src, flow_dst=flow_dst,
        flow_op=flow_op, ranks=ranks_out, windows=kept_windows, origin_ns=origin,
        tracks=_tracks(run, ev_rows, ranks_out), cut=cut,
        selection={"ranks": None if ranks is None else list(sel_ranks),
                   "windows": None if windows is None else list(sel_windows),
                   "steps": None if steps is None else [int(steps[0]), int(steps[1])],
                   "max_events": budget, "launch_flows": bool(launch_flows)},
        coll_args=_collective_args(run, coll, m_row, keep_m), comm_args=_comm_args(run, ev_keep),
        enq_src=enq_src, enq_dst=enq_dst, enq_op=enq_op, launch_src=l_src, launch_dst=l_dst,
    )
    return plan


def _cut(run, cut: Cut, cost, units, sel_ranks, room, ev_m, mem_m, st_m, comm_member, enq_end, enq_links, launched):
    """Shrink the selection to `room` trace events: whole steps, then ranks, then the shortest events.

    When dropping short events, collectives and the ends of enqueue links stay (with their arrows); a kernel with a
    launch arrow costs 3 (its slice and the arrow)."""
    ev, mem, st = run.events, run.memory, run.steps
    outside = int(cost[:, 0].sum())
    in_cost = cost[:, 1:]
    col = in_cost.sum(0)
    k = int(np.searchsorted(np.cumsum(col), room, side="right")) if len(units) else 0
    if k >= 1:
        cut.stage = "steps"
        cut.steps_kept = units[:k]
        cut.ranks_kept = list(sel_ranks)
        cut.rest = [{"steps": c, "ranks": None} for c in _chunks(units[k:], col[k:], room)]
    else:
        cut.steps_kept = units[:1]
        per_rank = in_cost[:, 0] if len(units) else cost[:, 0]
        j = int(np.searchsorted(np.cumsum(per_rank), room, side="right"))
        cut.stage = "ranks" if j >= 1 else "short_events"
        j = max(j, 1)
        cut.ranks_kept = list(sel_ranks[:j])
        rest_ranks = sel_ranks[j:]
        step1 = (units[0], units[0]) if units else None
        for chunk in _rank_chunks(rest_ranks, per_rank[j:], room):
            cut.rest.append({"steps": step1, "ranks": chunk})
        if len(units) > 1:
            cut.rest += [{"steps": c, "ranks": None} for c in _chunks(units[1:], col[1:], room)]

    def keep(tab, mask):
        m = mask & np.isin(tab["rank"], cut.ranks_kept)
        if units:
            m &= np.isin(tab["step"], cut.steps_kept)
        return m

    ev_keep, mem_keep, st_keep = keep(ev, ev_m), keep(mem, mem_m), keep(st, st_m)
    cut.outside_steps_dropped = outside if units else 0
    if cut.stage == "short_events":
        protected = (comm_member | enq_end) & ev_keep
        e_src, e_dst = enq_links
        fixed = (int(st_keep.sum()) + int(protected.sum()) + 2 * int((comm_member & ev_keep).sum())
                 + 2 * int((ev_keep[e_src] & ev_keep[e_dst]).sum()) + 2 * int((launched & protected).sum()))
        left = max(room - fixed, 0)
        n_mem = int(mem_keep.sum())
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
    return ev_keep, mem_keep, st_keep


def _chunks(units: Sequence[int], col: np.ndarray, room: int) -> list[tuple[int, int]]:
    """Consecutive step ranges whose cost fits `room` (a step alone over it is a range of its own)."""
    out, start, acc = [], None, 0
    for u, c in zip(units, col.tolist()):
        if start is not None and acc + c > room:
            out.append((start, prev))
            start, acc = None, 0
        if start is None:
            start = u
        acc += c
        prev = u
    if start is not None:
        out.append((start, prev))
    return out


def _rank_chunks(ranks: Sequence[int], cost: np.ndarray, room: int) -> list[list[int]]:
    out, cur, acc = [], [], 0
    for r, c in zip(ranks, cost.tolist()):
        if cur and acc + c > room:
            out.append(cur)
            cur, acc = [], 0
        cur.append(int(r))
        acc += c
    if cur:
        out.append(cur)
    return out


_DEV_BITS = 10  # device index bits in a stream's track key


def _track_key(device: np.ndarray | int, tid: np.ndarray | int):
    """Tracks are keyed by (device, tid): an OS thread (device < 0) is ``tid·2``, stream S of device D is
    ``(S·1024 + D)·2 + 1``, so a stream never collides with an OS thread nor with the same stream id of another
    device."""
    device = np.asarray(device, np.int64)
    tid = np.asarray(tid, np.int64)
    is_dev = device >= 0
    return np.where(is_dev, ((tid << _DEV_BITS) + (device & ((1 << _DEV_BITS) - 1))) * 2 + 1, tid * 2)


def _split_key(k: int) -> tuple[int, int | None]:
    """(tid or stream, device or None for an OS thread) of a track key."""
    if k & 1:
        return (k >> 1) >> _DEV_BITS, (k >> 1) & ((1 << _DEV_BITS) - 1)
    return k >> 1, None


def _tracks(run: MergedRun, ev_rows: np.ndarray, ranks: list[int]) -> dict[int, list[tuple[int, int, str]]]:
    ev, th = run.events, run.threads
    keys = _track_key(ev["device"][ev_rows], ev["tid"][ev_rows])
    rk = ev["rank"][ev_rows]
    names = run.names
    out: dict[int, list[tuple[int, int, str]]] = {}
    for r in ranks:
        used = np.unique(keys[rk == r])
        dev_of = {}
        m = (ev["rank"][ev_rows] == r) & (ev["device"][ev_rows] >= 0)
        for k, d in zip(keys[m].tolist(), ev["device"][ev_rows][m].tolist()):
            dev_of.setdefault(k, d)
        info: dict[int, tuple[int, str]] = {}
        tm = th["rank"] == r
        th_dev = th["device"][tm].tolist() if "device" in th else [0] * int(tm.sum())
        for tid, nid, role, pg, d in zip(th["tid"][tm].tolist(), th["name_id"][tm].tolist(),
                                         th["role"][tm].tolist(), th["pg"][tm].tolist(), th_dev):
            dev = role == schema.THREAD_STREAM
            k = int(_track_key(d if dev else -1, tid))
            name = str(names[nid]) if nid < len(names) else f"thread {tid}"
            if dev:
                label = name if "stream" in name.lower() else f"stream {tid} {name}".strip()
            else:
                label = f"{name} [{tid}]"
                if role == schema.THREAD_MAIN:
                    label += " main"
                elif role == schema.THREAD_COMM:
                    label += f" pg {pg}" if pg >= 0 else " comm"
            info.setdefault(k, (role, label))
        rows = []
        for k in used.tolist():
            tid, is_dev = _split_key(k)[0], k & 1
            if k in info:
                role, label = info[k]
            elif is_dev:
                role, label = schema.THREAD_STREAM, f"stream {tid}"
            else:
                role, label = schema.THREAD_OTHER, f"thread [{tid}]"
            if is_dev and k in dev_of and not label.startswith("cuda"):
                label = f"device {dev_of[k]} {label}"
            rows.append((_ROLE_ORDER.get(role, 3), tid, k, label))
        rows.sort()
        out[r] = [(-1, 1, "steps")] + [(k, i + 2, label) for i, (_, _, k, label) in enumerate(rows)]
    return out


def _collective_args(run: MergedRun, coll, m_row, keep_m) -> dict[int, dict[str, Any]]:
    """events row -> op, pg, seq, bytes, arrival order and lateness of each kept exec collective."""
    if not keep_m.any():
        return {}
    m = coll.members
    ci = collective_instances(run)
    late: dict[tuple[int, int, int, int], tuple[int, int, float]] = {}
    for w, pg, seq, r, pos, n, lat in zip(ci["window"].tolist(), ci["pg"].tolist(), ci["seq"].tolist(),
                                          ci["rank"].tolist(), ci["pos"].tolist(), ci["n_ranks"].tolist(),
                                          ci["lateness_ns"].tolist()):
        late[(w, pg, seq, r)] = (pos, n, lat)
    out = {}
    names = run.names
    sel = np.flatnonzero(keep_m)
    for row, w, pg, seq, r, op, nbytes in zip(m_row[sel].tolist(), m["window"][sel].tolist(), m["pg"][sel].tolist(),
                                              m["seq"][sel].tolist(), m["rank"][sel].tolist(),
                                              m["op_id"][sel].tolist(), m["bytes"][sel].tolist()):
        a: dict[str, Any] = {"op": str(names[op]) if op < len(names) else f"op#{op}", "pg": pg, "seq": seq}
        if nbytes >= 0:
            a["bytes"] = nbytes
        hit = late.get((w, pg, seq, r))
        if hit is not None:
            a["arrival"] = f"{hit[0] + 1}/{hit[1]}"
            a["late_ms"] = round(hit[2] / 1e6, 6)
        out[row] = a
    return out


def _comm_args(run: MergedRun, ev_keep: np.ndarray) -> dict[int, dict[str, Any]]:
    cm = run.comms
    if not len(cm["row"]):
        return {}
    sel = np.flatnonzero(ev_keep[cm["row"]] & (cm["role"] != schema.ROLE_EXEC))
    names = run.names
    out = {}
    for row, op, pg, nbytes, role in zip(cm["row"][sel].tolist(), cm["op_id"][sel].tolist(), cm["pg"][sel].tolist(),
                                         cm["bytes"][sel].tolist(), cm["role"][sel].tolist()):
        a: dict[str, Any] = {"op": str(names[op]) if op < len(names) else f"op#{op}", "pg": pg,
                             "comm_role": schema.COMM_ROLES[role] if role < len(schema.COMM_ROLES) else role}
        if nbytes >= 0:
            a["bytes"] = nbytes
        out[row] = a
    return out


# ---- enqueue -> execution and launch -> kernel links -----------------------------------------------------------------

_LAUNCH_KINDS = tuple(schema.KIND_CODE[k] for k in ("cuda_runtime", "cuda_driver", "privateuse1_runtime",
                                                    "privateuse1_driver"))


def _launch_of(run: MergedRun, rows: np.ndarray) -> np.ndarray:
    """events row of the runtime call (``cudaLaunchKernel`` …) that launched each device event of `rows`, or −1:
    the CPU launch row of the same rank and window with the same correlation id."""
    ev = run.events
    out = np.full(len(rows), -1, np.int64)
    corr = ev["corr_id"][rows].astype(np.int64)
    ok = corr > 0
    if not ok.any():
        return out
    cand = np.flatnonzero(np.isin(ev["kind"], _LAUNCH_KINDS) & (ev["device"] < 0) & (ev["corr_id"] > 0))
    cand = cand[np.isin(ev["corr_id"][cand], corr[ok])]
    if not len(cand):
        return out

    def key(r):
        return (ev["rank"][r].astype(np.int64) << 48) + (ev["window"][r].astype(np.int64) << 40) + \
            ev["corr_id"][r].astype(np.int64)

    ck = key(cand)
    o = np.argsort(ck, kind="stable")
    ck, cand = ck[o], cand[o]
    want = key(rows)
    pos = np.minimum(np.searchsorted(ck, want), len(ck) - 1)
    hit = ok & (ck[pos] == want)
    out[hit] = cand[pos[hit]]
    return out


def enqueue_links(run: MergedRun) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(enqueue row, exec row, op id) per collective execution whose enqueue is recorded on the same rank.

    The enqueue is an *outermost* CPU row of comms role "enqueue" (``c10d::allreduce_`` rather than the
    ``nccl:all_reduce`` nested in it). A device exec (the NCCL kernel) is linked through its launch: the runtime call
    with its correlation id lies inside the enqueue on the launching thread. A CPU exec (``gloo:all_reduce`` on a
    worker thread) is paired first-in first-out per (rank, window, op) with the enqueues no kernel claimed — gloo runs
    the work of a process group in the order it was queued; an exec that starts before the next unpaired enqueue was
    queued before the recording began and gets no link. Each exec gets at most one link, each enqueue at most one
    FIFO link (a coalesced GPU enqueue may launch several kernels).
    """
    ev, cm = run.events, run.comms
    none = (np.zeros(0, np.int64),) * 3
    if not len(cm["row"]):
        return none
    role = cm["role"]
    c_rows = cm["row"].astype(np.int64)
    enq = np.flatnonzero((role == schema.ROLE_ENQUEUE) & (ev["device"][c_rows] < 0))
    exe = np.flatnonzero(role == schema.ROLE_EXEC)
    if not len(enq) or not len(exe):
        return none

    # outermost enqueues per (rank, window, thread): sorted by start (longest first at equal starts), a row that
    # starts before the open outer one ends is nested in it
    e_rows = c_rows[enq]
    e_ts = ev["ts_ns"][e_rows].astype(np.int64)
    e_end = e_ts + ev["dur_ns"][e_rows].astype(np.int64)
    e_track = (ev["rank"][e_rows].astype(np.int64) << 48) + (ev["window"][e_rows].astype(np.int64) << 40) + \
        ev["tid"][e_rows].astype(np.int64)
    o = np.lexsort((-e_end, e_ts, e_track))
    outer = np.zeros(len(o), bool)
    prev_track, open_end = None, None
    for i, (t, s, e) in zip(o.tolist(), zip(e_track[o].tolist(), e_ts[o].tolist(), e_end[o].tolist())):
        if t != prev_track or s >= open_end:
            outer[i] = True
            prev_track, open_end = t, e
    enq = enq[outer]
    e_rows, e_ts, e_end, e_track = e_rows[outer], e_ts[outer], e_end[outer], e_track[outer]
    o = np.lexsort((e_ts, e_track))
    enq, e_rows, e_ts, e_end, e_track = enq[o], e_rows[o], e_ts[o], e_end[o], e_track[o]
    used = np.zeros(len(enq), bool)

    src: list[int] = []
    dst: list[int] = []
    ops: list[int] = []
    # device execs: through the launch's correlation id to the outermost enqueue around the launch
    x_rows = c_rows[exe]
    on_dev = ev["device"][x_rows] >= 0
    dev_x = exe[on_dev]
    if len(dev_x):
        launch = _launch_of(run, c_rows[dev_x])
        has = launch >= 0
        dev_x, launch = dev_x[has], launch[has]
        l_ts = ev["ts_ns"][launch].astype(np.int64)
        l_track = (ev["rank"][launch].astype(np.int64) << 48) + (ev["window"][launch].astype(np.int64) << 40) + \
            ev["tid"][launch].astype(np.int64)
        # last outer enqueue starting at or before the launch on its thread (outer enqueues of a track are disjoint)
        for j, t, s in zip(dev_x.tolist(), l_track.tolist(), l_ts.tolist()):
            lo = int(np.searchsorted(e_track, t, side="left"))
            hi = int(np.searchsorted(e_track, t, side="right"))
            k = lo + int(np.searchsorted(e_ts[lo:hi], s, side="right")) - 1
            if k >= lo and e_end[k] >= s:
                used[k] = True
                src.append(int(e_rows[k]))
                dst.append(int(c_rows[j]))
                ops.append(int(cm["op_id"][j]))

    # CPU execs: FIFO per (rank, window, op) with the enqueues no kernel claimed
    cpu_x = exe[~on_dev]
    if len(cpu_x):
        free = np.flatnonzero(~used)
        queues: dict[tuple[int, int, int], list[int]] = {}
        for k in free[np.argsort(e_ts[free], kind="stable")].tolist():
            j = enq[k]
            queues.setdefault((int(cm["rank"][j]), int(cm["window"][j]), int(cm["op_id"][j])), []).append(k)
        heads: dict[tuple[int, int, int], int] = {}
        xr = c_rows[cpu_x]
        for j in cpu_x[np.argsort(ev["ts_ns"][xr], kind="stable")].tolist():
            key = (int(cm["rank"][j]), int(cm["window"][j]), int(cm["op_id"][j]))
            q = queues.get(key)
            h = heads.get(key, 0)
            if q is None or h >= len(q):
                continue
            if e_ts[q[h]] <= int(ev["ts_ns"][c_rows[j]]):
                heads[key] = h + 1
                src.append(int(e_rows[q[h]]))
                dst.append(int(c_rows[j]))
                ops.append(int(cm["op_id"][j]))
    return np.asarray(src, np.int64), np.asarray(dst, np.int64), np.asarray(ops, np.int64)


def launch_links(run: MergedRun, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(launch row, device row) for the device events among `rows` whose launch (same correlation id, same rank and
    window) is recorded — Kineto's ``ac2g`` arrows."""
    ev = run.events
    dev = rows[ev["device"][rows] >= 0]
    launch = _launch_of(run, dev)
    ok = launch >= 0
    return launch[ok], dev[ok]


# ---- events ----------------------------------------------------------------------------------------------------------


def _us(ns: np.ndarray) -> list[float]:
    """int ns offsets -> µs floats (exact to the ns: offsets stay far below 2^53 ns)."""
    return (np.asarray(ns, np.int64).astype(np.float64) / 1e3).tolist()


def _drift_factor(run: MergedRun, ranks: np.ndarray) -> np.ndarray:
    """Per row: 1 + drift of the rank's host (aligned durations = recorded durations × this)."""
    f = np.ones(len(ranks))
    for r, host in run.hosts.items():
        hc = run.clock.get(host)
        if hc is not None and hc.drift_ppm:
            f[ranks == r] = 1.0 + hc.drift_ppm * 1e-6
    return f


def _aligned_durations(run: MergedRun, rows: np.ndarray) -> np.ndarray:
    """Durations of events `rows` on the aligned clock: scaled by the host's drift, then nesting repaired."""
    ev = run.events
    rank = ev["rank"][rows]
    dur = np.rint(ev["dur_ns"][rows] * _drift_factor(run, rank)).astype(np.int64)
    ts = ev["ts_ns"][rows]
    track = _track_key(ev["device"][rows], ev["tid"][rows]) * 65536 + rank
    end = _nested_ends(track, ts, ts + dur)
    return end - ts


def _nested_ends(track: np.ndarray, ts: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Ends such that slices on one track nest or follow each other (what trace viewers require).

    Aligning starts per window and durations with the host's drift leaves a few ns of partial overlap between events
    that abutted on the recorded clock (real traces have some of their own). A slice that starts inside the open one
    and ends after it is taken as its next sibling when it sticks out more than it overlaps (the open one is cut
    to end where it starts), else as its child (its end is clamped to the open one's).
    """
    n = len(ts)
    if n < 2:
        return end.copy()
    order = np.lexsort((ts - end, ts, track))
    tr, s, e = track[order].tolist(), ts[order].tolist(), end[order].tolist()
    stack: list[int] = []
    prev = None
    fixed = 0
    for i in range(n):
        if tr[i] != prev:
            stack.clear()
            prev = tr[i]
        si, ei = s[i], e[i]
        while stack:
            top = stack[-1]
            pe = e[top]
            if pe <= si:
                stack.pop()
            elif ei <= pe:
                break
            elif pe - si <= ei - pe:
                e[top] = si
                stack.pop()
                fixed += 1
            else:
                e[i] = ei = pe
                fixed += 1
                break
        stack.append(i)
    if fixed:
        log.debug("timeline: %d slice end(s) moved to keep tracks nested", fixed)
    out = np.empty(n, np.int64)
    out[order] = e
    return out


def timeline_metadata(run: MergedRun, plan: TimelinePlan) -> dict[str, Any]:
    """The ``otherData.distprof`` dict: origin, run, selection, clocks, counts and the cut."""
    origin = plan.origin_ns
    utc = datetime.fromtimestamp(origin // 10**9, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
    st = run.steps
    kept_steps = sorted({int(s) for s in st["step"][plan.step_rows]})
    return {
        "format": "distprof-timeline",
        "version": 1,
        "run_id": run.run_id,
        "world_size": run.world_size,
        "origin_ns": origin,
        "origin_utc": f"{utc}.{origin % 10**9:09d}Z",
        "time_unit": "ts and dur are microseconds since origin_ns on the aligned clock (ns as decimals)",
        "pid": "rank + 1",
        "ranks": plan.ranks,
        "hosts": {str(r): run.hosts.get(r, "?") for r in plan.ranks},
        "windows": plan.windows,
        "steps": [kept_steps[0], kept_steps[-1]] if kept_steps else None,
        "selection": plan.selection,
        "clock": {h: {"offset_ns": float(c.offset_ns), "drift_ppm": float(c.drift_ppm), "method": c.method,
                      "residual_us": c.residual_us} for h, c in run.clock.items()},
        "counts": {"slices": int(len(plan.ev_rows)), "step_markers": int(len(plan.step_rows)),
                   "memory_samples": int(len(plan.mem_rows)), "flows": int(len(plan.flow_src)),
                   "enqueue_flows": int(len(plan.enq_src)), "launch_flows": int(len(plan.launch_src)),
                   "metadata": plan.n_metadata, "total": plan.n_events},
        "cut": plan.cut.to_dict(plan.selection) if plan.cut.happened else None,
        "warnings": list(run.warnings[:20]),
    }


def iter_trace_events(run: MergedRun, plan: TimelinePlan) -> Iterator[dict[str, Any]]:
    """Every trace event of the plan, metadata first, then slices per rank, steps, memory counters and flows."""
    for r in plan.ranks:
        pid = r + 1
        yield {"ph": "M", "name": "process_name", "pid": pid, "args": {"name": f"rank {r} · {run.hosts.get(r, '?')}"}}
        yield {"ph": "M", "name": "process_sort_index", "pid": pid, "args": {"sort_index": r}}
        for _, tid, label in plan.tracks[r]:
            yield {"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": label}}
            yield {"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid, "args": {"sort_index": tid}}

    ev, names, origin = run.events, run.names, plan.origin_ns
    tid_of = {(r, k): tid for r, tr in plan.tracks.items() for k, tid, _ in tr}
    kinds = list(schema.KINDS)
    cats = list(schema.CATEGORIES)
    instant = schema.KIND_CODE["cpu_instant_event"]
    rows_all = plan.ev_rows
    for c0 in range(0, len(rows_all), _CHUNK):
        rows = rows_all[c0:c0 + _CHUNK]
        rank = ev["rank"][rows]
        keys = _track_key(ev["device"][rows], ev["tid"][rows])
        dur = plan.ev_dur_ns[c0:c0 + _CHUNK]
        cols = zip(rows.tolist(), names[ev["name_id"][rows]].tolist(), ev["kind"][rows].tolist(),
                   ev["category"][rows].tolist(), _us(ev["ts_ns"][rows] - origin), _us(dur), rank.tolist(),
                   keys.tolist(), ev["step"][rows].tolist(), ev["flops"][rows].tolist(), ev["device"][rows].tolist(),
                   ev["corr_id"][rows].tolist())
        for row, name, kind, cat, ts, d, r, k, step, flops, dev, corr in cols:
            args: dict[str, Any] = {}
            if step >= 0:
                args["step"] = step
            if cat:
                args["category"] = cats[cat] if cat < len(cats) else cat
            if flops > 0:
                args["flops"] = flops
            if dev >= 0:
                args["device"] = dev
            if corr > 0:
                args["correlation"] = corr
            extra = plan.coll_args.get(row) or plan.comm_args.get(row)
            if extra:
                args.update(extra)
            e = {"ph": "X", "name": name, "cat": kinds[kind] if kind < len(kinds) else "other", "ts": ts, "dur": d,
                 "pid": r + 1, "tid": tid_of[(r, k)], "args": args}
            if kind == instant:
                e["ph"] = "i"
                e["s"] = "t"
                del e["dur"]
            yield e

    st = run.steps
    sr = plan.step_rows
    for r, step, w, s, e_, fl, pk in zip(st["rank"][sr].tolist(), st["step"][sr].tolist(), st["window"][sr].tolist(),
                                         st["start_ns"][sr].tolist(), st["end_ns"][sr].tolist(),
                                         st["flops"][sr].tolist(), st["peak_mem_bytes"][sr].tolist()):
        yield {"ph": "X", "name": f"step {step}", "cat": "step", "ts": (s - origin) / 1e3, "dur": (e_ - s) / 1e3,
               "pid": r + 1, "tid": 1,
               "args": {"step": step, "window": w, "step_ms": (e_ - s) / 1e6, "flops": fl, "peak_mem_bytes": pk}}

    mem = run.memory
    mr = plan.mem_rows
    for c0 in range(0, len(mr), _CHUNK):
        rows = mr[c0:c0 + _CHUNK]
        for r, dev, ts, tot in zip(mem["rank"][rows].tolist(), mem["device"][rows].tolist(),
                                   _us(mem["ts_ns"][rows] - origin), mem["total_bytes"][rows].tolist()):
            name = "memory" if dev < 0 else f"memory device {dev}"
            yield {"ph": "C", "name": name, "ts": ts, "pid": r + 1, "tid": 1,
                   "args": {"allocated_MiB": round(tot / 1048576, 6)}}

    # flows: ids 1.. across all three kinds; each starts where its source slice starts and ends (bp "e", bound to the
    # enclosing slice) where its target starts
    n_coll, n_enq = len(plan.flow_src), len(plan.enq_src)
    flows = [(plan.flow_src, plan.flow_dst, plan.flow_op, "collective", 1),
             (plan.enq_src, plan.enq_dst, plan.enq_op, "enqueue", 1 + n_coll),
             (plan.launch_src, plan.launch_dst, None, "launch", 1 + n_coll + n_enq)]
    for srcs, dsts, ops, cat, first in flows:
        if not len(srcs):
            continue
        op_list = ops.tolist() if ops is not None else [None] * len(srcs)
        for fid, (src, dst, op) in enumerate(zip(srcs.tolist(), dsts.tolist(), op_list), start=first):
            if op is None:
                name = "launch"
            else:
                name = str(names[op]) if op < len(names) else "collective"
            for ph, row in (("s", src), ("f", dst)):
                r = int(ev["rank"][row])
                k = int(_track_key(ev["device"][row], ev["tid"][row]))
                e = {"ph": ph, "id": fid, "name": name, "cat": cat, "ts": (int(ev["ts_ns"][row]) - origin) / 1e3,
                     "pid": r + 1, "tid": tid_of[(r, k)]}
                if ph == "f":
                    e["bp"] = "e"
                yield e


# ---- files -----------------------------------------------------------------------------------------------------------


@dataclass
class WriteResult:
    path: Path
    n_events: int
    n_bytes: int  # bytes on disk
    json_bytes: int  # uncompressed JSON bytes
    seconds: float


def write_timeline(run: MergedRun, plan: TimelinePlan, path: str | os.PathLike, *,
                   progress: bool | None = None) -> WriteResult:
    """Write the timeline to `path` (gzip when it ends in .gz) via a temporary file and a rename."""
    import orjson

    path = Path(path)
    if not path.parent.is_dir():
        raise ConfigError(f"-o {path}: directory {path.parent} does not exist; create it or pick another path")
    t0 = time.perf_counter()
    meta = timeline_metadata(run, plan)
    show = progress_enabled(progress, plan.n_events, PROGRESS_MIN_EVENTS)
    bar = None
    if show:
        from tqdm import tqdm

        bar = tqdm(total=plan.n_events, desc="writing timeline", unit="ev", unit_scale=True, file=sys.stderr,
                   leave=False)
    n = 0
    json_bytes = 0
    try:
        with atomic_write(path, gzip=path.name.endswith(".gz"), compresslevel=GZIP_LEVEL,
                          gzip_name=path.name[:-3]) as f:
            head = (b'{"otherData":{"distprof":' + orjson.dumps(meta) + b'},"displayTimeUnit":"ms",'
                    b'"traceEvents":[\n')
            f.write(head)
            json_bytes += len(head)
            buf: list[dict[str, Any]] = []
            first = True

            def flush():
                nonlocal first, json_bytes
                if not buf:
                    return
                body = orjson.dumps(buf)[1:-1].replace(b',{"ph"', b',\n{"ph"')
                if not first:
                    body = b",\n" + body
                f.write(body)
                json_bytes += len(body)
                first = False
                if bar is not None:
                    bar.update(len(buf))
                buf.clear()

            for e in iter_trace_events(run, plan):
                buf.append(e)
                n += 1
                if len(buf) >= _CHUNK:
                    flush()
            flush()
            f.write(b"\n]}\n")
            json_bytes += 4
    finally:
        if bar is not None:
            bar.close()
    secs = time.perf_counter() - t0
    size = path.stat().st_size
    log.info("wrote %s: %d trace events, %d bytes (%d JSON) in %.2f s", path, n, size, json_bytes, secs)
    return WriteResult(path=path, n_events=n, n_bytes=size, json_bytes=json_bytes, seconds=secs)


def read_timeline(path: str | os.PathLike) -> dict[str, Any]:
    """Load a timeline written by :func:`write_timeline` (or any Chrome trace JSON, gzipped or not)."""
    import orjson

    p = Path(path)
    with open(p, "rb") as fh:
        magic = fh.read(2)
    opener = gzip.open if magic == b"\x1f\x8b" else open
    with opener(p, "rb") as fh:
        return orjson.loads(fh.read())


def format_ranges(values: Sequence[int]) -> str:
    """[0, 1, 2, 5] -> "0-2,5" (the --ranks syntax)."""
    return rank_ranges(values, sep=",")


def _span(steps: Sequence[int]) -> str:
    if not steps:
        return ""
    return str(steps[0]) if len(steps) == 1 else f"{steps[0]}..{steps[-1]}"
