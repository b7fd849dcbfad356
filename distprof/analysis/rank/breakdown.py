"""Per rank × step time breakdown: step time, compute, communication, exposed communication, memcpy, idle, other.

Definitions (per rank; S = the step's span ``[start_ns, end_ns)`` on the aligned clock; every set is a union, so
nested or concurrent events count once):

* **C, compute**: category-1 events on the rank's *compute resource*: device events (``device >= 0``) on a rank that
  has any, else CPU events not on a communication-worker thread.
* **K, communication**: communication events with ``comms.role == 1`` (exec: ``gloo:*`` on worker threads, NCCL
  kernels); ``c10d::*`` (role 2) only enqueues and is not communication time.
* **M, memcpy**: category-3 events (``gpu_memcpy``, ``gpu_memset``).
* **I, idle**: CPU rank: the main thread (``threads.role == 1``) inside no ``cpu_op``/``user_annotation`` other than
  the ``ProfilerStep#N`` annotation itself (``python_function`` events do not count). Device rank: no kernel, memcpy
  or memset on any stream (HTA's GPU idle).
* **E, exposed-communication candidates** (the main thread waiting for communication): CPU rank: K while the main
  thread is not working, i.e. not inside a non-communication ``cpu_op`` — or inside one, but also inside a
  communication op nested in it (``c10d::*``, ``gloo:send``, ``record_param_comms``, functional collectives). The
  main thread's wait for gloo work has no event of its own, so waiting shows as main-thread gaps, annotation-only
  time (``FSDP::all_gather``), or time inside a communication op (FSDP's reduce-scatter wait inside
  ``RegisterPostBackwardFunctionBackward``) during gloo work. Device rank: K.

Columns (ms): ``step_ms = |S|``; ``compute_ms = |S∩C|``; ``memcpy_ms = |S∩M \\ C|``;
``exposed_comm_ms = |S∩E \\ (C∪M)|``; ``idle_ms = |S∩I \\ (C∪M∪E)|``; ``other_ms`` = the rest (busy in neither
compute, memcpy nor exposed communication), so ``compute + memcpy + exposed_comm + idle + other = step``.
Also ``comm_ms = |S∩K|`` (total, overlapped or not) and ``overlapped_ms = |S∩K∩C|`` (communication hidden under
compute on another thread or stream). From the capture's scheduler statistics (NaN when unknown: imports, older
shards, no ``/proc/thread-self/schedstat``): ``cpu_run_ms``, the stepping thread's time on a CPU in the step, and
``cpu_wait_ms``, its time runnable but waiting for one (other threads or processes held the host's cores);
``page_faults``, its page faults in the step (minor + major: the kernel mapping memory it touched for the first time,
e.g. an allocator handing out pages it had returned).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from ...storage.schema import CAT_COMM, CAT_COMPUTE, CAT_MEMCPY, KIND_CODE
from ..load.rankdata import RankData
from . import intervals as iv
from .index import RankIndex, step_name_mask

logger = logging.getLogger(__name__)

__all__ = ["RankSets", "rank_sets", "rank_breakdown", "BREAKDOWN_COLUMNS", "step_name_mask",
           "empty_breakdown", "step_span"]

Table = dict[str, np.ndarray]
NS_PER_MS = 1e6
_K_CPU_OP = KIND_CODE["cpu_op"]
_K_ANNOT = KIND_CODE["user_annotation"]
_DEVICE_KINDS = (KIND_CODE["kernel"], KIND_CODE["gpu_memcpy"], KIND_CODE["gpu_memset"])

BREAKDOWN_COLUMNS = (
    "rank",
    "window",
    "step",
    "start_ns",
    "end_ns",
    "step_ms",
    "compute_ms",
    "comm_ms",
    "overlapped_ms",
    "exposed_comm_ms",
    "memcpy_ms",
    "idle_ms",
    "other_ms",
    "flops",
    "peak_mem_bytes",
    "cpu_run_ms",
    "cpu_wait_ms",
    "cpu_wait_opt_ms",
    "page_faults",
)


@dataclass
class RankSets:
    """The normalised interval sets of one rank (see the module docstring)."""

    rank: int
    device_rank: bool
    compute: iv.Intervals
    comm: iv.Intervals
    memcpy: iv.Intervals
    idle: iv.Intervals
    exposed: iv.Intervals  # E, before removing compute and memcpy
    main_tid: int | None
    wait: iv.Intervals = iv.empty()  # the main thread blocked on communication: E and its time inside comm ops


def rank_sets(rd: RankData, ix: RankIndex, lo: int, hi: int) -> RankSets:
    """The interval sets of one rank over ``[lo, hi)``."""
    e = rd.events
    ts = np.asarray(e["ts_ns"], np.int64)
    end = ts + np.asarray(e["dur_ns"], np.int64)
    cat, kind, tid, dev = (np.asarray(e[k]) for k in ("category", "kind", "tid", "device"))
    on_device = dev >= 0
    device_rank = ix.device_rank
    main_tid = ix.main_tid
    exec_ = ix.is_exec

    if device_rank:
        cmask = (cat == CAT_COMPUTE) & on_device
    else:
        worker = np.isin(tid, ix.comm_tids) | (exec_ & (tid != (main_tid if main_tid is not None else -1)))
        worker_tids = np.unique(tid[worker])
        cmask = (cat == CAT_COMPUTE) & ~on_device & ~np.isin(tid, worker_tids)
    compute = iv.union(ts[cmask], end[cmask])
    comm = iv.union(ts[exec_], end[exec_])
    mm = cat == CAT_MEMCPY
    memcpy = iv.union(ts[mm], end[mm])
    span = iv.union([lo], [hi])

    if device_rank:
        busy_m = on_device & np.isin(kind, _DEVICE_KINDS)
        idle = iv.subtract(span, iv.union(ts[busy_m], end[busy_m]))
        exposed = comm
    elif main_tid is not None:
        main = (tid == main_tid) & ~on_device & ~ix.is_step
        in_any = main & ((kind == _K_CPU_OP) | (kind == _K_ANNOT))
        idle = iv.subtract(span, iv.union(ts[in_any], end[in_any]))
        in_op = main & (kind == _K_CPU_OP) & (cat != CAT_COMM)
        in_comm = main & (cat == CAT_COMM) & ((kind == _K_CPU_OP) | (kind == _K_ANNOT))
        # the main thread works inside a non-communication op, except while inside a communication op nested in it
        # (FSDP's backward hook waits in c10d::_reduce_scatter_base_ under RegisterPostBackwardFunctionBackward)
        comm_ops = iv.union(ts[in_comm], end[in_comm])
        working = iv.subtract(iv.union(ts[in_op], end[in_op]), comm_ops)
        exposed = iv.subtract(comm, working)
        wait = iv.union_all(exposed, comm_ops)
    else:
        logger.warning("rank %d: no main thread found; idle and exposed communication are not computed", rd.rank)
        idle = iv.empty()
        exposed = iv.empty()
    if device_rank or main_tid is None:
        wait = iv.empty()
    return RankSets(rd.rank, device_rank, compute, comm, memcpy, idle, exposed, main_tid, wait)


def empty_breakdown() -> Table:
    out: Table = {}
    for c in BREAKDOWN_COLUMNS:
        if c in ("rank", "window", "step"):
            out[c] = np.zeros(0, np.int32)
        elif c.endswith("_ns") or c in ("flops", "peak_mem_bytes"):
            out[c] = np.zeros(0, np.int64)
        else:
            out[c] = np.zeros(0, np.float64)
    return out


def step_span(rd: RankData) -> tuple[int, int]:
    """Start of the rank's first recorded step and end of its last (0, 0 without steps)."""
    st = rd.steps
    if st["step"].size == 0:
        return 0, 0
    ws = np.asarray(st["start_ns"], np.int64)
    return int(ws.min()), int(np.maximum(np.asarray(st["end_ns"], np.int64), ws).max())


