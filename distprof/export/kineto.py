"""A merged run as Kineto chrome-trace JSON: one file per rank, readable by Holistic Trace Analysis, TensorBoard's
profiler plugin, Perfetto and chrome://tracing. No torch.

    from distprof.export import export_kineto
    files = export_kineto(distprof.load(run_dir), "out/kineto")     # out/kineto/rank-0.json.gz, rank-1.json.gz, ...

One rank's events are in memory at a time (``run.rank_merged``); the base time and the clock come from the run
summary.

What a file holds (format in docs/export.md):

* top-level keys first, ``traceEvents`` last (streaming readers stop at ``traceEvents``): ``schemaVersion``,
  ``distributedInfo`` (backend, rank, world_size, pg_count, pg_config), ``deviceProperties`` ([] on CPU),
  ``traceName``, ``displayTimeUnit``, ``baseTimeNanoseconds``, ``distprof`` (provenance). Header values are written
  with ``": "`` separators: HTA finds a file's rank with the regex ``"rank":\\s+N`` and loses compact files.
* times: one ``baseTimeNanoseconds`` for every rank of the export (the run's first aligned timestamp, floored to the
  second), ``ts``/``dur`` float µs relative to it with 3 decimals, so ``round(ts·1000) + base`` gives back the aligned
  epoch ns exactly. The ranks share MergedRun's aligned clock, so a reader that adds the base (or shifts every rank by
  one global minimum, as HTA does) sees the ranks in step.
* events: ``ph:"X"``, ``cat`` = the Kineto activity kind; CPU rows on ``pid`` = OS pid (else 1,000,000 + rank),
  ``tid`` = OS thread id; device rows on ``pid`` = device index, ``tid`` = stream; kernels, memcpy and memset carry
  ``args.device``/``stream``/``correlation`` (a ``gpu_user_annotation`` only an ``External id``, as in Kineto).
  Links: ``External id`` on CPU ops and annotations (their correlation id); ``correlation`` on runtime calls; a runtime
  call's ``External id`` is that of the innermost CPU op around it on its thread, a device row's that of its
  launching runtime call; ``ac2g`` flow pairs (``ph`` s/f) draw the launch arrows. ``ProfilerStep#N``
  annotations exist for every recorded step (synthesised from /steps when a shard lacks them). Communication rows
  carry ``Collective name``, ``Process Group Name/Description/Ranks``, ``Group size``, ``In msg bytes``, ``Seq`` (NCCL
  sequence number, where recorded) and distprof's instance key (``distprof window``/``distprof seq``).
  Allocator rows become ``[memory]`` instants. Process/thread names and sort order are ``ph:"M"`` metadata.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

import numpy as np

from .._version import __version__
from ..analysis.names import rank_ranges
from ..analysis.rank.index import main_thread
from ..analysis.summarize.merged import rank_merged
from ..analysis.types import MergedRun, device_properties
from ..atomic import atomic_write
from ..errors import ConfigError, IncompleteRunError
from ..events.launches import LAUNCH_KINDS, launch_rows
from ..progress import progress_enabled
from ..storage import schema

log = logging.getLogger(__name__)

__all__ = ["ExportedFile", "export_kineto", "rank_trace", "choose_base_ns", "file_name", "KINETO_SCHEMA_VERSION"]

KINETO_SCHEMA_VERSION = 1
#: pid of a rank's CPU process when its OS pid is unknown (kept clear of device indices, which are GPU pids).
CPU_PID_BASE = 1_000_000
#: Device rows: Kineto puts them on pid = device, tid = stream.
DEVICE_KINDS = frozenset({"kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation"})
#: Device rows that carry ``device``/``stream``/``correlation`` args. Not gpu_user_annotation: Kineto gives it only an
#: ``External id``, so HTA keeps it off its GPU timeline (a ``stream`` arg would make HTA count it as GPU activity).
LINKED_DEVICE_KINDS = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
#: Host-side calls into the device runtime: carry ``correlation`` (= the device row's) and the enclosing op's id.
RUNTIME_KINDS = frozenset(schema.KINDS[k] for k in LAUNCH_KINDS)
#: Host rows that Kineto gives an ``External id`` of their own, and that enclose runtime calls.
EXTERNAL_ID_KINDS = frozenset({"cpu_op", "user_annotation"})
#: distprof's normalised collective name -> the c10d name Kineto writes in ``Collective name``.
COLLECTIVE_NAMES = {"all_reduce": "allreduce", "all_gather": "allgather", "all_to_all": "alltoall",
                    "send_recv": "sendrecv"}
ROLE_NAMES = {schema.ROLE_EXEC: "exec", schema.ROLE_ENQUEUE: "enqueue", schema.ROLE_ANNOTATION: "annotation"}
#: Events serialised per write.
CHUNK = 8192
NS_PER_S = 1_000_000_000


@dataclass
class ExportedFile:
    rank: int
    path: Path
    n_events: int  # traceEvents entries, metadata included
    n_x: int  # complete events (ph "X")
    bytes: int


def file_name(rank: int, gzip: bool = True) -> str:
    return f"rank-{rank}.json" + (".gz" if gzip else "")


def choose_base_ns(run, ranks: Iterable[int]) -> int:
    """One base for every exported rank: the earliest aligned timestamp among them (events, steps, memory), floored
    to the second. From the run summary: per rank and window the earliest recorded time, aligned."""
    want = sorted(int(r) for r in ranks)
    lows = []
    st = run.steps
    m = np.isin(st["rank"], want)
    if m.any():
        lows.append(int(st["start_ns"][m].min()))
    for r in want:
        s = run.ranks.get(r)
        if s is None or not s.t_min:
            continue
        w = np.asarray(sorted(s.t_min), np.int64)
        t = np.asarray([s.t_min[int(x)] for x in w], np.int64)
        lows.append(int(run.model.align(np.full(w.size, r), w, t).min()))
    if not lows:
        return 0
    return (min(lows) // NS_PER_S) * NS_PER_S


def export_kineto(
    run,
    out_dir: str | os.PathLike,
    *,
    ranks: Sequence[int] | None = None,
    gzip: bool = True,
    compresslevel: int = 6,
    progress: bool | None = None,
) -> list[ExportedFile]:
    """Write ``rank-N.json.gz`` (or ``.json``) for each rank of `run` (a RunSummary) into `out_dir`; return what was
    written.

    ranks: the ranks to write (default: every rank present). Raises IncompleteRunError when one is not in the run.
    progress: True forces a tqdm bar over the ranks, False hides it, None shows it when stderr is a terminal.
    Each file is written under a temporary name and renamed when complete.
    """
    present = [int(r) for r in run.ranks_present]
    if ranks is None:
        ranks = present
    else:
        ranks = sorted({int(r) for r in ranks})
        absent = [r for r in ranks if r not in present]
        if absent:
            raise IncompleteRunError(
                f"--ranks: rank(s) {', '.join(map(str, absent))} not in run {run.run_id!r} (present: "
                f"{rank_ranges(present, sep=',') or 'none'}); pick ranks that have shards")
    if not ranks:
        raise IncompleteRunError(f"run {run.run_id!r}: no rank to export")
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"-o {out}: exists and is not a directory; pass a directory for the rank files")
    out.mkdir(parents=True, exist_ok=True)
    _warn_foreign_files(out, {file_name(r, gzip) for r in ranks})
    base = choose_base_ns(run, ranks)
    written: list[ExportedFile] = []
    for r in _bar(ranks, progress, "exporting ranks"):
        rm, _ = rank_merged(run, r)
        header, events = rank_trace(rm, r, base, trace_name=file_name(r, gzip))
        path = out / file_name(r, gzip)
        n, n_x, size = _write(path, header, events, gzip=gzip, compresslevel=compresslevel)
        log.info("rank %d: wrote %s (%d events, %d bytes)", r, path, n, size)
        written.append(ExportedFile(rank=r, path=path, n_events=n, n_x=n_x, bytes=size))
    return written


# ---- one rank ------------------------------------------------------------------------------------------------------


def rank_trace(run: MergedRun, rank: int, base_ns: int, *, trace_name: str = "") -> tuple[dict[str, Any],
                                                                                        Iterator[dict[str, Any]]]:
    """The Kineto header dict (without ``traceEvents``) and an iterator over the trace events of `rank`."""
    attrs = run.attrs.get(rank, {})
    header: dict[str, Any] = {
        "schemaVersion": KINETO_SCHEMA_VERSION,
        "distributedInfo": _distributed_info(run, rank),
        "deviceProperties": _device_properties(run, rank),
        "traceName": trace_name,
        "displayTimeUnit": "ms",
        "baseTimeNanoseconds": int(base_ns),
        "distprof": {
            "source": "distprof export --format kineto",
            "distprof_version": __version__,
            "run_id": run.run_id,
            "rank": int(rank),
            "host": run.hosts.get(rank, str(attrs.get("host", ""))),
            "clock": _clock_note(run, rank),
            "times": "aligned to the reference rank's clock (epoch ns = round(ts*1000) + baseTimeNanoseconds)",
        },
    }
    return header, _events(run, rank, base_ns)


def _distributed_info(run: MergedRun, rank: int) -> dict[str, Any]:
    attrs = run.attrs.get(rank, {})
    info: dict[str, Any] = {"backend": str(attrs.get("backend") or "none"), "rank": int(rank),
                            "world_size": int(run.world_size)}
    pgs = [g for g in run.process_groups if not g.get("ranks") or rank in g["ranks"]]
    if pgs:
        info["pg_count"] = len(pgs)
        info["pg_config"] = [{
            "pg_name": str(g.get("name", g.get("index", ""))),
            "pg_desc": str(g.get("desc") or "undefined"),
            "backend_config": str(g.get("backend") or ""),
            "pg_size": len(g["ranks"]) if g.get("ranks") else -1,
            "ranks": [int(x) for x in g.get("ranks") or []],
        } for g in pgs]
    cfg = attrs.get("config") if isinstance(attrs.get("config"), dict) else {}
    nccl = attrs.get("nccl_version") or cfg.get("nccl_version")  # imported traces keep it in config
    if nccl:
        info["nccl_version"] = str(nccl)
    return info


def _device_properties(run: MergedRun, rank: int) -> list[dict[str, Any]]:
    attrs = run.attrs.get(rank, {})
    out = [dict(d) for d in device_properties(attrs)]
    dtype = str(attrs.get("device_type") or "")
    if dtype in ("", "cpu"):
        return out
    ev = run.events
    m = (ev["rank"] == rank) & (ev["device"] >= 0) if "device" in ev else np.zeros(0, bool)
    if m.any():
        devices = sorted({int(d) for d in np.unique(ev["device"][m])})
    else:
        devices = [] if out else [int(attrs.get("local_rank", 0))]
    have = {d.get("id") for d in out}
    # a device the rank's events use but the shard has no properties for: Kineto's minimum, id and name
    return out + [{"id": d, "name": str(attrs.get("device") or dtype)} for d in devices if d not in have]


def _clock_note(run: MergedRun, rank: int) -> dict[str, Any]:
    c = run.clock.get(run.hosts.get(rank, ""))
    if c is None:
        return {"method": "none"}
    return {"method": c.method, "offset_ns": round(float(c.offset_ns)), "drift_ppm": float(c.drift_ppm)}


def _rank_rows(tab: dict[str, np.ndarray], rank: int) -> np.ndarray:
    if "rank" not in tab or not len(tab["rank"]):
        return np.zeros(0, dtype=np.int64)
    return np.flatnonzero(tab["rank"] == rank)


@dataclass
class _RankEvents:
    """One rank's events as exported, its synthesised ProfilerStep rows included, sorted by (ts, -dur)."""

    #: int64 columns name_id (ids past run.names index extra_names), kind, tid, device, ts, dur, flops, corr, and src
    #: (position in `rows`; -1 for synthesised rows)
    cols: dict[str, np.ndarray]
    rows: np.ndarray  # the rank's rows of run.events
    main_tid: int
    extra_names: list[str]


