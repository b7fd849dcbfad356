"""The frame every rule shares: thresholds (:class:`FindingRules`), severity, a rule's hit on one rank, and how
hits become findings.

Every rule measures a share of step time "at stake" (``metrics["impact_pct"]``); severity follows from it:
**high** ≥ 25 %, **medium** ≥ 10 %, else **low** (``FindingRules.high_pct`` / ``medium_pct``). A rule that fires on
at least half of the ranks (and more than one) gives one finding with ``rank = None`` (metrics are means over those
ranks, plus ``n_ranks`` and ``worst_rank``); otherwise one finding per rank, the worst ``max_per_rule`` ranks
(:func:`group`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..names import rank_ranges
from ..types import FindingRules
from .finding import SEVERITY_ORDER, Finding


@dataclass
class Hit:
    rank: int
    host: str
    impact_pct: float
    metrics: dict[str, float]
    severity: str | None = None  # set by rules without a time impact
    notes: dict[str, Any] = field(default_factory=dict)  # non-numeric evidence (names), of this rank


def pct(x: float, of: float) -> float:
    return 100.0 * x / of if of > 0 else 0.0


def group(rule_id: str, hits: list[Hit], n_ranks: int, rules: FindingRules, text) -> list[Finding]:
    """One finding for many ranks, else one per rank (worst first).

    `text(metrics, where, worst_hit)` returns (title, evidence, advice).
    """
    if not hits:
        return []
    hits = sorted(hits, key=lambda h: (-h.impact_pct, -h.metrics.get("times_threshold", 0.0), h.rank))

    def sev(h: Hit) -> str:
        return h.severity or rules.severity(h.impact_pct)

    if len(hits) > 1 and 2 * len(hits) >= n_ranks:
        keys = hits[0].metrics.keys()
        metrics = {k: float(np.mean([h.metrics[k] for h in hits])) for k in keys}
        metrics.update({"n_ranks": float(len(hits)), "worst_rank": float(hits[0].rank),
                        "impact_pct": float(np.mean([h.impact_pct for h in hits]))})
        where = f"all {n_ranks} ranks" if len(hits) == n_ranks else _some_ranks([h.rank for h in hits], n_ranks)
        sevs = [sev(h) for h in hits]
        severity = min(sevs, key=lambda s: (-sevs.count(s), SEVERITY_ORDER[s]))  # the most common, worst on ties
        if hits[0].severity is None:
            severity = rules.severity(metrics["impact_pct"])
        title, evidence, advice = text(metrics, where, hits[0])
        hosts = {h.host for h in hits}
        return [Finding(rule_id, severity, None, hosts.pop() if len(hosts) == 1 else None, title, evidence, advice,
                        metrics)]
    out = []
    for h in hits[: rules.max_per_rule]:
        metrics = {**h.metrics, "impact_pct": h.impact_pct}
        title, evidence, advice = text(metrics, f"rank {h.rank}", h)
        out.append(Finding(rule_id, sev(h), h.rank, h.host, title, evidence, advice, metrics))
    if len(hits) > rules.max_per_rule:
        out[-1].evidence += f" ({len(hits) - rules.max_per_rule} more ranks not listed)"
    return out


def on_rank(where, worst) -> str:
    return "" if where.startswith("rank ") else f" (rank {worst.rank})"


#: The longest list of ranks a finding's title spells out.
_MAX_RANKS_TEXT = 60


def _some_ranks(ranks: list[int], n_ranks: int) -> str:
    """'k of n ranks (0-3,7)'; when that list is long, the ranks left out instead ('all but 5,9'), else the count
    alone (the ranks are in the per-rank sections of report.json)."""
    listed = rank_ranges(ranks, sep=",")
    if len(listed) <= _MAX_RANKS_TEXT:
        return f"{len(ranks)} of {n_ranks} ranks ({listed})"
    hit = {int(r) for r in ranks}
    others = sorted(set(range(n_ranks)) - hit)
    but = rank_ranges(others, sep=",")
    if others and max(hit) < n_ranks and len(but) <= _MAX_RANKS_TEXT:  # ranks 0..n-1: the rest are the others
        return f"{len(ranks)} of {n_ranks} ranks (all but {but})"
    return f"{len(ranks)} of {n_ranks} ranks"
