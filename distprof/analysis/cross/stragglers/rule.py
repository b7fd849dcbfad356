"""The naming rule (:class:`StragglerRule`): who is named a straggler, in one paragraph (:meth:`StragglerRule.text`,
the same text as docs/report-format.md's).

A rank is named when its lateness in a step (:mod:`.lateness`) reaches the **floor** in at least ``min_late_fraction``
of its recorded steps (every step when it has fewer than 4). The floor is the largest of ``min_lateness_ms``,
``residual_factor`` × the largest clock residual (a clock error cannot name a rank), ``step_fraction`` × the median
step time, and ``noise_factor`` × the run's step-to-step noise — 1.4826 × the median absolute deviation of each
rank's largest lateness per step from its own median, over all ranks — but that last term never above
``max_noise_fraction`` × the median step time. Lateness that comes and goes with the scheduling of a busy host
raises the floor instead of naming someone (a rank late by the same amount every step adds no noise), and a rank late
by more than ``max_noise_fraction`` of the step in most steps is named however noisy the host. On a run over several
hosts the clock-free estimate (:mod:`.clock_free`) must confirm ``clock_free_factor`` of its lateness. A host is
named by the same rule on its latest rank's arrivals (:mod:`.hosts`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ...groupstats import group_median, sort_within
from .lateness import CHANCE_FULL, CHANCE_NONE
from .peers import MAD_TO_SIGMA

if TYPE_CHECKING:
    from ...types import RunSummary
    from .lateness import Cells

__all__ = ["StragglerRule", "floor_ms", "late_in_steps", "step_noise_ms"]

NS_PER_MS = 1e6
#: Below this many steps a rank must be late in every one of them.
EVERY_STEP_BELOW = 4


@dataclass(frozen=True)
class StragglerRule:
    """Thresholds of the naming rule (see the module docstring)."""

    min_lateness_ms: float = 1.0
    residual_factor: float = 3.0
    step_fraction: float = 0.02
    noise_factor: float = 1.5
    max_noise_fraction: float = 0.08
    min_late_fraction: float = 0.75
    clock_free_factor: float = 0.5

    def text(self) -> str:
        return (
            f"A rank's lateness in a step is its largest arrival at the step's collectives minus the median of the "
            f"other members' arrivals there, less the median of the other ranks' lateness in that step where positive "
            f"(chance lateness every rank has cancels; a late rank's lateness never drops below 0 by it): in full "
            f"while the rank's own is at most {CHANCE_FULL:g} x it, fading to nothing at {CHANCE_NONE:g} x (chance "
            f"does not add to a real delay). A rank is "
            f"named a straggler when its lateness reaches the floor in at least {self.min_late_fraction:.0%} of its "
            f"recorded steps (every step when it has fewer than {EVERY_STEP_BELOW}); the floor is the largest of "
            f"{self.min_lateness_ms:g} ms, {self.residual_factor:g} x the largest clock residual, "
            f"{self.step_fraction:g} x the median step time and {self.noise_factor:g} x the run's step-to-step noise "
            f"(1.4826 x the median absolute deviation of each rank's largest lateness per step from its own median), "
            f"the last never above {self.max_noise_fraction:g} x the median step time. On a run over "
            f"several hosts, its clock-free lateness (from durations) must be at least {self.clock_free_factor:g} x "
            f"its lateness (medians over its steps). A host is named by the same rule on its latest rank's arrivals."
        )


def step_noise_ms(cells: Cells, c_lat: np.ndarray, ng: int) -> float:
    """The run's step-to-step noise: each group's largest lateness per step (`c_lat`) around its own median over
    steps, robustly pooled (a σ estimate, ms; 0 with fewer than two steps)."""
    g = cells.group
    ok = np.isfinite(c_lat)
    g, v = g[ok], c_lat[ok]
    if g.size == 0:
        return 0.0
    n = np.bincount(g, minlength=ng)
    med = group_median(g, v, ng)
    o = sort_within(g, v)
    rank_in = np.empty(g.size, np.int64)
    rank_in[o] = np.arange(g.size) - np.r_[0, np.cumsum(n)[:-1]][g[o]]
    n_g = n[g]
    is_median = (n_g % 2 == 1) & (rank_in == n_g // 2)  # its deviation is 0 by construction: not a sample
    dev = np.abs(v - med[g])[(n_g >= 2) & ~is_median]
    return MAD_TO_SIGMA * float(np.median(dev)) if dev.size else 0.0


def floor_ms(run: RunSummary, rule: StragglerRule, noise_ms: float) -> tuple[float, dict[str, float]]:
    """The lateness floor and its parts (ms)."""
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
        "step_noise_ms": noise_ms,
        "from_noise_ms": min(rule.noise_factor * noise_ms, rule.max_noise_fraction * median_step_ms),
    }
    thr = max(parts["min_lateness_ms"], parts["from_clock_residual_ms"], parts["from_step_time_ms"],
              parts["from_noise_ms"])
    return thr, parts


def late_in_steps(cells: Cells, c_lat: np.ndarray, ng: int, thr: float,
                  rule: StragglerRule) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per group: (its steps, the share of them whose lateness reaches the floor, whether that share passes the
    rule)."""
    n = np.bincount(cells.group, minlength=ng)
    late = np.bincount(cells.group, weights=(c_lat >= thr).astype(float), minlength=ng)
    frac = late / np.maximum(n, 1)
    need = np.where(n < EVERY_STEP_BELOW, 1.0, rule.min_late_fraction)
    return n, frac, (n > 0) & (frac >= need - 1e-12)