def _export_main_tid(names: Sequence[str], threads: dict[tuple[int, int], tuple[str, int]], tid: np.ndarray,
                     name_id: np.ndarray, device: np.ndarray) -> int:
    """The rank's main thread: the threads table's, else the stepping thread, else the busiest host thread (0)."""
    main_tid = next((t for (d, t), (_, role) in threads.items() if d == -1 and role == schema.THREAD_MAIN), None)
    if main_tid is None and len(tid):
        is_step = np.array([str(x).startswith("ProfilerStep#") for x in np.asarray(names, dtype=object)], bool)
        main_tid = main_thread({}, tid, is_step[name_id] if is_step.size else np.zeros(len(tid), bool), device)
    if main_tid is None and len(tid):  # no step at all: the busiest host thread
        vals, counts = np.unique(tid[device < 0], return_counts=True)
        main_tid = int(vals[np.argmax(counts)]) if len(vals) else 0
    return int(main_tid or 0)


def _rank_events(run: MergedRun, rank: int, threads: dict[tuple[int, int], tuple[str, int]]) -> _RankEvents:
    """`rank`'s events, plus a ProfilerStep#N on the main thread for every recorded step that has no such event."""
    ev = run.events
    rows = _rank_rows(ev, rank)
    names = run.names
    n = len(rows)
    cols = {
        "name_id": ev["name_id"][rows].astype(np.int64),
        "kind": ev["kind"][rows].astype(np.int64),
        "tid": ev["tid"][rows].astype(np.int64),
        "device": ev["device"][rows].astype(np.int64) if "device" in ev else np.full(n, -1, np.int64),
        "ts": ev["ts_ns"][rows].astype(np.int64),
        "dur": ev["dur_ns"][rows].astype(np.int64),
        "flops": ev["flops"][rows].astype(np.int64) if "flops" in ev else np.zeros(n, np.int64),
        "corr": ev["corr_id"][rows].astype(np.int64) if "corr_id" in ev else np.zeros(n, np.int64),
        "src": np.arange(n, dtype=np.int64),
    }
    main_tid = _export_main_tid(names, threads, cols["tid"], cols["name_id"], cols["device"])
    name_id = cols["name_id"]
    have = {str(names[i]) for i in np.unique(name_id)} if len(name_id) else set()
    syn = []
    for j in _rank_rows(run.steps, rank):
        nm = f"ProfilerStep#{int(run.steps['step'][j])}"
        if nm not in have:
            have.add(nm)
            syn.append((nm, int(run.steps["start_ns"][j]), int(run.steps["end_ns"][j])))
    if syn:
        m = len(syn)
        added = {"name_id": np.arange(len(names), len(names) + m, dtype=np.int64),
                 "kind": np.full(m, schema.KIND_CODE["user_annotation"], np.int64),
                 "tid": np.full(m, main_tid, np.int64), "device": np.full(m, -1, np.int64),
                 "ts": np.array([s[1] for s in syn], np.int64),
                 "dur": np.array([max(s[2] - s[1], 0) for s in syn], np.int64),
                 "flops": np.zeros(m, np.int64), "corr": np.zeros(m, np.int64), "src": np.full(m, -1, np.int64)}
        cols = {k: np.concatenate([v, added[k]]) for k, v in cols.items()}
    order = np.lexsort((-cols["dur"], cols["ts"]))
    return _RankEvents({k: v[order] for k, v in cols.items()}, rows=rows, main_tid=main_tid,
                       extra_names=[s[0] for s in syn])


