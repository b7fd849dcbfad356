"""The whole-run watch section of the report (numpy only, no torch): the saved ``--watch`` series of every rank
(RUN_DIR/watch/) read one segment at a time, the drift rule (``distprof.drift``) run over them, and the windows the
drifts triggered.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ...drift import DriftRule, DriftSpan, DriftTracker, own_ms
from ...storage import watchfile as wf
from .watch_section import MAX_SPANS, WatchSection, watch_section

__all__ = ["summarize_watch", "watch_report", "WatchSummary", "MAX_HEATMAP_COLS"]

#: The report's heatmap has at most this many step columns (steps are binned).
MAX_HEATMAP_COLS = 600


# ---- the report's watch section ---------------------------------------------------------------------------------
@dataclass
class WatchSummary:
    """The watch series of a run, bounded: per rank a few numbers, per (rank block, step bin) one, the drifts."""

    ranks: list[int]
    first_step: int
    last_step: int
    bin_steps: int  # steps per heatmap column
    per_rank: dict[int, dict[str, Any]]  # rank -> steps, step_ms median, own_ms median, comm_ms median, data_ms ...
    bin_mean: dict[str, np.ndarray]  # "step_ms"/"own_ms" -> [ranks, bins] mean per rank and bin (NaN: no step)
    peers_own_bin: np.ndarray  # [bins] median over ranks of own work, mean per bin
    spans: list[DriftSpan]
    skipped: list[str]  # files that could not be read (one line each)
    rule: DriftRule


class _Bins:
    """What :func:`summarize_watch` gathers over the segments: per (rank, heatmap bin) the sums of step and own time
    and the step counts, per bin the peers' median own time (sum and count), per rank its segments' medians and
    its number of steps."""

    def __init__(self, ranks: list[int], lo: int, bin_steps: int, n_bins: int) -> None:
        self.ranks, self.lo, self.bin_steps = ranks, lo, bin_steps
        self.ri = {r: i for i, r in enumerate(ranks)}
        self.sums = {k: np.zeros((len(ranks), n_bins)) for k in ("step_ms", "own_ms")}
        self.counts = np.zeros((len(ranks), n_bins))
        self.peer_sum, self.peer_n = np.zeros(n_bins), np.zeros(n_bins)
        self.stats: dict[int, dict[str, list]] = {r: {"step_ms": [], "own_ms": [], "comm_ms": [], "data_ms": [],
                                                      "opt_ms": [], "mem_peak": []} for r in ranks}
        self.n_steps = dict.fromkeys(ranks, 0)

    def add_rank(self, r: int, rows: np.ndarray, o: np.ndarray) -> None:
        """One segment's rows of rank `r`, with their own time `o`."""
        i = self.ri[r]
        b = (rows["step"] - self.lo) // self.bin_steps
        np.add.at(self.sums["step_ms"][i], b, rows["step_ms"])
        np.add.at(self.sums["own_ms"][i], b, o)
        np.add.at(self.counts[i], b, 1)
        self.n_steps[r] += rows.size
        st = self.stats[r]
        for k in ("step_ms", "comm_ms", "data_ms", "opt_ms"):
            st[k].append(float(np.median(rows[k])))
        st["own_ms"].append(float(np.median(o)))
        st["mem_peak"].append(int(rows["mem_peak"].max()))

    def add_peers(self, steps: np.ndarray, own: np.ndarray) -> None:
        """The median over ranks of one segment's own time `own` [ranks, steps]."""
        with np.errstate(all="ignore"):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                med = np.nanmedian(own, axis=0)
        ok = ~np.isnan(med)
        b = (steps[ok] - self.lo) // self.bin_steps
        np.add.at(self.peer_sum, b, med[ok])
        np.add.at(self.peer_n, b, 1)

    def means(self) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """The mean per (rank, bin) of step and own time, and per bin of the peers' median own time (NaN: none)."""
        with np.errstate(invalid="ignore", divide="ignore"):
            bin_mean = {k: np.where(self.counts > 0, v / np.maximum(self.counts, 1), np.nan)
                        for k, v in self.sums.items()}
            peers = np.where(self.peer_n > 0, self.peer_sum / np.maximum(self.peer_n, 1), np.nan)
        return bin_mean, peers

    def per_rank(self) -> dict[int, dict[str, Any]]:
        """Per rank: its steps, the medians of its segments' medians (bounded, and what its typical step is) and its
        peak memory."""
        per_rank = {}
        for r in self.ranks:
            st = self.stats[r]
            per_rank[r] = {"rank": r, "steps": self.n_steps[r],
                           **{f"{k}_median": (float(np.median(v)) if v else None)
                              for k, v in st.items() if k != "mem_peak"},
                           "mem_peak_max": (max(st["mem_peak"]) if st["mem_peak"] and max(st["mem_peak"]) >= 0
                                            else None)}
        return per_rank


