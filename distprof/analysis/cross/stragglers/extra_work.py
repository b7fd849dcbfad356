"""A rank's own extra work per step: its lateness with the ranks' waits for a CPU taken out.

A rank's arrival at a collective is its work since it left the previous one plus the time its training thread waited
for a CPU there (runnable, not running: ``cpu/samples``, analysis.cpuwait). On a host whose cores are shared, the
waits move the arrivals: a rank that sleeps (or waits for its device) gives its core away, and its peers computing
meanwhile wait for one instead, so they arrive later and its lateness shrinks (the README demo: a 20 ms sleep seen as
13.5 ms of lateness beside a busy process). Its **extra work** at a collective is its arrival less its CPU wait since
it left its previous collective (the latest one that ended before it arrived: bucket all-reduces that overlap it are
one stretch), against the median of the other members' same; in a step, at the collective that gives the step's
lateness (:mod:`.lateness`), less the same chance lateness. Unknown (None) without CPU samples, or where collectives
run on a device (a kernel's start, which a CPU wait delays only when its stream has run dry). It is reported beside
the lateness, never used to name a rank; the waits themselves are the ``cpu_contention`` finding's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ...groupstats import rank_step_values
from .peers import excess_by

if TYPE_CHECKING:
    from ...types import RunSummary
    from .instances import Table
    from .lateness import StepLateness

__all__ = ["cpu_wait_before_ns", "extra_work_ms"]

NS_PER_MS = 1e6


def cpu_wait_before_ns(run: RunSummary, t: Table) -> np.ndarray | None:
    """Per instance row: how long the rank's training thread waited for a CPU from leaving its previous collective
    (the latest end among its earlier collectives in the window, when that came before this arrival; else the same
    start as the previous one's, which this one overlaps; the first: the step's start) to this arrival. NaN where
    unknown; None where no rank sampled its CPU wait (GPU ranks, imports: the collective rows have no such column)."""
    cr = run.collective_rows
    if t["rank"].size == 0 or "cpu_wait_at_start_ns" not in cr:
        return None
    n_all = int(np.asarray(cr["rank"]).size)
    a_all = np.asarray(cr["cpu_wait_at_start_ns"], np.float64)
    if not np.isfinite(a_all).any():
        return None
    z_all = np.asarray(cr.get("cpu_wait_at_end_ns", np.full(n_all, np.nan)), np.float64)
    out = np.full(t["rank"].size, np.nan)
    on_device = [r for r, at in run.attrs.items() if str(at.get("device_type", "cpu")) != "cpu"]
    o = np.lexsort((t["arrival_ns"], t["window"], t["rank"]))
    rank, win, a, z = t["rank"][o], t["window"][o], t["arrival_ns"][o], t["end_ns"][o]
    new = np.r_[True, (rank[1:] != rank[:-1]) | (win[1:] != win[:-1])]
    idx = np.arange(o.size)
    first = np.maximum.accumulate(np.where(new, idx, 0))
    # the latest end among the rank's earlier collectives: a running max that restarts at each (rank, window)
    span = int(z.max() - a.min()) + 1
    shifted = (z - a.min()) + first * span
    prev_end = np.r_[-1, np.maximum.accumulate(shifted)[:-1]] - first * span
    resync = ~new & (prev_end <= a - a.min())  # it left its previous collectives before this arrival
    anchor = np.maximum.accumulate(np.where(resync | new, idx, 0))  # the row whose stretch this one continues
    prev_row = np.where(new[anchor], -1, anchor - 1)  # the row whose end starts that stretch (−1: the step start)
    rows = t["row"][o]
    at_arrival = a_all[rows]
    left = np.where(prev_row >= 0, _latest_end_wait(z_all[rows], first, prev_row), np.nan)
    start = rank_step_values(run.steps, "cpu_wait_at_start_ns", rank, t["step"][o])
    w = at_arrival - np.where(prev_row >= 0, left, start)
    w[np.isin(rank, on_device)] = np.nan
    out[o] = np.maximum(w, 0.0)
    return out


def _latest_end_wait(z_wait: np.ndarray, first: np.ndarray, prev_row: np.ndarray) -> np.ndarray:
    """The cumulative CPU wait when the rank left its collectives up to `prev_row` (the counter only grows: the
    largest over its earlier rows of the same (rank, window) is the latest end's); NaN where none is known."""
    v = np.where(np.isfinite(z_wait), z_wait, -1.0)
    big = float(v.max()) + 2.0
    run_max = np.maximum.accumulate(v + first * big) - first * big  # a running max restarting at each group
    res = run_max[np.maximum(prev_row, 0)]
    return np.where(res >= 0, res, np.nan)


def extra_work_ms(inst: np.ndarray, before_ns: np.ndarray | None, sl: StepLateness) -> np.ndarray:
    """Per (step, group) cell: the lateness less the rank's CPU-wait excess over the other members' median at the
    collective that gave it (`before_ns`: :func:`cpu_wait_before_ns` per instance row of `inst`); NaN where any
    member's wait there is unknown."""
    if before_ns is None:  # no CPU samples: unknown everywhere
        return np.full(sl.lateness.size, np.nan)
    w = before_ns / NS_PER_MS
    if not np.isfinite(w).any():  # collectives on a device: unknown everywhere, and no copies of the instance rows
        return np.full(sl.lateness.size, np.nan)  # (1,024 LLM-shaped GPU ranks: 97 MB)
    bad = np.bincount(inst, weights=(~np.isfinite(w)).astype(float), minlength=int(inst.max()) + 1)[inst] > 0
    held = excess_by(inst, np.where(bad, 0.0, w))
    held[bad] = np.nan
    return sl.lateness - held[sl.row]
