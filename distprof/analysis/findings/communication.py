"""Communication rule: communication the step waits for (measured in :mod:`.measures`).

* ``exposed_comm`` — exposed communication (``steps.exposed_comm_ms``) net of the rank's wait for named stragglers
  (the stragglers' ``waits_for_named``: its time in collectives until a named rank arrived, overlapping waits once;
  that wait is the straggler's finding) and of a pipeline stage's transfers, waits included (the
  ``pipeline_bubble`` finding's). Fires when the net share reaches
  ``exposed_min_pct`` (10 %) of step time. The advice fits the job's parallelism and the collectives whose time is
  exposed the most (``parallelism.advice_for_exposed``: DDP buckets, FSDP prefetch / reshard_after_forward, tensor
  parallel placement / sequence parallel / async TP, all-to-all overlap for experts).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..types import FindingRules
from .rules import Hit, pct

if TYPE_CHECKING:
    from ..rank.measures import RankMeasures


def exposed_comm(ms: list[RankMeasures], rules: FindingRules, straggler_wait: dict[int, float],
                 pipeline_wait: dict[int, float] | None = None) -> list[Hit]:
    """`straggler_wait`: per rank, its wait for the named stragglers per step (ms)."""
    hits = []
    pipeline_wait = pipeline_wait or {}
    for m in ms:
        exp_ = m.exposed_comm_ms_per_step
        wait = min(max(straggler_wait.get(m.rank, 0.0), 0.0), exp_)
        pipe = min(max(pipeline_wait.get(m.rank, 0.0), 0.0), exp_ - wait)
        net = exp_ - wait - pipe
        impact = pct(net, m.step_ms)
        if impact >= rules.exposed_min_pct:
            hits.append(Hit(m.rank, m.host, impact, {
                "exposed_comm_ms_per_step": exp_, "exposed_pct": pct(exp_, m.step_ms),
                "straggler_wait_ms_per_step": wait, "pipeline_wait_ms_per_step": pipe,
                "net_exposed_ms_per_step": net, "comm_ms_per_step": m.comm_ms_per_step,
                "overlap_pct": m.overlap_pct if m.overlap_pct is not None else 0.0,
                "step_ms": m.step_ms, "threshold_step_pct": rules.exposed_min_pct}))
    return hits


def exposed_comm_text(m, where, worst, advice: str | None = None):
    title = f"Exposed communication on {where}: {m['impact_pct']:.0f} % of step time"
    ev = (f"{m['exposed_comm_ms_per_step']:.1f} ms of the {m['step_ms']:.1f} ms step "
          f"({m['exposed_pct']:.0f} %) waits for communication; ")
    if m["straggler_wait_ms_per_step"] > 0:
        ev += f"about {m['straggler_wait_ms_per_step']:.1f} ms of it is the wait for the straggler (its own finding), "
    if m.get("pipeline_wait_ms_per_step", 0) > 0:
        ev += f"{m['pipeline_wait_ms_per_step']:.1f} ms is pipeline transfers and bubble (their own finding), "
    if m["straggler_wait_ms_per_step"] > 0 or m.get("pipeline_wait_ms_per_step", 0) > 0:
        ev += f"leaving {m['net_exposed_ms_per_step']:.1f} ms ({m['impact_pct']:.0f} %); "
    ev += (f"{m['overlap_pct']:.0f} % of the {m['comm_ms_per_step']:.1f} ms/step of communication overlaps compute. "
           f"Rule: exposed communication net of straggler and pipeline waits >= {m['threshold_step_pct']:.0f} % of "
           "step time.")
    if advice is None:
        from ..cross.parallelism import advice_for_exposed

        advice = advice_for_exposed(None, [])
    return title, ev, advice
