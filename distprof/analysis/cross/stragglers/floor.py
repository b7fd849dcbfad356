"""The lateness floor, below which lateness cannot be told from clock error and scheduling grain.

``threshold_ms = max(min_lateness_ms, residual_factor × largest per-host clock residual, step_fraction × median
step time)``. Every lateness, excess and cost the rule compares is set against it.

The **arrival jitter** is the ranks' ordinary scatter: 1.4826 × the median absolute deviation of arrivals within an
instance, the median over instances, taken over the ranks of one host and over all ranks, the smaller (needs three
ranks). It is reported with the floor and counts only for a run of a single step, where a rank is named when its
excess is ≥ ``single_step_factor`` × the floor and ≥ ``jitter_factor`` × the jitter.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ...groupstats import group_median
from .peers import MAD_TO_SIGMA
from .rule import StragglerRule

if TYPE_CHECKING:
    from ...types import RunSummary
    from .instances import Table

__all__ = ["arrival_jitter_ms", "threshold_ms"]

NS_PER_MS = 1e6


def arrival_jitter_ms(run: RunSummary, t: Table) -> float:
    """The ranks' ordinary arrival scatter (σ estimate, ms): see the module docstring. 0 when it cannot be estimated."""
    if t["inst"].size == 0:
        return 0.0
    a = t["arrival_ns"] - t["arrival_ns"][t["pos"] == 0][t["inst"]]  # small numbers: relative to the first arrival
    a = a.astype(np.float64) / NS_PER_MS
    estimates = []
    host_of = np.array([str(run.hosts.get(int(r), "?")) for r in t["rank"]], dtype=object).astype(str)
    _, hidx = np.unique(host_of, return_inverse=True)
    keys = [(t["inst"], 3)]  # with 2 arrivals the MAD is half the gap: a straggler would set its own threshold
    if int(hidx.max()) > 0:  # several hosts: a slow host's ranks agree with each other
        keys.insert(0, (t["inst"] * (int(hidx.max()) + 1) + hidx.reshape(-1), 2))
    for key, min_n in keys:
        _, g = np.unique(key, return_inverse=True)
        g = g.reshape(-1)
        ng = int(g.max()) + 1
        med, cnt = group_median(g, a, ng), np.bincount(g, minlength=ng)
        mad = group_median(g, np.abs(a - med[g]), ng)
        ok = cnt >= min_n
        if np.any(ok):
            estimates.append(MAD_TO_SIGMA * float(np.median(mad[ok])))
    return min(estimates) if estimates else 0.0


def threshold_ms(run: RunSummary, rule: StragglerRule, jitter_ms: float = 0.0) -> tuple[float, dict[str, float]]:
    """The lateness floor and its parts (ms); the arrival jitter is reported with it (it only counts for one step)."""
    residuals = [hc.residual_us for hc in run.clock.values() if hc.residual_us is not None]
    residual_ms = max(residuals) / 1e3 if residuals else 0.0
    st = run.steps
    step_ms = (np.asarray(st["end_ns"], np.int64) - np.asarray(st["start_ns"], np.int64)) / NS_PER_MS
    median_step_ms = float(np.median(step_ms)) if step_ms.size else 0.0
    parts = {
        "min_lateness_ms": rule.min_lateness_ms,
        "clock_residual_ms": residual_ms,
        "from_clock_residual_ms": rule.residual_factor * residual_ms,
        "median_step_ms": median_step_ms,
        "from_step_time_ms": rule.step_fraction * median_step_ms,
        "arrival_jitter_ms": jitter_ms,
        "from_jitter_ms": rule.jitter_factor * jitter_ms,
    }
    thr = max(parts["min_lateness_ms"], parts["from_clock_residual_ms"], parts["from_step_time_ms"])
    return thr, parts
