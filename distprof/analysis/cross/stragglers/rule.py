"""The naming rule (:class:`StragglerRule`): lateness that is large, consistent across steps, and seen by both measures.

A rank is **named** iff

1. its mean lateness (less its CPU-wait excess, :mod:`.cpu_wait`) ≥ the floor (:mod:`.floor`);
2. its excess (:mod:`.cells`) ≥ the floor in at least ``min_late_fraction`` of its steps (arrival order consistent
   across steps), and
3. over its steps it is either *steadily late* or *often far out* (:mod:`.consistency`; with a single step, its
   excess ≥ ``single_step_factor`` × the floor and ≥ ``jitter_factor`` × the arrival jitter);
4. the clock-free cross-check confirms it (:mod:`.clock_free`), so a clock error cannot name a rank.

**Own work** is the other way to be named: its work before each step's first collective, over its peers', passes
(2) and (3) or a sign test (:mod:`.own_work`). Durations on one rank's clock need no clock check (4). Slow hosts are
named by the same rule on the hosts' arrivals (:mod:`.hosts`).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["StragglerRule"]


@dataclass(frozen=True)
class StragglerRule:
    """Thresholds of the naming rule (see the module docstring)."""

    min_lateness_ms: float = 1.0
    residual_factor: float = 3.0
    step_fraction: float = 0.02
    min_late_fraction: float = 0.5
    confidence: float = 0.99
    single_step_factor: float = 2.0
    jitter_factor: float = 1.5
    clock_free_factor: float = 0.5
    outlier_z: float = 4.0

    def text(self) -> str:
        return (
            f"a rank is named if its lateness (per step: latest arrival at the step's collectives minus the median of "
            f"the other ranks' arrivals, less how much longer it waited for a CPU before them) is at least the floor "
            f"max({self.min_lateness_ms:g} ms, "
            f"{self.residual_factor:g} x max clock residual, {self.step_fraction:g} x median step time), the "
            f"clock-free estimate from durations confirms it, and it is consistent across steps: either that lateness "
            f"exceeds the other ranks' by the floor in >= {self.min_late_fraction:.0%} of its steps and, over steps, "
            f"the lower confidence bound of that excess ({self.confidence:.0%} for the run, Bonferroni over ranks) is "
            f"above the floor or the excess is an outlier (>= {self.outlier_z:g} x the run's step-to-step noise) in "
            f">= {self.min_late_fraction:.0%} of its steps and at least 2 (one step: {self.single_step_factor:g} x "
            f"the floor and {self.jitter_factor:g} x the arrival jitter); or if its own work before each step's first "
            f"collective (its waits for a CPU left out) exceeds its peers' the same way, or by a median above the "
            f"floor in more steps than chance allows (sign test at the same confidence)"
        )
