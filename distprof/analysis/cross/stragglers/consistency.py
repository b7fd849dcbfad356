"""Consistency across steps: whether a group's (rank's or host's) excess lateness is more than chance.

Parts (2) and (3) of the naming rule (:mod:`.rule`), from the per-step excess (:mod:`.cells`):

* (2) its excess is ≥ the floor in at least ``min_late_fraction`` of its steps (arrival order consistent across
  steps);
* (3) over its steps, either *steadily late*: the lower one-sided confidence bound of its mean excess (Student's t,
  :mod:`.student_t`, ``confidence`` for the whole run: the error rate is split over the ranks, Bonferroni) ≥ the
  floor — lateness that comes and goes with scheduling noise has a wide bound and is not named, however large one
  step's was — or *often far out*: its excess is ≥ ``outlier_z`` × the run's step-to-step noise (1.4826 × the median
  absolute deviation of each rank's excess around its own median, pooled over ranks) in ≥ ``min_late_fraction`` of
  its steps and in at least two (a rank 20 ms late in 4 of 6 steps of a run whose ranks otherwise agree to 0.3 ms);
  with a single step, its excess ≥ ``single_step_factor`` × the floor and ≥ a given minimum (for ranks,
  ``jitter_factor`` × the arrival jitter, :mod:`.floor`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ...groupstats import group_median
from .peers import MAD_TO_SIGMA
from .student_t import t_quantile

if TYPE_CHECKING:
    from .cells import Cells
    from .rule import StragglerRule

__all__ = ["Consistency", "consistency"]


@dataclass
class Consistency:
    """Per group (rank or host) over its steps: excess lateness statistics and the naming test's parts."""

    n_steps: np.ndarray
    mean_excess: np.ndarray
    excess_bound: np.ndarray  # lower one-sided confidence bound of the mean excess (NaN with one step)
    excess_step_fraction: np.ndarray  # share of its steps with excess >= the floor
    outlier_step_fraction: np.ndarray  # share of its steps with excess >= max(floor, outlier_z × step noise)
    step_noise_ms: float  # robust σ of a group's excess around its own median, pooled over groups
    passes: np.ndarray  # (2) and (3) of the rule


def _step_noise_ms(g: np.ndarray, c_exc: np.ndarray, n: np.ndarray, ng: int) -> float:
    """The run's step-to-step noise: each group's excess around its own median, robustly pooled (σ estimate)."""
    med = group_median(g, c_exc, ng)
    o = np.lexsort((c_exc, g))
    rank_in = np.empty(g.size, np.int64)
    rank_in[o] = np.arange(g.size) - np.r_[0, np.cumsum(n.astype(np.int64))[:-1]][g[o]]
    n_g = n[g].astype(np.int64)
    is_median = (n_g % 2 == 1) & (rank_in == n_g // 2)  # its deviation is 0 by construction: not a sample
    dev = np.abs(c_exc - med[g])[(n_g >= 2) & ~is_median]
    return MAD_TO_SIGMA * float(np.median(dev)) if dev.size else 0.0


def consistency(cells: Cells, c_exc: np.ndarray, ng: int, thr: float, rule: StragglerRule,
                single_step_min_ms: float) -> Consistency:
    """The consistency parts of the naming rule for each of ng groups, from per-cell excess lateness."""
    g = cells.group
    n = np.bincount(g, minlength=ng).astype(np.float64)
    den = np.maximum(n, 1)
    mean = np.bincount(g, weights=c_exc, minlength=ng) / den
    ss = np.bincount(g, weights=(c_exc - mean[g]) ** 2, minlength=ng)
    sd = np.sqrt(ss / np.maximum(n - 1, 1))
    alpha = (1 - rule.confidence) / max(int(np.count_nonzero(n)), 1)  # Bonferroni: the run's error rate
    tq = np.array([t_quantile(alpha, int(k) - 1) if k >= 2 else 0.0 for k in n])
    bound = np.where(n >= 2, mean - tq * sd / np.sqrt(den), np.nan)
    frac = np.bincount(g, weights=(c_exc >= thr).astype(float), minlength=ng) / den
    noise = _step_noise_ms(g, c_exc, n, ng)
    big = c_exc >= max(thr, rule.outlier_z * noise)
    n_big = np.bincount(g, weights=big.astype(float), minlength=ng)
    big_frac = n_big / den
    ok_steady = np.where(n >= 2, bound >= thr, mean >= max(rule.single_step_factor * thr, single_step_min_ms))
    ok_outlier = (n >= 2) & (n_big >= 2) & (big_frac >= rule.min_late_fraction)
    passes = (n > 0) & (frac >= rule.min_late_fraction) & (ok_steady | ok_outlier)
    return Consistency(n, mean, bound, frac, big_frac, noise, passes)
