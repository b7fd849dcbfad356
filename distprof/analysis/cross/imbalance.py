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
from typing import TYPE_CHECKING, Any

import numpy as np

Table = dict[str, np.ndarray]

if TYPE_CHECKING:
    from ..types import RunSummary

logger = logging.getLogger(__name__)

__all__ = ["per_rank_metrics", "imbalance_stats", "imbalance", "METRICS"]

METRICS = ("compute_ms", "flops", "tflops", "peak_mem_bytes", "step_ms")


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


def imbalance_stats(values, ranks) -> dict[str, Any]:
    """min/mean/max/max_rank/min_rank/lambda/cv/lb/max_over_min of one metric (NaN values ignored)."""
    v = np.asarray(values, np.float64)
    r = np.asarray(ranks)
    ok = np.isfinite(v)
    v, r = v[ok], r[ok]
    if v.size == 0:
        return {k: None for k in ("min", "mean", "max", "max_rank", "min_rank", "lambda", "cv", "lb", "max_over_min")}
    mean = float(v.mean())
    vmax, vmin = float(v.max()), float(v.min())
    return {
        "min": vmin,
        "mean": mean,
        "max": vmax,
        "max_rank": int(r[int(np.argmax(v))]),
        "min_rank": int(r[int(np.argmin(v))]),
        "lambda": vmax / mean - 1.0 if mean > 0 else None,
        "cv": float(v.std()) / mean if mean > 0 else None,
        "lb": mean / vmax if vmax > 0 else None,
        "max_over_min": vmax / vmin if vmin > 0 else None,
    }


def imbalance(run: RunSummary) -> dict[str, Any]:
    """``{"per_rank": [{rank, n_steps, <metrics>}], "metrics": {metric: stats}}``."""
    pr = per_rank_metrics(run.steps)
    per_rank = [
        {"rank": int(pr["rank"][i]), "n_steps": int(pr["n_steps"][i]), **{m: float(pr[m][i]) for m in METRICS}}
        for i in range(pr["rank"].size)
    ]
    out = {"per_rank": per_rank, "metrics": {m: imbalance_stats(pr[m], pr["rank"]) for m in METRICS}}
    _add_reserved_peaks(run, out)
    return out


def _add_reserved_peaks(run: RunSummary, out: dict[str, Any]) -> None:
    """With --memory-history: per rank the allocator's reserved peak (max over steps and devices), the footprint
    that decides OOMs; added as metric ``reserved_peak_bytes`` (None for ranks without history)."""
    by_rank = {r: s.reserved_peak_bytes for r, s in run.ranks.items() if s.reserved_peak_bytes is not None}
    if not by_rank:
        return
    for row in out["per_rank"]:
        row["reserved_peak_bytes"] = by_rank.get(row["rank"])
    vals = [r["reserved_peak_bytes"] for r in out["per_rank"] if r["reserved_peak_bytes"] is not None]
    rks = [r["rank"] for r in out["per_rank"] if r["reserved_peak_bytes"] is not None]
    out["metrics"]["reserved_peak_bytes"] = imbalance_stats(vals, rks)
