"""The clock-free cross-check: lateness from durations only, with no clock alignment.

A collective ends at about the same time on all ranks, so ``median_{r'≠r} d_r'i − d_ri`` (durations d) estimates ℓ
without any clock: per step the largest, the median over steps (``clock_free_lateness_ms``). On a run over several
hosts the rule (:mod:`.rule`) needs it to confirm a rank's lateness, so that a clock error cannot name a rank.
``agrees`` says whether its most-late rank is a named one (or, with nobody named, the same rank as the aligned
measure's).
"""

from __future__ import annotations

import numpy as np

from ...groupstats import sort_within
from .peers import median_of_others
from .result import ClockFreeCheck

__all__ = ["clock_free_check", "clock_free_lateness_ns"]


def clock_free_lateness_ns(inst: np.ndarray, first: np.ndarray, n: np.ndarray, d: np.ndarray) -> np.ndarray:
    """Per instance row (rows sorted by instance; its first row and size): the median of the instance's other
    durations ``d`` minus its own (float ns)."""
    od = sort_within(inst, d)  # durations sorted within the instance
    d_sorted = d[od].astype(np.float64, copy=False)  # as the medians read them: no cast per read
    at = np.arange(inst.size, dtype=first.dtype)  # in first's (narrow) type, and in place: every instance row
    at -= first[od]
    d_pos = np.empty(inst.size, first.dtype)
    d_pos[od] = at
    del od, at
    out = median_of_others(first, n, d_pos, d_sorted)
    out -= d
    return out


def clock_free_check(ranks: np.ndarray, mean_lat: np.ndarray, cf_lat: np.ndarray, confirmed: np.ndarray,
                     candidates: np.ndarray, named: list[int]) -> ClockFreeCheck:
    """The report's ``clock_free`` entry: the most-late rank by each measure, whether they agree, and per rank the
    lateness part of the rule names (`candidates`), whether the clock-free measure confirms it."""
    top_lat = int(ranks[int(np.argmax(mean_lat))])
    cf_top = int(ranks[int(np.argmax(cf_lat))])
    return ClockFreeCheck(
        top_rank=cf_top, top_rank_by_lateness=top_lat, agrees=(cf_top in named) if named else cf_top == top_lat,
        named_confirmed={str(int(ranks[i])): bool(confirmed[i]) for i in np.flatnonzero(candidates).tolist()})