def rank_breakdown(rd: RankData, ix: RankIndex, rs: RankSets | None = None) -> Table:
    """The step table of one rank (columns ``BREAKDOWN_COLUMNS``), sorted by start; times on the rank's clock.
    `rs`: its interval sets over ``step_span`` (computed when not given)."""
    st = rd.steps
    if st["step"].size == 0:
        return empty_breakdown()
    idx = np.argsort(np.asarray(st["start_ns"]), kind="stable")
    ws = np.asarray(st["start_ns"][idx], np.int64)
    we = np.maximum(np.asarray(st["end_ns"][idx], np.int64), ws)
    if rs is None:
        rs = rank_sets(rd, ix, int(ws.min()), int(we.max()))
    cm = iv.union_all(rs.compute, rs.memcpy)
    ex = iv.subtract(rs.exposed, cm)
    idle = iv.subtract(rs.idle, iv.union_all(cm, ex))

    def ms(x: iv.Intervals) -> np.ndarray:
        return iv.measure_in_windows(x, ws, we) / NS_PER_MS

    step_ms = (we - ws) / NS_PER_MS
    compute_ms = ms(rs.compute)
    memcpy_ms = ms(iv.subtract(rs.memcpy, rs.compute))
    exposed_ms = ms(ex)
    idle_ms = ms(idle)
    other_ms = np.maximum(step_ms - compute_ms - memcpy_ms - exposed_ms - idle_ms, 0.0)
    return {
        "rank": np.full(idx.size, rd.rank, np.int32),
        "window": np.asarray(st["window"][idx], np.int32) if "window" in st else np.zeros(idx.size, np.int32),
        "step": np.asarray(st["step"][idx], np.int32),
        "start_ns": ws,
        "end_ns": we,
        "step_ms": step_ms,
        "compute_ms": compute_ms,
        "comm_ms": ms(rs.comm),
        "overlapped_ms": ms(iv.intersect(rs.comm, rs.compute)),
        "exposed_comm_ms": exposed_ms,
        "memcpy_ms": memcpy_ms,
        "idle_ms": idle_ms,
        "other_ms": other_ms,
        "flops": np.asarray(st["flops"][idx], np.int64),
        "peak_mem_bytes": np.asarray(st["peak_mem_bytes"][idx], np.int64),
        "cpu_run_ms": _known_ms(st, "cpu_run_ns", idx),
        "cpu_wait_ms": _known_ms(st, "cpu_wait_ns", idx),
        "cpu_wait_opt_ms": _known_ms(st, "cpu_wait_opt_ns", idx),
        "page_faults": _known(st, "page_faults", idx),
    }


def _known(st: Table, col: str, idx: np.ndarray) -> np.ndarray:
    """A steps column, -1 unknown (older shards, imports, no scheduler statistics), as float with NaN unknown."""
    if col not in st:
        return np.full(idx.size, np.nan)
    v = np.asarray(st[col], np.int64)[idx]
    return np.where(v >= 0, v.astype(np.float64), np.nan)


def _known_ms(st: Table, col: str, idx: np.ndarray) -> np.ndarray:
    """A steps column in ns, -1 unknown (older shards, imports, no scheduler statistics), as ms with NaN unknown."""
    return _known(st, col, idx) / NS_PER_MS
