"""The report's ``watch`` section (a ``--watch`` run): the drift rule, per rank its typical step, the drifts, the
windows they asked for, and a bounded heatmap and line chart of every step of the run — built from the
:class:`.watch.WatchSummary` of the saved series and rank 0's drift records (``watch/drifts.json``).

Values read from drifts.json and the status files are checked here: a field of the wrong type reads as unknown
(None), never as whatever the file holds.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ...drift import DriftSpan
from ...record import Record

if TYPE_CHECKING:
    from .watch import WatchSummary

__all__ = ["WatchDrift", "WatchHeatmap", "WatchLineRank", "WatchLines", "WatchRank", "WatchRule", "WatchSection",
           "WatchTrigger", "watch_section", "MAX_HEATMAP_ROWS", "MAX_LINES", "MAX_SPANS"]

#: The heatmap has at most this many rows (ranks in blocks beyond).
MAX_HEATMAP_ROWS = 128
#: A line is drawn for at most this many drifting ranks (the largest drifts).
MAX_LINES = 8
#: Drift records kept in the report (the largest first).
MAX_SPANS = 200


@dataclass
class WatchRule(Record):
    """The drift rule the run was judged by (``distprof.drift.DriftRule``) and its text."""

    threshold: float
    steps: int
    min_ms: float
    text: str


@dataclass
class WatchRank(Record):
    """One rank's series: its steps and the medians of its segments' medians (ms), its largest memory peak."""

    rank: int
    steps: int
    step_ms_median: float | None
    own_ms_median: float | None
    comm_ms_median: float | None
    data_ms_median: float | None
    opt_ms_median: float | None
    mem_peak_max: int | None


@dataclass
class WatchDrift(Record):
    """One drift of one rank (``distprof.drift.DriftSpan``): its steps and mean own work against its peers'."""

    rank: int
    first_step: int
    last_step: int
    confirmed_step: int
    steps: int
    flagged_steps: int
    own_ms: float
    peers_ms: float
    excess_ms: float
    excess_pct: float | None
    open: bool

    @classmethod
    def of(cls, s: DriftSpan) -> WatchDrift:
        return cls(rank=s.rank, first_step=s.first_step, last_step=s.last_step, confirmed_step=s.confirmed_step,
                   steps=s.last_step - s.first_step + 1, flagged_steps=s.n_flagged, own_ms=round(s.own_ms, 3),
                   peers_ms=round(s.peers_ms, 3), excess_ms=round(s.excess_ms, 3),
                   excess_pct=round(100 * s.excess_ms / s.peers_ms, 1) if s.peers_ms > 0 else None, open=s.open)


@dataclass
class WatchTrigger(Record):
    """A window the watch asked for: rank 0's drift record, the window recorded, and the drift it matches."""

    request_id: str | None
    rank: int | None
    first_step: int | None
    confirmed_step: int | None
    excess_ms: float | None
    excess_pct: float | None
    state: str | None
    message: str | None
    window: int | None
    window_first_step: int | None
    window_last_step: int | None
    drift: WatchDrift | None = None


@dataclass
class WatchHeatmap(Record):
    """Per row (a rank, or a block of ranks: their maximum) and step bin, the mean step and own time (ms; None: no
    step there)."""

    bin_steps: int
    bin_first_steps: list[int]
    rows: list[str]
    row_ranks: list[list[int]]  # [first, last] rank of each row
    step_ms: list[list[float | None]]
    own_ms: list[list[float | None]]


@dataclass
class WatchLineRank(Record):
    rank: int
    own_ms: list[float | None]
    step_ms: list[float | None]


@dataclass
class WatchLines(Record):
    """The peers' median own time per step bin, and the drifting ranks' own and step time beside it."""

    bin_first_steps: list[int]
    peers_own_ms: list[float | None]
    ranks: list[WatchLineRank] = field(default_factory=list)


@dataclass
class WatchSection(Record):
    """The report's ``watch`` section (docs/report-format.md)."""

    rule: WatchRule
    n_ranks: int
    first_step: int
    last_step: int
    per_rank: list[WatchRank]
    drifts: list[WatchDrift]
    triggers: list[WatchTrigger]
    heatmap: WatchHeatmap
    lines: WatchLines
    skipped: list[str] = field(default_factory=list)  # files that could not be read, one line each


def _r(x: Any, nd: int = 3) -> float | None:
    if x is None:
        return None
    x = float(x)
    return round(x, nd) if math.isfinite(x) else None


def _int(x: Any) -> int | None:
    return x if isinstance(x, int) and not isinstance(x, bool) else None


