"""Communication/computation overlap per rank and step (HTA's definition).

From the step breakdown (see ``breakdown.py`` for the sets): ``comm_ms = |K|`` (exec communication),
``overlapped_ms = |K ∩ C|`` (hidden under compute on another thread or stream of the rank),
**``overlap_pct = 100 · |K ∩ C| / |K|``** (HTA ``get_comm_comp_overlap``; None when the rank did no communication),
and ``exposed_comm_ms``: communication the rank waited for. On a CPU rank that is main-thread time in no compute op
during gloo work (the main thread's wait has no event of its own); on a device rank, communication kernels not
overlapped by compute or memcpy. ``exposed_pct`` = exposed communication as a share of step time.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ...record import Record

Table = dict[str, np.ndarray]

if TYPE_CHECKING:
    from ..types import RunSummary

logger = logging.getLogger(__name__)

__all__ = ["OverlapRow", "overlap_by_step", "overlap_by_rank"]


@dataclass
class OverlapRow(Record):
    """One rank's communication over its analysed steps: totals (ms), shares (%) and the per-step means."""

    rank: int
    mode: str  # "device" (communication kernels) or "cpu" (gloo work on the main thread)
    n_steps: int
    comm_ms: float
    overlapped_ms: float
    exposed_comm_ms: float
    overlap_pct: float | None  # None without communication
    exposed_pct: float | None  # of step time; None without step time
    comm_ms_per_step: float
    exposed_comm_ms_per_step: float


def _pct(num: float, den: float) -> float | None:
    return float(100.0 * num / den) if den > 0 else None


def overlap_by_step(breakdown: Table) -> Table:
    """Columns rank, step, comm_ms, overlapped_ms, exposed_comm_ms, overlap_pct (NaN without communication)."""
    comm = breakdown["comm_ms"]
    with np.errstate(invalid="ignore", divide="ignore"):
        pct = np.where(comm > 0, 100.0 * breakdown["overlapped_ms"] / np.where(comm > 0, comm, 1), np.nan)
    return {
        "rank": breakdown["rank"],
        "step": breakdown["step"],
        "comm_ms": comm,
        "overlapped_ms": breakdown["overlapped_ms"],
        "exposed_comm_ms": breakdown["exposed_comm_ms"],
        "overlap_pct": pct,
    }


def overlap_by_rank(run: RunSummary) -> list[OverlapRow]:
    """One row per rank: totals over its analysed steps and the per-step means."""
    bd = run.steps
    dev = run.device_rank_set
    out = []
    for r in np.unique(bd["rank"]):
        m = bd["rank"] == r
        n = int(m.sum())
        comm = float(bd["comm_ms"][m].sum())
        ovl = float(bd["overlapped_ms"][m].sum())
        exp_ = float(bd["exposed_comm_ms"][m].sum())
        step = float(bd["step_ms"][m].sum())
        out.append(OverlapRow(rank=int(r), mode="device" if int(r) in dev else "cpu", n_steps=n, comm_ms=comm,
                              overlapped_ms=ovl, exposed_comm_ms=exp_, overlap_pct=_pct(ovl, comm),
                              exposed_pct=_pct(exp_, step), comm_ms_per_step=comm / n if n else 0.0,
                              exposed_comm_ms_per_step=exp_ / n if n else 0.0))
    return out