@dataclass
class _Links:
    """Per exported row: its Kineto kind and which of Kineto's id links it carries."""

    kind_s: np.ndarray  # the kind's name
    is_dev: np.ndarray  # on a device track
    is_rt: np.ndarray  # a host call into the device runtime
    is_op: np.ndarray  # a host op or annotation with an External id of its own
    is_linked: np.ndarray  # a device row with device/stream/correlation args
    ext: np.ndarray  # External id it carries (0: none): a runtime call's enclosing op's, a device row's launch's
    launch_of: np.ndarray  # a linked device row's launching runtime call (row), else -1


def _links(evs: _RankEvents) -> _Links:
    """Kinds, device/runtime/op flags, External ids and launches of the rows of `evs`."""
    c = evs.cols
    kind, device, tid, ts, corr = c["kind"], c["device"], c["tid"], c["ts"], c["corr"]
    kinds = np.array(schema.KINDS, dtype=object)
    kind_clip = np.where((kind >= 0) & (kind < len(kinds)), kind, 0)
    kind_s = kinds[kind_clip]
    is_dev = np.isin(kind_s, list(DEVICE_KINDS)) | (device >= 0)
    is_rt = np.isin(kind_s, list(RUNTIME_KINDS)) & ~is_dev
    is_op = np.isin(kind_s, list(EXTERNAL_ID_KINDS)) & ~is_dev
    is_linked = np.isin(kind_s, list(LINKED_DEVICE_KINDS))
    ext = _enclosing_external_ids(tid, ts, ts + c["dur"], corr, is_op, is_rt)
    linked = np.flatnonzero(is_linked & (corr > 0))
    launch_of = np.full(len(ts), -1, np.int64)  # each device row's launch (same order as the columns here)
    launch_of[linked] = launch_rows(kind, device, corr, linked)
    for i in linked.tolist():  # a device row inherits its launch's External id
        j = int(launch_of[i])
        if j >= 0:
            ext[i] = ext[j]
    return _Links(kind_s=kind_s, is_dev=is_dev, is_rt=is_rt, is_op=is_op, is_linked=is_linked, ext=ext,
                  launch_of=launch_of)


