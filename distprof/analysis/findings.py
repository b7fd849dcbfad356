"""Findings: the common causes of slow distributed training, detected per rank, each with its numbers and usual fix.

    fs = findings(run, breakdown=bd, stragglers=find_stragglers(run), root_cause=rc)
    text = verdict(summary, stragglers, rc, fs)

Every rule measures a share of step time "at stake" (``metrics["impact_pct"]``); severity follows from it:
**high** ≥ 25 %, **medium** ≥ 10 %, else **low** (``FindingRules.high_pct`` / ``medium_pct``). Findings are sorted by
severity, then impact. A rule that fires on at least half of the ranks (and more than one) gives one finding with
``rank = None`` (metrics are means over those ranks, plus ``n_ranks`` and ``worst_rank``); otherwise one finding per
rank, the worst ``max_per_rule`` ranks. Rules and thresholds (defaults of :class:`FindingRules`):

* ``tiny_ops`` — many tiny ops. CPU rank: top-level ``cpu_op`` events of the main thread (not nested in another op,
  not communication) in the rank's steps; device rank: compute kernels. Tiny = shorter than ``tiny_op_us`` (100 µs).
  Fires when tiny ops hold ≥ ``tiny_min_share_pct`` (50 %) of op time, number ≥ ``tiny_min_per_step`` (100) per step,
  and the impact reaches ``tiny_min_step_pct`` (10 %) of step time. Impact: the tiny ops' (kernels') own time; the
  device's idle time between small kernels is ``device_idle``'s, so no time is counted by both.
* ``device_idle`` — GPU ranks: step time in which no kernel, memcpy or memset runs on any stream of the rank (the
  breakdown's device idle). Fires when it reaches ``idle_min_step_pct`` (10 %) of step time and ``idle_min_ms``
  (0.5 ms) per step; impact = that share. Evidence: where it sits (before the step's first GPU work, between, after
  the last) and what the host did meanwhile, each idle ns counted once, in this order: the main thread waited for
  input (``input_wait``'s time), the idle stretch began inside a synchronising call (the sync drained the queue), a
  CPU thread of the rank (not a communication worker) was inside a ``cpu_op`` (dispatch/launch-bound; the leaf ops
  with most such time are named), else the host ran code outside any recorded op. Advice follows the largest part.
* ``host_sync`` — GPU ranks: synchronising calls (runtime/driver calls matching ``SYNC_CALL_RE`` on the rank's CPU
  threads, and Kineto ``cuda_sync`` records; overlapping ones count once). Fires when there are ≥
  ``sync_min_per_step`` (1) per step and the host's blocked time or the device idle that starts inside them reaches
  ``sync_min_step_pct`` (5 %) of step time. Impact = that device idle (the sync's cost: the host blocked while the
  device was busy costs nothing by itself); it is the part of ``device_idle`` the evidence calls "followed a
  synchronising call". Call sites: the outermost ``cpu_op`` enclosing each call (e.g. ``aten::item``).
* ``input_wait`` — the main thread waits for input. Input time = main-thread time in DataLoader ``__next__``
  (``enumerate(DataLoader)#…`` annotations) ∪ main-thread gaps at the step boundaries (from the step start to the
  first op, and from the last op to the step end; ops = ``cpu_op``/``user_annotation`` other than
  ``ProfilerStep#N``), minus time the rank's communication runs (that is waiting for peers, not input). Fires when
  it reaches ``input_min_step_pct`` (10 %) of step time and ``input_min_ms`` (0.5 ms) per step.
* ``memory_churn`` — from ``run.memory`` (allocator events) per rank and step. *Churn* fires when allocations run at
  ≥ ``churn_min_allocs_per_ms`` (20) per ms of step time and ≥ ``churn_min_allocs_per_step`` (500) per step, or when
  the bytes allocated per step are ≥ ``churn_min_turnover`` (8) × the step's swing of allocated memory (max − min)
  and ≥ ``churn_min_alloc_mib`` (64 MiB). *Swing between steps* fires when the per-step peak of allocated memory
  varies by ≥ ``swing_min_pct`` (50 %) of its mean across steps and ≥ ``swing_min_mib`` (64 MiB). No time is
  measured for it: severity is medium when a measure is ≥ 2× its threshold, else low.
* ``exposed_comm`` — exposed communication (``steps.exposed_comm_ms``) net of the wait for named stragglers (on
  every other rank ≈ the largest named straggler's mean lateness per step; that wait is the straggler's finding).
  Fires when the net share reaches ``exposed_min_pct`` (10 %) of step time.
* ``straggler_rank`` — every rank the stragglers analysis names (its naming rule and threshold are in
  ``straggler_info.rule``) and that no ``straggler_host`` finding covers. Impact: its mean lateness / median step
  time. Advice follows its root cause (``[idle]`` or a slower op).
* ``straggler_host`` — a host whose ranks are late together: at least two ranks, of which ≥ ``host_min_fraction``
  (75 %) are named stragglers, on a run that spans at least two hosts. (The stragglers host table alone is not
  enough: a host's arrival is its latest rank's, so one late rank makes its host late.) Its lateness and share of
  late collectives come from the stragglers host table; the ranks it covers get no ``straggler_rank`` finding.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..storage.schema import CAT_COMM, CAT_COMPUTE, KIND_CODE, ROLE_EXEC, THREAD_COMM, THREAD_MAIN
from . import intervals as iv
from .breakdown import rank_slices, step_name_mask
from .gpu_time import GPU_KINDS
from .model import MergedRun, Table
from .names import display_name
from .rootcause import IDLE_NAME

logger = logging.getLogger(__name__)

__all__ = ["FindingRules", "findings", "rank_measures", "DATALOADER_PREFIX", "SYNC_CALL_RE", "is_sync_call",
           "IDLE_CAUSES", "dominant_idle_cause"]

NS_PER_MS = 1e6
MIB = 2**20
DATALOADER_PREFIX = "enumerate(DataLoader)#"
_K_CPU_OP = KIND_CODE["cpu_op"]
_K_ANNOT = KIND_CODE["user_annotation"]
_K_KERNEL = KIND_CODE["kernel"]
_K_CUDA_SYNC = KIND_CODE["cuda_sync"]
_RUNTIME_KINDS = tuple(KIND_CODE[k] for k in ("cuda_runtime", "cuda_driver", "privateuse1_runtime",
                                                "privateuse1_driver"))
#: Runtime/driver calls that block the host until device work completes: the explicit synchronisations and the
#: synchronous copies (``cudaMemcpy``, HIP's ``hipMemcpyWithStream`` - what a ``non_blocking=False`` copy calls on
#: ROCm; on CUDA such a copy is ``cudaMemcpyAsync`` + ``cudaStreamSynchronize``). Suffixes ``_v2``/``_ptsz``/``_ptds``.
SYNC_CALL_RE = re.compile(
    r"^(?:(?:cuda|hip|cu)(?:Device|Stream|Event|Ctx)Synchronize"
    r"|(?:cuda|hip)Memcpy(?:2D|3D|Peer|ToSymbol|FromSymbol|WithStream)?"
    r"|cuMemcpy(?:DtoH|HtoD|DtoD|Peer)?)(?:_v\d+)?(?:_ptsz|_ptds|_spt)?$")


def is_sync_call(name: str) -> bool:
    """Whether a runtime/driver call name blocks the host (see ``SYNC_CALL_RE``)."""
    return SYNC_CALL_RE.match(name) is not None
_SEVERITY_ORDER = {"high": 0, "medium": 1, "low": 2}


@dataclass(frozen=True)
class FindingRules:
    """Thresholds of the rules (see the module docstring)."""

    high_pct: float = 25.0
    medium_pct: float = 10.0
    tiny_op_us: float = 100.0
    tiny_min_share_pct: float = 50.0
    tiny_min_per_step: float = 100.0
    tiny_min_step_pct: float = 10.0
    input_min_step_pct: float = 10.0
    input_min_ms: float = 0.5
    churn_min_allocs_per_ms: float = 20.0
    churn_min_allocs_per_step: float = 500.0
    churn_min_turnover: float = 8.0
    churn_min_alloc_mib: float = 64.0
    swing_min_pct: float = 50.0
    swing_min_mib: float = 64.0
    exposed_min_pct: float = 10.0
    idle_min_step_pct: float = 10.0
    idle_min_ms: float = 0.5
    sync_min_per_step: float = 1.0
    sync_min_step_pct: float = 5.0
    host_min_fraction: float = 0.75
    max_per_rule: int = 8

    def severity(self, impact_pct: float) -> str:
        return "high" if impact_pct >= self.high_pct else "medium" if impact_pct >= self.medium_pct else "low"


# ---------------------------------------------------------------------------------------------------------------
# per-rank measures


def _main_tid(run: MergedRun, rank: int, tid: np.ndarray, is_step: np.ndarray, device: np.ndarray) -> int | None:
    th = run.threads
    if th.get("tid") is not None and np.asarray(th["tid"]).size:
        hit = np.asarray(th["tid"])[(np.asarray(th["rank"]) == rank) & (np.asarray(th["role"]) == THREAD_MAIN)]
        if hit.size:
            return int(hit[0])
    steps = tid[is_step & (device < 0)]
    if steps.size:
        vals, counts = np.unique(steps, return_counts=True)
        return int(vals[np.argmax(counts)])
    return None


def _top_level(ts: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Mask of events (sorted by start) not nested in an earlier one: start ≥ the running maximum of earlier ends."""
    if ts.size == 0:
        return np.zeros(0, bool)
    prev_end = np.maximum.accumulate(np.r_[np.iinfo(np.int64).min, end[:-1]])
    return ts >= prev_end


