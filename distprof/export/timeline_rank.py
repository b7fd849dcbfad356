"""One rank of the timeline: its tracks, the arguments of its communication slices, the arrows that stay on the rank
(enqueue -> execution, launch -> kernel) and its slices' durations on the aligned clock. Every function takes a
MergedRun holding (at least) that rank — the timeline passes one rank at a time
(``analysis.summarize.merged.rank_merged``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from ..analysis.cross.stragglers import collective_instances
from ..analysis.types import MergedRun
from ..events.launches import launch_rows
from ..storage import schema

log = logging.getLogger(__name__)

__all__ = ["track_key", "tracks", "lateness", "collective_args", "comm_args", "enqueue_links", "launch_links",
           "aligned_durations", "nested_ends", "us"]

ROLE_ORDER = {schema.THREAD_MAIN: 0, schema.THREAD_COMM: 1, schema.THREAD_STREAM: 2, schema.THREAD_OTHER: 3}
_DEV_BITS = 10  # device index bits in a stream's track key


def track_key(device: np.ndarray | int, tid: np.ndarray | int):
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


def tracks(run: MergedRun, ev_rows: np.ndarray, ranks: list[int]) -> dict[int, list[tuple[int, int, str]]]:
    ev, th = run.events, run.threads
    keys = track_key(ev["device"][ev_rows], ev["tid"][ev_rows])
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
            k = int(track_key(d if dev else -1, tid))
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
            rows.append((ROLE_ORDER.get(role, 3), tid, k, label))
        rows.sort()
        out[r] = [(-1, 1, "steps")] + [(k, i + 2, label) for i, (_, _, k, label) in enumerate(rows)]
    return out


def lateness(run) -> dict[tuple[int, int, int, int], tuple[int, int, float]]:
    """(window, pg, seq, rank) -> (arrival position, ranks, lateness ns) of every matched collective member."""
    ci = collective_instances(run)
    return {(w, pg, seq, r): (pos, n, lat) for w, pg, seq, r, pos, n, lat in zip(
        ci["window"].tolist(), ci["pg"].tolist(), ci["seq"].tolist(), ci["rank"].tolist(), ci["pos"].tolist(),
        ci["n_ranks"].tolist(), ci["lateness_ns"].tolist())}


def collective_args(rm: MergedRun, rows: np.ndarray, late) -> dict[int, dict[str, Any]]:
    """events row -> op, pg, seq, bytes, arrival order and lateness of each kept exec collective of one rank."""
    out = {}
    cm = rm.comms
    pos = np.searchsorted(cm["row"], rows)
    names = rm.names
    for row, j in zip(rows.tolist(), pos.tolist()):
        w, pg, seq, r = int(cm["window"][j]), int(cm["pg"][j]), int(cm["seq"][j]), int(cm["rank"][j])
        op, nbytes = int(cm["op_id"][j]), int(cm["bytes"][j])
        a: dict[str, Any] = {"op": str(names[op]) if op < len(names) else f"op#{op}", "pg": pg, "seq": seq}
        if nbytes >= 0:
            a["bytes"] = nbytes
        hit = late.get((w, pg, seq, r))
        if hit is not None:
            a["arrival"] = f"{hit[0] + 1}/{hit[1]}"
            a["late_ms"] = round(hit[2] / 1e6, 6)
        out[row] = a
    return out


def comm_args(run: MergedRun, ev_keep: np.ndarray) -> dict[int, dict[str, Any]]:
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

def _launch_of(run: MergedRun, rows: np.ndarray) -> np.ndarray:
    """events row of the runtime call (``cudaLaunchKernel`` …) that launched each device event of `rows`, or −1
    (``launches.launch_rows``, within the same rank and window)."""
    ev = run.events
    group = (np.asarray(ev["rank"], np.int64) << 20) + np.asarray(ev["window"], np.int64)
    return launch_rows(ev["kind"], ev["device"], ev["corr_id"], rows, group)


class _Enqueues(NamedTuple):
    """The outermost CPU enqueues, sorted by (track, start): comms index, events row, start, end, track
    (``_thread_track``), and whether a device exec already claimed each one."""

    comm: np.ndarray
    rows: np.ndarray
    ts: np.ndarray
    end: np.ndarray
    track: np.ndarray
    used: np.ndarray


@dataclass
class _Links:
    """The enqueue -> exec links found so far, as parallel lists (see :func:`enqueue_links`)."""

    src: list[int] = field(default_factory=list)
    dst: list[int] = field(default_factory=list)
    ops: list[int] = field(default_factory=list)
    group: list[int] = field(default_factory=list)
    order: list[int] = field(default_factory=list)

    def add(self, src: int, dst: int, op: int, group: int, order: int) -> None:
        self.src.append(src)
        self.dst.append(dst)
        self.ops.append(op)
        self.group.append(group)
        self.order.append(order)

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        return (np.asarray(self.src, np.int64), np.asarray(self.dst, np.int64), np.asarray(self.ops, np.int64),
                np.asarray(self.group, np.int64), np.asarray(self.order, np.int64))


def _thread_track(ev: dict[str, np.ndarray], rows: np.ndarray) -> np.ndarray:
    """One int64 per (rank, window, thread) of events `rows`."""
    return (ev["rank"][rows].astype(np.int64) << 48) + (ev["window"][rows].astype(np.int64) << 40) + \
        ev["tid"][rows].astype(np.int64)


def _outer_enqueues(ev: dict[str, np.ndarray], c_rows: np.ndarray, enq: np.ndarray) -> _Enqueues:
    """The outermost of the enqueues `enq` (comms indices) per (rank, window, thread): sorted by start (longest first
    at equal starts), a row that starts before the open outer one ends is nested in it."""
    e_rows = c_rows[enq]
    e_ts = ev["ts_ns"][e_rows].astype(np.int64)
    e_end = e_ts + ev["dur_ns"][e_rows].astype(np.int64)
    e_track = _thread_track(ev, e_rows)
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
    return _Enqueues(enq[o], e_rows[o], e_ts[o], e_end[o], e_track[o], np.zeros(len(enq), bool))


def _link_device_execs(run: MergedRun, c_rows: np.ndarray, dev_x: np.ndarray, outer: _Enqueues,
                       links: _Links) -> None:
    """Group 0: each device exec of `dev_x` (comms indices) through its launch's correlation id to the outermost
    enqueue around the launch; marks the enqueues it claims as used."""
    ev, cm = run.events, run.comms
    launch = _launch_of(run, c_rows[dev_x])
    has = launch >= 0
    dev_x, launch = dev_x[has], launch[has]
    l_ts = ev["ts_ns"][launch].astype(np.int64)
    l_track = _thread_track(ev, launch)
    # last outer enqueue starting at or before the launch on its thread (outer enqueues of a track are disjoint)
    for j, t, s in zip(dev_x.tolist(), l_track.tolist(), l_ts.tolist()):
        lo = int(np.searchsorted(outer.track, t, side="left"))
        hi = int(np.searchsorted(outer.track, t, side="right"))
        k = lo + int(np.searchsorted(outer.ts[lo:hi], s, side="right")) - 1
        if k >= lo and outer.end[k] >= s:
            outer.used[k] = True
            links.add(int(outer.rows[k]), int(c_rows[j]), int(cm["op_id"][j]), 0, len(links.order))


def _link_cpu_execs(run: MergedRun, c_rows: np.ndarray, cpu_x: np.ndarray, outer: _Enqueues, links: _Links) -> None:
    """Group 1: the CPU execs of `cpu_x` (comms indices) paired FIFO per (rank, window, op) with the enqueues no
    kernel claimed; an exec that starts before the next free enqueue gets no link."""
    ev, cm = run.events, run.comms
    free = np.flatnonzero(~outer.used)
    queues: dict[tuple[int, int, int], list[int]] = {}
    for k in free[np.argsort(outer.ts[free], kind="stable")].tolist():
        j = outer.comm[k]
        queues.setdefault((int(cm["rank"][j]), int(cm["window"][j]), int(cm["op_id"][j])), []).append(k)
    heads: dict[tuple[int, int, int], int] = {}
    xr = c_rows[cpu_x]
    for j in cpu_x[np.argsort(ev["ts_ns"][xr], kind="stable")].tolist():
        key = (int(cm["rank"][j]), int(cm["window"][j]), int(cm["op_id"][j]))
        q = queues.get(key)
        h = heads.get(key, 0)
        if q is None or h >= len(q):
            continue
        if outer.ts[q[h]] <= int(ev["ts_ns"][c_rows[j]]):
            heads[key] = h + 1
            links.add(int(outer.rows[q[h]]), int(c_rows[j]), int(cm["op_id"][j]), 1, int(ev["ts_ns"][c_rows[j]]))


def enqueue_links(run: MergedRun) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(enqueue row, exec row, op id, group, order) per collective execution whose enqueue is recorded on the same
    rank; group 0: device executions (linked through their launch), in comms order; group 1: CPU executions, with
    their start as `order` (the timeline numbers its arrows by group, then order).

    The enqueue is an *outermost* CPU row of comms role "enqueue" (``c10d::allreduce_`` rather than the
    ``nccl:all_reduce`` nested in it). A device exec (the NCCL kernel) is linked through its launch: the runtime call
    with its correlation id lies inside the enqueue on the launching thread. A CPU exec (``gloo:all_reduce`` on a
    worker thread) is paired first-in first-out per (rank, window, op) with the enqueues no kernel claimed — gloo runs
    the work of a process group in the order it was queued; an exec that starts before the next unpaired enqueue was
    queued before the recording began and gets no link. Each exec gets at most one link, each enqueue at most one
    FIFO link (a coalesced GPU enqueue may launch several kernels).
    """
    ev, cm = run.events, run.comms
    none = (np.zeros(0, np.int64),) * 5
    if not len(cm["row"]):
        return none
    role = cm["role"]
    c_rows = cm["row"].astype(np.int64)
    enq = np.flatnonzero((role == schema.ROLE_ENQUEUE) & (ev["device"][c_rows] < 0))
    exe = np.flatnonzero(role == schema.ROLE_EXEC)
    if not len(enq) or not len(exe):
        return none
    outer = _outer_enqueues(ev, c_rows, enq)
    links = _Links()
    on_dev = ev["device"][c_rows[exe]] >= 0
    if on_dev.any():
        _link_device_execs(run, c_rows, exe[on_dev], outer, links)
    if (~on_dev).any():
        _link_cpu_execs(run, c_rows, exe[~on_dev], outer, links)
    return links.arrays()


def launch_links(run: MergedRun, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(launch row, device row) for the device events among `rows` whose launch (same correlation id, same rank and
    window) is recorded — Kineto's ``ac2g`` arrows."""
    ev = run.events
    dev = rows[ev["device"][rows] >= 0]
    launch = _launch_of(run, dev)
    ok = launch >= 0
    return launch[ok], dev[ok]


# ---- events ----------------------------------------------------------------------------------------------------------


def us(ns: np.ndarray) -> list[float]:
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


def aligned_durations(run: MergedRun, rows: np.ndarray) -> np.ndarray:
    """Durations of events `rows` on the aligned clock: scaled by the host's drift, then nesting repaired."""
    ev = run.events
    rank = ev["rank"][rows]
    dur = np.rint(ev["dur_ns"][rows] * _drift_factor(run, rank)).astype(np.int64)
    ts = ev["ts_ns"][rows]
    track = track_key(ev["device"][rows], ev["tid"][rows]) * 65536 + rank
    end = nested_ends(track, ts, ts + dur)
    return end - ts


def nested_ends(track: np.ndarray, ts: np.ndarray, end: np.ndarray) -> np.ndarray:
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