def _segment_own(seg: int, members: list[tuple[int, Path]], acc: _Bins, bad: set[str],
                 skipped: list[str]) -> tuple[np.ndarray, np.ndarray] | None:
    """Read segment `seg` of every rank in `members` into `acc`; its own time [ranks, steps] over the steps some rank
    has, and those steps. None when no rank has a step in it. Unreadable files are named in `skipped`."""
    s0 = seg * wf.SEGMENT_STEPS
    own = np.full((len(acc.ranks), wf.SEGMENT_STEPS), np.nan)
    for r, p in members:
        if str(p) in bad:
            continue
        try:
            rows = wf.read_segment(p)
        except wf.WatchFileError as e:
            skipped.append(str(e))
            continue
        rows = rows[(rows["step"] >= s0) & (rows["step"] < s0 + wf.SEGMENT_STEPS)]
        if rows.size == 0:
            continue
        o = own_ms(rows)
        own[acc.ri[r], rows["step"] - s0] = o
        acc.add_rank(r, rows, o)
    cols = np.flatnonzero(~np.all(np.isnan(own), axis=0))
    if cols.size == 0:
        return None
    return own[:, cols[0]:cols[-1] + 1], np.arange(s0 + cols[0], s0 + cols[-1] + 1)


def summarize_watch(run_dir: str | Path, rule: DriftRule | None = None) -> WatchSummary | None:
    """Read RUN_DIR/watch/ one segment (of SEGMENT_STEPS steps) at a time for every rank, run the drift rule over
    every step, and bin for the heatmap. None when the run has no watch series. Memory: ranks x SEGMENT_STEPS
    values at a time, plus ranks x MAX_HEATMAP_COLS."""
    rule = rule or DriftRule()
    segs = wf.list_segments(Path(run_dir))
    if not segs:
        return None
    ranks = sorted(segs)
    skipped: list[str] = []
    lo, hi = _step_range(segs, skipped)
    if lo is None:
        return WatchSummary(ranks, 0, -1, 1, {}, {}, np.zeros(0), [], skipped, rule)
    n_bins_max = MAX_HEATMAP_COLS
    bin_steps = max(1, math.ceil((hi - lo + 1) / n_bins_max))
    acc = _Bins(ranks, lo, bin_steps, (hi - lo) // bin_steps + 1)
    tracker = DriftTracker(rule, max_spans=MAX_SPANS * 5)
    by_seg: dict[int, list[tuple[int, Path]]] = {}
    for r, lst in segs.items():
        for seg, p in lst:
            by_seg.setdefault(seg, []).append((r, p))
    bad = {s.split(":")[0] for s in skipped}
    for seg in sorted(by_seg):
        got = _segment_own(seg, by_seg[seg], acc, bad, skipped)
        if got is None:
            continue
        own, steps = got
        tracker.feed(steps, np.asarray(ranks), own)
        acc.add_peers(steps, own)
    bin_mean, peers = acc.means()
    return WatchSummary(ranks, lo, hi, bin_steps, acc.per_rank(), bin_mean, peers, tracker.spans, skipped, rule)


def _step_range(segs: dict[int, list[tuple[int, Path]]], skipped: list[str]) -> tuple[int | None, int | None]:
    """First and last step of the run: each rank's first and last segment (read once more later: small)."""
    lo = hi = None
    for r, lst in segs.items():
        for seg, p in (lst[0], lst[-1]) if len(lst) > 1 else lst[:1]:
            try:
                rows = wf.read_segment(p)
            except wf.WatchFileError as e:
                skipped.append(str(e))
                continue
            if rows.size:
                lo = int(rows["step"][0]) if lo is None else min(lo, int(rows["step"][0]))
                hi = int(rows["step"][-1]) if hi is None else max(hi, int(rows["step"][-1]))
    return lo, hi


#: A status file is never read past this size.
_MAX_STATUS_BYTES = 16 * 1024 * 1024


def triggered_windows(run_dir: str | Path) -> list[dict[str, Any]]:
    """The run's triggered windows as rank 0 recorded them in its status file (the first readable rank's otherwise):
    window, first_step, last_step, request_id, reason. [] when there is none."""
    from ...storage import safefs, schema

    paths = sorted(Path(run_dir).glob(schema.STATUS_TEMPLATE.replace("{rank:05d}", "*")))
    for p in paths:
        try:  # a regular file only (never a FIFO: opened non-blocking), bounded, any bad JSON skipped
            doc = safefs.read_json(p, _MAX_STATUS_BYTES, what="status file")
        except OSError:
            continue
        tws = doc.get("triggered_windows") if isinstance(doc, dict) else None
        if not isinstance(tws, list):
            continue
        return [{"window": t.get("index"), "first_step": t.get("first"), "last_step": t.get("last"),
                 "request_id": t.get("request_id"), "reason": t.get("reason", ""), "recorded": t.get("recorded")}
                for t in tws if isinstance(t, dict)]
    return []


def rule_of(config: dict[str, Any] | None) -> DriftRule:
    """The drift rule the job ran with (its shards' config), else the defaults."""
    cfg = config or {}
    try:
        return DriftRule(float(cfg.get("watch_threshold", DriftRule.threshold)),
                         int(cfg.get("watch_steps", DriftRule.steps)))
    except (TypeError, ValueError):
        return DriftRule()


def watch_report(run_dir: str | Path, rule: DriftRule | None = None) -> WatchSection | None:
    """The report's ``watch`` key for RUN_DIR (None when the run has no watch series); a bad segment or drifts.json
    is skipped and named in ``skipped``."""
    ws = summarize_watch(run_dir, rule)
    if ws is None:
        return None
    try:
        drifts = wf.read_drifts(Path(run_dir))
    except wf.WatchFileError as e:  # the series still shows the run; the live record is named as skipped
        ws.skipped.append(str(e))
        drifts = []
    return watch_section(ws, drifts, triggered_windows(run_dir))
