"""Kineto event list -> numpy column tables of the shard schema.

Reads `_KinetoEvent` objects straight from the profiler's results (≈200k+ events/s here) instead of exporting and
re-parsing chrome JSON (≈64k events/s and no FLOPs). One Python pass fills preallocated arrays; everything after it
(classification, step assignment, sequence numbers, per-step sums) is vectorised over unique names or columns.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable

import numpy as np

from ..storage import schema
from . import schedstat
from .sim import SimClock
from ..events.classify import DTYPE_BYTES, comm_args, comm_role, normalize_op  # noqa: F401  (re-exported)
from ..events.p2p import P2PCalls
from ..events.tables import Columns, Strings, build_tables

#: Names whose Kineto metadata (the trace's ``args``) carries collective arguments worth parsing.
_ARG_NAMES = ("record_param_comms",)
#: The name of an event whose name torch cannot decode (its Python tracer, seen on torch 2.13 with --stack): the event
#: is kept under this name rather than losing the window.
UNDECODABLE_NAME = "[name not UTF-8]"


@dataclass
class Extracted:
    tables: dict[str, dict[str, np.ndarray]]
    strings: list[str]
    window_start_ns: int
    window_end_ns: int
    steps_covered: list[int]
    stats: dict[str, Any] = field(default_factory=dict)


def _message_bytes(ev) -> int:
    try:
        shapes, dtypes = ev.shapes(), ev.dtypes()
    except Exception:  # noqa: BLE001 -- shapes are optional
        return -1
    total, seen = 0, False
    for shape, dt in zip(shapes, dtypes):
        size = DTYPE_BYTES.get(dt)
        if size is None or not isinstance(shape, list) or not shape or not all(isinstance(d, int) for d in shape):
            continue
        total += int(np.prod(shape)) * size
        seen = True
    return total if seen else -1


def _event_comm_args(ev):
    """Collective arguments Kineto attached to the event (record_param_comms, NCCL kernels), or None."""
    try:
        raw = ev.metadata_json()
    except Exception:  # noqa: BLE001 -- absent on older torch
        return None
    if not raw:
        return None
    try:
        args = json.loads("{" + raw + "}") if not raw.lstrip().startswith("{") else json.loads(raw)
    except ValueError:
        return None
    return comm_args(args) if isinstance(args, dict) else None


_USER_SCOPE = 7  # torch's RecordScope.USER_SCOPE: record_function regions, ProfilerStep# included
#: Kineto's names of its own CUPTI overhead records (a CPU row) and of its CUDA synchronisation records (a device row)
_OVERHEAD_NAMES = frozenset(("Activity Buffer Request", "Buffer Flush", "Instrumentation", "Resource",
                             "Driver Compiler"))
_CUDA_SYNC_NAMES = frozenset(("Event Sync", "Stream Sync", "Stream Wait Event", "Context Sync"))
#: torch's Python tracer (with_stack): "file.py(12): fn", "<built-in method ...>", "nn.Module: Linear_0"
_PYTHON_CALL = re.compile(r"^(?:.+\(\d+\): |<built-in |nn\.Module: |nn\.Optimizer: )")


def _user_annotation(e) -> bool:
    """A record_function region (or a GPU user annotation): torch's flag, or on torch < 2.4 the event's scope."""
    flag = getattr(e, "is_user_annotation", None)
    return flag() if flag is not None else e.scope() == _USER_SCOPE


def _activity_kind(e, cpu) -> str:
    """An event's Kineto activity type on a torch whose `_KinetoEvent` does not say it (`activity_type()` came with
    torch 2.12; older ones have only the device type and the user-annotation flag or scope): the kinds the analyses
    tell apart, read from those and the name, as torch's own exporter names them."""
    name = e.name()
    if e.device_type() != cpu:
        if name.startswith("Memcpy"):
            return "gpu_memcpy"
        if name.startswith("Memset"):
            return "gpu_memset"
        if name in _CUDA_SYNC_NAMES:
            return "cuda_sync"
        return "gpu_user_annotation" if _user_annotation(e) else "kernel"
    if name.startswith("[") and name.endswith("]"):  # [memory], [OutOfMemory]
        return "cpu_instant_event"
    if _user_annotation(e):
        return "user_annotation"
    if name in _OVERHEAD_NAMES:
        return "overhead"
    if _PYTHON_CALL.match(name):
        return "python_function"
    if name.startswith("cuda") and name[4:5].isupper():  # cudaLaunchKernel, cudaMemcpyAsync, cudaStreamSynchronize
        return "cuda_runtime"
    if name.startswith("cu") and name[2:3].isupper():  # cuLaunchKernel, cuLaunchKernelEx
        return "cuda_driver"
    return "cpu_op"


