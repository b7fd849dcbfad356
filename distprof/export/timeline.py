"""The merged timeline: one Chrome trace-event JSON for every rank of a run, on the aligned clock.

    run = distprof.load(run_dir)                                    # RunSummary
    plan = plan_timeline(run, ranks=[0, 1], max_events=1_000_000)   # what goes in, what is cut
    for ev in iter_trace_events(run, plan): ...                     # the trace events, as dicts
    write_timeline(run, plan, "merged.json.gz")                     # JSON (gzipped for .gz), tmp + rename

Bounded memory: planning and writing read one rank's events at a time (``run.rank_merged``); what crosses ranks —
the matched collectives, the clock model, the steps — comes from the run summary.

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
  arrival order (the run's matched collectives): the last arrow ends at the rank everyone waited for;
* flow arrows ``cat`` "p2p" (named ``send → recv``) from each point-to-point send to the receive it was paired with
  on the peer (the run's matched transfers): a pipeline stage's activations and gradients;
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
import os
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from ..analysis.summarize.merged import rank_merged
from ..atomic import atomic_write
from ..errors import ConfigError
from ..progress import progress_enabled
from ..storage import schema
from .timeline_cut import Cut, format_ranges
from .timeline_plan import (
    BYTES_PER_EVENT,
    DEFAULT_MAX_EVENTS,
    TimelinePlan,
    cells_of,
    kept_members,
    kept_p2p,
    p2p_rows_of,
    plan_timeline,
    rank_masks,
    select,
    step_keep,
)
from .timeline_rank import (
    aligned_durations,
    collective_args,
    comm_args,
    enqueue_links,
    lateness,
    launch_links,
    nested_ends,
    track_key,
    us,
)

log = logging.getLogger(__name__)

__all__ = ["DEFAULT_MAX_EVENTS", "BYTES_PER_EVENT", "Cut", "TimelinePlan", "plan_timeline", "iter_trace_events",
           "timeline_metadata", "write_timeline", "read_timeline", "format_ranges", "enqueue_links", "launch_links",
           "nested_ends"]

#: Trace events from this many on get a progress bar while writing (when stderr is a terminal).
PROGRESS_MIN_EVENTS = 200_000
#: gzip level: 1 is ≈2.5× faster than 6 for a file ≈40 % larger (measured on real traces).
GZIP_LEVEL = 3
_CHUNK = 50_000


def timeline_metadata(run, plan: TimelinePlan) -> dict[str, Any]:
    """The ``otherData.distprof`` dict: origin, run, selection, clocks, counts and the cut."""
    origin = plan.origin_ns
    utc = datetime.fromtimestamp(origin // 10**9, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
    kept_steps = sorted({int(s) for s in run.steps["step"][step_keep(run, plan)]})
    c = plan.counts
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
        "clock": {h: {"offset_ns": float(hc.offset_ns), "drift_ppm": float(hc.drift_ppm), "method": hc.method,
                      "residual_us": hc.residual_us} for h, hc in run.clock.items()},
        "counts": {"slices": c["slices"], "step_markers": c["step_markers"], "memory_samples": c["memory_samples"],
                   "flows": c["flows"], "enqueue_flows": c["enqueue_flows"], "launch_flows": c["launch_flows"],
                   "metadata": plan.n_metadata, "total": plan.n_events},
        "cut": plan.cut.to_dict(plan.selection) if plan.cut.happened else None,
        "warnings": list(run.warnings[:20]),
    }


@dataclass
class _FlowEnds:
    """Where the arrows start and end, gathered while each rank's slices are written (they are written last)."""

    member: dict[tuple[int, int], tuple[int, int]] = field(default_factory=dict)  # (rank, ev_row) -> (ts, tid)
    p2p: dict[tuple[int, int], tuple[int, int]] = field(default_factory=dict)  # (rank, ev_row) -> (ts, tid)
    enqueue: list[tuple] = field(default_factory=list)  # (group, order, rank, i, ts_s, tid_s, ts_d, tid_d, name)
    launch: list[tuple] = field(default_factory=list)  # (rank, ts_s, tid_s, ts_d, tid_d)