def _events(run: MergedRun, rank: int, base_ns: int) -> Iterator[dict[str, Any]]:
    """`rank`'s trace events: metadata, its rows (``X``, or ``i`` for instants) by (ts, -dur), flows, memory."""
    names = run.names
    attrs = run.attrs.get(rank, {})
    cpu_pid = int(attrs.get("pid") or 0) or CPU_PID_BASE + int(rank)
    threads = _threads(run, rank)
    evs = _rank_events(run, rank, threads)
    lk = _links(evs)
    comm_args = _comm_args(run, rank, evs.rows)
    cols, is_dev, launch_of = evs.cols, lk.is_dev, lk.launch_of
    tid, device, n = cols["tid"], cols["device"], len(cols["ts"])
    ts_us = ((cols["ts"] - base_ns) / 1e3).tolist()
    dur_us = (cols["dur"] / 1e3).tolist()
    pid = np.where(is_dev, np.maximum(device, 0), cpu_pid).tolist()
    name_l = [str(names[i]) if i < len(names) else evs.extra_names[i - len(names)] for i in cols["name_id"].tolist()]
    kind_l, tid_l, dev_l = lk.kind_s.tolist(), tid.tolist(), device.tolist()
    corr_l, ext_l, flops_l, src_l = cols["corr"].tolist(), lk.ext.tolist(), cols["flops"].tolist(), cols["src"].tolist()
    is_rt_l, is_op_l, is_linked_l = lk.is_rt.tolist(), lk.is_op.tolist(), lk.is_linked.tolist()
    is_dev_l = is_dev.tolist()
    yield from _metadata(rank, cpu_pid, threads, sorted({int(t) for t in tid[~is_dev]} | {evs.main_tid}),
                         sorted({(int(d), int(s)) for d, s in zip(np.maximum(device[is_dev], 0), tid[is_dev])}),
                         attrs, ts_us[0] if n else 0.0)

    flows: list[dict[str, Any]] = []
    for i in range(n):
        k = kind_l[i]
        c = corr_l[i]
        args: dict[str, Any] = {}
        if is_linked_l[i]:
            if ext_l[i] > 0:
                args["External id"] = ext_l[i]
            args["device"] = max(dev_l[i], 0)
            args["stream"] = tid_l[i]
            args["correlation"] = c if c > 0 else 0
        elif is_rt_l[i]:
            if ext_l[i] > 0:
                args["External id"] = ext_l[i]
            if c > 0:
                args["correlation"] = c
        elif (is_op_l[i] or is_dev_l[i]) and c > 0:
            args["External id"] = c
        if flops_l[i]:
            args["flops"] = flops_l[i]
        extra = comm_args.get(src_l[i])
        if extra:
            args.update(extra)
        if k == "cpu_instant_event":
            yield {"ph": "i", "cat": k, "s": "t", "name": name_l[i], "pid": pid[i], "tid": tid_l[i],
                   "ts": ts_us[i], "args": args}
            continue
        yield {"ph": "X", "cat": k, "name": name_l[i], "pid": pid[i], "tid": tid_l[i], "ts": ts_us[i],
               "dur": dur_us[i], "args": args}
        if is_linked_l[i] and c > 0:
            j = int(launch_of[i])
            if j >= 0:
                flows.append({"ph": "s", "id": c, "pid": pid[j], "tid": tid_l[j], "ts": ts_us[j], "cat": "ac2g",
                              "name": "ac2g"})
                flows.append({"ph": "f", "id": c, "pid": pid[i], "tid": tid_l[i], "ts": ts_us[i], "cat": "ac2g",
                              "name": "ac2g", "bp": "e"})
    yield from flows
    yield from _memory_events(run, rank, base_ns, cpu_pid, evs.main_tid)


