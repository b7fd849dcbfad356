"""One rank, summarised: everything the cross-rank analyses need from its events, in a compact typed object.

    rd = read_rank(cat, 3)
    s = summarize_rank(rd, steps=(10, 19))     # RankSummary; rd (the events) can now be dropped

A summary is O(steps + collectives + top ops + annotations) in size, never O(events): at 1,024 ranks the summaries
of a run fit one process, while each rank's events are read, summarised and freed in turn (``engine.summarize``, or
spread over MPI processes). Times are on the rank's recorded clock; ``RunSummary`` aligns them.

Parts (each computed once, in its own module):

* ``steps`` — the step breakdown (``breakdown.rank_breakdown``), one row per recorded step.
* ``collectives`` — every executed collective of the rank's shards (``comms.role == exec``, numbered: ``seq >= 0``),
  before the steps selection (the clock model uses all of them): window, pg, seq, op (index into ``ops_names``),
  bytes, start/end ns, step, and ``exposed_ns`` (its time the rank spent waiting for communication and nothing else,
  in the selected steps).
* ``p2p`` — every executed point-to-point transfer (``send``/``recv``: not collectives), before the steps selection:
  window, pg, peer, p2p_seq, is_recv, bytes, start/end ns, step.
* ``op_totals`` — per (op name, step) the own work and calls of the rank's ``TOP_OPS`` heaviest op names (cpu_op,
  user_annotation, kernel, gpu_memcpy/memset; no communication, no ``ProfilerStep#N``): inclusive time minus the
  main thread's wait for communication inside the op (``breakdown.RankSets.wait``: the exposed-communication
  candidates E and its time inside communication ops), ``dur_ms``, and the part of it outside the events nested in
  the op, ``self_ms`` (``selftime``); root cause reads ``self_ms``.
* ``annotations`` — per user ``record_function`` region: total ms and calls in the rank's steps.
* ``measures`` — the per-rank numbers the findings rules read (``rank.measures.rank_measures``).
* ``gpu_time`` — HTA's temporal breakdown of the rank's device timeline (``gpu_time.rank_gpu_time``), device ranks.
* ``memory_series`` — the allocated-memory curve, min/max-downsampled per window, for the HTML report.
* ``samples`` — the clock-sync samples of the rank's shards (host leaders).
* ``unlaunched``, ``after_last_step`` — what belongs to no step: device events launched before the recording
  began (their launch is not in the trace), and per window the work after its last step (a checkpoint after the
  loop), on the CPU.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ...events.launches import launch_rows
from ...events.p2p import P2P_OPS
from ...storage.schema import CAT_COMM, KIND_CODE, KINDS, ROLE_EXEC
from ..load.rankdata import RankData, filter_steps
from ..types import FindingRules, RankSummary
from . import intervals as iv
from .annotations import rank_annotations
from .breakdown import rank_breakdown, rank_sets, step_span
from .cpuwait import wait_at
from .gpu_time import rank_gpu_time
from .index import RankIndex
from .measures import rank_measures
from .selftime import own_work_ns, self_work_ns

__all__ = ["summarize_rank", "TOP_OPS", "MEMORY_POINTS", "collective_rows", "p2p_rows",
           "downsample_minmax"]

Table = dict[str, np.ndarray]
NS_PER_MS = 1e6
#: Op names kept per rank (by inclusive time in the selected steps) for root cause.
TOP_OPS = 256
#: Points kept per rank for the memory curve (min/max per bucket).
MEMORY_POINTS = 2000
_OP_KINDS = np.array([KIND_CODE[k] for k in ("cpu_op", "user_annotation", "kernel", "gpu_memcpy", "gpu_memset")],
                     dtype=np.int64)


def _p2p_mask(rd: RankData) -> np.ndarray:
    """Comms rows whose op is a point-to-point transfer (``send``/``recv``; numbered as collectives before 1.2)."""
    op_ids = np.asarray(rd.comms["op_id"], np.int64)
    u, inv = np.unique(op_ids, return_inverse=True)
    names = np.asarray(rd.names, dtype=object)
    is_p2p = np.array([str(names[i]) in P2P_OPS if i < names.size else False for i in u.tolist()], bool)
    return is_p2p[inv.reshape(-1)] if u.size else np.zeros(0, bool)


def collective_rows(rd: RankData) -> tuple[Table, np.ndarray]:
    """The rank's executed, numbered collectives with their times (raw clock), step and events row (``ev_row``),
    and the names of their ``op`` indices. Point-to-point transfers are not collectives (:func:`p2p_rows`)."""
    cm = rd.comms
    sel = np.flatnonzero((np.asarray(cm["role"]) == ROLE_EXEC) & (np.asarray(cm["seq"]) >= 0) & ~_p2p_mask(rd))
    row = np.asarray(cm["row"], np.int64)[sel]
    ev = rd.events
    start = np.asarray(ev["ts_ns"], np.int64)[row]
    op_ids = np.asarray(cm["op_id"], np.int64)[sel]
    u, inv = np.unique(op_ids, return_inverse=True)
    return {
        "window": np.asarray(cm["window"], np.int32)[sel],
        "pg": np.asarray(cm["pg"], np.int32)[sel],
        "seq": np.asarray(cm["seq"], np.int32)[sel],
        "nccl_seq": np.asarray(cm["nccl_seq"], np.int64)[sel] if "nccl_seq" in cm else np.full(sel.size, -1),
        "op": inv.reshape(-1).astype(np.int32),
        "bytes": np.asarray(cm["bytes"], np.int64)[sel],
        "start_ns": start,
        "end_ns": start + np.asarray(ev["dur_ns"], np.int64)[row],
        "step": np.asarray(ev["step"], np.int64)[row],
        "ev_row": row,
    }, np.asarray(rd.names, dtype=object)[u] if len(u) else np.zeros(0, dtype=object)


def _exposed_in(rs, coll: Table) -> np.ndarray:
    """Per collective row: its time during which the rank waited for communication doing nothing else (the
    breakdown's exposed set, E minus compute and memcpy), within the selected steps."""
    exposed = iv.subtract(rs.exposed, iv.union_all(rs.compute, rs.memcpy))
    return iv.measure_in_windows(exposed, coll["start_ns"], coll["end_ns"])


def p2p_rows(rd: RankData) -> Table:
    """The rank's executed point-to-point transfers (raw clock): window, pg, peer (global rank, −1 unknown),
    is_recv, bytes, start/end ns, step, and their row in the rank's events (``ev_row``, as ``collective_rows``)."""
    cm = rd.comms
    sel = np.flatnonzero((np.asarray(cm["role"]) == ROLE_EXEC) & _p2p_mask(rd))
    row = np.asarray(cm["row"], np.int64)[sel]
    ev = rd.events
    start = np.asarray(ev["ts_ns"], np.int64)[row]
    names = np.asarray(rd.names, dtype=object)
    return {
        "window": np.asarray(cm["window"], np.int32)[sel],
        "pg": np.asarray(cm["pg"], np.int32)[sel],
        "peer": np.asarray(cm["peer"], np.int32)[sel] if "peer" in cm else np.full(sel.size, -1, np.int32),
        "p2p_seq": np.asarray(cm["p2p_seq"], np.int64)[sel] if "p2p_seq" in cm else np.full(sel.size, -1, np.int64),
        "is_recv": np.array([names[i] == "recv" for i in np.asarray(cm["op_id"], np.int64)[sel].tolist()], bool),
        "bytes": np.asarray(cm["bytes"], np.int64)[sel],
        "start_ns": start,
        "end_ns": start + np.asarray(ev["dur_ns"], np.int64)[row],
        "step": np.asarray(ev["step"], np.int64)[row],
        "ev_row": row,
    }


def _op_totals(rd: RankData, ix: RankIndex, steps: np.ndarray, top: int,
               wait: iv.Intervals) -> tuple[Table, np.ndarray, list[str]]:
    """Per (op name, step): the rank's own work in the op — its inclusive time minus the time its main thread spent
    waiting for communication inside it (`wait`): a rank that reached a collective first and waited there for a
    late peer did no more work, although its ``FSDP::pre_forward`` lasted longer — and its self work, outside the
    events nested in it (``selftime``)."""
    ev = rd.events
    kind = np.asarray(ev["kind"]).astype(np.int64)
    name_id = np.asarray(ev["name_id"]).astype(np.int64)
    step = np.asarray(ev["step"]).astype(np.int64)
    sel = np.isin(kind, _OP_KINDS) & (np.asarray(ev["category"]) != CAT_COMM) & ~ix.is_step & np.isin(step, steps)
    nid = name_id[sel]
    ts, tid, device = np.asarray(ev["ts_ns"], np.int64), np.asarray(ev["tid"]), np.asarray(ev["device"])
    on_main = (tid == (ix.main_tid if ix.main_tid is not None else -1)) & (device < 0)
    own = own_work_ns(ts, np.asarray(ev["dur_ns"], np.int64), on_main, wait)
    window = np.asarray(ev["window"], np.int64) if "window" in ev else np.zeros(ts.size, np.int64)
    _, track = np.unique(np.stack([window, device.astype(np.int64),
                                   tid.astype(np.int64)]), axis=1, return_inverse=True)
    own_self = self_work_ns(ts, np.asarray(ev["dur_ns"], np.int64), track.reshape(-1), own)[sel].astype(np.float64)
    dur = own[sel].astype(np.float64)
    u, ni = np.unique(nid, return_inverse=True)
    ni = ni.reshape(-1)
    tot = np.bincount(ni, weights=dur, minlength=u.size)
    keep = np.sort(np.argsort(-tot, kind="stable")[:top])
    kind_of = np.zeros(u.size, np.int64)
    kind_of[ni] = kind[sel]  # the kind of the name's last event
    pos = np.full(u.size, -1, np.int64)
    pos[keep] = np.arange(keep.size)
    k = pos[ni] >= 0
    si = np.searchsorted(steps, step[sel][k])
    flat = pos[ni][k] * steps.size + si
    cells = keep.size * steps.size
    d = np.bincount(flat, weights=dur[k], minlength=cells) / NS_PER_MS
    d_self = np.bincount(flat, weights=own_self[k], minlength=cells) / NS_PER_MS
    c = np.bincount(flat, minlength=cells).astype(np.float64)
    grid_n, grid_s = np.divmod(np.arange(cells), max(steps.size, 1))
    nz = c > 0
    # 18-byte rows: these are most of a rank's summary (top ops x steps), kept for every rank until the report is
    # built (at 16k ranks, 28-byte rows held 590 MB). float32 ms is within 0.1 µs of the truth below 1 s per step,
    # and every sum over them is taken in float64
    table = {"name": grid_n[nz].astype(np.uint16 if keep.size <= 1 << 16 else np.int32),
             "step": steps[grid_s[nz]].astype(np.int32), "dur_ms": d[nz].astype(np.float32),
             "self_ms": d_self[nz].astype(np.float32), "calls": c[nz].astype(np.int32)}
    kinds = [KINDS[x] if x < len(KINDS) else str(x) for x in kind_of[keep]]
    return table, np.asarray(rd.names, dtype=object)[u[keep]], kinds


def downsample_minmax(t: np.ndarray, v: np.ndarray, budget: int) -> tuple[np.ndarray, np.ndarray]:
    """At most ~`budget` points: per bucket of consecutive samples, the minimum and the maximum (in time order)."""
    n = t.size
    if n <= budget:
        return t, v
    nb = max(budget // 2, 1)
    bucket = (np.arange(n, dtype=np.int64) * nb) // n
    order = np.lexsort((v, bucket))  # by bucket, then value
    b_sorted = bucket[order]
    first = np.flatnonzero(np.r_[True, b_sorted[1:] != b_sorted[:-1]])
    last = np.r_[first[1:] - 1, n - 1]
    keep = np.unique(np.concatenate([order[first], order[last]]))
    return t[keep], v[keep]


def _memory_series(rd: RankData, points: int) -> tuple[dict[int, tuple[np.ndarray, np.ndarray]], int]:
    """The rank's allocated-memory curve on one device (its accelerator if it has allocator events there, else the
    CPU), per window, with at most ~`points` points in all (each window its share)."""
    mem = rd.memory
    ts = np.asarray(mem["ts_ns"], np.int64)
    if ts.size == 0:
        return {}, -1
    total = np.asarray(mem["total_bytes"], np.int64)
    device = np.asarray(mem["device"]) if "device" in mem else np.full(ts.size, -1)
    window = np.asarray(mem["window"]) if "window" in mem else np.zeros(ts.size, np.int32)
    dev = int(device[device >= 0].min()) if (device >= 0).any() else -1
    idx = np.flatnonzero(device == dev)
    idx = idx[np.argsort(ts[idx], kind="stable")]
    wins = window[idx]
    out = {}
    for w in sorted(int(x) for x in np.unique(wins)):
        part = idx[wins == w]
        budget = max(4, int(round(points * part.size / idx.size)))
        out[w] = downsample_minmax(ts[part], total[part], budget)
    return out, dev


def _outside_steps(rd: RankData) -> tuple[tuple[int, float], dict[int, float]]:
    """Device events launched before the recording began (count, ms): in no step, with a correlation id and no launch
    with that id in their window (one whose launch is in the trace is never counted, whatever its step); and per
    window the time from its last step's end to the last event after it (checkpoints, evaluation, teardown after the
    loop: outside every step)."""
    ev = rd.events
    step = np.asarray(ev["step"])
    dev = np.asarray(ev["device"])
    un = (step < 0) & (dev >= 0) & (np.asarray(ev["corr_id"]) != 0) if "corr_id" in ev else np.zeros(step.size, bool)
    if un.any():
        rows = np.flatnonzero(un)
        un[rows[launch_rows(ev["kind"], dev, ev["corr_id"], rows, group=ev["window"]) >= 0]] = False
    unlaunched = (int(un.sum()), float(np.asarray(ev["dur_ns"])[un].sum()) / NS_PER_MS)
    after: dict[int, float] = {}
    st = rd.steps
    ts = np.asarray(ev["ts_ns"], np.int64)
    end = ts + np.asarray(ev["dur_ns"], np.int64)
    for w in np.unique(np.asarray(st["window"])).tolist():
        last_end = int(np.asarray(st["end_ns"])[st["window"] == w].max())
        m = (np.asarray(ev["window"]) == w) & (step < 0) & (ts >= last_end) & (dev < 0)
        if m.any():
            after[int(w)] = float(end[m].max() - last_end) / NS_PER_MS
    return unlaunched, after


def summarize_rank(rd: RankData, *, steps: tuple[int, int] | None = None, rules: FindingRules | None = None,
                   top_ops: int = TOP_OPS, memory_points: int = MEMORY_POINTS) -> RankSummary:
    """Summarise one rank (see the module docstring); `steps` selects global steps lo..hi (inclusive)."""
    coll, coll_names = collective_rows(rd)  # before the steps selection: the clock model uses every window's
    p2p = p2p_rows(rd)
    unlaunched, after = _outside_steps(rd)
    n_events = int(rd.events["ts_ns"].size)
    if steps is not None:
        rd = replace(rd, **filter_steps({t: rd.table(t) for t in ("events", "comms", "steps", "memory", "threads",
                                                                    "cuda_memory", "cuda_memory_blocks")},
                                        steps[0], steps[1]))
    ix = RankIndex.build(rd)
    rs = rank_sets(rd, ix, *step_span(rd))
    bd = rank_breakdown(rd, ix, rs)
    coll["exposed_ns"] = _exposed_in(rs, coll)
    for tab in (coll, bd):  # the training thread's CPU wait so far at each start and end (NaN unknown)
        tab["cpu_wait_at_start_ns"] = wait_at(rd.cpu_samples, tab["start_ns"])
        tab["cpu_wait_at_end_ns"] = wait_at(rd.cpu_samples, tab["end_ns"])
    # a step's wait from the samples where they know it: the step marks are taken just before torch's profiler
    # step, and a window's first mark before its trace starts (up to 250 ms of wait outside the step, under load)
    # (interpolated across a starved sampler's long interval it can exceed the step: never more than its wall time)
    sampled = (bd["cpu_wait_at_end_ns"] - bd["cpu_wait_at_start_ns"]) / 1e6
    wall = (np.asarray(bd["end_ns"], np.int64) - np.asarray(bd["start_ns"], np.int64)) / 1e6
    bd["cpu_wait_ms"] = np.where(np.isfinite(sampled), np.clip(sampled, 0.0, wall), bd["cpu_wait_ms"])
    st = np.unique(np.asarray(rd.steps["step"], np.int64))
    ops, op_names, op_kinds = _op_totals(rd, ix, st, top_ops, rs.wait)
    dev = np.asarray(rd.events["device"])
    cm = rd.cuda_memory
    reserved = (float(np.asarray(cm["reserved_peak_bytes"], np.float64).max())
                if len(cm.get("step", ())) else None)
    series, mem_dev = _memory_series(rd, memory_points)
    t_min: dict[int, int] = {}
    for tab in (rd.events, rd.memory):
        for w in np.unique(tab["window"]).tolist():
            lo = int(np.asarray(tab["ts_ns"])[tab["window"] == w].min())
            t_min[int(w)] = min(lo, t_min.get(int(w), lo))
    return RankSummary(
        rank=rd.rank, host=rd.host, windows=list(rd.windows), device_rank=ix.device_rank, steps=bd,
        collectives=coll, ops_names=coll_names, op_totals=ops, op_names=op_names, op_kinds=op_kinds,
        annotations=rank_annotations(rd, ix.name_flags), measures=rank_measures(rd, ix, bd, rules),
        gpu_time=rank_gpu_time(rd), used_devices=np.unique(dev[dev >= 0]).tolist(), reserved_peak_bytes=reserved,
        memory_series=series, memory_device=mem_dev, samples=dict(rd.samples), n_events=n_events, t_min=t_min,
        p2p=p2p, unlaunched=unlaunched, after_last_step=after)
