"""The per-rank numbers every rule reads (:func:`rank_measures`): op sizes (tiny ops), input wait, device idle and
host synchronisation (from :mod:`.device`), allocator churn (from the profiler's memory events, and from the CUDA
allocator history when the run has it: :func:`memory_history_measures`) and exposed communication, per step of each
rank.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...record import Record
from ...storage.schema import CAT_COMM, CAT_COMPUTE
from ..load.rankdata import RankData
from ..types import FindingRules
from . import intervals as iv
from . import nameflags as nf
from .device import DeviceIdle, device_measures
from .events import K_ANNOT, K_CPU_OP, K_KERNEL, NS_PER_MS, boundary_gaps, top_level
from .index import RankIndex

Table = dict[str, np.ndarray]
MIB = 2**20

__all__ = ["Churn", "HistoryChurn", "InputWait", "OpSizes", "RankMeasures", "memory_history_measures",
           "rank_measures"]


@dataclass
class OpSizes(Record):
    """Op sizes per step: the rank's compute kernels (a device rank) or its main thread's top-level CPU ops."""

    op_ms_per_step: float
    ops_per_step: float
    tiny_ops_per_step: float  # shorter than FindingRules.tiny_op_us
    tiny_ms_per_step: float
    tiny_share_pct: float  # of op time
    tiny_median_us: float


@dataclass
class InputWait(Record):
    """The main thread's wait for input per step: DataLoader calls and its gaps at step boundaries (ms)."""

    dataloader_ms_per_step: float
    boundary_gap_ms_per_step: float
    input_ms_per_step: float  # the two together
    dataloader_names: list[str]


@dataclass
class Churn(Record):
    """Allocator churn per step (means over the steps): allocations, bytes, and how the allocated level swings."""

    allocs_per_step: float
    allocs_per_ms: float
    alloc_mib_per_step: float
    swing_mib_per_step: float  # per step, the allocated peak minus its low
    turnover: float  # MiB allocated / MiB of swing
    peak_mib_mean: float  # the per-step peak, averaged
    peak_swing_mib: float  # how much the per-step peak varies (max - min)


@dataclass
class HistoryChurn(Churn):
    """Churn from the CUDA allocator history (``--memory-history``): exact per step, plus the reserved footprint."""

    n_steps: int = 0
    complete_steps: int = 0  # steps whose history ring kept every entry
    frees_per_step: float = 0.0
    alloc_peak_mib: float = 0.0
    reserved_peak_mib: float = 0.0
    reserved_ratio: float = 0.0  # reserved peak / allocated peak
    reserved_gap_mib: float = 0.0  # reserved peak - allocated peak
    segment_allocs_per_step: float = 0.0
    segment_frees_per_step: float = 0.0
    n_oom: float = 0.0
    sites: list[tuple[str, float, float, float]] | None = None  # (site, MiB/step, allocations/step, alive at peak)


@dataclass
class RankMeasures(Record):
    """The numbers every findings rule reads for one rank (means per step of that rank)."""

    rank: int
    host: str
    n_steps: int
    step_ms: float
    device_rank: bool
    ops: OpSizes
    idle_ms_per_step: float  # the breakdown's idle (device idle on a device rank, main thread in no op on CPU)
    input: InputWait
    device: DeviceIdle | None  # device ranks only
    churn: Churn | None  # None without memory events
    history: HistoryChurn | None  # with --memory-history only
    exposed_comm_ms_per_step: float
    comm_ms_per_step: float
    overlap_pct: float | None  # of communication hidden under compute; None without communication


def _event_columns(ev: Table) -> dict[str, np.ndarray]:
    """The event columns the measures read, typed (views, not copies, where the stored type already fits), with each
    event's end."""
    ts = np.asarray(ev["ts_ns"], np.int64)
    dur = np.asarray(ev["dur_ns"], np.int64)
    return {"ts": ts, "dur": dur, "end": ts + dur, "kind": np.asarray(ev["kind"]), "cat": np.asarray(ev["category"]),
            "tid": np.asarray(ev["tid"], np.int64), "dev": np.asarray(ev["device"]),
            "nid": np.asarray(ev["name_id"], np.int64), "step": np.asarray(ev["step"], np.int64)}


