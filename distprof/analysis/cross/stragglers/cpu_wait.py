"""The lateness the host's scheduler caused ("held back"), taken off a rank's lateness before it is named.

A rank's **CPU-wait excess** before an arrival (``held_back_ms``) is how much longer than the instance's other
members its training thread waited for a CPU (runnable, not running: ``cpu/samples``, analysis.cpuwait) between the
end of its previous collective and this arrival (``cpu_wait_before``) — the share of that lateness the host's
scheduler caused. The naming rule uses the lateness less it (``lateness_not_cpu_wait_ms``; the mean lateness stays
what the trace shows, and ``cpu_wait_excess_ms`` is their difference): beside one busy process on 2 cores, a
balanced 4-rank DDP run had a rank late 22.8 ms in most steps whose own work equalled its peers' and whose thread had
waited 24 ms per step longer for a CPU; such a rank is reported by ``cpu_contention``, not as the rank to fix. The
wait is taken only up to each arrival, since the rank's previous collective: a rank slowed by a sleep before its
FSDP2 all-gathers competes for the cores after them while its blocked peers do not, and a wait summed over its whole
step (the step boundaries' ``steps.cpu_wait_opt_ms``) unnamed it in 7 runs of 7. Without samples, or where
collectives run on a device (a kernel's start, which a CPU wait delays only when its stream has run dry), nothing is
taken off and the step boundaries' wait is reported beside the lateness.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ...groupstats import rank_step_values
from .cells import Cells, excess
from .peers import excess_by

if TYPE_CHECKING:
    from ...types import RunSummary
    from .instances import Table

__all__ = ["cpu_wait_before", "held_back_ms", "step_lateness"]

NS_PER_MS = 1e6


def cpu_wait_before(run: RunSummary) -> np.ndarray:
    """Per row of ``run.collective_rows``: how long the rank's training thread waited for a CPU (runnable, not
    running; ``cpu_wait_at_*``) from the end of its last collective of an earlier step in the window (the latest end
    so far; in the window's first step, the step's start) to this one's start — the part of the stretch before the
    arrival that the host's scheduler took. From the previous step, not the previous collective: a rank held up
    before its first bucket's all-reduce is as late at the buckets that follow, with no wait between them. NaN where
    unknown: no ``cpu/samples``, a collective outside the steps with none before it, or a rank whose collectives run
    on a device (its arrival is a kernel's start on a stream, which a CPU wait delays only when the stream has run
    dry)."""
    cr = run.collective_rows
    n = int(np.asarray(cr["rank"]).size)
    a = np.asarray(cr.get("cpu_wait_at_start_ns", np.full(n, np.nan)), np.float64)
    z = np.asarray(cr.get("cpu_wait_at_end_ns", np.full(n, np.nan)), np.float64)
    out = np.full(n, np.nan)
    if n == 0 or not np.isfinite(a).any():
        return out
    rank, win, step = (np.asarray(cr[k], np.int64) for k in ("rank", "window", "step"))
    o = np.lexsort((np.asarray(cr["start_ns"], np.int64), win, rank))
    bounds = np.flatnonzero(np.r_[True, (rank[o][1:] != rank[o][:-1]) | (win[o][1:] != win[o][:-1]), True])
    on_device = {r for r, at in run.attrs.items() if str(at.get("device_type", "cpu")) != "cpu"}
    for lo, hi in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
        if int(rank[o[lo]]) in on_device:
            continue
        idx = o[lo:hi]
        s = step[idx]
        run_start = np.maximum.accumulate(np.where(np.r_[True, s[1:] != s[:-1]], np.arange(idx.size), 0))
        has_prev = run_start > 0
        prev_end = np.fmax.accumulate(z[idx])  # the cumulative wait only grows: the latest end's is the max
        k = idx[has_prev]
        out[k] = np.maximum(a[k] - prev_end[run_start[has_prev] - 1], 0.0)
    first = ~np.isfinite(out) & np.isfinite(a) & (step >= 0) & ~np.isin(rank, list(on_device))
    if first.any():  # the window's first step: from the step's start
        at_start = rank_step_values(run.steps, "cpu_wait_at_start_ns", rank[first], step[first])
        out[first] = np.maximum(a[first] - at_start, 0.0)
    return out


def held_back_ms(t: Table) -> np.ndarray:
    """Per instance row: how much longer the rank waited for a CPU before its arrival (``cpu_wait_before_ns``) than
    the median of the instance's other members (ms, 0 when shorter) — the part of its lateness the host's scheduler
    caused. NaN for every row of an instance where a member's wait is unknown."""
    w = t["cpu_wait_before_ns"] / NS_PER_MS
    if w.size == 0:
        return w
    bad = np.bincount(t["inst"], weights=(~np.isfinite(w)).astype(float))[t["inst"]] > 0
    out = np.maximum(excess_by(t["inst"], np.where(bad, 0.0, w)), 0.0)  # a peer's longer wait makes nobody late
    out[bad] = np.nan
    return out


def _step_boundary_wait_excess(run: RunSummary, cells: Cells, ranks: np.ndarray) -> np.ndarray:
    """Per (step, rank) cell: the rank's wait for a CPU before the step's collectives (``steps.cpu_wait_opt_ms``:
    from the previous step's optimizer start to this step's) minus the median of the other ranks' — how much longer
    the host's scheduler held it back in the step than a typical peer; 0 where a step lacks any rank's value."""
    c_q = rank_step_values(run.steps, "cpu_wait_opt_ms", ranks[cells.group], cells.step)
    if not np.isfinite(c_q).any():
        return np.zeros(cells.n)
    out = excess(cells, c_q)
    bad = ~np.isfinite(out)  # a NaN in a step spoils its medians: that step gets no value
    if bad.any():
        out[np.isin(cells.step, np.unique(cells.step[bad]))] = 0.0
    return out


def step_lateness(run: RunSummary, t: Table, cells: Cells, lat: np.ndarray,
                  ranks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per (step, rank) cell, from each instance row's lateness ``lat`` (ms): (its lateness in the step, that
    lateness less its CPU-wait excess — what names a rank —, the CPU-wait excess reported beside it)."""
    c_lat = cells.max(lat)
    held = held_back_ms(t)
    if np.isfinite(held).any():  # the lateness the host's scheduler did not cause: what names a rank
        c_own = cells.max(lat - np.nan_to_num(held))
        return c_lat, c_own, c_lat - c_own
    # no samples: the step-boundary wait is reported beside the lateness, not taken out of it
    return c_lat, c_lat, _step_boundary_wait_excess(run, cells, ranks)
