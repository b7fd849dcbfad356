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
* **E, exposed-communication candidates**: CPU rank: K while the main thread is inside no non-communication
  ``cpu_op`` — the main thread's wait for gloo work has no event of its own, so waiting shows as main-thread gaps
  (or annotation-only time, or time inside ``c10d::*``/``gloo:send``) during gloo work. Device rank: K.

Columns (ms): ``step_ms = |S|``; ``compute_ms = |S∩C|``; ``memcpy_ms = |S∩M \\ C|``;
``exposed_comm_ms = |S∩E \\ (C∪M)|``; ``idle_ms = |S∩I \\ (C∪M∪E)|``; ``other_ms`` = the rest (busy in neither
compute, memcpy nor exposed communication), so ``compute + memcpy + exposed_comm + idle + other = step``.
Also ``comm_ms = |S∩K|`` (total, overlapped or not) and ``overlapped_ms = |S∩K∩C|`` (communication hidden under
compute on another thread or stream).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from ..storage.schema import CAT_COMM, CAT_COMPUTE, CAT_MEMCPY, KIND_CODE, ROLE_EXEC, THREAD_COMM, THREAD_MAIN
from . import intervals as iv
from .model import MergedRun, Table

logger = logging.getLogger(__name__)

__all__ = ["RankSets", "rank_sets", "step_breakdown", "BREAKDOWN_COLUMNS", "step_name_mask", "rank_slices"]

NS_PER_MS = 1e6
STEP_PREFIX = "ProfilerStep#"
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


def step_name_mask(names: np.ndarray, prefix: str = STEP_PREFIX) -> np.ndarray:
    """Boolean mask over the string table: names starting with `prefix` (one Python call per name, not per event)."""
    return np.fromiter((str(n).startswith(prefix) for n in names), dtype=bool, count=len(names))


def rank_slices(rank_col: np.ndarray) -> tuple[np.ndarray, dict[int, slice]]:
    """An order that groups rows by rank (identity when already sorted) and each rank's slice of it."""
    rank_col = np.asarray(rank_col)
    if rank_col.size and np.any(rank_col[1:] < rank_col[:-1]):
        order = np.argsort(rank_col, kind="stable")
    else:
        order = np.arange(rank_col.size)
    r = rank_col[order]
    uniq, first = np.unique(r, return_index=True)
    ends = np.r_[first[1:], r.size]
    return order, {int(u): slice(int(a), int(b)) for u, a, b in zip(uniq, first, ends)}


class _Context:
    """Run-wide masks computed once (vectorised) and shared by every rank."""

    def __init__(self, run: MergedRun):
        ev = run.events
        n = ev["ts_ns"].shape[0]
        self.run = run
        self.n = n
        self.is_exec = np.zeros(n, dtype=bool)
        rows = np.asarray(run.comms["row"], dtype=np.int64)
        exec_rows = rows[np.asarray(run.comms["role"]) == ROLE_EXEC]
        bad = (exec_rows < 0) | (exec_rows >= n)
        if np.any(bad):
            logger.warning("%d communication rows point outside the events table; ignored", int(bad.sum()))
            exec_rows = exec_rows[~bad]
        self.is_exec[exec_rows] = True
        self.is_step_name = step_name_mask(run.names)[np.asarray(ev["name_id"], dtype=np.int64)]
        self.order, self.slices = rank_slices(ev["rank"])
        th = run.threads
        self.thread_rank = np.asarray(th.get("rank", np.zeros(0, np.int32)))
        self.thread_tid = np.asarray(th.get("tid", np.zeros(0, np.int64)))
        self.thread_role = np.asarray(th.get("role", np.zeros(0, np.uint8)))

    def rank_events(self, rank: int) -> dict[str, np.ndarray]:
        sl = self.slices.get(rank)
        idx = self.order[sl] if sl is not None else np.zeros(0, np.int64)
        ev = self.run.events
        out = {k: np.asarray(ev[k])[idx] for k in ("ts_ns", "dur_ns", "category", "kind", "tid", "device")}
        out["is_exec"] = self.is_exec[idx]
        out["is_step"] = self.is_step_name[idx]
        out["row"] = idx
        return out

    def main_tid(self, rank: int, e: dict[str, np.ndarray]) -> int | None:
        hit = self.thread_tid[(self.thread_rank == rank) & (self.thread_role == THREAD_MAIN)]
        if hit.size:
            return int(hit[0])
        steps = e["tid"][e["is_step"] & (e["device"] < 0)]
        if steps.size:  # fall back: the thread that records ProfilerStep#N
            vals, counts = np.unique(steps, return_counts=True)
            return int(vals[np.argmax(counts)])
        return None

    def comm_tids(self, rank: int) -> np.ndarray:
        return self.thread_tid[(self.thread_rank == rank) & (self.thread_role == THREAD_COMM)]


