"""Pipeline rule, from the pipeline analysis (:mod:`distprof.analysis.cross.pipeline`).

* ``pipeline_bubble`` — one finding per pipeline whose stages wait for each other (the bubble: receives waiting
  for a peer that has not sent yet) at least ``pipeline_min_pct`` (10 %) of step time on average. Impact: that mean
  bubble share. The evidence gives the stages, the micro-batches per step and the fill-and-drain bubble GPipe/1F1B
  would have with them, the busiest stage and whose sends the others waited for. Advice by cause: a stage the others
  wait for (≥ half the threshold of its step) → balance its layers when it also computes ≥ ``pipeline_imbalance_pct``
  (15 %) more than the median stage, else look outside compute on it; a stage with 15 % more compute → balance the
  layers; fewer than 4 micro-batches per stage → more micro-batches; always → interleaved or zero-bubble schedules of
  ``torch.distributed.pipelining``.
"""

from __future__ import annotations

from ..cross.pipeline import Pipeline
from ..names import rank_ranges
from ..types import FindingRules
from .finding import Finding


def pipeline_findings(pipes: list[Pipeline], rules: FindingRules) -> list[Finding]:
    out = []
    for p in pipes:
        if p.bubble_pct < rules.pipeline_min_pct:
            continue
        n = len(p.stages)
        by_rank = {s.rank: s for s in p.stages}
        bott, holds = by_rank[p.bottleneck_rank], by_rank[p.holds_rank]
        med_busy = p.median_busy_ms
        chain = " -> ".join(str(r) for r in p.ranks)
        ideal = (f"; with {p.micro_batches:g} micro-batches over {n} stages GPipe/1F1B leave "
                 f"{p.ideal_bubble_pct:.0f} % as fill and drain" if p.ideal_bubble_pct is not None else "")
        evidence = (f"ranks {chain} form a {n}-stage pipeline; its stages wait for each other {p.bubble_pct:.0f} % "
                    f"of step time on average (most: stage {max(p.stages, key=lambda s: s.wait_pct).stage}, "
                    f"{max(s.wait_pct for s in p.stages):.0f} %){ideal}. Stage {bott.stage} (rank {bott.rank}) "
                    f"computes the most, {bott.busy_ms:.1f} ms per step against {med_busy:.1f} ms for the median "
                    f"stage ({p.imbalance_pct:+.0f} %); the others wait {holds.caused_ms:.1f} ms per step for the "
                    f"sends of stage {holds.stage} (rank {holds.rank}). Rule: mean bubble >= "
                    f"{rules.pipeline_min_pct:.0f} % of step time.")
        advice = []
        holding = holds.caused_ms >= 0.5 * holds.step_ms * rules.pipeline_min_pct / 100
        if holding and holds.rank == bott.rank and p.imbalance_pct >= rules.pipeline_imbalance_pct:
            advice.append(f"Stage {holds.stage} (rank {holds.rank}) holds the others and computes the most "
                          f"({p.imbalance_pct:+.0f} % against the median stage): balance the stages — move layers "
                          "off it (split_spec / the layers given to each PipelineStage).")
        elif holding:
            advice.append(f"Stage {holds.stage} (rank {holds.rank}) holds the others although its compute is not "
                          "what sets it apart: its extra time is outside compute — look for work only that stage does "
                          "(data loading, logging, host-device copies, Python overhead, sleeps) and for CPU "
                          "contention on its host.")
        elif p.imbalance_pct >= rules.pipeline_imbalance_pct:
            advice.append(f"Balance the stages: stage {bott.stage} (rank {bott.rank}) has {p.imbalance_pct:.0f} % more "
                          "compute than the median stage; move layers off it (split_spec / the layers given to each "
                          "PipelineStage) or look for work only that stage does.")
        if p.micro_batches and p.micro_batches < 4 * n:
            advice.append(f"Use more micro-batches: {p.micro_batches:g} for {n} stages leaves a large fill and "
                          f"drain; n_microbatches >= {4 * n} shrinks it (a smaller micro-batch each).")
        advice.append("Schedules with less bubble: ScheduleInterleaved1F1B (several virtual stages per rank), "
                      "ScheduleInterleavedZeroBubble or ScheduleZBVZeroBubble from torch.distributed.pipelining, "
                      "instead of GPipe or plain 1F1B.")
        impact = p.bubble_pct
        out.append(Finding(
            id="pipeline_bubble", severity=rules.severity(impact), rank=None, host=None,
            title=f"Pipeline bubble: stages {rank_ranges(p.ranks, sep=',')} wait {p.bubble_pct:.0f} % of step time",
            evidence=evidence, advice=" ".join(advice),
            metrics={"impact_pct": impact, "bubble_pct": p.bubble_pct, "n_stages": float(n),
                     "micro_batches": p.micro_batches,
                     **({"ideal_bubble_pct": p.ideal_bubble_pct} if p.ideal_bubble_pct is not None else {}),
                     "bottleneck_rank": float(p.bottleneck_rank), "imbalance_pct": p.imbalance_pct,
                     "holds_rank": float(p.holds_rank), "threshold_pct": rules.pipeline_min_pct},
        ))
    return out


def pipeline_comm(pipes: list[Pipeline], with_collectives: set[int]) -> dict[int, float]:
    """rank -> ms per step of its pipeline transfers (waits included): the pipeline finding's, not exposed_comm's.
    A stage with no collective at all: all its exposed communication is the pipeline's (inf)."""
    return {s.rank: (s.p2p_ms if s.rank in with_collectives else float("inf")) for p in pipes for s in p.stages}
