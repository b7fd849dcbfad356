"""The step-time summary over every rank-step: the mean and largest step, and the share of step time in each part
of the breakdown (compute, exposed communication, memory copies, idle, other) — the report's ``summary`` section.

Shares are of the total step time over every rank-step (so longer steps weigh more); ``comm_pct`` counts all
communication, hidden or not, and ``overlap_pct`` is the share of it hidden under compute. None where undefined
(no step time, no communication).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...record import Record

__all__ = ["StepSummary", "step_summary"]


@dataclass
class StepSummary(Record):
    """The ``summary`` section (see the module docstring)."""

    n_rank_steps: int = 0
    n_steps: int = 0
    step_ms_mean: float | None = None
    step_ms_max: float | None = None
    compute_pct: float | None = None
    comm_pct: float | None = None
    exposed_comm_pct: float | None = None
    memcpy_pct: float | None = None
    idle_pct: float | None = None
    other_pct: float | None = None
    overlap_pct: float | None = None

    #: (field, label) of the parts that add up to the step, in the order they are shown.
    PARTS = (("compute_pct", "compute"), ("exposed_comm_pct", "exposed communication"), ("memcpy_pct", "memcpy"),
             ("idle_pct", "idle"), ("other_pct", "other"))

    def ms_of(self, pct: float | None) -> float | None:
        """A share of the mean step in milliseconds (None when either is unknown)."""
        return None if pct is None or self.step_ms_mean is None else pct * self.step_ms_mean / 100


def step_summary(bd: dict[str, np.ndarray]) -> StepSummary:
    """The summary of a run's step breakdown table `bd` (``RunSummary.steps``)."""
    total = float(bd["step_ms"].sum())
    n = int(bd["step"].size)

    def pct(col: str) -> float | None:
        return 100.0 * float(bd[col].sum()) / total if total > 0 else None

    comm = float(bd["comm_ms"].sum())
    return StepSummary(
        n_rank_steps=n, n_steps=int(np.unique(bd["step"]).size), step_ms_mean=total / n if n else None,
        step_ms_max=float(bd["step_ms"].max()) if n else None, compute_pct=pct("compute_ms"), comm_pct=pct("comm_ms"),
        exposed_comm_pct=pct("exposed_comm_ms"), memcpy_pct=pct("memcpy_ms"), idle_pct=pct("idle_ms"),
        other_pct=pct("other_ms"),
        overlap_pct=100.0 * float(bd["overlapped_ms"].sum()) / comm if comm > 0 else None)