def _sets_for_rank(ctx: _Context, rank: int, lo: int, hi: int) -> RankSets:
    e = ctx.rank_events(rank)
    ts = e["ts_ns"].astype(np.int64)
    end = ts + e["dur_ns"].astype(np.int64)
    cat, kind, tid, dev = e["category"], e["kind"], e["tid"], e["device"]
    on_device = dev >= 0
    device_rank = bool(np.any(on_device))
    main_tid = ctx.main_tid(rank, e)
    exec_ = e["is_exec"]

    if device_rank:
        cmask = (cat == CAT_COMPUTE) & on_device
    else:
        worker = np.isin(tid, ctx.comm_tids(rank)) | (exec_ & (tid != (main_tid if main_tid is not None else -1)))
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
        main = (tid == main_tid) & ~on_device & ~e["is_step"]
        in_any = main & ((kind == _K_CPU_OP) | (kind == _K_ANNOT))
        idle = iv.subtract(span, iv.union(ts[in_any], end[in_any]))
        in_op = main & (kind == _K_CPU_OP) & (cat != CAT_COMM)
        exposed = iv.subtract(comm, iv.union(ts[in_op], end[in_op]))
    else:
        logger.warning("rank %d: no main thread found; idle and exposed communication are not computed", rank)
        idle = iv.empty()
        exposed = iv.empty()
    return RankSets(rank, device_rank, compute, comm, memcpy, idle, exposed, main_tid)


def rank_sets(run: MergedRun, rank: int) -> RankSets:
    """Interval sets of one rank over the span of its recorded steps."""
    st = run.steps
    m = np.asarray(st["rank"]) == rank
    if not np.any(m):
        return _sets_for_rank(_Context(run), rank, 0, 0)
    return _sets_for_rank(_Context(run), rank, int(np.min(st["start_ns"][m])), int(np.max(st["end_ns"][m])))


def _empty_table() -> Table:
    out: Table = {}
    for c in BREAKDOWN_COLUMNS:
        if c in ("rank", "window", "step"):
            out[c] = np.zeros(0, np.int32)
        elif c.endswith("_ns") or c in ("flops", "peak_mem_bytes"):
            out[c] = np.zeros(0, np.int64)
        else:
            out[c] = np.zeros(0, np.float64)
    return out


def step_breakdown(run: MergedRun) -> Table:
    """The rank × step table (columns ``BREAKDOWN_COLUMNS``), sorted by (rank, start)."""
    st = run.steps
    if st["step"].size == 0:
        return _empty_table()
    ctx = _Context(run)
    s_order, s_slices = rank_slices(st["rank"])
    parts: list[Table] = []
    device_ranks = []
    for rank in sorted(s_slices):
        idx = s_order[s_slices[rank]]
        idx = idx[np.argsort(st["start_ns"][idx], kind="stable")]
        ws = np.asarray(st["start_ns"][idx], np.int64)
        we = np.maximum(np.asarray(st["end_ns"][idx], np.int64), ws)
        rs = _sets_for_rank(ctx, rank, int(ws.min()), int(we.max()))
        if rs.device_rank:
            device_ranks.append(rank)
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
        parts.append(
            {
                "rank": np.full(idx.size, rank, np.int32),
                "window": np.asarray(st["window"][idx], np.int32)
                if "window" in st
                else np.zeros(idx.size, np.int32),
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
            }
        )
    if device_ranks:
        logger.debug("device ranks (compute = device kernels): %s", device_ranks)
    return {c: np.concatenate([p[c] for p in parts]) for c in BREAKDOWN_COLUMNS}
