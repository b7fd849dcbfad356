"""Student's t, one-sided: the quantile behind the report diff's confidence bounds (analysis/report/diff.py).

Closed forms, so that the analysis needs no SciPy.
"""

from __future__ import annotations

import functools
import math

__all__ = ["t_quantile"]


def _t_tail(t: float, df: int) -> float:
    """P(T > t) for Student's t with integer df ≥ 1 and t ≥ 0 (the closed forms in cos θ, θ = atan(t/√df))."""
    if df > 400:  # normal limit, within 1e-3 relative here
        return 0.5 * math.erfc(t / math.sqrt(2))
    th = math.atan(t / math.sqrt(df))
    c2, term = math.cos(th) ** 2, 1.0
    if df % 2:
        acc = 0.0
        if df > 1:
            acc = term = 1.0
            for k in range(3, df - 1, 2):
                term *= c2 * (k - 1) / k
                acc += term
            acc *= math.sin(th) * math.cos(th)
        inside = 2 / math.pi * (th + acc)
    else:
        acc = 1.0
        for k in range(2, df - 1, 2):
            term *= c2 * (k - 1) / k
            acc += term
        inside = math.sin(th) * acc
    return max(0.0, (1.0 - inside) / 2)


@functools.lru_cache(maxsize=4096)
def t_quantile(alpha: float, df: int) -> float:
    """The t with P(T > t) = alpha (one-sided, 0 < alpha < 0.5) for Student's t with df ≥ 1, by bisection."""
    lo, hi = 0.0, 1.0
    while _t_tail(hi, df) > alpha:
        hi *= 2
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _t_tail(mid, df) > alpha else (lo, mid)
    return hi