def _edge_gaps(busy: iv.Intervals, ws: np.ndarray, we: np.ndarray) -> tuple[iv.Intervals, iv.Intervals]:
    """Per window [ws, we): (head, tail) - from ws to the first busy interval, and from the last one to we.

    A window with nothing busy is all head (its tail is empty)."""
    bs, be = busy.s, busy.e
    if bs.size == 0:
        return iv.union(ws, we), iv.empty()
    j = np.searchsorted(be, ws, side="right")  # first busy interval ending after ws
    first_s = np.where(j < bs.size, bs[np.minimum(j, bs.size - 1)], we)
    head_end = np.clip(first_s, ws, we)
    k = np.searchsorted(bs, we, side="left") - 1  # last busy interval starting before we
    last_e = np.where(k >= 0, be[np.maximum(k, 0)], ws)
    tail_start = np.clip(last_e, ws, we)
    head = iv.union(ws, head_end)
    return head, iv.subtract(iv.union(tail_start, we), head)


def _boundary_gaps(busy: iv.Intervals, ws: np.ndarray, we: np.ndarray) -> iv.Intervals:
    """Per window [ws, we): the gaps from ws to the first busy interval and from the last one to we (normalised)."""
    return iv.union_all(*_edge_gaps(busy, ws, we))


def _starts_inside(starts: np.ndarray, sets: iv.Intervals) -> np.ndarray:
    """Mask: each start lies in a closed interval [s, e] of the normalised set."""
    if len(sets) == 0:
        return np.zeros(starts.size, bool)
    j = np.searchsorted(sets.s, starts, side="right") - 1
    return (j >= 0) & (sets.e[np.maximum(j, 0)] >= starts)


def _in_windows(t: np.ndarray, ws: np.ndarray, we: np.ndarray) -> np.ndarray:
    """Mask: each time lies in one of the sorted, disjoint windows [ws, we)."""
    k = np.searchsorted(ws, t, side="right") - 1
    return (k >= 0) & (t < we[np.maximum(k, 0)])


def _leaf_ops(ts: np.ndarray, end: np.ndarray, tid: np.ndarray) -> np.ndarray:
    """Mask of ops that enclose no other op of their thread (the op the thread is actually running)."""
    if ts.size == 0:
        return np.zeros(0, bool)
    o = np.lexsort((-end, ts, tid))  # by thread, start, longest first (a parent before a child starting with it)
    nxt_same = np.r_[tid[o][1:] == tid[o][:-1], False]
    nxt_ts = np.r_[ts[o][1:], 0]
    out = np.zeros(ts.size, bool)
    out[o] = ~(nxt_same & (nxt_ts < end[o]))
    return out


def _outermost_op(op_ts, op_end, op_tid, op_nid, q_ts, q_end, q_tid) -> np.ndarray:
    """For each query interval, the name id of the top-level op of its thread that encloses it, else -1."""
    out = np.full(q_ts.size, -1, np.int64)
    for t in np.unique(q_tid).tolist():
        o = np.flatnonzero(op_tid == t)
        if o.size == 0:
            continue
        o = o[np.lexsort((-op_end[o], op_ts[o]))]
        o = o[_top_level(op_ts[o], op_end[o])]
        q = np.flatnonzero(q_tid == t)
        j = np.searchsorted(op_ts[o], q_ts[q], side="right") - 1
        hit = (j >= 0) & (op_end[o][np.maximum(j, 0)] >= q_end[q])
        out[q[hit]] = op_nid[o][j[hit]]
    return out


def _top_ids(nid: np.ndarray, weight: np.ndarray, k: int = 3) -> list[tuple[int, float]]:
    """The k ids with the largest total weight (> 0), as (id, total)."""
    if nid.size == 0:
        return []
    u, inv = np.unique(nid, return_inverse=True)
    tot = np.bincount(inv, weights=weight.astype(np.float64))
    top = np.argsort(-tot, kind="stable")[:k]
    return [(int(u[i]), float(tot[i])) for i in top if tot[i] > 0]


def _op_label(run: MergedRun, name_id: int) -> str:
    return display_name(str(run.names[name_id])) if name_id >= 0 else "(outside any op)"