def _op_measures(ix: RankIndex, e: dict[str, np.ndarray], on_main: np.ndarray, tiny_ns: float,
                 n: int) -> OpSizes:
    """Op sizes per step: the rank's compute kernels (a device rank) or its main thread's top-level CPU ops."""
    ts, end, kind, dur = e["ts"], e["end"], e["kind"], e["dur"]
    in_steps = e["step"] >= 0  # an event's step is one its rank recorded, or -1 (outside every step)
    if ix.device_rank:
        ops = (kind == K_KERNEL) & (e["dev"] >= 0) & (e["cat"] == CAT_COMPUTE) & in_steps
    else:
        cand = on_main & (kind == K_CPU_OP) & (e["cat"] != CAT_COMM)
        ci = np.flatnonzero(cand)
        ci = ci[np.argsort(ts[ci], kind="stable")]
        top = np.zeros(ts.size, bool)
        top[ci[top_level(ts[ci], end[ci])]] = True
        ops = top & in_steps
    d = dur[ops].astype(np.float64)
    tiny = d < tiny_ns
    return OpSizes(
        op_ms_per_step=float(d.sum()) / NS_PER_MS / n, ops_per_step=float(d.size) / n,
        tiny_ops_per_step=float(tiny.sum()) / n, tiny_ms_per_step=float(d[tiny].sum()) / NS_PER_MS / n,
        tiny_share_pct=100.0 * float(d[tiny].sum()) / float(d.sum()) if d.sum() > 0 else 0.0,
        tiny_median_us=float(np.median(d[tiny])) / 1e3 if tiny.any() else 0.0)


def _input_wait(rd: RankData, ix: RankIndex, e: dict[str, np.ndarray], on_main: np.ndarray, ws: np.ndarray,
                we: np.ndarray) -> tuple[InputWait, iv.Intervals, iv.Intervals]:
    """Input wait per step (data-loader calls and the main thread's gaps at step boundaries), with the two interval
    sets it came from (the data-loader calls, the boundary gaps)."""
    ts, end, kind, nid = e["ts"], e["end"], e["kind"], e["nid"]
    n = ws.size
    dl = on_main & nf.has(ix.name_flags, nf.DATALOADER)[nid]
    busy_m = on_main & ((kind == K_CPU_OP) | (kind == K_ANNOT)) & ~ix.is_step
    busy = iv.union(ts[busy_m], end[busy_m])
    comm = iv.union(ts[ix.is_exec], end[ix.is_exec])
    dl_set = iv.union(ts[dl], end[dl])
    gaps = iv.subtract(boundary_gaps(busy, ws, we), comm) if ix.main_tid is not None else iv.empty()
    dl_ms = float(iv.measure_in_windows(dl_set, ws, we).sum()) / NS_PER_MS / n
    gap_ms = float(iv.measure_in_windows(gaps, ws, we).sum()) / NS_PER_MS / n
    m = InputWait(dl_ms, gap_ms, dl_ms + gap_ms, sorted({str(rd.names[k]) for k in np.unique(nid[dl])}))
    return m, dl_set, gaps


def _memory_event_measures(mem: Table, steps_of: np.ndarray, step_ms: float, n: int) -> Churn | None:
    """Allocator churn per step from the profiler's memory events; None when the rank had none."""
    if not np.asarray(mem["ts_ns"]).size:
        return None
    mstep = np.asarray(mem["step"], np.int64)
    mb = np.asarray(mem["bytes"], np.int64)
    mt = np.asarray(mem["total_bytes"], np.int64)
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
    peaks = hi[has]
    return Churn(
        allocs_per_step=float(n_alloc.sum()) / n, allocs_per_ms=float(n_alloc.sum()) / max(step_ms * n, 1e-9),
        alloc_mib_per_step=float(b_alloc.sum()) / MIB / n,
        swing_mib_per_step=float(swing[has].mean()) / MIB if has.any() else 0.0,
        turnover=float(b_alloc.sum() / swing.sum()) if swing.sum() > 0 else 0.0,
        peak_mib_mean=float(peaks.mean()) / MIB if peaks.size else 0.0,
        peak_swing_mib=float(peaks.max() - peaks.min()) / MIB if peaks.size >= 2 else 0.0)


