"""User annotations across ranks: each ``record_function`` region's time and calls per step on every rank, side by
side, with the spread between ranks, so that marked code can be compared across ranks. Which regions count and how
one rank's figures are taken: ``rank.annotations``.

Per (name, rank): ``ms_per_step`` = the rank's total for the name divided by the number of steps the rank recorded
(a rank that never ran the region counts 0); ``count_per_step`` the same for the number of events. ``spread_pct`` =
100 · (max − min) / mean of ``ms_per_step`` over the ranks (``None`` with fewer than two ranks or a zero mean).
Names are ranked by their mean ``ms_per_step`` over ranks, largest first.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping

import numpy as np

from ...record import Record

if TYPE_CHECKING:
    from ..types import RunSummary

logger = logging.getLogger(__name__)

__all__ = ["annotations", "combine", "Annotation", "AnnotationRank"]


@dataclass
class AnnotationRank(Record):
    """One annotation on one rank, per step it recorded."""

    ms_per_step: float
    count_per_step: float


@dataclass
class Annotation(Record):
    """One user annotation across ranks."""

    name: str
    ranks: dict[str, AnnotationRank]  # "<rank>" -> its figures (every rank that recorded steps)
    spread_pct: float | None  # 100 (max - min) / mean of ms_per_step; None with < 2 ranks or a zero mean


def annotations(run: "RunSummary", *, max_names: int = 50) -> list[Annotation]:
    """Per user annotation its figures on every rank, largest first.

    At most `max_names` names are returned (the largest); see the module docstring for what counts.
    """
    return combine({r: s.annotations for r, s in run.ranks.items()},
                   {r: int(s.steps["step"].size) for r, s in run.ranks.items() if s.steps["step"].size},
                   max_names=max_names)


def combine(per_rank: Mapping[int, Mapping[str, tuple[float, float]]], n_steps: Mapping[int, int], *,
            max_names: int = 50) -> list[Annotation]:
    """:func:`annotations` from `per_rank` (rank -> ``rank_annotations``) and `n_steps` (rank -> steps recorded)."""
    ranks = np.array(sorted(n_steps), dtype=np.int64)
    all_names = sorted({n for a in per_rank.values() for n in a})
    if not all_names or ranks.size == 0:
        return []
    nn, nr = len(all_names), ranks.size
    pos = {n: i for i, n in enumerate(all_names)}
    tot = np.zeros((nn, nr))
    cnt = np.zeros((nn, nr))
    for j, r in enumerate(ranks.tolist()):
        for name, (t, c) in (per_rank.get(r) or {}).items():
            tot[pos[name], j] = t
            cnt[pos[name], j] = c
    steps = np.array([n_steps[r] for r in ranks.tolist()], dtype=np.float64)
    per_step = tot / np.maximum(steps, 1)[None, :]
    calls = cnt / np.maximum(steps, 1)[None, :]
    mean = per_step.mean(axis=1)
    order = np.argsort(-mean, kind="stable")
    if order.size > max_names:
        logger.info("%d user annotations; keeping the %d largest", order.size, max_names)
        order = order[:max_names]
    out = []
    for k in order:
        m = float(mean[k])
        spread = 100.0 * float(per_step[k].max() - per_step[k].min()) / m if nr >= 2 and m > 0 else None
        out.append(Annotation(
            name=all_names[k],
            ranks={str(int(r)): AnnotationRank(float(per_step[k, j]), float(calls[k, j])) for j, r in enumerate(ranks)},
            spread_pct=spread))
    return out