def _device_measures(run: MergedRun, rank: int, e: dict[str, np.ndarray], ws: np.ndarray, we: np.ndarray,
                     input_set: iv.Intervals, is_sync_name: np.ndarray) -> dict[str, Any]:
    """Device idle (where it sits, what the host did meanwhile) and host synchronisation, per step of the rank."""
    ts, end, kind, tid, dev, nid = e["ts"], e["end"], e["kind"], e["tid"], e["dev"], e["nid"]
    n = ws.size

    def per_step(x: iv.Intervals) -> float:
        return float(iv.measure_in_windows(x, ws, we).sum()) / NS_PER_MS / n

    win = iv.union(ws, we)
    g = (dev >= 0) & np.isin(kind, GPU_KINDS)
    busy = iv.union(ts[g], end[g])
    idle = iv.subtract(win, busy)
    head, tail = _edge_gaps(busy, ws, we)
    head = iv.intersect(head, idle)
    tail = iv.intersect(tail, idle)
    # host synchronisation: blocking runtime calls on the rank's CPU threads, and Kineto's cuda_sync records
    scall = (dev < 0) & np.isin(kind, _RUNTIME_KINDS) & is_sync_name[nid]
    sk = scall | (kind == _K_CUDA_SYNC)
    sync = iv.union(ts[sk], end[sk])
    # an idle stretch that starts while the host waits in a sync: the sync drained the device's queue
    drained_m = _starts_inside(idle.s, sync)
    drained = iv.Intervals(idle.s[drained_m], idle.e[drained_m])
    th = run.threads
    th_rank = np.asarray(th.get("rank", np.zeros(0, np.int32)))
    comm_tids = np.asarray(th.get("tid", np.zeros(0, np.int64)))[
        (th_rank == rank) & (np.asarray(th.get("role", np.zeros(0, np.uint8))) == THREAD_COMM)]
    hop = (dev < 0) & (kind == _K_CPU_OP) & ~np.isin(tid, comm_tids)
    host_ops = iv.union(ts[hop], end[hop])
    # each idle ns goes to the first of: input wait, drained by a sync, host inside an op, host outside any op
    p_input = iv.intersect(idle, input_set)
    rest = iv.subtract(idle, input_set)
    p_sync = iv.intersect(rest, drained)
    rest = iv.subtract(rest, drained)
    p_ops = iv.intersect(rest, host_ops)
    p_other = iv.subtract(rest, host_ops)
    hi = np.flatnonzero(hop)
    li = hi[_leaf_ops(ts[hi], end[hi], tid[hi])]
    ov = iv.measure_in_windows(p_ops, ts[li], end[li])
    top_ops = [(_op_label(run, k), t / NS_PER_MS / n) for k, t in _top_ids(nid[li], ov)]

    sync_in = _in_windows(sync.s, ws, we)
    si = np.flatnonzero(scall)
    si = si[_in_windows(ts[si], ws, we)]
    ci = np.flatnonzero((dev < 0) & (kind == _K_CPU_OP))
    site = _outermost_op(ts[ci], end[ci], tid[ci], nid[ci], ts[si], end[si], tid[si])
    sites = [(_op_label(run, k), t / NS_PER_MS / n, float(np.count_nonzero(site == k)) / n)
             for k, t in _top_ids(site, end[si] - ts[si])]
    return {
        "device_idle_ms_per_step": per_step(idle),
        "idle_head_ms_per_step": per_step(head),
        "idle_tail_ms_per_step": per_step(tail),
        "idle_between_ms_per_step": per_step(iv.subtract(idle, iv.union_all(head, tail))),
        "idle_input_ms_per_step": per_step(p_input),
        "idle_after_sync_ms_per_step": per_step(p_sync),
        "idle_host_ops_ms_per_step": per_step(p_ops),
        "idle_host_other_ms_per_step": per_step(p_other),
        "idle_top_host_ops": top_ops,
        "sync_ms_per_step": per_step(sync),
        "syncs_per_step": float(np.count_nonzero(sync_in)) / n,
        "sync_calls_per_step": float(si.size) / n,
        "sync_sites": sites,
    }