@dataclass
class _Raw:
    """One window's Kineto events in input order, memory events included."""

    strings: Strings
    cols: Columns  # every event's columns (a memory event's flops, corr and msg_bytes stay unset)
    is_mem: np.ndarray  # a ``[memory]`` (allocator) event
    nbytes: np.ndarray  # allocator events: bytes allocated (< 0: freed)


def _read_events(events: Iterable[Any]) -> _Raw:
    """One Python pass over torch's `_KinetoEvent` objects into lists (an append is a third of a numpy item store),
    each name's id and communication role looked up once per name (and kind); arrays are made at the end."""
    evs = events if isinstance(events, list) else list(events)
    n = len(evs)
    strings = Strings()
    from torch._C._autograd import DeviceType

    cpu = DeviceType.CPU
    kind_code = schema.KIND_CODE
    k_kernel = kind_code["kernel"]
    seen: dict[str, tuple[int, int, int, bool]] = {}  # name -> (its id, the kind last seen, comm role, memory event)
    name_id, kind, tid, ts, dur, flops, corr = [0] * n, [0] * n, [0] * n, [0] * n, [0] * n, [0] * n, [0] * n
    device: dict[int, int] = {}  # event index -> device index, device events only
    mem: dict[int, int] = {}  # event index -> bytes allocated (< 0: freed), ``[memory]`` events only
    comm: list[int] = []  # indices of communication events
    typed = n == 0 or hasattr(evs[0], "activity_type")
    in_ns = n == 0 or hasattr(evs[0], "start_ns")  # torch < 2.4: microseconds only
    for i, e in enumerate(evs):
        try:
            name = e.name()
        except UnicodeDecodeError:  # torch 2.13's Python tracer can hand out a name that is not UTF-8 (--stack)
            name = UNDECODABLE_NAME
        k = kind_code.get(e.activity_type() if typed else _activity_kind(e, cpu), 0)
        info = seen.get(name)
        if info is None or info[1] != k:  # the role depends on the kind too (a name rarely has two)
            info = seen[name] = (strings.id(name), k, comm_role(name, k), name == "[memory]")
        name_id[i] = info[0]
        kind[i] = k
        tid[i] = e.device_resource_id()
        if in_ns:
            ts[i] = e.start_ns()
            dur[i] = e.duration_ns()
        else:
            ts[i] = e.start_us() * 1000
            dur[i] = e.duration_us() * 1000
        if e.device_type() != cpu:
            device[i] = e.device_index()
        if info[3]:
            mem[i] = e.nbytes()
            continue
        flops[i] = e.flops()
        corr[i] = e.correlation_id()
        if info[2]:
            comm.append(i)
    cols = Columns(
        name_id=np.array(name_id, np.uint32), kind=np.array(kind, np.uint8), tid=np.array(tid, np.int64),
        device=np.full(n, -1, np.int16), ts=np.array(ts, np.int64), dur=np.array(dur, np.int64),
        flops=np.array(flops, np.int64), corr=np.array(corr, np.int64),
        msg_bytes=np.full(n, -1, np.int64),  # collective message size, filled for communication events only
    )
    cols.device[list(device)] = list(device.values())
    is_mem, nbytes = np.zeros(n, bool), np.zeros(n, np.int64)
    is_mem[list(mem)] = True
    nbytes[list(mem)] = list(mem.values())
    names = strings.list() if comm else []
    for i in comm:
        e = evs[i]
        cols.msg_bytes[i] = _message_bytes(e)
        if names[name_id[i]] in _ARG_NAMES or kind[i] == k_kernel:
            meta = _event_comm_args(e)
            if meta is not None:
                cols.comm_meta[i] = meta
    return _Raw(strings=strings, cols=cols, is_mem=is_mem, nbytes=nbytes)


