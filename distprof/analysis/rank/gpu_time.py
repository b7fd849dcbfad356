"""GPU time per rank: temporal breakdown (idle / compute / non-compute) and communication/computation overlap.

The same figures as Holistic Trace Analysis' ``get_temporal_breakdown`` and ``get_comm_comp_overlap``, computed on a
rank's device timeline (every stream of the rank together); definitions in docs/gpu-semantics.md:

* GPU events: kernels, memcpy and memset on a device stream (``device >= 0``).
* ``span``: end of the last GPU event − start of the first (HTA's "kernel_time").
* ``idle``: span − |union of GPU events| (no GPU event on any stream).
* ``compute``: |union of computation kernels| (category compute: not communication, not memcpy/memset/sync).
* ``non_compute``: span − compute − idle (only communication or memory ran). The three add up to the span.
* ``overlap_pct``: 100 · |comm ∩ compute| / |comm| with comm = union of communication kernels (NCCL/RCCL and the
  library kernels of :mod:`distprof.events.classify`), i.e. the share of communication time hidden under compute.

Selection: by default every GPU event of the rank in a recorded step (its ``step``: the step that *launched* it, see
:mod:`distprof.events.tables`; a kernel launched before the recording began, or after the last step, belongs to
none, as in HTA). ``steps=(lo, hi)`` keeps GPU events whose step is in ``lo..hi``; ``drop_last_step=True`` keeps
those launched before the rank's last recorded step (HTA's default trace filter, which drops the last
ProfilerStep).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from ...record import Record
from ...storage.schema import CAT_COMM, CAT_COMPUTE, KIND_CODE
from ..load.rankdata import RankData
from ..rank import intervals as iv

logger = logging.getLogger(__name__)

__all__ = ["rank_gpu_time", "GPU_KINDS", "GpuTime"]


@dataclass
class GpuTime(Record):
    """One device rank's GPU time (µs, and % of its span; None where the span or communication is zero)."""

    rank: int
    n_gpu_events: int
    span_us: float
    idle_us: float
    compute_us: float
    non_compute_us: float
    idle_pct: float | None
    compute_pct: float | None
    non_compute_pct: float | None
    comm_us: float
    comm_hidden_us: float
    overlap_pct: float | None

#: Kinds that occupy a device stream for the breakdown.
GPU_KINDS = (KIND_CODE["kernel"], KIND_CODE["gpu_memcpy"], KIND_CODE["gpu_memset"])


def _pct(x: float, d: float) -> float | None:
    return 100.0 * x / d if d > 0 else None


def rank_gpu_time(rd: RankData, *, steps: tuple[int, int] | None = None, drop_last_step: bool = False,
                  whole_us: bool = False) -> GpuTime | None:
    """One rank's span/idle/compute/non-compute (µs and % of span), comm and overlap; None without device events.

    ``whole_us=True`` rounds every event inward to whole microseconds (start up, end down) as HTA's parser does;
    distprof's default keeps nanoseconds (see docs/gpu-semantics.md).
    """
    ev = rd.events
    dev = np.asarray(ev["device"])
    kind = np.asarray(ev["kind"])
    m = (dev >= 0) & np.isin(kind, GPU_KINDS)
    if not m.any():
        return None
    step = np.asarray(ev["step"])
    m &= step >= 0  # in a recorded step (a kernel launched before the recording began belongs to none)
    if steps is not None:
        m &= (step >= steps[0]) & (step <= steps[1])
    if drop_last_step:
        rs = np.asarray(rd.steps["step"])
        if rs.size >= 2:
            m &= step < int(rs.max())
    idx = np.flatnonzero(m)
    if idx.size == 0:
        return None
    ts = np.asarray(ev["ts_ns"], np.int64)[idx]
    end = ts + np.asarray(ev["dur_ns"], np.int64)[idx]
    if whole_us:
        ts = -((-ts) // 1000) * 1000  # ceil to µs
        end = np.maximum((end // 1000) * 1000, ts)  # floor to µs, never before the start
    cat = np.asarray(ev["category"])[idx]
    k = kind[idx]
    span = int(end.max() - ts.min())
    busy = iv.union(ts, end)
    is_kernel = k == KIND_CODE["kernel"]
    pc = is_kernel & (cat == CAT_COMPUTE)
    cc = is_kernel & (cat == CAT_COMM)
    compute = iv.union(ts[pc], end[pc])
    comm = iv.union(ts[cc], end[cc])
    idle = span - busy.total
    comp = compute.total
    hidden = iv.intersect(comm, compute).total
    return GpuTime(rank=int(rd.rank), n_gpu_events=int(idx.size), span_us=span / 1e3, idle_us=idle / 1e3,
                   compute_us=comp / 1e3, non_compute_us=(span - comp - idle) / 1e3, idle_pct=_pct(idle, span),
                   compute_pct=_pct(comp, span), non_compute_pct=_pct(span - comp - idle, span),
                   comm_us=comm.total / 1e3, comm_hidden_us=hidden / 1e3, overlap_pct=_pct(hidden, comm.total))