def rank_measures(run: MergedRun, breakdown: Table, rules: FindingRules | None = None) -> list[dict[str, Any]]:
    """The per-rank numbers every rule reads (one dict per rank with steps; means are per step of that rank)."""
    rules = rules or FindingRules()
    bd = breakdown
    ev = run.events
    if bd["step"].size == 0:
        return []
    order, slices = rank_slices(ev["rank"])
    is_step_name = step_name_mask(run.names)
    is_dl_name = np.fromiter((str(n).startswith(DATALOADER_PREFIX) for n in run.names), bool, count=len(run.names))
    is_sync_name = np.fromiter((is_sync_call(str(n)) for n in run.names), bool, count=len(run.names))
    exec_rows = np.asarray(run.comms["row"], np.int64)[np.asarray(run.comms["role"]) == ROLE_EXEC]
    is_exec = np.zeros(ev["ts_ns"].size, bool)
    is_exec[exec_rows[(exec_rows >= 0) & (exec_rows < is_exec.size)]] = True
    tiny_ns = rules.tiny_op_us * 1e3
    mem = run.memory
    m_order, m_slices = rank_slices(np.asarray(mem.get("rank", np.zeros(0, np.int32))))
    out = []
    for rank in np.unique(bd["rank"]).tolist():
        bm = bd["rank"] == rank
        n = int(bm.sum())
        ws = np.asarray(bd["start_ns"][bm], np.int64)
        we = np.asarray(bd["end_ns"][bm], np.int64)
        step_ms = float(bd["step_ms"][bm].sum()) / n
        steps_of = np.asarray(bd["step"][bm], np.int64)
        sl = slices.get(rank)
        idx = order[sl] if sl is not None else np.zeros(0, np.int64)
        ts = np.asarray(ev["ts_ns"], np.int64)[idx]
        dur = np.asarray(ev["dur_ns"], np.int64)[idx]
        end = ts + dur
        kind = np.asarray(ev["kind"])[idx]
        cat = np.asarray(ev["category"])[idx]
        tid = np.asarray(ev["tid"], np.int64)[idx]
        dev = np.asarray(ev["device"])[idx]
        nid = np.asarray(ev["name_id"], np.int64)[idx]
        step = np.asarray(ev["step"], np.int64)[idx]
        in_steps = np.isin(step, steps_of)
        is_step = is_step_name[nid]
        device_rank = bool(np.any(dev >= 0))
        main = _main_tid(run, rank, tid, is_step, dev)
        on_main = (tid == main) & (dev < 0) if main is not None else np.zeros(ts.size, bool)
        m: dict[str, Any] = {"rank": int(rank), "host": run.hosts.get(int(rank), "?"), "n_steps": n,
                             "step_ms": step_ms, "device_rank": device_rank}

        # tiny ops
        if device_rank:
            ops = (kind == _K_KERNEL) & (dev >= 0) & (cat == CAT_COMPUTE) & in_steps
        else:
            cand = on_main & (kind == _K_CPU_OP) & (cat != CAT_COMM)
            ci = np.flatnonzero(cand)
            ci = ci[np.argsort(ts[ci], kind="stable")]
            top = np.zeros(ts.size, bool)
            top[ci[_top_level(ts[ci], end[ci])]] = True
            ops = top & in_steps
        d = dur[ops].astype(np.float64)
        tiny = d < tiny_ns
        m["op_ms_per_step"] = float(d.sum()) / NS_PER_MS / n
        m["ops_per_step"] = float(d.size) / n
        m["tiny_ops_per_step"] = float(tiny.sum()) / n
        m["tiny_ms_per_step"] = float(d[tiny].sum()) / NS_PER_MS / n
        m["tiny_share_pct"] = 100.0 * float(d[tiny].sum()) / float(d.sum()) if d.sum() > 0 else 0.0
        m["tiny_median_us"] = float(np.median(d[tiny])) / 1e3 if tiny.any() else 0.0
        m["idle_ms_per_step"] = float(bd["idle_ms"][bm].sum()) / n

        # input wait
        dl = on_main & is_dl_name[nid]
        busy_m = on_main & ((kind == _K_CPU_OP) | (kind == _K_ANNOT)) & ~is_step
        busy = iv.union(ts[busy_m], end[busy_m])
        comm = iv.union(ts[is_exec[idx]], end[is_exec[idx]])
        dl_set = iv.union(ts[dl], end[dl])
        gaps = iv.subtract(_boundary_gaps(busy, ws, we), comm) if main is not None else iv.empty()
        dl_ms = float(iv.measure_in_windows(dl_set, ws, we).sum()) / NS_PER_MS / n
        gap_ms = float(iv.measure_in_windows(gaps, ws, we).sum()) / NS_PER_MS / n
        m["dataloader_ms_per_step"] = dl_ms
        m["boundary_gap_ms_per_step"] = gap_ms
        m["input_ms_per_step"] = dl_ms + gap_ms
        m["dataloader_names"] = sorted({str(run.names[k]) for k in np.unique(nid[dl])})

        # device idle and host synchronisation
        if device_rank:
            m.update(_device_measures(run, int(rank), {"ts": ts, "end": end, "kind": kind, "tid": tid, "dev": dev,
                                                       "nid": nid}, ws, we, iv.union_all(dl_set, gaps),
                                      is_sync_name))

        # memory
        msl = m_slices.get(int(rank))
        mm = m_order[msl] if msl is not None else np.zeros(0, np.int64)
        if mm.size:
            mstep = np.asarray(mem["step"], np.int64)[mm]
            mb = np.asarray(mem["bytes"], np.int64)[mm]
            mt = np.asarray(mem["total_bytes"], np.int64)[mm]
            ok = np.isin(mstep, steps_of)
            si = np.searchsorted(np.unique(steps_of), mstep[ok])
            ns_ = np.unique(steps_of).size
            alloc = mb[ok] > 0
            n_alloc = np.bincount(si[alloc], minlength=ns_).astype(float)
            b_alloc = np.bincount(si[alloc], weights=mb[ok][alloc].astype(float), minlength=ns_)
            hi = np.full(ns_, -np.inf)
            lo = np.full(ns_, np.inf)
            np.maximum.at(hi, si, mt[ok].astype(float))
            np.minimum.at(lo, si, mt[ok].astype(float))
            has = np.isfinite(hi)
            swing = np.where(has, hi - lo, 0.0)
            m["allocs_per_step"] = float(n_alloc.sum()) / n
            m["allocs_per_ms"] = float(n_alloc.sum()) / max(step_ms * n, 1e-9)
            m["alloc_mib_per_step"] = float(b_alloc.sum()) / MIB / n
            m["swing_mib_per_step"] = float(swing[has].mean()) / MIB if has.any() else 0.0
            m["turnover"] = float(b_alloc.sum() / swing.sum()) if swing.sum() > 0 else 0.0
            peaks = hi[has]
            m["peak_mib_mean"] = float(peaks.mean()) / MIB if peaks.size else 0.0
            m["peak_swing_mib"] = float(peaks.max() - peaks.min()) / MIB if peaks.size >= 2 else 0.0
            m["memory_events"] = True
        else:
            m["memory_events"] = False

        # exposed communication
        m["exposed_comm_ms_per_step"] = float(bd["exposed_comm_ms"][bm].sum()) / n
        m["comm_ms_per_step"] = float(bd["comm_ms"][bm].sum()) / n
        comm_tot = float(bd["comm_ms"][bm].sum())
        m["overlap_pct"] = 100.0 * float(bd["overlapped_ms"][bm].sum()) / comm_tot if comm_tot > 0 else None
        out.append(m)
    return out


# ---------------------------------------------------------------------------------------------------------------
# rules


@dataclass
class _Hit:
    rank: int
    host: str
    impact_pct: float
    metrics: dict[str, float]
    severity: str | None = None  # set by rules without a time impact
    notes: dict[str, Any] = field(default_factory=dict)  # non-numeric evidence (names), of this rank


def _pct(x: float, of: float) -> float:
    return 100.0 * x / of if of > 0 else 0.0


def _tiny_ops(ms: list[dict], rules: FindingRules) -> list[_Hit]:
    hits = []
    for m in ms:
        impact = _pct(m["tiny_ms_per_step"], m["step_ms"])  # device idle between them is device_idle's
        if (m["tiny_share_pct"] >= rules.tiny_min_share_pct and m["tiny_ops_per_step"] >= rules.tiny_min_per_step
                and impact >= rules.tiny_min_step_pct):
            hits.append(_Hit(m["rank"], m["host"], impact, {
                "tiny_share_pct": m["tiny_share_pct"], "tiny_ops_per_step": m["tiny_ops_per_step"],
                "tiny_ms_per_step": m["tiny_ms_per_step"], "tiny_median_us": m["tiny_median_us"],
                "ops_per_step": m["ops_per_step"], "op_ms_per_step": m["op_ms_per_step"],
                "device_rank": float(m["device_rank"]),
                "step_ms": m["step_ms"], "threshold_us": rules.tiny_op_us,
                "threshold_share_pct": rules.tiny_min_share_pct, "threshold_per_step": rules.tiny_min_per_step,
                "threshold_step_pct": rules.tiny_min_step_pct}))
    return hits