def _columns(raw: _Raw, ts: np.ndarray) -> tuple[Columns, np.ndarray]:
    """The non-memory events as build_tables columns (times `ts`), and the memory events' indices in time order."""
    c = raw.cols
    mem_idx = np.flatnonzero(raw.is_mem)
    ev_idx = np.flatnonzero(~raw.is_mem)
    mem_order = mem_idx[np.argsort(ts[mem_idx], kind="stable")]
    pos = np.full(len(ts), -1, np.int64)
    pos[ev_idx] = np.arange(len(ev_idx))
    cols = Columns(
        name_id=c.name_id[ev_idx], kind=c.kind[ev_idx], tid=c.tid[ev_idx], device=c.device[ev_idx],
        ts=ts[ev_idx], dur=c.dur[ev_idx], flops=c.flops[ev_idx], corr=c.corr[ev_idx],
        msg_bytes=c.msg_bytes[ev_idx], comm_meta={int(pos[i]): m for i, m in c.comm_meta.items()},
    )
    return cols, mem_order


def _memory_table(raw: _Raw, ts: np.ndarray, mem_order: np.ndarray, cuda_baseline: dict[int, int] | None,
                  assign: Callable[[np.ndarray], np.ndarray]) -> dict[str, np.ndarray]:
    """The memory table: allocator events in time order, with each device's running total and their step."""
    m_ts = ts[mem_order]
    m_bytes = raw.nbytes[mem_order]
    m_dev = raw.cols.device[mem_order]
    m_total = np.zeros(len(mem_order), np.int64)
    for d in np.unique(m_dev).tolist():
        sel = m_dev == d
        base = (cuda_baseline or {}).get(int(d), 0) if d >= 0 else 0
        m_total[sel] = base + np.cumsum(m_bytes[sel])
    m_step = assign(m_ts)
    return {"ts_ns": m_ts, "bytes": m_bytes, "total_bytes": m_total, "device": m_dev, "step": m_step}


def _peak_memory(steps: dict[str, np.ndarray], memory: dict[str, np.ndarray], step_span: tuple[np.ndarray, np.ndarray],
                 cuda_step_peaks: dict[int, int] | None) -> None:
    """Fill the steps table's peak_mem_bytes: the CUDA peaks recorded per step, else the memory table's."""
    s_start, s_end = step_span
    m_ts, m_total = memory["ts_ns"], memory["total_bytes"]
    pos_of = {int(st): i for i, st in enumerate(steps["step"].tolist())}
    peak = steps["peak_mem_bytes"]
    if cuda_step_peaks:
        for st, v in cuda_step_peaks.items():
            if st in pos_of:
                peak[pos_of[st]] = v
    elif len(m_ts):
        for i in range(len(steps["step"])):
            before = np.searchsorted(m_ts, s_start[i], side="left")
            lo, hi = before, np.searchsorted(m_ts, s_end[i], side="left")
            level = m_total[before - 1] if before > 0 else 0
            peak[i] = max(level, int(m_total[lo:hi].max()) if hi > lo else level)


def _cpu_columns(steps: dict[str, np.ndarray], cpu_marks: dict[int, tuple[int, ...] | None] | None,
                 cpu_opt_marks: dict[int, tuple[int, ...] | None] | None,
                 cpu_end_marks: dict[int, tuple[int, ...] | None] | None = None) -> None:
    """Fill the steps table's CPU run, wait and page-fault columns from the training thread's marks."""
    steps["cpu_run_ns"], steps["cpu_wait_ns"] = schedstat.step_columns(steps["step"], cpu_marks, ends=cpu_end_marks)
    steps["cpu_wait_opt_ns"] = schedstat.step_columns(steps["step"], cpu_opt_marks, since_previous=True)[1]
    steps["page_faults"] = schedstat.step_faults(steps["step"], cpu_marks, cpu_end_marks)


