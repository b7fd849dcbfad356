"""Facts beside a rank's lateness: its CPU time and page faults per step against the other ranks'.

``cpu_time_ratio`` — a rank's mean CPU time per step (``steps.cpu_run_ms``) over the median of the other ranks'
means: above 1 in a balanced job, the same work ran slower on its CPU (a core shared with another process,
throttled, or slower). ``page_faults_per_step`` with ``others_page_faults_per_step`` (``steps.page_faults``): a rank
whose kernel maps memory for it anew every step. Neither takes part in the naming rule; the findings state them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .peers import median_of_others

if TYPE_CHECKING:
    from ...types import RunSummary

__all__ = ["cpu_time_ratios", "page_faults_per_step"]


def _rank_means(run: RunSummary, column: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ranks, each rank's mean of a steps column over its known steps, the median of the other ranks' means; NaN
    with one rank) — ranks without the value are left out."""
    st = run.steps
    v = np.asarray(st.get(column, np.zeros(0)), np.float64)
    ok = np.isfinite(v)
    u, idx = np.unique(np.asarray(st["rank"], np.int64)[ok], return_inverse=True)
    mean = np.bincount(idx, weights=v[ok]) / np.bincount(idx) if u.size else np.zeros(0)
    if u.size < 2:
        return u, mean, np.full(u.size, np.nan)
    o = np.argsort(mean, kind="stable")
    pos = np.empty(u.size, np.int64)
    pos[o] = np.arange(u.size)
    return u, mean, median_of_others(np.zeros(u.size, np.int64), np.full(u.size, u.size), pos, mean[o])


def page_faults_per_step(run: RunSummary) -> dict[int, tuple[float, float]]:
    """Per rank: (its mean page faults per step, the median of the other ranks' means) from ``steps.page_faults``
    (ranks without the value are left out; with one rank, the other's median is NaN)."""
    u, mean, ref = _rank_means(run, "page_faults")
    return {int(r): (float(m), float(q)) for r, m, q in zip(u.tolist(), mean.tolist(), ref.tolist())}


def cpu_time_ratios(run: RunSummary) -> dict[int, float]:
    """Per rank: its mean CPU time per step (``steps.cpu_run_ms``) over the median of the other ranks' means — how
    much slower its CPU ran the same work when the job is balanced (ranks without the value are left out)."""
    u, mean, ref = _rank_means(run, "cpu_run_ms")
    good = ref > 0
    return {int(r): float(m / q) for r, m, q in zip(u[good].tolist(), mean[good].tolist(), ref[good].tolist())}