def _input_wait(ms: list[dict], rules: FindingRules) -> list[_Hit]:
    hits = []
    for m in ms:
        impact = _pct(m["input_ms_per_step"], m["step_ms"])
        if impact >= rules.input_min_step_pct and m["input_ms_per_step"] >= rules.input_min_ms:
            h = _Hit(m["rank"], m["host"], impact, {
                "input_ms_per_step": m["input_ms_per_step"], "dataloader_ms_per_step": m["dataloader_ms_per_step"],
                "boundary_gap_ms_per_step": m["boundary_gap_ms_per_step"], "step_ms": m["step_ms"],
                "threshold_step_pct": rules.input_min_step_pct, "threshold_ms": rules.input_min_ms})
            h.metrics["multiprocess_loader"] = float(any("MultiProcessing" in x for x in m["dataloader_names"]))
            hits.append(h)
    return hits


def _memory_churn(ms: list[dict], rules: FindingRules) -> list[_Hit]:
    hits = []
    for m in ms:
        if not m["memory_events"]:
            continue
        rate = (m["allocs_per_ms"] / rules.churn_min_allocs_per_ms
                if m["allocs_per_step"] >= rules.churn_min_allocs_per_step else 0.0)
        turn = (m["turnover"] / rules.churn_min_turnover
                if m["alloc_mib_per_step"] >= rules.churn_min_alloc_mib else 0.0)
        swing = (m["peak_swing_mib"] / m["peak_mib_mean"] * 100.0 / rules.swing_min_pct
                 if m["peak_swing_mib"] >= rules.swing_min_mib and m["peak_mib_mean"] > 0 else 0.0)
        worst = max(rate, turn, swing)
        if worst < 1.0:
            continue
        hits.append(_Hit(m["rank"], m["host"], 0.0, {
            "allocs_per_step": m["allocs_per_step"], "allocs_per_ms": m["allocs_per_ms"],
            "alloc_mib_per_step": m["alloc_mib_per_step"], "swing_mib_per_step": m["swing_mib_per_step"],
            "turnover": m["turnover"], "peak_mib_mean": m["peak_mib_mean"], "peak_swing_mib": m["peak_swing_mib"],
            "churn_rate": float(rate >= 1.0), "churn_turnover": float(turn >= 1.0), "churn_swing": float(swing >= 1.0),
            "threshold_allocs_per_ms": rules.churn_min_allocs_per_ms,
            "threshold_allocs_per_step": rules.churn_min_allocs_per_step,
            "threshold_turnover": rules.churn_min_turnover, "threshold_alloc_mib": rules.churn_min_alloc_mib,
            "threshold_swing_pct": rules.swing_min_pct, "threshold_swing_mib": rules.swing_min_mib,
            "times_threshold": worst}, severity="medium" if worst >= 2.0 else "low"))
    return hits


def _exposed_comm(ms: list[dict], rules: FindingRules, named: dict[int, float]) -> list[_Hit]:
    hits = []
    wait_for = max(named.values()) if named else 0.0
    for m in ms:
        exp_ = m["exposed_comm_ms_per_step"]
        wait = 0.0 if m["rank"] in named else min(max(wait_for, 0.0), exp_)
        net = exp_ - wait
        impact = _pct(net, m["step_ms"])
        if impact >= rules.exposed_min_pct:
            hits.append(_Hit(m["rank"], m["host"], impact, {
                "exposed_comm_ms_per_step": exp_, "exposed_pct": _pct(exp_, m["step_ms"]),
                "straggler_wait_ms_per_step": wait, "net_exposed_ms_per_step": net,
                "comm_ms_per_step": m["comm_ms_per_step"],
                "overlap_pct": m["overlap_pct"] if m["overlap_pct"] is not None else 0.0,
                "step_ms": m["step_ms"], "threshold_step_pct": rules.exposed_min_pct}))
    return hits


#: Where device idle time goes, in the order each idle ns is assigned: (metric, clause, advice).
IDLE_CAUSES = (
    ("idle_input_ms_per_step", "while the main thread waits for input",
     "The device waits while the main thread waits for input: load batches in background processes "
     "(DataLoader(num_workers=N > 0, pin_memory=True, prefetch_factor=2 or more, persistent_workers=True)) and copy "
     "them with .to(device, non_blocking=True)."),
    ("idle_after_sync_ms_per_step", "after host synchronisations drain its queue",
     "Host synchronisations drain the device's queue, and it idles until the host launches again: avoid .item(), "
     ".cpu(), printing losses and torch.cuda.synchronize() in the loop (see the host_sync finding)."),
    ("idle_host_ops_ms_per_step", "while the host is inside ops, dispatching and launching work (launch/CPU-bound)",
     "The device waits for the host to launch work (launch/CPU-bound): capture the step in CUDA graphs "
     "(torch.compile(mode=\"reduce-overhead\") or torch.cuda.graphs), fuse small ops with torch.compile, use a "
     "larger batch so each kernel does more work, and use fused/foreach optimizers (Adam(fused=True))."),
    ("idle_host_other_ms_per_step", "while the host runs code outside any recorded op",
     "The host runs code outside any recorded op (Python, logging, garbage collection, CPU preprocessing) while "
     "the device waits: find it with with_stack=True or a Python sampler (py-spy) and move it out of the step."),
)


def dominant_idle_cause(metrics: dict[str, float]) -> tuple[str, str, str] | None:
    """The ``IDLE_CAUSES`` entry holding most of a device_idle finding's idle time (None without idle)."""
    best = max(IDLE_CAUSES, key=lambda c: metrics.get(c[0], 0.0))
    return best if metrics.get(best[0], 0.0) > 0 else None


def _device_idle(ms: list[dict], rules: FindingRules) -> list[_Hit]:
    hits = []
    for m in ms:
        if not m["device_rank"]:
            continue
        idle = m["device_idle_ms_per_step"]
        impact = _pct(idle, m["step_ms"])
        if impact >= rules.idle_min_step_pct and idle >= rules.idle_min_ms:
            met = {k: m[k] for k in ("device_idle_ms_per_step", "idle_head_ms_per_step", "idle_between_ms_per_step",
                                     "idle_tail_ms_per_step", "idle_input_ms_per_step", "idle_after_sync_ms_per_step",
                                     "idle_host_ops_ms_per_step", "idle_host_other_ms_per_step", "step_ms")}
            met.update({"kernels_per_step": m["ops_per_step"], "tiny_kernels_per_step": m["tiny_ops_per_step"],
                        "threshold_step_pct": rules.idle_min_step_pct, "threshold_ms": rules.idle_min_ms,
                        "threshold_us": rules.tiny_op_us})
            hits.append(_Hit(m["rank"], m["host"], impact, met, notes={"top_host_ops": m["idle_top_host_ops"]}))
    return hits


def _host_sync(ms: list[dict], rules: FindingRules) -> list[_Hit]:
    hits = []
    for m in ms:
        if not m["device_rank"]:
            continue
        blocked = _pct(m["sync_ms_per_step"], m["step_ms"])
        impact = _pct(m["idle_after_sync_ms_per_step"], m["step_ms"])
        if m["syncs_per_step"] >= rules.sync_min_per_step and max(blocked, impact) >= rules.sync_min_step_pct:
            hits.append(_Hit(m["rank"], m["host"], impact, {
                "sync_ms_per_step": m["sync_ms_per_step"], "syncs_per_step": m["syncs_per_step"],
                "sync_calls_per_step": m["sync_calls_per_step"], "blocked_pct": blocked,
                "idle_after_sync_ms_per_step": m["idle_after_sync_ms_per_step"], "step_ms": m["step_ms"],
                "threshold_per_step": rules.sync_min_per_step, "threshold_step_pct": rules.sync_min_step_pct},
                notes={"sites": m["sync_sites"]}))
    return hits


