"""Device rules (GPU ranks): where the device sits idle and what the host did meanwhile, and the host's
synchronising calls. Their per-rank measures are taken in the map (``rank.device.device_measures``).

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

from typing import TYPE_CHECKING

from ..types import FindingRules
from .rules import Hit, on_rank, pct

if TYPE_CHECKING:
    from ..rank.measures import RankMeasures

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


_IDLE_FIELDS = ("device_idle_ms_per_step", "idle_head_ms_per_step", "idle_between_ms_per_step",
                "idle_tail_ms_per_step", "idle_input_ms_per_step", "idle_after_sync_ms_per_step",
                "idle_host_ops_ms_per_step", "idle_host_other_ms_per_step")


def device_idle(ms: list[RankMeasures], rules: FindingRules) -> list[Hit]:
    hits = []
    for m in ms:
        d = m.device
        if not m.device_rank or d is None:
            continue
        idle = d.device_idle_ms_per_step
        impact = pct(idle, m.step_ms)
        if impact >= rules.idle_min_step_pct and idle >= rules.idle_min_ms:
            met = {k: getattr(d, k) for k in _IDLE_FIELDS}
            met.update({"step_ms": m.step_ms, "kernels_per_step": m.ops.ops_per_step,
                        "tiny_kernels_per_step": m.ops.tiny_ops_per_step,
                        "threshold_step_pct": rules.idle_min_step_pct, "threshold_ms": rules.idle_min_ms,
                        "threshold_us": rules.tiny_op_us})
            hits.append(Hit(m.rank, m.host, impact, met, notes={"top_host_ops": d.idle_top_host_ops}))
    return hits


def host_sync(ms: list[RankMeasures], rules: FindingRules) -> list[Hit]:
    hits = []
    for m in ms:
        d = m.device
        if not m.device_rank or d is None:
            continue
        blocked = pct(d.sync_ms_per_step, m.step_ms)
        impact = pct(d.idle_after_sync_ms_per_step, m.step_ms)
        if d.syncs_per_step >= rules.sync_min_per_step and max(blocked, impact) >= rules.sync_min_step_pct:
            hits.append(Hit(m.rank, m.host, impact, {
                "sync_ms_per_step": d.sync_ms_per_step, "syncs_per_step": d.syncs_per_step,
                "sync_calls_per_step": d.sync_calls_per_step, "blocked_pct": blocked,
                "idle_after_sync_ms_per_step": d.idle_after_sync_ms_per_step, "step_ms": m.step_ms,
                "threshold_per_step": rules.sync_min_per_step, "threshold_step_pct": rules.sync_min_step_pct},
                notes={"sites": d.sync_sites}))
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
