"""The stragglers analysis end to end: instances, floor, per-rank measures and rule, the report's tables.

:func:`find_stragglers` runs the steps in order — the instances inside steps (:mod:`.instances`), the floor and
arrival jitter (:mod:`.floor`), the per-rank measures and the naming rule (:mod:`.measures`, :mod:`.rule`), the rank
rows and per-step stragglers (:mod:`.rows`), the clock-free summary (:mod:`.clock_free`) and the host table
(:mod:`.hosts`) — and returns them as one :class:`.result.Stragglers`.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING

from .clock_free import clock_free_summary
from .floor import arrival_jitter_ms, threshold_ms
from .hosts import host_table
from .instances import collective_instances, inside_steps
from .measures import rank_measures
from .result import StragglerInfo, StragglerRuleInfo, Stragglers
from .rows import per_step, rank_rows
from .rule import StragglerRule

if TYPE_CHECKING:
    from ...graph.critical_path import StepGraph
    from ...types import RunSummary

__all__ = ["find_stragglers"]


def find_stragglers(run: RunSummary, *, rule: StragglerRule | None = None,
                    graph: StepGraph | None = None) -> Stragglers:
    """Rank and host straggler tables, per-step stragglers and the naming rule (see :mod:`.result`)."""
    rule = rule or StragglerRule()
    t = inside_steps(collective_instances(run))
    jitter = arrival_jitter_ms(run, t)
    thr, parts = threshold_ms(run, rule, jitter)
    info = StragglerInfo(StragglerRuleInfo(text=rule.text(), threshold_ms=thr, **{**parts, **asdict(rule)}),
                         n_instances=int(t["inst"].max()) + 1 if t["inst"].size else 0)
    if info.n_instances == 0:
        return Stragglers([], info)
    m = rank_measures(run, t, thr, rule, jitter, graph)
    info.rule.step_noise_ms = m.cons.step_noise_ms
    ranks = rank_rows(run, m)
    info.named = [d.rank for d in ranks if d.named]
    info.clock_free = clock_free_summary(m, info.named, thr)
    info.per_step, info.changes = per_step(m.cells, m.c_lat, m.c_exc, m.c_blame, m.ranks, thr)
    info.hosts = host_table(run, t, m.skey, m.blame_row, thr, rule)
    return Stragglers(ranks, info)
