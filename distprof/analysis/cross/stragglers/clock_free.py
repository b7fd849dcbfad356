"""The clock-free cross-check: lateness from durations only, with no clock alignment.

A collective ends at about the same time on all ranks, so ``median_{r'≠r} d_r'i − d_ri`` estimates ℓ
(``clock_free_lateness_ms``, per step the largest, averaged over steps) and ``d_ri − min_r' d_r'i`` is how long r
waited (``clock_free_wait_ms``, DeepSpeed's "straggler effect"). Part (4) of the naming rule: its clock-free
lateness ≥ ``clock_free_factor`` × its mean lateness, so a clock error cannot name a rank. ``clock_free.agrees``
says whether the clock-free measure's most-late rank is a named one (or, with nobody named, the same rank as the
aligned measure's).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .peers import median_of_others
from .result import ClockFreeCheck

if TYPE_CHECKING:
    from .instances import Table
    from .measures import RankMeasures

__all__ = ["clock_free_lateness_ns", "clock_free_summary", "clock_free_wait_ms"]

NS_PER_MS = 1e6


def clock_free_lateness_ns(inst: np.ndarray, first: np.ndarray, n: np.ndarray, d: np.ndarray) -> np.ndarray:
    """Per instance row (rows sorted by instance; its first row and size): the median of the instance's other
    durations ``d`` minus its own (float ns)."""
    od = np.lexsort((d, inst))  # durations sorted within the instance
    d_sorted = d[od]
    d_pos = np.empty(inst.size, np.int64)
    d_pos[od] = np.arange(inst.size) - first[od]
    return median_of_others(first, n, d_pos, d_sorted) - d


def clock_free_wait_ms(t: Table, n_inst: int) -> np.ndarray:
    """Per instance row: its duration minus the shortest in the instance (ms), how long the rank waited there."""
    dur = t["dur_ns"] / NS_PER_MS
    dmin = np.full(n_inst, np.inf)
    np.minimum.at(dmin, t["inst"], dur)
    return dur - dmin[t["inst"]]


def clock_free_summary(m: RankMeasures, named: list[int], thr: float) -> ClockFreeCheck:
    """The report's ``clock_free`` entry: the most-late rank by each measure, whether they agree, and per rank that
    passes the aligned rule's (1)-(3), whether the clock-free measure confirms it."""
    ranks = m.ranks
    top_lat = int(ranks[int(np.argmax(m.mean_lat))])
    cf_top = int(ranks[int(np.argmax(m.cf_lat))])
    return ClockFreeCheck(
        top_rank=cf_top, top_rank_by_lateness=top_lat, agrees=(cf_top in named) if named else cf_top == top_lat,
        named_confirmed={str(int(ranks[i])): bool(m.confirmed[i]) for i in range(ranks.size)
                         if m.mean_own[i] >= thr and m.cons.passes[i]})