def rank_measures(rd: RankData, ix: RankIndex, bd: Table, rules: FindingRules | None = None) -> RankMeasures | None:
    """The numbers every rule reads for one rank (means are per step of that rank); None without steps.

    `bd` is the rank's step breakdown (``breakdown.rank_breakdown``).
    """
    rules = rules or FindingRules()
    if bd["step"].size == 0:
        return None
    n = int(bd["step"].size)
    ws = np.asarray(bd["start_ns"], np.int64)
    we = np.asarray(bd["end_ns"], np.int64)
    step_ms = float(bd["step_ms"].sum()) / n
    steps_of = np.asarray(bd["step"], np.int64)
    e = _event_columns(rd.events)
    main = ix.main_tid
    on_main = (e["tid"] == main) & (e["dev"] < 0) if main is not None else np.zeros(e["ts"].size, bool)
    inp, dl_set, gaps = _input_wait(rd, ix, e, on_main, ws, we)
    dev = None
    if ix.device_rank:  # device idle and host synchronisation
        dev = device_measures(rd, ix, {k: e[k] for k in ("ts", "end", "kind", "tid", "dev", "nid")},
                              ws, we, iv.union_all(dl_set, gaps), nf.has(ix.name_flags, nf.SYNC_CALL))
    comm_tot = float(bd["comm_ms"].sum())
    return RankMeasures(
        rank=int(rd.rank), host=rd.host, n_steps=n, step_ms=step_ms, device_rank=ix.device_rank,
        ops=_op_measures(ix, e, on_main, rules.tiny_op_us * 1e3, n), idle_ms_per_step=float(bd["idle_ms"].sum()) / n,
        input=inp, device=dev, churn=_memory_event_measures(rd.memory, steps_of, step_ms, n),
        history=memory_history_measures(rd, steps_of, np.asarray(bd["step_ms"], np.float64)),
        exposed_comm_ms_per_step=float(bd["exposed_comm_ms"].sum()) / n, comm_ms_per_step=comm_tot / n,
        overlap_pct=100.0 * float(bd["overlapped_ms"].sum()) / comm_tot if comm_tot > 0 else None)


def _frame_label(names: np.ndarray, user_id: int, frame_id: int) -> str:
    for i in (user_id, frame_id):
        if 0 <= i < len(names) and str(names[i]):
            return str(names[i])
    return "(no stack)"


def _history_rows(cm: Table, steps: np.ndarray) -> Table | None:
    """The rank's ``cuda_memory`` rows in `steps`, sorted by window, device and step; None when there are none."""
    if not len(cm.get("step", ())):
        return None
    sel = np.isin(np.asarray(cm["step"], np.int64), steps)
    if not sel.any():
        return None
    r = {c: np.asarray(v)[sel] for c, v in cm.items()}
    o = np.lexsort((r["step"], r["device"], r["window"]))
    return {c: v[o] for c, v in r.items()}


def _history_sites(rd: RankData, us: np.ndarray, top_sites: int) -> list[tuple[str, float, float, float]]:
    """The `top_sites` allocation sites with the most bytes among the largest allocations of steps `us`, as
    (label, MiB per step, allocations per step, share of them alive at the step's peak)."""
    blk = rd.cuda_memory_blocks
    bsel = np.isin(np.asarray(blk.get("step", np.zeros(0, np.int32)), np.int64), us)
    sites: dict[str, list[float]] = {}
    cols = [np.asarray(blk[c])[bsel].tolist() for c in ("user_frame_id", "frame_id", "bytes", "live_at_peak")]
    for uf, fr, nb, live in zip(*cols):
        acc = sites.setdefault(_frame_label(rd.names, int(uf), int(fr)), [0.0, 0.0, 0.0])
        acc[0] += nb
        acc[1] += 1
        acc[2] += bool(live)
    top = sorted(sites.items(), key=lambda kv: (-kv[1][0], kv[0]))[:top_sites]
    return [(label, b / MIB / us.size, k / us.size, live / k) for label, (b, k, live) in top]


