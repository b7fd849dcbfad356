"""Allocated memory over time per rank, on the aligned clock and bounded in size: what the HTML report draws.

From each rank's summary curve (``RankSummary.memory_series``: one device per rank, its accelerator if it has
allocator events there, else the CPU; at most ``MEMORY_POINTS`` points per rank, min/max per bucket). With many
ranks, every rank gets fewer points (``MAX_POINTS`` in all, at least ``MIN_POINTS_PER_RANK`` each), and beyond
``MANY_RANKS`` ranks only a few curves are kept: the highest peaks, the median and the lowest (``MEMORY_LINES``).

Times are seconds since the first recorded step (or the first memory sample), values MiB; windows are separated by
a ``None`` point (a break in the line).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from ...record import Record
from ..rank.summary import MEMORY_POINTS, downsample_minmax

if TYPE_CHECKING:
    from ..types import RunSummary

__all__ = ["MemoryCurve", "MemoryTimeline", "memory_timeline", "MAX_POINTS_PER_RANK", "MANY_RANKS"]

#: Points per rank at most, and in all.
MAX_POINTS_PER_RANK = 2000
MAX_POINTS = 120_000
MIN_POINTS_PER_RANK = 200
#: Above this many ranks with memory, only MEMORY_LINES curves are kept.
MANY_RANKS = 64
MEMORY_LINES = 4


@dataclass
class MemoryCurve(Record):
    """One rank's allocated memory: ``x_s`` seconds since the run's start, ``y_mib`` MiB (None: a window break)."""

    rank: int
    device: int  # the CUDA device, or -1 for the CPU
    x_s: list[float | None] = field(default_factory=list)
    y_mib: list[float | None] = field(default_factory=list)


@dataclass
class MemoryTimeline(Record):
    """The curves drawn, of how many ranks with memory, at how many points per rank at most."""

    n_ranks: int  # ranks with a memory curve (more than are drawn beyond MANY_RANKS)
    points_per_rank: int
    cpu_relative: bool  # CPU totals are relative to each window's start (torch has no CPU allocator total)
    curves: list[MemoryCurve] = field(default_factory=list)


def _pick_ranks(peaks: dict[int, float]) -> list[int]:
    """The ranks whose curves are drawn when there are many: the highest peaks, then the median and the lowest."""
    order = sorted(peaks, key=lambda r: (-peaks[r], r))
    pick = order[:MEMORY_LINES - 2] + [order[len(order) // 2], order[-1]]
    return sorted(dict.fromkeys(pick))


def _curve(run: RunSummary, r: int, per_rank: int, t0: int) -> MemoryCurve:
    s = run.ranks[r]
    n_total = sum(t.size for t, _ in s.memory_series.values())
    xs: list[float | None] = []
    ys: list[float | None] = []
    for w in sorted(s.memory_series):
        t_w, v_w = s.memory_series[w]
        if per_rank < MEMORY_POINTS:  # many ranks: fewer points each than the summaries kept
            t_w, v_w = downsample_minmax(t_w, v_w, max(4, int(round(per_rank * t_w.size / max(n_total, 1)))))
        t_a = run.model.align(np.full(t_w.size, r), np.full(t_w.size, w), t_w)
        if xs:
            xs.append(None)  # break the line between windows
            ys.append(None)
        xs.extend(np.round((t_a - t0) / 1e9, 6).tolist())
        ys.extend(np.round(v_w / 2**20, 4).tolist())
    return MemoryCurve(r, int(s.memory_device), xs, ys)


def memory_timeline(run: RunSummary) -> MemoryTimeline:
    """The memory curves of the run's ranks (see the module docstring); no curve when no allocator event was
    recorded."""
    ranks = sorted(r for r, s in run.ranks.items() if s.memory_series)
    relative = any(bool(a.get("memory_total_relative")) for a in run.attrs.values())
    if not ranks:
        return MemoryTimeline(0, 0, relative)
    n_all = len(ranks)
    if n_all > MANY_RANKS:
        ranks = _pick_ranks({r: max(float(v.max()) for _, v in run.ranks[r].memory_series.values() if v.size)
                             for r in ranks})
    per_rank = max(MIN_POINTS_PER_RANK, min(MAX_POINTS_PER_RANK, MAX_POINTS // max(len(ranks), 1)))
    starts = np.asarray(run.steps["start_ns"], np.int64)
    firsts = [int(t[0]) for r in ranks for t, _ in run.ranks[r].memory_series.values() if t.size]
    t0 = int(starts.min()) if starts.size else min(firsts)
    return MemoryTimeline(n_all, per_rank, relative, [_curve(run, r, per_rank, t0) for r in ranks])