def _threads(run: MergedRun, rank: int) -> dict[tuple[int, int], tuple[str, int]]:
    """(device, tid) -> (name, role) of `rank`'s tracks, first row wins across windows: OS threads on device −1,
    streams on their device. A stream row of a shard older than ``threads.device`` (read as device 0) is also keyed
    (−2, stream): the fallback for a stream of any device."""
    th = run.threads
    out: dict[tuple[int, int], tuple[str, int]] = {}
    has_dev = "device" in th
    for j in _rank_rows(th, rank):
        t = int(th["tid"][j])
        role = int(th["role"][j]) if "role" in th else 0
        stream = role == schema.THREAD_STREAM
        d = (int(th["device"][j]) if has_dev else 0) if stream else -1
        nid = int(th["name_id"][j]) if "name_id" in th else -1
        nm = str(run.names[nid]) if 0 <= nid < len(run.names) else ""
        out.setdefault((d, t), (nm, role))
        if stream:
            out.setdefault((-2, t), (nm, role))
    return out


def _metadata(rank: int, cpu_pid: int, threads: dict[tuple[int, int], tuple[str, int]], cpu_tids: list[int],
              streams: list[tuple[int, int]], attrs: dict[str, Any], ts: float) -> Iterator[dict[str, Any]]:
    def meta(name: str, pid: int, tid: int, args: dict[str, Any]) -> dict[str, Any]:
        return {"name": name, "ph": "M", "ts": ts, "pid": pid, "tid": tid, "args": args}

    yield meta("process_name", cpu_pid, 0, {"name": f"rank {rank}" + (f" ({attrs['host']})" if attrs.get("host")
                                                                         else "")})
    yield meta("process_labels", cpu_pid, 0, {"labels": "CPU"})
    yield meta("process_sort_index", cpu_pid, 0, {"sort_index": 0})
    for k, t in enumerate(cpu_tids):
        nm, role = threads.get((-1, t), ("", 0))
        yield meta("thread_name", cpu_pid, t, {"name": nm or f"thread {t}"})
        yield meta("thread_sort_index", cpu_pid, t, {"sort_index": (0 if role == schema.THREAD_MAIN else 1 + k)})
    for d in sorted({d for d, _ in streams}):
        yield meta("process_name", d, 0, {"name": f"GPU {d}"})
        yield meta("process_labels", d, 0, {"labels": f"GPU {d}"})
        yield meta("process_sort_index", d, 0, {"sort_index": 1_000 + d})
    for d, s in streams:
        nm = threads.get((d, s), threads.get((-2, s), ("", 0)))[0]
        yield meta("thread_name", d, s, {"name": nm or f"stream {s}"})
        yield meta("thread_sort_index", d, s, {"sort_index": s})


