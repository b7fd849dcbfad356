"""Device rules (GPU ranks): where the device sits idle and what the host did meanwhile, and the host's
synchronising calls; with their per-rank measures (:func:`device_measures`).

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
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from ...storage.schema import KIND_CODE
from .. import intervals as iv
from ..gpu_time import GPU_KINDS
from ..index import RankIndex
from ..rankdata import RankData
from .events import (K_CPU_OP, K_CUDA_SYNC, NS_PER_MS, edge_gaps, in_windows, leaf_ops, op_label, outermost_op,
                     starts_inside, top_ids)
from .rules import FindingRules, Hit, on_rank, pct


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


def device_measures(rd: RankData, ix: RankIndex, e: dict[str, np.ndarray], ws: np.ndarray, we: np.ndarray,
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


def device_idle(ms: list[dict], rules: FindingRules) -> list[Hit]:
    hits = []
    for m in ms:
        if not m["device_rank"]:
            continue
        idle = m["device_idle_ms_per_step"]
        impact = pct(idle, m["step_ms"])
        if impact >= rules.idle_min_step_pct and idle >= rules.idle_min_ms:
            met = {k: m[k] for k in ("device_idle_ms_per_step", "idle_head_ms_per_step", "idle_between_ms_per_step",
                                     "idle_tail_ms_per_step", "idle_input_ms_per_step", "idle_after_sync_ms_per_step",
                                     "idle_host_ops_ms_per_step", "idle_host_other_ms_per_step", "step_ms")}
            met.update({"kernels_per_step": m["ops_per_step"], "tiny_kernels_per_step": m["tiny_ops_per_step"],
                        "threshold_step_pct": rules.idle_min_step_pct, "threshold_ms": rules.idle_min_ms,
                        "threshold_us": rules.tiny_op_us})
            hits.append(Hit(m["rank"], m["host"], impact, met, notes={"top_host_ops": m["idle_top_host_ops"]}))
    return hits


def host_sync(ms: list[dict], rules: FindingRules) -> list[Hit]:
    hits = []
    for m in ms:
        if not m["device_rank"]:
            continue
        blocked = pct(m["sync_ms_per_step"], m["step_ms"])
        impact = pct(m["idle_after_sync_ms_per_step"], m["step_ms"])
        if m["syncs_per_step"] >= rules.sync_min_per_step and max(blocked, impact) >= rules.sync_min_step_pct:
            hits.append(Hit(m["rank"], m["host"], impact, {
                "sync_ms_per_step": m["sync_ms_per_step"], "syncs_per_step": m["syncs_per_step"],
                "sync_calls_per_step": m["sync_calls_per_step"], "blocked_pct": blocked,
                "idle_after_sync_ms_per_step": m["idle_after_sync_ms_per_step"], "step_ms": m["step_ms"],
                "threshold_per_step": rules.sync_min_per_step, "threshold_step_pct": rules.sync_min_step_pct},
                notes={"sites": m["sync_sites"]}))
    return hits


def device_idle_text(m, where, worst):
    title = f"Device idle on {where}: no kernel or copy runs for {m['impact_pct']:.0f} % of step time"
    tops = worst.notes.get("top_host_ops") or []
    mostly = (" (largest: " + ", ".join(f"{n} {t:.2f} ms" for n, t in tops) + on_rank(where, worst) + ")"
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


def host_sync_text(m, where, worst):
    title = (f"Host synchronisation on {where}: {m['syncs_per_step']:.1f} syncs per step block the host "
             f"{m['sync_ms_per_step']:.2f} ms")
    sites = worst.notes.get("sites") or []
    ev = (f"the host waits for the device in synchronising calls {m['syncs_per_step']:.1f} times per step, for "
          f"{m['sync_ms_per_step']:.2f} ms of the {m['step_ms']:.1f} ms step ({m['blocked_pct']:.0f} %); after them "
          f"the device sits idle {m['idle_after_sync_ms_per_step']:.2f} ms per step ({m['impact_pct']:.0f} % of "
          f"step time, counted in device idle) until the host launches new work.")
    if sites:
        ev += (" Call sites" + on_rank(where, worst) + ": "
               + ", ".join(f"{n} {t:.2f} ms ({c:.1f} per step)" for n, t, c in sites) + ".")
    ev += (f" Rule: >= {m['threshold_per_step']:.0f} sync per step, and the blocked time or the device idle after "
           f"syncs >= {m['threshold_step_pct']:.0f} % of step time.")
    advice = ("Keep the host ahead of the device: avoid host syncs in the training loop - .item(), .cpu(), .tolist(), "
              "printing or logging a loss tensor every step (accumulate on the device, read every N steps), "
              "torch.cuda.synchronize(), data-dependent shapes (nonzero, boolean masks); copy inputs with "
              ".to(device, non_blocking=True) from pinned memory (DataLoader(pin_memory=True)). "
              "torch.cuda.set_sync_debug_mode(\"warn\") reports each synchronising call.")
    return title, ev, advice
