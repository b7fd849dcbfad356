"""Rows for the report: one row per rank (named first, then by cost), the per-step straggler with its changes, and the
(rank, step) cells of the heatmap.

``per_step`` names, per recorded step, the latest rank when its lateness reaches the floor, and ``changes`` the steps
where that rank differs from the previous step's.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .lateness import Cells
from .result import StragglerCells, StragglerChange, StragglerRank, StragglerStep

__all__ = ["RankFigures", "cells_record", "per_step", "rank_rows"]


@dataclass
class RankFigures:
    """Per rank (arrays indexed like ``ranks``): the figures of its row."""

    ranks: np.ndarray
    n_instances: np.ndarray
    n_steps: np.ndarray
    lateness: np.ndarray  # median over its steps
    late_steps: np.ndarray
    late_fraction: np.ndarray
    extra_work: np.ndarray  # NaN unknown
    blame: np.ndarray
    wait: np.ndarray  # its own wait, summed over steps
    cost: np.ndarray
    clock_free: np.ndarray
    late: np.ndarray  # the lateness part of the rule passes
    named: np.ndarray


def rank_rows(f: RankFigures, hosts: dict[int, str]) -> list[StragglerRank]:
    """One row per rank, named first, then by cost, blame and lateness."""
    rows = []
    for i, r in enumerate(f.ranks.tolist()):
        n = max(int(f.n_steps[i]), 1)
        rows.append(StragglerRank(
            rank=int(r), host=hosts.get(int(r), "?"), n_instances=int(f.n_instances[i]), n_steps=int(f.n_steps[i]),
            lateness_ms=float(f.lateness[i]), late_step_fraction=float(f.late_steps[i]),
            late_fraction=float(f.late_fraction[i]),
            extra_work_ms=None if np.isnan(f.extra_work[i]) else float(f.extra_work[i]),
            blame_ms=float(f.blame[i]), blame_ms_per_step=float(f.blame[i] / n), wait_ms_per_step=float(f.wait[i] / n),
            cost_ms_per_step=float(f.cost[i]), clock_free_lateness_ms=float(f.clock_free[i]), named=bool(f.named[i])))
    rows.sort(key=lambda d: (not d.named, -d.cost_ms_per_step, -d.blame_ms, -d.lateness_ms, d.rank))
    return rows


def per_step(cells: Cells, c_lat: np.ndarray, c_blame: np.ndarray, ranks: np.ndarray,
             thr: float) -> tuple[list[StragglerStep], list[StragglerChange]]:
    """Per recorded step: the latest rank, named when its lateness reaches the floor; and where that changes."""
    real = cells.step >= 0
    o = np.lexsort((-c_lat[real], cells.step[real]))
    st, lat = cells.step[real][o], c_lat[real][o]
    grp, bl = cells.group[real][o], c_blame[real][o]
    first = np.flatnonzero(np.r_[True, st[1:] != st[:-1]]) if st.size else np.zeros(0, np.int64)
    out, changes = [], []
    prev: int | None = None
    for n, k in enumerate(first.tolist()):
        who = int(ranks[grp[k]]) if lat[k] >= thr else None
        out.append(StragglerStep(int(st[k]), who, float(lat[k]), float(bl[k]), int(ranks[grp[k]])))
        if n and who != prev:
            changes.append(StragglerChange(int(st[k]), prev, who))
        prev = who
    return out, changes


def cells_record(cells: Cells, c_lat: np.ndarray, c_extra: np.ndarray, ranks: np.ndarray) -> StragglerCells:
    """The recorded steps' (rank, step) cells, by rank then step."""
    real = np.flatnonzero(cells.step >= 0)
    o = real[np.lexsort((cells.step[real], ranks[cells.group[real]]))]
    return StragglerCells(rank=[int(r) for r in ranks[cells.group[o]].tolist()],
                          step=[int(s) for s in cells.step[o].tolist()],
                          lateness_ms=[round(float(x), 4) for x in c_lat[o].tolist()],
                          extra_work_ms=[round(float(x), 4) if np.isfinite(x) else None for x in c_extra[o].tolist()])