def _num(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else None


def _str(x: Any) -> str | None:
    return x if isinstance(x, str) else None


def _blocks(ranks: list[int]) -> list[list[int]]:
    if len(ranks) <= MAX_HEATMAP_ROWS:
        return [[r] for r in ranks]
    size = math.ceil(len(ranks) / MAX_HEATMAP_ROWS)
    return [ranks[i:i + size] for i in range(0, len(ranks), size)]


def _triggers(ws: WatchSummary, drifts: list[dict[str, Any]], windows: list[dict[str, Any]]) -> list[WatchTrigger]:
    """Per drift record of rank 0: the window it asked for (from the status files) and the drift it matches."""
    out = []
    for d in drifts:
        rank, at = _int(d.get("rank")), _int(d.get("confirmed_step"))
        match = next((s for s in ws.spans if s.rank == rank and at is not None
                      and s.first_step <= at <= s.last_step + ws.rule.steps), None)
        rid = _str(d.get("request_id"))
        win = next((w for w in windows if rid and w.get("request_id") == rid), None)
        out.append(WatchTrigger(
            request_id=rid, rank=rank, first_step=_int(d.get("first_step")), confirmed_step=at,
            excess_ms=_num(d.get("excess_ms")), excess_pct=_num(d.get("excess_pct")), state=_str(d.get("state")),
            message=_str(d.get("message")),
            window=_int(win.get("window") if win else d.get("window")),
            window_first_step=_int(win.get("first_step") if win else d.get("window_first")),
            window_last_step=_int(win.get("last_step") if win else d.get("window_last")),
            drift=WatchDrift.of(match) if match else None))
    return out


def _heatmap(ws: WatchSummary, bins: list[int]) -> WatchHeatmap:
    blocks = _blocks(ws.ranks)
    ri = {r: i for i, r in enumerate(ws.ranks)}
    z: dict[str, list] = {"step_ms": [], "own_ms": []}
    for key, out in z.items():
        for blk in blocks:
            rows = ws.bin_mean[key][[ri[r] for r in blk]] if ws.bin_mean else np.zeros((0, 0))
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # an all-NaN column: no step there
                out.append([_r(v) for v in np.nanmax(rows, axis=0)] if rows.size else [])
    labels = [f"rank {b[0]}" if len(b) == 1 else f"ranks {b[0]}-{b[-1]}" for b in blocks]
    return WatchHeatmap(ws.bin_steps, bins, labels, [[b[0], b[-1]] for b in blocks], z["step_ms"], z["own_ms"])


def _lines(ws: WatchSummary, spans: list[DriftSpan], bins: list[int]) -> WatchLines:
    """The peers' median own time, and the (up to MAX_LINES) ranks with the largest drifts."""
    ri = {r: i for i, r in enumerate(ws.ranks)}
    outliers = []
    seen: set[int] = set()
    for s in spans:
        if s.rank in seen or len(seen) >= MAX_LINES:
            continue
        seen.add(s.rank)
        i = ri[s.rank]
        outliers.append(WatchLineRank(s.rank, [_r(v) for v in ws.bin_mean["own_ms"][i]],
                                      [_r(v) for v in ws.bin_mean["step_ms"][i]]))
    return WatchLines(bins, [_r(v) for v in ws.peers_own_bin], outliers)


def watch_section(ws: WatchSummary, drifts: list[dict[str, Any]], windows: list[dict[str, Any]]) -> WatchSection:
    """The report's ``watch`` section from the summary, rank 0's drift records (which asked for a window) and the
    run's triggered windows ({window, first_step, last_step, request_id, reason})."""
    spans = sorted(ws.spans, key=lambda s: (-s.excess_ms * s.n_flagged, s.rank))[:MAX_SPANS]
    bins = [ws.first_step + i * ws.bin_steps for i in range(len(ws.peers_own_bin))]
    per_rank = [WatchRank(**{k: _r(v) if isinstance(v, float) else v for k, v in ws.per_rank[r].items()})
                for r in ws.ranks if r in ws.per_rank]
    return WatchSection(
        rule=WatchRule(ws.rule.threshold, ws.rule.steps, ws.rule.min_ms, ws.rule.text()), n_ranks=len(ws.ranks),
        first_step=ws.first_step, last_step=ws.last_step, per_rank=per_rank,
        drifts=[WatchDrift.of(s) for s in spans], triggers=_triggers(ws, drifts, windows),
        heatmap=_heatmap(ws, bins), lines=_lines(ws, spans, bins), skipped=list(ws.skipped))
