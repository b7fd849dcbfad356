"""What fixing each finding would gain: the what-if change a finding proposes (:mod:`..graph.whatif`), replayed.

    annotate_findings(run, found, graph=graph)   # sets estimated_gain_ms_per_step / predicted_step_ms, in place

A straggler (rank or host) → its ranks at their peers' median; exposed communication → overlapped; input wait,
CPU contention, device idle → removed, on the finding's rank (or every rank for a finding on many). Other findings
have no modelled change and get None. A finding asking for a change the report's what-if table has (or another
finding has) gets that replay's figures, not a new replay (:func:`..graph.whatif.estimator`, kept with the graph).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..graph.whatif import (
    Change,
    Estimator,
    NoCpuWait,
    NoIdle,
    NoInputWait,
    OverlapComm,
    Straggler,
    estimator,
)

if TYPE_CHECKING:
    from ..graph.critical_path import StepGraph
    from ..types import RunSummary
    from .finding import Finding

__all__ = ["annotate_findings", "change_for"]


def change_for(f: Finding, run: RunSummary) -> Change | None:
    """The change finding `f` proposes (on its rank, or its host's ranks, where it has them); None if none models it."""
    ranks = (int(f.rank),) if f.rank is not None else None
    if f.id == "straggler_rank" and f.rank is not None:
        return Straggler(ranks=(int(f.rank),))
    if f.id == "straggler_host":
        members = tuple(sorted(r for r, h in run.hosts.items() if h == f.host))
        return Straggler(ranks=members) if members else None
    kinds = {"exposed_comm": OverlapComm, "input_wait": NoInputWait, "cpu_contention": NoCpuWait,
             "device_idle": NoIdle}
    return kinds[f.id](ranks=ranks) if f.id in kinds else None


def annotate_findings(run: RunSummary, found: list[Finding], *, graph: StepGraph | None = None) -> None:
    """Give each finding ``estimated_gain_ms_per_step`` and ``predicted_step_ms`` (None where no change models it),
    in place."""
    est: Estimator | None = None
    for f in found:
        c = change_for(f, run)
        if c is None:
            f.estimated_gain_ms_per_step = None
            f.predicted_step_ms = None
            continue
        if est is None:
            est = estimator(run, graph)  # the graph's: the what-if table's replays are reused
        w = est.estimate(c)
        f.estimated_gain_ms_per_step = w.gain_ms_per_step
        f.predicted_step_ms = w.predicted_step_ms
