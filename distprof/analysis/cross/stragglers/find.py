"""The stragglers analysis end to end: instances, floor, per-rank measures and rule, the report's tables.

:func:`find_stragglers` runs the steps in order — the instances inside steps (:mod:`.instances`), the floor and
arrival jitter (:mod:`.floor`), the per-rank measures and the naming rule (:mod:`.measures`, :mod:`.rule`), the rank
rows and per-step stragglers (:mod:`.rows`), the clock-free summary (:mod:`.clock_free`) and the host table
(:mod:`.hosts`) — and returns them as one JSON-ready dict.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from .clock_free import clock_free_summary
from .floor import arrival_jitter_ms, threshold_ms
from .hosts import host_table
from .instances import collective_instances, inside_steps
from .measures import rank_measures
from .rows import per_step, rank_rows
from .rule import StragglerRule

if TYPE_CHECKING:
    from ...graph.critical_path import StepGraph
    from ...types import RunSummary
    from .instances import Table

__all__ = ["find_stragglers"]


def find_stragglers(run: RunSummary, *, rule: StragglerRule | None = None,
                    graph: StepGraph | None = None) -> dict[str, Any]:
    """Rank and host straggler tables, per-step stragglers and the naming rule (a JSON-ready dict).

    Keys: ``rule`` (text, threshold_ms and its parts), ``n_instances``, ``ranks`` (one dict per rank, named first,
    then by cost), ``named`` (ranks named, by cost), ``hosts``, ``per_step``, ``changes`` (steps where the step's
    straggler differs from the previous step's), ``clock_free``.
    """
    rule = rule or StragglerRule()
    t = inside_steps(collective_instances(run))
    jitter = arrival_jitter_ms(run, t)
    thr, parts = threshold_ms(run, rule, jitter)
    out = _empty_result(rule, thr, parts, t)
    if out["n_instances"] == 0:
        return out
    m = rank_measures(run, t, thr, rule, jitter, graph)
    out["rule"]["step_noise_ms"] = m.cons.step_noise_ms
    out["ranks"] = rank_rows(run, m)
    out["named"] = [d["rank"] for d in out["ranks"] if d["named"]]
    out["clock_free"] = clock_free_summary(m, out["named"], thr)
    out["per_step"], out["changes"] = per_step(m.cells, m.c_lat, m.c_exc, m.c_blame, m.ranks, thr)
    out["hosts"] = host_table(run, t, m.skey, m.blame_row, thr, rule)
    return out


def _empty_result(rule: StragglerRule, thr: float, parts: dict[str, float], t: Table) -> dict[str, Any]:
    """The result with the rule and the instance count, and every table empty (what a run without instances gets)."""
    return {
        "rule": {"text": rule.text(), "threshold_ms": thr, **parts, **asdict(rule)},
        "n_instances": int(t["inst"].max()) + 1 if t["inst"].size else 0,
        "ranks": [],
        "named": [],
        "hosts": [],
        "per_step": [],
        "changes": [],
        "clock_free": {"top_rank": None, "top_rank_by_lateness": None, "agrees": None, "named_confirmed": {}},
    }
