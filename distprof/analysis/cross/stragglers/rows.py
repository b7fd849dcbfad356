"""Rows for the report: one row per rank (named first, then by cost), and the per-step straggler with its changes.

The rank rows carry the measures (:mod:`.measures`), the own-work test (:mod:`.own_work`) and the facts stated beside
the lateness (:mod:`.rank_means`); ``per_step`` names, per recorded step, the rank most in excess when its excess
reaches the floor, and ``changes`` the steps where that rank differs from the previous step's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .rank_means import cpu_time_ratios, page_faults_per_step
from .result import StragglerChange, StragglerRank, StragglerStep

if TYPE_CHECKING:
    from ...types import RunSummary
    from .cells import Cells
    from .measures import RankMeasures

__all__ = ["per_step", "rank_rows"]


def rank_rows(run: RunSummary, m: RankMeasures) -> list[StragglerRank]:
    """One row per rank, named first, then by cost, blame and lateness."""
    cpu_ratio = cpu_time_ratios(run)
    faults = page_faults_per_step(run)
    rows = [_rank_row(run, m, i, cpu_ratio, faults) for i in range(m.ranks.size)]
    rows.sort(key=lambda d: (not d.named, -d.cost_ms_per_step, -d.blame_ms, -d.mean_lateness_ms, d.rank))
    return rows


def _rank_row(run: RunSummary, m: RankMeasures, i: int, cpu_ratio: dict[int, float],
              faults: dict[int, tuple[float, float]]) -> StragglerRank:
    """The row of the i-th rank."""
    r = int(m.ranks[i])
    cons, own = m.cons, m.own
    no_own = own.n_steps[i] == 0
    return StragglerRank(
        rank=r, host=run.hosts.get(r, "?"), n_instances=int(m.cnt[i]), n_steps=int(cons.n_steps[i]),
        blame_ms=float(m.blame[i]), blame_ms_per_step=float(m.blame[i] / m.den[i]),
        mean_lateness_ms=float(m.mean_lat[i]), cpu_wait_excess_ms=float(m.mean_cpu[i]),
        lateness_not_cpu_wait_ms=float(m.mean_own[i]), cpu_time_ratio=cpu_ratio.get(r),
        page_faults_per_step=faults[r][0] if r in faults else None,
        others_page_faults_per_step=faults[r][1] if r in faults and np.isfinite(faults[r][1]) else None,
        mean_excess_ms=float(cons.mean_excess[i]),
        own_excess_ms=None if no_own else float(own.mean_excess[i]),
        own_excess_median_ms=None if no_own else float(own.median_excess[i]),
        own_excess_bound_ms=_or_none(own.excess_bound[i]),
        own_positive_fraction=None if no_own else float(own.positive_fraction[i]),
        own_sign_p=float(own.sign_p[i]), own_steps_consistent=bool(own.passes[i]),
        excess_bound_ms=_or_none(cons.excess_bound[i]), excess_step_fraction=float(cons.excess_step_fraction[i]),
        outlier_step_fraction=float(cons.outlier_step_fraction[i]), mean_instance_lateness_ms=float(m.inst_lat[i]),
        max_behind_first_ms=float(m.max_behind[i]), late_fraction=float(m.late_frac[i]),
        late_step_fraction=float(m.late_steps[i]), lost_ms_per_step=float(m.lost[i]), cost_ms_per_step=float(m.cost[i]),
        clock_free_lateness_ms=float(m.cf_lat[i]), clock_free_wait_ms=float(m.cf_wait_mean[i]),
        named=bool(m.named[i]))


def _or_none(x: float) -> float | None:
    return None if np.isnan(x) else float(x)


def per_step(cells: Cells, c_lat: np.ndarray, c_exc: np.ndarray, c_blame: np.ndarray, ranks: np.ndarray,
             thr: float) -> tuple[list[StragglerStep], list[StragglerChange]]:
    """Per recorded step: the rank most in excess, named when its excess reaches the floor; and where that changes."""
    real = cells.step >= 0
    o = np.lexsort((-c_exc[real], cells.step[real]))
    st, lat, exc = cells.step[real][o], c_lat[real][o], c_exc[real][o]
    grp, bl = cells.group[real][o], c_blame[real][o]
    first = np.flatnonzero(np.r_[True, st[1:] != st[:-1]]) if st.size else np.zeros(0, np.int64)
    out, changes = [], []
    prev: int | None = None
    for n, k in enumerate(first.tolist()):
        who = int(ranks[grp[k]]) if exc[k] >= thr else None
        out.append(StragglerStep(int(st[k]), who, float(lat[k]), float(exc[k]), float(bl[k]), int(ranks[grp[k]])))
        if n and who != prev:
            changes.append(StragglerChange(int(st[k]), prev, who))
        prev = who
    return out, changes
