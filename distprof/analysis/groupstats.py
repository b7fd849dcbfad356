"""Statistics per group of a labelled array, vectorised (one sort): what the straggler rule and the step graph's
replay both take."""

from __future__ import annotations

import numpy as np

__all__ = ["group_median"]


def group_median(g: np.ndarray, v: np.ndarray, n_groups: int) -> np.ndarray:
    """Per-group median of v (NaN for empty groups); g in 0..n_groups−1."""
    o = np.lexsort((v, g))
    gs, vs = g[o], np.asarray(v, np.float64)[o]
    cnt = np.bincount(gs, minlength=n_groups)
    first = np.r_[0, np.cumsum(cnt)[:-1]]
    med = np.full(n_groups, np.nan)
    ok = cnt > 0
    lo = first[ok] + (cnt[ok] - 1) // 2
    hi = first[ok] + cnt[ok] // 2
    med[ok] = (vs[lo] + vs[hi]) / 2
    return med
