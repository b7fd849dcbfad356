"""Values against a member's peers: the median of the *other* members of its group, never its own.

Every comparison of the straggler rule sets a value against the median of the others in the same group (an
instance's other members, a step's other ranks): a rank's own value would pull the reference toward itself, and the
median is robust to the odd late peer. ``MAD_TO_SIGMA`` turns a median absolute deviation into a σ estimate (the
ranks' arrival jitter, the run's step-to-step noise).
"""

from __future__ import annotations

import numpy as np

from ...groupstats import sort_within
from ...narrow import index_dtype

__all__ = ["MAD_TO_SIGMA", "excess_by", "group_bounds", "median_of_others"]

MAD_TO_SIGMA = 1.4826


def group_bounds(key: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For a sorted, non-empty key: per row (its group's first row, its group's size, its position in the group)."""
    new = np.r_[True, key[1:] != key[:-1]]
    dt = index_dtype(key.size)  # row numbers and counts (not times): 32 bits where they fit
    f_of = np.flatnonzero(new).astype(dt)
    n_of = np.diff(np.r_[f_of, key.size]).astype(dt)
    gi = np.cumsum(new)
    gi -= 1  # in place, as below: these run over every instance row (1.4 M at 1,024 LLM-shaped ranks)
    first, n = f_of[gi], n_of[gi]
    del gi
    pos = np.arange(key.size, dtype=dt)
    pos -= first
    return first, n, pos


def median_of_others(first: np.ndarray, n: np.ndarray, pos: np.ndarray, x: np.ndarray) -> np.ndarray:
    """For rows sorted by (group, x): median of the group's x without the row itself (rows of groups with n ≥ 2)."""
    # m = n − 1 values left: the (m − 1) // 2-th and m // 2-th smallest of them
    def rem(j: np.ndarray) -> np.ndarray:  # j-th smallest of the others (j is consumed)
        j += j >= pos
        j += first
        return x[j].astype(np.float64, copy=False)

    out = rem((n - 2) // 2)
    out += rem((n - 1) // 2)
    out /= 2
    return out


def excess_by(key: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Each value minus the median of the other values with the same key (0 subtracted where it is alone)."""
    if key.size == 0:
        return np.zeros(0)
    o = sort_within(key, values)
    v = values[o]
    first, n, pos = group_bounds(key[o])
    many = n >= 2
    if many.all():  # every group has others (a collective's instances): no masked copies of the row columns
        ref = median_of_others(first, n, pos, v)
    else:
        ref = np.zeros(v.size)
        ref[many] = median_of_others(first[many], n[many], pos[many], v)
    del first, n, pos, many
    out = np.empty(v.size)
    out[o] = v - ref
    return out