def _rank_slices(run, plan: TimelinePlan, r: int, late, ends: _FlowEnds) -> Iterator[dict[str, Any]]:
    """One rank's slices (and what its arrows need, into `ends`)."""
    rm, orig = rank_merged(run, r)
    ev_m, mem_m, st_m, ev_keep, mem_keep, st_keep, member, enq, (l_src, l_dst) = rank_masks(run, plan, rm, orig)
    ev, names, origin = rm.events, rm.names, plan.origin_ns
    tid_of = {k: tid for k, tid, _ in plan.tracks[r]}
    rows_all = np.flatnonzero(ev_keep)
    dur_all = aligned_durations(rm, rows_all)
    coll_args = collective_args(rm, rows_all[member[rows_all]], late)
    other_args = comm_args(rm, ev_keep)
    keys_all = track_key(ev["device"], ev["tid"])
    for row in np.flatnonzero(member & ev_keep).tolist():
        ends.member[(r, int(orig[row]))] = (int(ev["ts_ns"][row]), tid_of[int(keys_all[row])])
    for row in p2p_rows_of(run, r, orig).tolist():
        if ev_keep[row]:
            ends.p2p[(r, int(orig[row]))] = (int(ev["ts_ns"][row]), tid_of[int(keys_all[row])])
    src, dst, op, group, order = enq
    both = ev_keep[src] & ev_keep[dst]
    for i, (s_, d_, o_, g_, k_) in enumerate(zip(src[both].tolist(), dst[both].tolist(), op[both].tolist(),
                                                 group[both].tolist(), order[both].tolist())):
        name = str(names[o_]) if o_ < len(names) else "collective"
        ends.enqueue.append((g_, k_, r, i, int(ev["ts_ns"][s_]), tid_of[int(keys_all[s_])], int(ev["ts_ns"][d_]),
                             tid_of[int(keys_all[d_])], name))
    both = ev_keep[l_src] & ev_keep[l_dst]
    for s_, d_ in zip(l_src[both].tolist(), l_dst[both].tolist()):
        ends.launch.append((r, int(ev["ts_ns"][s_]), tid_of[int(keys_all[s_])], int(ev["ts_ns"][d_]),
                            tid_of[int(keys_all[d_])]))
    kinds = list(schema.KINDS)
    cats = list(schema.CATEGORIES)
    instant = schema.KIND_CODE["cpu_instant_event"]
    for c0 in range(0, len(rows_all), _CHUNK):
        rows = rows_all[c0:c0 + _CHUNK]
        dur = dur_all[c0:c0 + _CHUNK]
        cols = zip(rows.tolist(), names[ev["name_id"][rows]].tolist(), ev["kind"][rows].tolist(),
                   ev["category"][rows].tolist(), us(ev["ts_ns"][rows] - origin), us(dur),
                   keys_all[rows].tolist(), ev["step"][rows].tolist(), ev["flops"][rows].tolist(),
                   ev["device"][rows].tolist(), ev["corr_id"][rows].tolist())
        for row, name, kind, cat, ts, d, k, step, flops, dev, corr in cols:
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
            extra = coll_args.get(row) or other_args.get(row)
            if extra:
                args.update(extra)
            e = {"ph": "X", "name": name, "cat": kinds[kind] if kind < len(kinds) else "other", "ts": ts, "dur": d,
                 "pid": r + 1, "tid": tid_of[k], "args": args}
            if kind == instant:
                e["ph"] = "i"
                e["s"] = "t"
                del e["dur"]
            yield e


def _memory_samples(run, plan: TimelinePlan, r: int) -> Iterator[dict[str, Any]]:
    rm, orig = rank_merged(run, r, columns={"events": ["tid", "device", "kind", "name_id", "corr_id"]})
    if r in plan.explicit:
        mem_keep = plan.explicit[r][1]
    else:
        mem = rm.memory
        mem_keep = select(mem, plan.sel_windows, plan.selection["steps"]) & plan.keep_cell(
            r, cells_of(mem["step"], np.asarray(plan.units, np.int64)))
    mem = rm.memory
    mr = np.flatnonzero(mem_keep)
    origin = plan.origin_ns
    for c0 in range(0, len(mr), _CHUNK):
        rows = mr[c0:c0 + _CHUNK]
        for dev, ts, tot in zip(mem["device"][rows].tolist(), us(mem["ts_ns"][rows] - origin),
                                mem["total_bytes"][rows].tolist()):
            name = "memory" if dev < 0 else f"memory device {dev}"
            yield {"ph": "C", "name": name, "ts": ts, "pid": r + 1, "tid": 1,
                   "args": {"allocated_MiB": round(tot / 1048576, 6)}}


