"""Load imbalance across ranks (POP / Pearce et al. formulas).

Per rank, over its analysed steps: ``compute_ms`` (mean per step, from the step breakdown), ``flops`` (mean per step,
torch's FLOP counts), ``tflops`` (achieved: Σ FLOPs / Σ step time — wall-clock throughput, the MFU numerator),
``peak_mem_bytes`` (max over steps) and ``step_ms`` (mean). For each metric with values L_r and mean L̄:
min, mean, max, ``max_rank``, ``min_rank``, ``lambda = L_max/L̄ − 1`` (percent imbalance / 100), ``cv = σ/L̄``
(population σ), ``lb = L̄/L_max`` (POP load balance), ``max_over_min`` (slowdown). Ratios are None when undefined
(zero mean or max).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from ...record import Record, json_key, omit_if_none

Table = dict[str, np.ndarray]

if TYPE_CHECKING:
    from ..types import RunSummary

logger = logging.getLogger(__name__)

__all__ = ["per_rank_metrics", "imbalance_stats", "imbalance", "METRICS", "Imbalance", "ImbalanceRank",
           "ImbalanceStats"]

METRICS = ("compute_ms", "flops", "tflops", "peak_mem_bytes", "step_ms")


@dataclass
class ImbalanceStats(Record):
    """One metric over the ranks (see the module docstring); every value None when no rank has the metric."""

    min: float | None = None
    mean: float | None = None
    max: float | None = None
    max_rank: int | None = None
    min_rank: int | None = None
    lambda_: float | None = json_key("lambda")  # L_max / mean - 1
    cv: float | None = None
    lb: float | None = None
    max_over_min: float | None = None


@dataclass
class ImbalanceRank(Record):
    """One rank's metrics (means per step; peak memory the max over steps)."""

    rank: int
    n_steps: int
    compute_ms: float
    flops: float
    tflops: float | None  # None without step time
    peak_mem_bytes: float
    step_ms: float
    reserved_peak_bytes: float | None = omit_if_none()  # with --memory-history only (absent for a rank without)


@dataclass
class Imbalance(Record):
    """The ``imbalance`` section: per rank its metrics, per metric its spread over the ranks."""

    per_rank: list[ImbalanceRank] = field(default_factory=list)
    metrics: dict[str, ImbalanceStats] = field(default_factory=dict)  # METRICS (+ reserved_peak_bytes) -> stats


def per_rank_metrics(bd: Table) -> Table:
    """Columns rank, n_steps and every metric in ``METRICS`` (float64), from a step breakdown table."""
    ranks, idx = np.unique(bd["rank"], return_inverse=True)
    n = np.bincount(idx, minlength=ranks.size).astype(np.float64)

    def tot(col: str) -> np.ndarray:
        return np.bincount(idx, weights=bd[col].astype(np.float64), minlength=ranks.size)

    step_tot = tot("step_ms")
    flops_tot = tot("flops")
    peak = np.zeros(ranks.size)
    np.maximum.at(peak, idx, bd["peak_mem_bytes"].astype(np.float64))
    with np.errstate(invalid="ignore", divide="ignore"):
        tflops = np.where(step_tot > 0, flops_tot / (step_tot * 1e-3) / 1e12, np.nan)
    nn = np.maximum(n, 1)
    return {
        "rank": ranks.astype(np.int64),
        "n_steps": n.astype(np.int64),
        "compute_ms": tot("compute_ms") / nn,
        "flops": flops_tot / nn,
        "tflops": tflops,
        "peak_mem_bytes": peak,
        "step_ms": step_tot / nn,
    }


def imbalance_stats(values, ranks) -> ImbalanceStats:
    """min/mean/max/max_rank/min_rank/lambda/cv/lb/max_over_min of one metric (NaN values ignored)."""
    v = np.asarray(values, np.float64)
    r = np.asarray(ranks)
    ok = np.isfinite(v)
    v, r = v[ok], r[ok]
    if v.size == 0:
        return ImbalanceStats()
    mean = float(v.mean())
    vmax, vmin = float(v.max()), float(v.min())
    return ImbalanceStats(
        min=vmin, mean=mean, max=vmax, max_rank=int(r[int(np.argmax(v))]), min_rank=int(r[int(np.argmin(v))]),
        lambda_=vmax / mean - 1.0 if mean > 0 else None, cv=float(v.std()) / mean if mean > 0 else None,
        lb=mean / vmax if vmax > 0 else None, max_over_min=vmax / vmin if vmin > 0 else None)


def imbalance(run: RunSummary) -> Imbalance:
    """Per rank its metrics, per metric its spread over the ranks."""
    pr = per_rank_metrics(run.steps)
    per_rank = [
        ImbalanceRank(rank=int(pr["rank"][i]), n_steps=int(pr["n_steps"][i]),
                      **{m: _finite_or_none(pr[m][i]) if m == "tflops" else float(pr[m][i]) for m in METRICS})
        for i in range(pr["rank"].size)
    ]
    out = Imbalance(per_rank, {m: imbalance_stats(pr[m], pr["rank"]) for m in METRICS})
    _add_reserved_peaks(run, out)
    return out


def _finite_or_none(x: float) -> float | None:
    x = float(x)
    return x if np.isfinite(x) else None


def _add_reserved_peaks(run: RunSummary, out: Imbalance) -> None:
    """With --memory-history: per rank the allocator's reserved peak (max over steps and devices), the footprint
    that decides OOMs; added as metric ``reserved_peak_bytes`` (left out for ranks without history)."""
    by_rank = {r: s.reserved_peak_bytes for r, s in run.ranks.items() if s.reserved_peak_bytes is not None}
    if not by_rank:
        return
    for row in out.per_rank:
        row.reserved_peak_bytes = by_rank.get(row.rank)
    have = [r for r in out.per_rank if r.reserved_peak_bytes is not None]
    out.metrics["reserved_peak_bytes"] = imbalance_stats([r.reserved_peak_bytes for r in have],
                                                         [r.rank for r in have])
