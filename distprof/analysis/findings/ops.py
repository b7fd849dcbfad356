"""Op-size rule: many tiny ops or kernels (measured in :mod:`.measures`).

* ``tiny_ops`` — many tiny ops. CPU rank: top-level ``cpu_op`` events of the main thread (not nested in another op,
  not communication) in the rank's steps; device rank: compute kernels. Tiny = shorter than ``tiny_op_us`` (100 µs).
  Fires when tiny ops hold ≥ ``tiny_min_share_pct`` (50 %) of op time, number ≥ ``tiny_min_per_step`` (100) per step,
  and the impact reaches ``tiny_min_step_pct`` (10 %) of step time. Impact: the tiny ops' (kernels') own time; the
  device's idle time between small kernels is ``device_idle``'s, so no time is counted by both.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..types import FindingRules
from .rules import Hit, pct

if TYPE_CHECKING:
    from ..rank.measures import RankMeasures


def tiny_ops(ms: list[RankMeasures], rules: FindingRules) -> list[Hit]:
    hits = []
    for m in ms:
        o = m.ops
        impact = pct(o.tiny_ms_per_step, m.step_ms)  # device idle between them is device_idle's
        if (o.tiny_share_pct >= rules.tiny_min_share_pct and o.tiny_ops_per_step >= rules.tiny_min_per_step
                and impact >= rules.tiny_min_step_pct):
            hits.append(Hit(m.rank, m.host, impact, {
                "tiny_share_pct": o.tiny_share_pct, "tiny_ops_per_step": o.tiny_ops_per_step,
                "tiny_ms_per_step": o.tiny_ms_per_step, "tiny_median_us": o.tiny_median_us,
                "ops_per_step": o.ops_per_step, "op_ms_per_step": o.op_ms_per_step,
                "device_rank": float(m.device_rank),
                "step_ms": m.step_ms, "threshold_us": rules.tiny_op_us,
                "threshold_share_pct": rules.tiny_min_share_pct, "threshold_per_step": rules.tiny_min_per_step,
                "threshold_step_pct": rules.tiny_min_step_pct}))
    return hits


def tiny_ops_text(m, where, worst):
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