def extract(
    events: Iterable[Any],
    *,
    main_tid: int,
    sim: SimClock | None = None,
    thread_names: dict[int, str] | None = None,
    gloo_thread_pg: dict[int, str] | None = None,
    process_groups: list[dict[str, Any]] | None = None,
    cuda_step_peaks: dict[int, int] | None = None,
    cuda_baseline: dict[int, int] | None = None,
    step_end_ns: dict[int, int] | None = None,
    p2p_calls: P2PCalls | None = None,
    cpu_marks: dict[int, tuple[int, ...] | None] | None = None,
    cpu_opt_marks: dict[int, tuple[int, ...] | None] | None = None,
    cpu_end_marks: dict[int, tuple[int, ...] | None] | None = None,
) -> Extracted:
    """Turn one window's Kineto events into the shard tables.

    `step_end_ns`: step -> ``time.time_ns()`` when its iteration finished, for steps the window's close ended (see
    :func:`distprof.events.tables.build_tables`); the simulated clock is applied to them as to the events.
    `cpu_marks`: step -> the training thread's (CPU run, run-queue wait) ns at its start (capture/schedstat.py),
    giving the steps table's ``cpu_run_ns`` / ``cpu_wait_ns``; `cpu_opt_marks` the same as each step's optimizer step
    began, giving ``cpu_wait_opt_ns`` (the wait between the previous step's optimizer start and this step's);
    `cpu_end_marks` the same at each step's end (else the next step's start is its end); the marks' third number
    (page faults) gives ``page_faults``.
    """
    raw = _read_events(events)
    simulated = sim is not None and not sim.is_identity
    ts = sim.apply(raw.cols.ts) if simulated else raw.cols.ts
    cols, mem_order = _columns(raw, ts)
    if step_end_ns and simulated:
        step_end_ns = {k: int(sim.apply(int(t))) for k, t in step_end_ns.items()}
    if p2p_calls is not None and len(p2p_calls) and simulated:
        p2p_calls = replace(p2p_calls, t_ns=np.asarray(sim.apply(p2p_calls.t_ns), np.int64))
    built = build_tables(cols, raw.strings, main_tid=main_tid, thread_names=thread_names,
                         gloo_thread_pg=gloo_thread_pg, process_groups=process_groups, step_end_ns=step_end_ns,
                         p2p_calls=p2p_calls)
    events, comms, steps = built.tables["events"], built.tables["comms"], built.tables["steps"]
    _cpu_columns(steps, cpu_marks, cpu_opt_marks, cpu_end_marks)
    memory = _memory_table(raw, ts, mem_order, cuda_baseline, built.assign_step)
    _peak_memory(steps, memory, built.step_span, cuda_step_peaks)
    s_start, s_end = built.step_span
    n_steps = len(steps["step"])
    ev_ts = events["ts_ns"]
    # the window ends where the trace does (the last ProfilerStep span included), even when its last step ended
    # earlier: what ran after the last step stays visible as such
    trace_end = int((ev_ts + events["dur_ns"]).max()) if len(ev_ts) else 0
    return Extracted(
        tables={"events": events, "comms": comms, "threads": built.tables["threads"], "memory": memory, "steps": steps},
        strings=raw.strings.list(),
        window_start_ns=int(s_start[0]) if n_steps else int(ev_ts[0]) if len(ev_ts) else 0,
        window_end_ns=max(trace_end, int(s_end[-1])) if n_steps else trace_end,
        steps_covered=steps["step"].tolist(),
        stats={"n_events": int(len(built.order)), "n_memory": int(len(mem_order)), "n_comms": int(len(comms["row"]))},
    )