def _enclosing_external_ids(tid: np.ndarray, ts: np.ndarray, end: np.ndarray, corr: np.ndarray,
                            is_op: np.ndarray, is_rt: np.ndarray) -> np.ndarray:
    """For each runtime row: the correlation id of the innermost op row (same thread) that contains it; else 0.

    Rows must be sorted by (ts, -dur). A stack sweep per thread that has runtime rows.
    """
    ext = np.zeros(len(ts), dtype=np.int64)
    if not is_rt.any():
        return ext
    rt_tids = np.unique(tid[is_rt])
    sel = np.flatnonzero((is_op | is_rt) & np.isin(tid, rt_tids))
    sel = sel[np.argsort(tid[sel], kind="stable")]  # per thread, keeping the (ts, -dur) order
    tid_l, ts_l, end_l, corr_l = tid[sel].tolist(), ts[sel].tolist(), end[sel].tolist(), corr[sel].tolist()
    op_l, rt_l = is_op[sel].tolist(), is_rt[sel].tolist()
    stack: list[tuple[int, int]] = []  # (end, correlation id)
    cur = None
    for k, row in enumerate(sel.tolist()):
        if tid_l[k] != cur:
            cur, stack = tid_l[k], []
        t0 = ts_l[k]
        while stack and stack[-1][0] <= t0 and not (stack[-1][0] == t0 == end_l[k]):
            stack.pop()
        if rt_l[k]:
            for e, c in reversed(stack):
                if e >= end_l[k] and c > 0:
                    ext[row] = c
                    break
        if op_l[k]:
            stack.append((end_l[k], corr_l[k]))
    return ext


