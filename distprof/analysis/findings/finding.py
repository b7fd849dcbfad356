"""A finding: one cause of slow training, found on one rank, a host, or many ranks, with its numbers and usual fix."""

from __future__ import annotations

from dataclasses import dataclass, field

from ...record import Record

__all__ = ["Finding", "SEVERITY_ORDER"]

#: Severities, most severe first.
SEVERITY_ORDER = {"high": 0, "medium": 1, "low": 2}


@dataclass
class Finding(Record):
    """One finding of the report (docs/report-format.md): the rule that fired, where, what it measured and advises.

    ``metrics`` holds the rule's numbers by name (``impact_pct`` always); ``estimated_gain_ms_per_step`` and
    ``predicted_step_ms`` come from the what-if replay of the change the finding proposes (None where no change
    models it, see :mod:`.gains`).
    """

    id: str  # the rule: straggler_rank, straggler_host, exposed_comm, input_wait, cpu_contention, ...
    severity: str  # high, medium, low
    rank: int | None  # None: a host, a pipeline, or many ranks (metrics then hold n_ranks and worst_rank)
    host: str | None
    title: str
    evidence: str
    advice: str
    metrics: dict[str, float] = field(default_factory=dict)
    estimated_gain_ms_per_step: float | None = None
    predicted_step_ms: float | None = None

    @property
    def impact_pct(self) -> float:
        return self.metrics.get("impact_pct", 0.0)