def memory_history_measures(rd: RankData, steps: np.ndarray, step_ms: np.ndarray,
                            top_sites: int = 3) -> HistoryChurn | None:
    """The churn measures of one rank from its ``cuda_memory`` / ``cuda_memory_blocks`` (``--memory-history``).

    `steps` / `step_ms` are the rank's steps and their times (from the breakdown). None when the rank has no history
    row in those steps. Per step, devices are summed. Counts and bytes are means over the steps whose history is
    complete (all steps when none is); levels are exact on every step. ``swing_mib_per_step``: the step's allocated
    peak minus the lower of its end level and the previous step's (same device and window), a stand-in for
    max - min, which the table does not keep. ``sites``: the allocation sites (the user's frame, else the innermost)
    with the most bytes among each step's largest allocations, as (label, MiB per step, allocations per step,
    share of them alive at the step's peak).
    """
    r = _history_rows(rd.cuda_memory, steps)
    if r is None:
        return None
    step = r["step"].astype(np.int64)
    peak = r["alloc_peak_bytes"].astype(np.float64)
    end = r["alloc_end_bytes"].astype(np.float64)
    prev_ok = np.r_[False, (r["window"][1:] == r["window"][:-1]) & (r["device"][1:] == r["device"][:-1])
                    & (step[1:] == step[:-1] + 1)]
    low = np.where(prev_ok, np.minimum(end, np.r_[0.0, end[:-1]]), end)
    us, si = np.unique(step, return_inverse=True)

    def per_step(x) -> np.ndarray:
        return np.bincount(si, weights=np.asarray(x, np.float64), minlength=us.size)

    complete = per_step(r["complete"] == 0) == 0
    cs = complete if complete.any() else np.ones(us.size, bool)
    ms_of = dict(zip(np.asarray(steps, np.int64).tolist(), np.asarray(step_ms, np.float64).tolist()))
    nc = int(cs.sum())
    c_ms = float(sum(ms_of.get(s, 0.0) for s in us[cs].tolist()))
    n_alloc = float(per_step(r["n_alloc"])[cs].sum())
    b_alloc = float(per_step(r["alloc_bytes"])[cs].sum())
    swing = per_step(np.maximum(peak - low, 0.0))
    peaks = per_step(peak)
    reserved = per_step(r["reserved_peak_bytes"])
    alloc_max, res_max = float(peaks.max()), float(reserved.max())
    return HistoryChurn(
        n_steps=int(us.size), complete_steps=int(complete.sum()),
        allocs_per_step=n_alloc / nc, allocs_per_ms=n_alloc / max(c_ms, 1e-9),
        alloc_mib_per_step=b_alloc / MIB / nc, frees_per_step=float(per_step(r["n_free"])[cs].sum()) / nc,
        swing_mib_per_step=float(swing[cs].mean()) / MIB,
        turnover=b_alloc / float(swing[cs].sum()) if swing[cs].sum() > 0 else 0.0,
        peak_mib_mean=float(peaks.mean()) / MIB,
        peak_swing_mib=float(peaks.max() - peaks.min()) / MIB if us.size >= 2 else 0.0,
        alloc_peak_mib=alloc_max / MIB, reserved_peak_mib=res_max / MIB,
        reserved_ratio=res_max / alloc_max if alloc_max > 0 else 0.0,
        reserved_gap_mib=max(res_max - alloc_max, 0.0) / MIB,
        segment_allocs_per_step=float(per_step(r["n_segment_alloc"])[cs].sum()) / nc,
        segment_frees_per_step=float(per_step(r["n_segment_free"])[cs].sum()) / nc,
        n_oom=float(np.asarray(r["n_oom"], np.int64).sum()), sites=_history_sites(rd, us, top_sites))