def _comm_args(run: MergedRun, rank: int, rows: np.ndarray) -> dict[int, dict[str, Any]]:
    """Position in `rows` -> collective args for this rank's communication rows."""
    cm = run.comms
    crow = _rank_rows(cm, rank)
    if not len(crow) or not len(rows):
        return {}
    pos = np.searchsorted(rows, cm["row"][crow])
    ok = (pos < len(rows)) & (rows[np.minimum(pos, len(rows) - 1)] == cm["row"][crow])
    pgs = {int(g.get("index", i)): g for i, g in enumerate(run.process_groups)}
    out: dict[int, dict[str, Any]] = {}
    for j, p, good in zip(crow.tolist(), pos.tolist(), ok.tolist()):
        if not good:
            continue
        op = str(run.names[int(cm["op_id"][j])]) if "op_id" in cm else ""
        a: dict[str, Any] = {}
        if op:
            a["Collective name"] = COLLECTIVE_NAMES.get(op, op)
        b = int(cm["bytes"][j]) if "bytes" in cm else -1
        if b >= 0:
            a["In msg bytes"] = b
        gs = int(cm["group_size"][j]) if "group_size" in cm else -1
        g = pgs.get(int(cm["pg"][j])) if "pg" in cm else None
        if g is not None:
            a["Process Group Name"] = str(g.get("name", ""))
            a["Process Group Description"] = str(g.get("desc") or "undefined")
            if g.get("ranks"):
                a["Process Group Ranks"] = "[" + ", ".join(str(int(x)) for x in g["ranks"]) + "]"
                if gs < 0:
                    gs = len(g["ranks"])
        if gs >= 0:
            a["Group size"] = gs
        ns = int(cm["nccl_seq"][j]) if "nccl_seq" in cm else -1
        if ns >= 0:
            a["Seq"] = ns
        seq = int(cm["seq"][j]) if "seq" in cm else -1
        if seq >= 0:
            a["distprof window"] = int(cm["window"][j]) if "window" in cm else 0
            a["distprof seq"] = seq
        role = int(cm["role"][j]) if "role" in cm else 0
        if role in ROLE_NAMES:
            a["distprof role"] = ROLE_NAMES[role]
        out[p] = a
    return out