def _fmt_ranks(ranks: list[int]) -> str:
    ranks = sorted(ranks)
    parts, i = [], 0
    while i < len(ranks):
        j = i
        while j + 1 < len(ranks) and ranks[j + 1] == ranks[j] + 1:
            j += 1
        parts.append(str(ranks[i]) if i == j else f"{ranks[i]}-{ranks[j]}")
        i = j + 1
    return ",".join(parts)


def _group(rule_id: str, hits: list[_Hit], n_ranks: int, rules: FindingRules, text) -> list[dict[str, Any]]:
    """One finding for many ranks, else one per rank (worst first).

    `text(metrics, where, worst_hit)` returns (title, evidence, advice).
    """
    if not hits:
        return []
    hits = sorted(hits, key=lambda h: (-h.impact_pct, -h.metrics.get("times_threshold", 0.0), h.rank))

    def sev(h: _Hit) -> str:
        return h.severity or rules.severity(h.impact_pct)

    if len(hits) > 1 and 2 * len(hits) >= n_ranks:
        keys = hits[0].metrics.keys()
        metrics = {k: float(np.mean([h.metrics[k] for h in hits])) for k in keys}
        metrics.update({"n_ranks": float(len(hits)), "worst_rank": float(hits[0].rank),
                        "impact_pct": float(np.mean([h.impact_pct for h in hits]))})
        where = (f"all {n_ranks} ranks" if len(hits) == n_ranks
                 else f"{len(hits)} of {n_ranks} ranks ({_fmt_ranks([h.rank for h in hits])})")
        sevs = [sev(h) for h in hits]
        severity = min(sevs, key=lambda s: (-sevs.count(s), _SEVERITY_ORDER[s]))  # the most common, worst on ties
        if hits[0].severity is None:
            severity = rules.severity(metrics["impact_pct"])
        title, evidence, advice = text(metrics, where, hits[0])
        hosts = {h.host for h in hits}
        return [{"id": rule_id, "severity": severity, "rank": None, "host": hosts.pop() if len(hosts) == 1 else None,
                 "title": title, "evidence": evidence, "advice": advice, "metrics": metrics}]
    out = []
    for h in hits[: rules.max_per_rule]:
        metrics = {**h.metrics, "impact_pct": h.impact_pct}
        title, evidence, advice = text(metrics, f"rank {h.rank}", h)
        out.append({"id": rule_id, "severity": sev(h), "rank": h.rank, "host": h.host, "title": title,
                    "evidence": evidence, "advice": advice, "metrics": metrics})
    if len(hits) > rules.max_per_rule:
        out[-1]["evidence"] += f" ({len(hits) - rules.max_per_rule} more ranks not listed)"
    return out


def _tiny_text(m, where, worst):
    dev = m["device_rank"] >= 0.5
    op = "kernel" if dev else "op"
    title = f"Many tiny {op}s on {where}: {m['tiny_share_pct']:.0f} % of {op} time in {op}s under " \
            f"{m['threshold_us']:.0f} us"
    ev = (f"{m['tiny_ops_per_step']:.0f} of {m['ops_per_step']:.0f} {'compute' if dev else 'top-level'} {op}s per "
          f"step are under {m['threshold_us']:.0f} us (median {m['tiny_median_us']:.0f} us): "
          f"{m['tiny_ms_per_step']:.1f} ms of {m['op_ms_per_step']:.1f} ms {op} time per {m['step_ms']:.1f} ms step "
          f"({m['impact_pct']:.0f} % of step time"
          + ("; the device's idle time between kernels is the device_idle rule's" if dev else "")
          + f"). Rule: >= {m['threshold_share_pct']:.0f} % of {op} time in {op}s under {m['threshold_us']:.0f} us, "
          f">= {m['threshold_per_step']:.0f} such {op}s per step and >= {m['threshold_step_pct']:.0f} % of step time.")
    advice = ("Per-op dispatch and launch overhead dominates: fuse small ops (torch.compile the model or the hot "
              "function), use a larger batch per step, and replace Python loops over small tensors with batched "
              "tensor ops (torch._foreach_* / fused optimizers such as Adam(fused=True)).")
    return title, ev, advice


def _on_rank(where, worst) -> str:
    return "" if where.startswith("rank ") else f" (rank {worst.rank})"


def _device_idle_text(m, where, worst):
    title = f"Device idle on {where}: no kernel or copy runs for {m['impact_pct']:.0f} % of step time"
    tops = worst.notes.get("top_host_ops") or []
    mostly = (" (largest: " + ", ".join(f"{n} {t:.2f} ms" for n, t in tops) + _on_rank(where, worst) + ")"
              if tops else "")
    a, b, c, d = (m[k] for k in ("idle_host_ops_ms_per_step", "idle_host_other_ms_per_step", "idle_input_ms_per_step",
                                 "idle_after_sync_ms_per_step"))
    parts = [(a, f"the host was inside an op, dispatching and launching work, for {a:.2f} ms{mostly}"),
             (b, f"the host ran code outside any recorded op for {b:.2f} ms"),
             (c, f"the main thread waited for input for {c:.2f} ms"),
             (d, f"{d:.2f} ms followed a synchronising call that drained the device's queue")]
    meanwhile = [text for x, text in sorted(parts, key=lambda p: -p[0]) if x >= 0.005]
    ev = (f"no kernel, memcpy or memset runs on any stream for {m['device_idle_ms_per_step']:.2f} ms of the "
          f"{m['step_ms']:.1f} ms step: {m['idle_head_ms_per_step']:.2f} ms before the step's first GPU work, "
          f"{m['idle_between_ms_per_step']:.2f} ms between GPU work and {m['idle_tail_ms_per_step']:.2f} ms after "
          f"its last. " + ("Meanwhile " + "; ".join(meanwhile) + ". " if meanwhile else "") +
          f"The rank runs {m['kernels_per_step']:.0f} compute kernels per step, {m['tiny_kernels_per_step']:.0f} of "
          f"them under {m['threshold_us']:.0f} us. Rule: device idle >= {m['threshold_step_pct']:.0f} % of step time "
          f"and >= {m['threshold_ms']:.1f} ms per step.")
    idle = m["device_idle_ms_per_step"]
    ranked = sorted(IDLE_CAUSES, key=lambda c: -m.get(c[0], 0.0))
    advice = ranked[0][2]
    also = [c[2] for c in ranked[1:] if idle > 0 and m.get(c[0], 0.0) >= 0.25 * idle]
    if also:
        advice += " Also: " + " ".join(also)
    return title, ev, advice