def iter_trace_events(run, plan: TimelinePlan) -> Iterator[dict[str, Any]]:
    """Every trace event of the plan: metadata first, then slices rank by rank, steps, memory counters and flows.
    Reads one rank's events at a time."""
    for r in plan.ranks:
        pid = r + 1
        yield {"ph": "M", "name": "process_name", "pid": pid, "args": {"name": f"rank {r} · {run.hosts.get(r, '?')}"}}
        yield {"ph": "M", "name": "process_sort_index", "pid": pid, "args": {"sort_index": r}}
        for _, tid, label in plan.tracks[r]:
            yield {"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": label}}
            yield {"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid, "args": {"sort_index": tid}}

    late = lateness(run)
    ends = _FlowEnds()
    for r in plan.ranks:
        yield from _rank_slices(run, plan, r, late, ends)

    st = run.steps
    sr = np.flatnonzero(step_keep(run, plan))
    origin = plan.origin_ns
    for r, step, w, s, e_, fl, pk in zip(st["rank"][sr].tolist(), st["step"][sr].tolist(), st["window"][sr].tolist(),
                                         st["start_ns"][sr].tolist(), st["end_ns"][sr].tolist(),
                                         st["flops"][sr].tolist(), st["peak_mem_bytes"][sr].tolist()):
        yield {"ph": "X", "name": f"step {step}", "cat": "step", "ts": (s - origin) / 1e3, "dur": (e_ - s) / 1e3,
               "pid": r + 1, "tid": 1,
               "args": {"step": step, "window": w, "step_ms": (e_ - s) / 1e6, "flops": fl, "peak_mem_bytes": pk}}

    for r in plan.ranks:
        yield from _memory_samples(run, plan, r)

    # flows: ids 1.. across all three kinds; each starts where its source slice starts and ends (bp "e", bound to the
    # enclosing slice) where its target starts
    fid = 0
    for src, dst, name, cat in _collective_flows(run, plan, ends):
        fid += 1
        yield from _flow(fid, name, cat, src, dst, origin)
    for src, dst in _p2p_flows(run, plan, ends):
        fid += 1
        yield from _flow(fid, "send → recv", "p2p", src, dst, origin)
    for g, k, r, i, ts_s, tid_s, ts_d, tid_d, name in sorted(ends.enqueue, key=lambda x: (x[0], x[1] if x[0] else 0,
                                                                                          x[2], x[3])):
        fid += 1
        yield from _flow(fid, name, "enqueue", (r, ts_s, tid_s), (r, ts_d, tid_d), origin)
    for r, ts_s, tid_s, ts_d, tid_d in ends.launch:
        fid += 1
        yield from _flow(fid, "launch", "launch", (r, ts_s, tid_s), (r, ts_d, tid_d), origin)


def _flow(fid: int, name: str, cat: str, src: tuple[int, int, int], dst: tuple[int, int, int], origin: int):
    for ph, (r, ts, tid) in (("s", src), ("f", dst)):
        e = {"ph": ph, "id": fid, "name": name, "cat": cat, "ts": (ts - origin) / 1e3, "pid": r + 1, "tid": tid}
        if ph == "f":
            e["bp"] = "e"
        yield e


def _collective_flows(run, plan: TimelinePlan, ends: _FlowEnds):
    """(src, dst, name, "collective") between kept members of one instance, consecutive in arrival order."""
    m = run.collectives.members
    keep = kept_members(run, plan)
    ev_row = np.asarray(run.collective_rows["ev_row"], np.int64)[np.asarray(m["row"], np.int64)]
    inst, start, rank = np.asarray(m["inst"])[keep], np.asarray(m["start_ns"])[keep], np.asarray(m["rank"])[keep]
    rows, ops = ev_row[keep], np.asarray(m["op_id"])[keep]
    o = np.lexsort((rank, start, inst))
    inst, rank, rows, ops = inst[o], rank[o], rows[o], ops[o]
    names = run.names
    for i in np.flatnonzero(inst[1:] == inst[:-1]).tolist() if len(inst) > 1 else []:
        a, b = (int(rank[i]), int(rows[i])), (int(rank[i + 1]), int(rows[i + 1]))
        if a not in ends.member or b not in ends.member:
            continue
        op = int(ops[i])
        yield ((a[0], *ends.member[a]), (b[0], *ends.member[b]),
               str(names[op]) if op < len(names) else "collective", "collective")


def _p2p_flows(run, plan: TimelinePlan, ends: _FlowEnds):
    """(src, dst) of each kept matched transfer: from the send to the receive on the peer, in send order."""
    pp = run.p2p
    keep = np.flatnonzero(kept_p2p(run, plan))
    keep = keep[np.argsort(np.asarray(pp.send_start_ns)[keep], kind="stable")]
    for s_rank, s_row, d_rank, d_row in zip(np.asarray(pp.src)[keep].tolist(), np.asarray(pp.send_row)[keep].tolist(),
                                            np.asarray(pp.dst)[keep].tolist(), np.asarray(pp.recv_row)[keep].tolist()):
        a, b = ends.p2p.get((s_rank, s_row)), ends.p2p.get((d_rank, d_row))
        if a is not None and b is not None:
            yield (s_rank, *a), (d_rank, *b)


# ---- files -----------------------------------------------------------------------------------------------------------


@dataclass
class WriteResult:
    path: Path
    n_events: int
    n_bytes: int  # bytes on disk
    json_bytes: int  # uncompressed JSON bytes
    seconds: float


def write_timeline(run, plan: TimelinePlan, path: str | os.PathLike, *,
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