def _memory_events(run: MergedRun, rank: int, base_ns: int, cpu_pid: int, main_tid: int) -> Iterator[dict]:
    mem = run.memory
    rows = _rank_rows(mem, rank)
    if not len(rows):
        return
    ts = ((mem["ts_ns"][rows].astype(np.int64) - base_ns) / 1e3).tolist()
    nb = mem["bytes"][rows].tolist() if "bytes" in mem else [0] * len(rows)
    tot = mem["total_bytes"][rows].tolist() if "total_bytes" in mem else [0] * len(rows)
    dev = mem["device"][rows].tolist() if "device" in mem else [-1] * len(rows)
    for t, b, total, d in zip(ts, nb, tot, dev):
        yield {"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": cpu_pid, "tid": main_tid,
               "ts": t, "args": {"Bytes": b, "Total Allocated": total, "Device Type": 0 if d < 0 else 1,
                                 "Device Id": d}}


# ---- writing -------------------------------------------------------------------------------------------------------


def _write(path: Path, header: dict[str, Any], events: Iterable[dict[str, Any]], *, gzip: bool,
           compresslevel: int) -> tuple[int, int, int]:
    """Header keys one per line (``": "`` separators), then ``traceEvents`` one event per line; tmp then rename."""
    import orjson

    n = n_x = 0
    with atomic_write(path, gzip=gzip, compresslevel=compresslevel, fsync=True) as fh:
        fh.write(b"{\n")
        for key, value in header.items():
            fh.write(f"  {json.dumps(key)}: {json.dumps(value, ensure_ascii=False)},\n".encode())
        fh.write(b'  "traceEvents": [\n')
        buf: list[bytes] = []
        for e in events:
            buf.append(orjson.dumps(e))
            n += 1
            if e["ph"] == "X":
                n_x += 1
            if len(buf) >= CHUNK:
                fh.write((b",\n" if n > len(buf) else b"") + b",\n".join(buf))
                buf = []
        if buf:
            fh.write((b",\n" if n > len(buf) else b"") + b",\n".join(buf))
        fh.write(b"\n  ]\n}\n")
    return n, n_x, path.stat().st_size


def _warn_foreign_files(out: Path, ours: set[str]) -> None:
    others = sorted(p.name for p in out.iterdir()
                    if p.is_file() and p.name not in ours and (p.name.endswith(".json") or p.name.endswith(".gz")))
    if others:
        log.warning("%s also holds %s: trace readers such as HTA load every .json/.gz file of a directory; "
                    "export into an empty directory to analyse only this export", out,
                    ", ".join(others[:5]) + (f" and {len(others) - 5} more" if len(others) > 5 else ""))


def _bar(items: Sequence[int], progress: bool | None, desc: str):
    if not progress_enabled(progress):
        return items
    from tqdm import tqdm

    return tqdm(items, desc=desc, unit="rank", file=sys.stderr, leave=False)