def _host_sync_text(m, where, worst):
    title = (f"Host synchronisation on {where}: {m['syncs_per_step']:.1f} syncs per step block the host "
             f"{m['sync_ms_per_step']:.2f} ms")
    sites = worst.notes.get("sites") or []
    ev = (f"the host waits for the device in synchronising calls {m['syncs_per_step']:.1f} times per step, for "
          f"{m['sync_ms_per_step']:.2f} ms of the {m['step_ms']:.1f} ms step ({m['blocked_pct']:.0f} %); after them "
          f"the device sits idle {m['idle_after_sync_ms_per_step']:.2f} ms per step ({m['impact_pct']:.0f} % of "
          f"step time, counted in device idle) until the host launches new work.")
    if sites:
        ev += (" Call sites" + _on_rank(where, worst) + ": "
               + ", ".join(f"{n} {t:.2f} ms ({c:.1f} per step)" for n, t, c in sites) + ".")
    ev += (f" Rule: >= {m['threshold_per_step']:.0f} sync per step, and the blocked time or the device idle after "
           f"syncs >= {m['threshold_step_pct']:.0f} % of step time.")
    advice = ("Keep the host ahead of the device: avoid host syncs in the training loop - .item(), .cpu(), .tolist(), "
              "printing or logging a loss tensor every step (accumulate on the device, read every N steps), "
              "torch.cuda.synchronize(), data-dependent shapes (nonzero, boolean masks); copy inputs with "
              ".to(device, non_blocking=True) from pinned memory (DataLoader(pin_memory=True)). "
              "torch.cuda.set_sync_debug_mode(\"warn\") reports each synchronising call.")
    return title, ev, advice


def _input_text(m, where, worst):
    title = f"Waiting for input on {where}: {m['impact_pct']:.0f} % of step time"
    ev = (f"the main thread spends {m['input_ms_per_step']:.1f} ms of its {m['step_ms']:.1f} ms step waiting for "
          f"input: {m['dataloader_ms_per_step']:.1f} ms in DataLoader __next__ and "
          f"{m['boundary_gap_ms_per_step']:.1f} ms idle at the step boundary (before the first op or after the last). "
          f"Rule: >= {m['threshold_step_pct']:.0f} % of step time and >= {m['threshold_ms']:.1f} ms per step.")
    if m.get("multiprocess_loader", 0) >= 0.5:
        advice = ("The DataLoader workers cannot keep up: raise num_workers and prefetch_factor, set "
                  "persistent_workers=True and pin_memory=True, and make __getitem__ cheaper (pre-process offline, "
                  "decode or augment on the device).")
    else:
        advice = ("Load batches in background processes: DataLoader(num_workers=N > 0, pin_memory=True, "
                  "prefetch_factor=2 or more, persistent_workers=True), and move host-to-device copies off the "
                  "critical path (non_blocking=True). If the gap is not data loading, look for per-step work outside "
                  "any op (logging, checkpoints, time.sleep).")
    return title, ev, advice


def _memory_text(m, where, worst):
    kinds = []
    if m["churn_rate"] >= 0.5:
        kinds.append(f"{m['allocs_per_step']:.0f} allocations per step ({m['allocs_per_ms']:.0f} per ms)")
    if m["churn_turnover"] >= 0.5:
        kinds.append(f"{m['alloc_mib_per_step']:.0f} MiB allocated per step, {m['turnover']:.1f}x its "
                     f"{m['swing_mib_per_step']:.0f} MiB swing")
    if m["churn_swing"] >= 0.5:
        kinds.append(f"the per-step peak varies by {m['peak_swing_mib']:.0f} MiB around {m['peak_mib_mean']:.0f} MiB")
    title = f"Memory churn on {where}: " + "; ".join(kinds)
    ev = (f"{m['allocs_per_step']:.0f} allocations per step ({m['allocs_per_ms']:.1f} per ms), "
          f"{m['alloc_mib_per_step']:.1f} MiB allocated per step against a swing of {m['swing_mib_per_step']:.1f} MiB "
          f"(turnover {m['turnover']:.1f}x); per-step peak {m['peak_mib_mean']:.1f} MiB, varying by "
          f"{m['peak_swing_mib']:.1f} MiB. Rule: >= {m['threshold_allocs_per_ms']:.0f} allocations per ms and >= "
          f"{m['threshold_allocs_per_step']:.0f} per step, or turnover >= {m['threshold_turnover']:.0f}x with >= "
          f"{m['threshold_alloc_mib']:.0f} MiB per step, or a per-step peak varying by >= "
          f"{m['threshold_swing_pct']:.0f} % and >= {m['threshold_swing_mib']:.0f} MiB.")
    advice = ("Reuse buffers instead of allocating per step (preallocate, in-place ops, out= arguments, no torch.cat "
              "in loops), keep input shapes fixed (pad or bucket variable lengths), and on CUDA set "
              "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True; record the allocator history (--memory-history on "
              "CUDA) to see which code allocates.")
    return title, ev, advice


def _exposed_text(m, where, worst):
    title = f"Exposed communication on {where}: {m['impact_pct']:.0f} % of step time"
    ev = (f"{m['exposed_comm_ms_per_step']:.1f} ms of the {m['step_ms']:.1f} ms step "
          f"({m['exposed_pct']:.0f} %) waits for communication; ")
    if m["straggler_wait_ms_per_step"] > 0:
        ev += (f"about {m['straggler_wait_ms_per_step']:.1f} ms of it is the wait for the straggler (its own finding), "
               f"leaving {m['net_exposed_ms_per_step']:.1f} ms ({m['impact_pct']:.0f} %); ")
    ev += (f"{m['overlap_pct']:.0f} % of the {m['comm_ms_per_step']:.1f} ms/step of communication overlaps compute. "
           f"Rule: exposed communication net of straggler waits >= {m['threshold_step_pct']:.0f} % of step time.")
    advice = ("Overlap communication with the backward pass and send less of it: tune DDP bucket_cap_mb (larger "
              "buckets mean fewer collectives; smaller first buckets start earlier), keep gradient_as_bucket_view="
              "True and avoid find_unused_parameters, accumulate gradients over several micro-batches under "
              "model.no_sync(), and compress or shard (bf16 gradients, FSDP/ZeRO) when the network is the limit.")
    return title, ev, advice


