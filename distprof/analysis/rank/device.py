"""One rank's device measures, per step, for the device rules (``findings.device``): where the device sits idle
(before the step's first GPU work, between, after the last) and what the host did meanwhile, each idle ns counted
once, in this order: the main thread waited for input, the idle stretch began inside a synchronising call, a CPU
thread of the rank (not a communication worker) was inside a ``cpu_op`` (the leaf ops with most such time are kept),
else the host ran code outside any recorded op; and the host's synchronising calls (``names.is_sync_call`` and
Kineto ``cuda_sync`` records; overlapping ones count once), their blocked time, the device idle that starts inside
them, and their call sites (the outermost ``cpu_op`` enclosing each call).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...record import Record
from ...storage.schema import KIND_CODE
from ..load.rankdata import RankData
from ..rank import intervals as iv
from ..rank.events import (
    K_CPU_OP,
    K_CUDA_SYNC,
    NS_PER_MS,
    edge_gaps,
    in_windows,
    leaf_ops,
    op_label,
    outermost_op,
    starts_inside,
    top_ids,
)
from ..rank.gpu_time import GPU_KINDS
from ..rank.index import RankIndex

_RUNTIME_KINDS = tuple(KIND_CODE[k] for k in ("cuda_runtime", "cuda_driver", "privateuse1_runtime",
                                                "privateuse1_driver"))


@dataclass
class DeviceIdle(Record):
    """A device rank's idle time per step — where it sits and what the host did meanwhile — and its host
    synchronisation (ms per step unless said)."""

    device_idle_ms_per_step: float
    idle_head_ms_per_step: float  # before the step's first GPU work
    idle_tail_ms_per_step: float  # after its last
    idle_between_ms_per_step: float
    idle_input_ms_per_step: float  # the main thread waited for input meanwhile
    idle_after_sync_ms_per_step: float  # after a synchronising call drained the device's queue
    idle_host_ops_ms_per_step: float  # the host was inside an op
    idle_host_other_ms_per_step: float  # the host ran code outside any recorded op
    idle_top_host_ops: list[tuple[str, float]]  # (op, ms per step) of the host ops during idle, most first
    sync_ms_per_step: float
    syncs_per_step: float
    sync_calls_per_step: float
    sync_sites: list[tuple[str, float, float]]  # (call site, ms per step, calls per step), most first


def device_measures(rd: RankData, ix: RankIndex, e: dict[str, np.ndarray], ws: np.ndarray, we: np.ndarray,
                    input_set: iv.Intervals, is_sync_name: np.ndarray) -> DeviceIdle:
    """Device idle (where it sits, what the host did meanwhile) and host synchronisation, per step of the rank."""
    ts, end, kind, tid, dev, nid = e["ts"], e["end"], e["kind"], e["tid"], e["dev"], e["nid"]
    n = ws.size

    def per_step(x: iv.Intervals) -> float:
        return float(iv.measure_in_windows(x, ws, we).sum()) / NS_PER_MS / n

    win = iv.union(ws, we)
    g = (dev >= 0) & np.isin(kind, GPU_KINDS)
    busy = iv.union(ts[g], end[g])
    idle = iv.subtract(win, busy)
    head, tail = edge_gaps(busy, ws, we)
    head = iv.intersect(head, idle)
    tail = iv.intersect(tail, idle)
    # host synchronisation: blocking runtime calls on the rank's CPU threads, and Kineto's cuda_sync records
    scall = (dev < 0) & np.isin(kind, _RUNTIME_KINDS) & is_sync_name[nid]
    sk = scall | (kind == K_CUDA_SYNC)
    sync = iv.union(ts[sk], end[sk])
    # an idle stretch that starts while the host waits in a sync: the sync drained the device's queue
    drained_m = starts_inside(idle.s, sync)
    drained = iv.Intervals(idle.s[drained_m], idle.e[drained_m])
    hop = (dev < 0) & (kind == K_CPU_OP) & ~np.isin(tid, ix.comm_tids)
    host_ops = iv.union(ts[hop], end[hop])
    # each idle ns goes to the first of: input wait, drained by a sync, host inside an op, host outside any op
    p_input = iv.intersect(idle, input_set)
    rest = iv.subtract(idle, input_set)
    p_sync = iv.intersect(rest, drained)
    rest = iv.subtract(rest, drained)
    p_ops = iv.intersect(rest, host_ops)
    p_other = iv.subtract(rest, host_ops)
    hi = np.flatnonzero(hop)
    li = hi[leaf_ops(ts[hi], end[hi], tid[hi])]
    ov = iv.measure_in_windows(p_ops, ts[li], end[li])
    top_ops = [(op_label(rd.names, k), t / NS_PER_MS / n) for k, t in top_ids(nid[li], ov)]

    sync_in = in_windows(sync.s, ws, we)
    si = np.flatnonzero(scall)
    si = si[in_windows(ts[si], ws, we)]
    ci = np.flatnonzero((dev < 0) & (kind == K_CPU_OP))
    site = outermost_op(ts[ci], end[ci], tid[ci], nid[ci], ts[si], end[si], tid[si])
    sites = [(op_label(rd.names, k), t / NS_PER_MS / n, float(np.count_nonzero(site == k)) / n)
             for k, t in top_ids(site, end[si] - ts[si])]
    return DeviceIdle(
        device_idle_ms_per_step=per_step(idle), idle_head_ms_per_step=per_step(head),
        idle_tail_ms_per_step=per_step(tail),
        idle_between_ms_per_step=per_step(iv.subtract(idle, iv.union_all(head, tail))),
        idle_input_ms_per_step=per_step(p_input), idle_after_sync_ms_per_step=per_step(p_sync),
        idle_host_ops_ms_per_step=per_step(p_ops), idle_host_other_ms_per_step=per_step(p_other),
        idle_top_host_ops=top_ops, sync_ms_per_step=per_step(sync), syncs_per_step=float(np.count_nonzero(sync_in)) / n,
        sync_calls_per_step=float(si.size) / n, sync_sites=sites)