def _straggler_findings(stragglers: dict[str, Any], root_cause: list[dict], hosts: dict[int, str],
                        median_step_ms: float, rules: FindingRules) -> list[dict[str, Any]]:
    ranks = {d["rank"]: d for d in stragglers.get("ranks", [])}
    named = [d for d in stragglers.get("ranks", []) if d.get("named")]
    thr = (stragglers.get("rule") or {}).get("threshold_ms")
    out: list[dict[str, Any]] = []
    n_hosts = len(set(hosts.values()))
    covered: set[int] = set()
    host_rows = {h["host"]: h for h in stragglers.get("hosts", [])}
    by_host: dict[str, list[int]] = {}
    for r, h in hosts.items():
        by_host.setdefault(h, []).append(r)
    for host, members in sorted(by_host.items()):
        late = [r for r in members if r in ranks and ranks[r].get("named")]
        h = host_rows.get(host, {})
        if n_hosts < 2 or len(members) < 2 or len(late) < rules.host_min_fraction * len(members):
            continue
        covered.update(late)
        lat = h.get("mean_lateness_ms") or (float(np.mean([ranks[r]["mean_lateness_ms"] for r in late])) if late else 0)
        blame = sum(ranks[r]["blame_ms_per_step"] for r in members if r in ranks)
        impact = _pct(lat, median_step_ms)
        out.append({
            "id": "straggler_host", "severity": rules.severity(impact), "rank": None, "host": host,
            "title": f"Slow host {host}: ranks {_fmt_ranks(members)} are late together",
            "evidence": (f"{len(late)} of its {len(members)} ranks are named stragglers; the host arrives "
                         f"{lat:.1f} ms after the other hosts on average (last in "
                         f"{100 * (h.get('late_fraction') or 0):.0f} % of collectives) and its ranks cost the others "
                         f"{blame:.1f} ms of waiting per step ({impact:.0f} % of the {median_step_ms:.1f} ms median "
                         f"step). Rule: >= {100 * rules.host_min_fraction:.0f} % of its ranks (at least 2) are named "
                         f"stragglers, on a run with at least 2 hosts."),
            "advice": ("The node itself is slower: check it for thermal or power throttling (nvidia-smi -q -d "
                       "PERFORMANCE), other jobs or processes, a different device, driver or CPU model, and its "
                       "network link; exclude it from the job (e.g. Slurm --exclude) until fixed."),
            "metrics": {"mean_lateness_ms": float(lat), "late_fraction": float(h.get("late_fraction") or 0.0),
                        "blame_ms_per_step": float(blame), "n_ranks": float(len(members)),
                        "n_late_ranks": float(len(late)), "impact_pct": impact, "median_step_ms": median_step_ms,
                        "threshold_ms": float(thr or 0.0), "threshold_host_fraction": rules.host_min_fraction},
        })
    rc = {d["rank"]: d for d in root_cause}
    for d in named:
        r = d["rank"]
        if r in covered:
            continue
        impact = _pct(d["mean_lateness_ms"], median_step_ms)
        ops = (rc.get(r) or {}).get("ops") or []
        cause = "; ".join(f"{display_name(o['name'])} +{o['excess_ms_per_step']:.1f} ms/step ({o['rank_ms_per_step']:.1f} vs "
                          f"{o['others_median_ms_per_step']:.1f})" for o in ops[:3])
        top = ops[0] if ops else None
        if top is None:
            advice = ("Compare this rank with its peers in the timeline (distprof timeline) to see where it loses "
                      "time; check its host for CPU contention or throttling.")
        elif top["name"] == IDLE_NAME:
            advice = (f"Rank {r} spends its extra time outside any recorded op: look for work that only this rank "
                      "does (logging, checkpointing, evaluation, data loading on the main thread, time.sleep, garbage "
                      "collection) and for CPU contention on its host (other processes, OMP_NUM_THREADS, CPU "
                      "affinity).")
        else:
            advice = (f"Rank {r}'s {display_name(top['name'])} is slower than on its peers: check for uneven work (batch or "
                      "sequence lengths per rank; balance the sampler), a slower or throttled device, or CPU "
                      "contention on its host.")
        out.append({
            "id": "straggler_rank", "severity": rules.severity(impact), "rank": r, "host": d.get("host"),
            "title": f"Straggler: rank {r} (host {d.get('host')}) is late in {100 * d['late_fraction']:.0f} % of "
                     f"collectives",
            "evidence": (f"rank {r} arrives {d['mean_lateness_ms']:.1f} ms after the median of the other ranks per "
                         f"step ({impact:.0f} % of the {median_step_ms:.1f} ms median step), late in "
                         f"{100 * d['late_step_fraction']:.0f} % of steps; the others wait "
                         f"{d['blame_ms_per_step']:.1f} ms per step for it in total"
                         + (f"; it differs most in: {cause}" if cause else "")
                         + f". Rule: the stragglers naming rule (threshold {thr or 0:.2f} ms, see straggler_info)."),
            "advice": advice,
            "metrics": {"mean_lateness_ms": d["mean_lateness_ms"], "late_fraction": d["late_fraction"],
                        "late_step_fraction": d["late_step_fraction"], "blame_ms_per_step": d["blame_ms_per_step"],
                        "lost_ms_per_step": d["lost_ms_per_step"], "impact_pct": impact,
                        "median_step_ms": median_step_ms, "threshold_ms": float(thr or 0.0),
                        **({"top_excess_ms_per_step": top["excess_ms_per_step"]} if top else {})},
        })
    return out


def findings(
    run: MergedRun,
    *,
    breakdown: Table,
    stragglers: dict[str, Any],
    root_cause: list[dict[str, Any]],
    rules: FindingRules | None = None,
) -> list[dict[str, Any]]:
    """Every finding of every rule (see the module docstring), most severe first.

    `stragglers` is ``find_stragglers(run)``'s dict, `root_cause` ``root_cause(run, named)``'s list.
    """
    rules = rules or FindingRules()
    ms = rank_measures(run, breakdown, rules)
    if not ms:
        return []
    n = len(ms)
    step_ms = np.asarray(breakdown["step_ms"], np.float64)
    median_step = float(np.median(step_ms)) if step_ms.size else 0.0
    named_lat = {d["rank"]: float(d["mean_lateness_ms"]) for d in stragglers.get("ranks", []) if d.get("named")}
    out = _straggler_findings(stragglers, root_cause, dict(run.hosts), median_step, rules)
    out += _group("exposed_comm", _exposed_comm(ms, rules, named_lat), n, rules, _exposed_text)
    out += _group("input_wait", _input_wait(ms, rules), n, rules, _input_text)
    out += _group("device_idle", _device_idle(ms, rules), n, rules, _device_idle_text)
    out += _group("host_sync", _host_sync(ms, rules), n, rules, _host_sync_text)
    out += _group("tiny_ops", _tiny_ops(ms, rules), n, rules, _tiny_text)
    out += _group("memory_churn", _memory_churn(ms, rules), n, rules, _memory_text)
    for f in out:
        f["metrics"] = {k: float(v) for k, v in f["metrics"].items() if v is not None}
    out.sort(key=lambda f: (_SEVERITY_ORDER[f["severity"]], -f["metrics"].get("impact_pct", 0.0)))
    logger.debug("findings: %s", [(f["id"], f["severity"], f["rank"]) for f in out])
    return out

