"""The drift rule of ``--watch`` and the whole-run watch section of the report (numpy only, no torch).

**Own work.** A rank that waits in a collective for a late peer has a long step too, so comparing step times flags
the victims with the culprit. The rule compares *own work* instead: the step's wall time minus the time the training
thread was blocked waiting for communication (``comm_ms``: ``Work.wait`` of every collective and point-to-point call
made from Python: a synchronous ``dist.all_reduce``, ``barrier``, ``send``/``recv``, FSDP's and pipelining's waits).
The late rank arrives last and hardly waits, the others wait for it: their own work stays what it was, the late
rank's grows. See docs/watch.md for what this cannot see (DDP's gradient all-reduce waits inside C++).

**The rule** (:class:`DriftRule`), per step: a rank drifts when its own work exceeds the median of the *other* ranks'
(leave-one-out, so that with two ranks the peer is the other one) by more than ``threshold`` (a fraction) and by at
least ``min_ms``; a drift *starts* once that holds for ``steps`` consecutive steps (from the first of them) and *ends*
after ``steps`` consecutive steps without it (at the last step that held). The same :class:`DriftTracker` runs live
on rank 0 (capture/watch.py: fed the steps every rank has published) and over the saved series in the report.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..storage import watchfile as wf

__all__ = ["DriftRule", "DriftSpan", "DriftTracker", "own_ms", "peer_median", "flag_drift", "summarize_watch",
           "watch_section", "MAX_HEATMAP_COLS", "MAX_HEATMAP_ROWS", "MAX_LINES"]

#: The report's heatmap has at most this many step columns (steps are binned) and rows (ranks in blocks).
MAX_HEATMAP_COLS = 600
MAX_HEATMAP_ROWS = 128
#: A line is drawn for at most this many drifting ranks (the largest drifts).
MAX_LINES = 8
#: Drift records kept in the report (the largest first).
MAX_SPANS = 200


@dataclass(frozen=True)
class DriftRule:
    threshold: float = 0.2  # own work above the peers' median by more than this fraction of it ...
    steps: int = 10  # ... for this many consecutive steps
    min_ms: float = 1.0  # ... and by at least this many milliseconds (tiny steps are noisy)

    def __post_init__(self) -> None:
        if not (isinstance(self.threshold, (int, float)) and 0 < self.threshold <= 100):
            raise ValueError(f"watch threshold {self.threshold!r}: need a fraction > 0 (0.2 = 20 % above the peers)")
        if not (isinstance(self.steps, int) and 1 <= self.steps <= 100_000):
            raise ValueError(f"watch steps {self.steps!r}: need an integer in 1..100000")
        if not (self.min_ms >= 0 and math.isfinite(self.min_ms)):
            raise ValueError(f"watch min_ms {self.min_ms!r}: need a number of milliseconds >= 0")

    def text(self) -> str:
        return (f"own work (step time minus time blocked in communication) above the other ranks' median by more "
                f"than {self.threshold:.0%} and {self.min_ms:g} ms for {self.steps} consecutive steps")


def own_ms(rows: np.ndarray) -> np.ndarray:
    """Own work per row of the watch series (ms): wall time minus time blocked waiting for communication."""
    return np.maximum(rows["step_ms"].astype(np.float64) - rows["comm_ms"], 0.0)


def peer_median(own: np.ndarray) -> np.ndarray:
    """`own` [ranks, steps] (NaN: no value): per cell the median of the *other* ranks' values in its step (NaN where
    the cell has no value or no other rank has one). O(ranks log ranks) per step."""
    own = np.asarray(own, dtype=np.float64)
    n_r, n_s = own.shape
    out = np.full(own.shape, np.nan)
    if n_r < 2 or n_s == 0:
        return out
    order = np.argsort(own, axis=0, kind="stable")  # NaN last
    srt = np.take_along_axis(own, order, axis=0)
    pos = np.empty_like(order)
    np.put_along_axis(pos, order, np.broadcast_to(np.arange(n_r)[:, None], own.shape), axis=0)
    m = np.sum(~np.isnan(own), axis=0) - 1  # values left once a cell's own is removed
    lo, hi = (m - 1) // 2, m // 2  # the median's positions among the rest
    a = lo[None, :] + (lo[None, :] >= pos)  # rest position -> sorted index, skipping the cell itself
    b = hi[None, :] + (hi[None, :] >= pos)
    a = np.clip(a, 0, n_r - 1)
    b = np.clip(b, 0, n_r - 1)
    cols = np.arange(n_s)[None, :]
    med = (srt[a, cols] + srt[b, cols]) / 2
    ok = ~np.isnan(own) & (m >= 1)[None, :]
    out[ok] = med[ok]
    return out


def flag_drift(own: np.ndarray, rule: DriftRule) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per cell of `own` [ranks, steps]: (flagged, excess ms over the peers' median, the peers' median)."""
    med = peer_median(own)
    with np.errstate(invalid="ignore"):
        excess = own - med
        flagged = (excess > rule.threshold * med) & (excess >= rule.min_ms)
    return np.nan_to_num(flagged, nan=False).astype(bool), excess, med


@dataclass
class DriftSpan:
    """One drift of one rank: steps `first_step`..`last_step` (`open`: still going at the last step seen)."""

    rank: int
    first_step: int
    last_step: int
    confirmed_step: int  # the step at which the rule first held for `steps` steps
    n_flagged: int = 0
    excess_ms_sum: float = 0.0
    own_ms_sum: float = 0.0
    peers_ms_sum: float = 0.0
    open: bool = True

    @property
    def excess_ms(self) -> float:
        return self.excess_ms_sum / max(self.n_flagged, 1)

    @property
    def own_ms(self) -> float:
        return self.own_ms_sum / max(self.n_flagged, 1)

    @property
    def peers_ms(self) -> float:
        return self.peers_ms_sum / max(self.n_flagged, 1)

    def to_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "first_step": self.first_step, "last_step": self.last_step,
                "confirmed_step": self.confirmed_step, "steps": self.last_step - self.first_step + 1,
                "flagged_steps": self.n_flagged, "own_ms": round(self.own_ms, 3), "peers_ms": round(self.peers_ms, 3),
                "excess_ms": round(self.excess_ms, 3),
                "excess_pct": round(100 * self.excess_ms / self.peers_ms, 1) if self.peers_ms > 0 else None,
                "open": self.open}


@dataclass
class _RankState:
    cand_first: int = -1  # first step of the current run of flagged steps (-1: none)
    cand_len: int = 0
    cand: list = field(default_factory=lambda: [0.0, 0.0, 0.0])  # sums of excess, own, peers over the run
    span: DriftSpan | None = None  # confirmed and not ended
    quiet: int = 0  # consecutive unflagged steps inside a confirmed span


class DriftTracker:
    """The rule over steps fed in order (a few columns at a time): starts and ends of drifts, per rank.

    ``feed`` returns the spans confirmed by these steps; ``spans`` holds every span, ended or open. Only ranks with a
    flagged step or a span in progress cost a Python loop; the others nothing.
    """

    def __init__(self, rule: DriftRule, max_spans: int = 10_000) -> None:
        self.rule = rule
        self.spans: list[DriftSpan] = []
        self.max_spans = max_spans
        self._state: dict[int, _RankState] = {}

    def feed(self, steps: np.ndarray, ranks: np.ndarray, own: np.ndarray) -> list[DriftSpan]:
        """`own` [len(ranks), len(steps)] for consecutive `steps`; NaN where a rank has no value (not flagged)."""
        if own.size == 0:
            return []
        flagged, excess, med = flag_drift(own, self.rule)
        new: list[DriftSpan] = []
        active = set(np.flatnonzero(flagged.any(axis=1)).tolist())
        active |= {i for i, r in enumerate(ranks.tolist()) if r in self._state}
        for i in sorted(active):
            r = int(ranks[i])
            st = self._state.setdefault(r, _RankState())
            for j in range(steps.size):
                s = int(steps[j])
                if flagged[i, j]:
                    self._flagged(r, st, s, float(excess[i, j]), float(own[i, j]), float(med[i, j]), new)
                else:
                    self._unflagged(st)
            if st.span is None and st.cand_len == 0:
                del self._state[r]
        return new

    def _flagged(self, r: int, st: _RankState, s: int, ex: float, ow: float, md: float, new: list) -> None:
        rule = self.rule
        if st.span is not None:
            sp = st.span
            sp.last_step, st.quiet = s, 0
            sp.n_flagged += 1
            sp.excess_ms_sum += ex
            sp.own_ms_sum += ow
            sp.peers_ms_sum += md
            return
        if st.cand_len == 0:
            st.cand_first, st.cand = s, [0.0, 0.0, 0.0]
        st.cand_len += 1
        st.cand[0] += ex
        st.cand[1] += ow
        st.cand[2] += md
        if st.cand_len >= rule.steps:
            sp = DriftSpan(r, st.cand_first, s, s, st.cand_len, *st.cand)
            st.span, st.cand_len, st.quiet = sp, 0, 0
            if len(self.spans) < self.max_spans:
                self.spans.append(sp)
            new.append(sp)

    def _unflagged(self, st: _RankState) -> None:
        st.cand_len = 0
        if st.span is not None:
            st.quiet += 1
            if st.quiet >= self.rule.steps:
                st.span.open = False
                st.span = None

    def close(self) -> None:
        """No more steps: spans still going stay `open` (the drift lasted to the end of the series)."""


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
    n_bins = (hi - lo) // bin_steps + 1
    ri = {r: i for i, r in enumerate(ranks)}
    sums = {k: np.zeros((len(ranks), n_bins)) for k in ("step_ms", "own_ms")}
    counts = np.zeros((len(ranks), n_bins))
    peer_sum, peer_n = np.zeros(n_bins), np.zeros(n_bins)
    stats: dict[int, dict[str, list]] = {r: {"step_ms": [], "own_ms": [], "comm_ms": [], "data_ms": [], "opt_ms": [],
                                             "mem_peak": []} for r in ranks}
    n_steps = dict.fromkeys(ranks, 0)
    tracker = DriftTracker(rule, max_spans=MAX_SPANS * 5)
    by_seg: dict[int, list[tuple[int, Path]]] = {}
    for r, lst in segs.items():
        for seg, p in lst:
            by_seg.setdefault(seg, []).append((r, p))
    bad = {s.split(":")[0] for s in skipped}
    for seg in sorted(by_seg):
        s0 = seg * wf.SEGMENT_STEPS
        own = np.full((len(ranks), wf.SEGMENT_STEPS), np.nan)
        for r, p in by_seg[seg]:
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
            i = ri[r]
            o = own_ms(rows)
            own[i, rows["step"] - s0] = o
            b = (rows["step"] - lo) // bin_steps
            np.add.at(sums["step_ms"][i], b, rows["step_ms"])
            np.add.at(sums["own_ms"][i], b, o)
            np.add.at(counts[i], b, 1)
            n_steps[r] += rows.size
            st = stats[r]
            for k in ("step_ms", "comm_ms", "data_ms", "opt_ms"):
                st[k].append(float(np.median(rows[k])))
            st["own_ms"].append(float(np.median(o)))
            st["mem_peak"].append(int(rows["mem_peak"].max()))
        cols = np.flatnonzero(~np.all(np.isnan(own), axis=0))
        if cols.size == 0:
            continue
        own = own[:, cols[0]:cols[-1] + 1]
        steps = np.arange(s0 + cols[0], s0 + cols[-1] + 1)
        tracker.feed(steps, np.asarray(ranks), own)
        with np.errstate(all="ignore"):
            import warnings

            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                med = np.nanmedian(own, axis=0)
        ok = ~np.isnan(med)
        b = (steps[ok] - lo) // bin_steps
        np.add.at(peer_sum, b, med[ok])
        np.add.at(peer_n, b, 1)
    with np.errstate(invalid="ignore", divide="ignore"):
        bin_mean = {k: np.where(counts > 0, v / np.maximum(counts, 1), np.nan) for k, v in sums.items()}
        peers = np.where(peer_n > 0, peer_sum / np.maximum(peer_n, 1), np.nan)
    per_rank = {}
    for r in ranks:
        st = stats[r]
        # medians of the segments' medians: bounded, and what a rank's typical step is
        per_rank[r] = {"rank": r, "steps": n_steps[r],
                       **{f"{k}_median": (float(np.median(v)) if v else None)
                          for k, v in st.items() if k != "mem_peak"},
                       "mem_peak_max": (max(st["mem_peak"]) if st["mem_peak"] and max(st["mem_peak"]) >= 0 else None)}
    return WatchSummary(ranks, lo, hi, bin_steps, per_rank, bin_mean, peers, tracker.spans, skipped, rule)


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


def _blocks(ranks: list[int]) -> list[list[int]]:
    if len(ranks) <= MAX_HEATMAP_ROWS:
        return [[r] for r in ranks]
    size = math.ceil(len(ranks) / MAX_HEATMAP_ROWS)
    return [ranks[i:i + size] for i in range(0, len(ranks), size)]


def _r(x: Any, nd: int = 3) -> Any:
    if x is None:
        return None
    x = float(x)
    return round(x, nd) if math.isfinite(x) else None


def watch_section(ws: WatchSummary, drifts: list[dict[str, Any]], windows: list[dict[str, Any]]) -> dict[str, Any]:
    """The report's ``watch`` key (docs/report-format.md) from the summary, rank 0's drift records (which asked for
    a window) and the run's triggered windows ({window, first_step, last_step, request_id, reason})."""
    spans = sorted(ws.spans, key=lambda s: (-s.excess_ms * s.n_flagged, s.rank))[:MAX_SPANS]
    triggers = []
    for d in drifts:
        rank, at = d.get("rank"), d.get("confirmed_step")
        match = next((s for s in ws.spans if s.rank == rank and isinstance(at, int)
                      and s.first_step <= at <= s.last_step + ws.rule.steps), None)
        win = next((w for w in windows if d.get("request_id") and w.get("request_id") == d.get("request_id")), None)
        triggers.append({
            "request_id": d.get("request_id"), "rank": rank, "first_step": d.get("first_step"),
            "confirmed_step": at, "excess_ms": d.get("excess_ms"), "excess_pct": d.get("excess_pct"),
            "state": d.get("state"), "message": d.get("message"),
            "window": win.get("window") if win else d.get("window"),
            "window_first_step": win.get("first_step") if win else d.get("window_first"),
            "window_last_step": win.get("last_step") if win else d.get("window_last"),
            "drift": match.to_dict() if match else None,
        })
    blocks = _blocks(ws.ranks)
    ri = {r: i for i, r in enumerate(ws.ranks)}
    z: dict[str, list] = {"step_ms": [], "own_ms": []}
    for key, out in z.items():
        for blk in blocks:
            rows = ws.bin_mean[key][[ri[r] for r in blk]] if ws.bin_mean else np.zeros((0, 0))
            import warnings

            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # an all-NaN column: no step there
                out.append([_r(v) for v in np.nanmax(rows, axis=0)] if rows.size else [])
    labels = [f"rank {b[0]}" if len(b) == 1 else f"ranks {b[0]}-{b[-1]}" for b in blocks]
    n_bins = len(ws.peers_own_bin)
    bins = [ws.first_step + i * ws.bin_steps for i in range(n_bins)]
    outliers = []
    seen: set[int] = set()
    for s in spans:
        if s.rank in seen or len(seen) >= MAX_LINES:
            continue
        seen.add(s.rank)
        i = ri[s.rank]
        outliers.append({"rank": s.rank, "own_ms": [_r(v) for v in ws.bin_mean["own_ms"][i]],
                         "step_ms": [_r(v) for v in ws.bin_mean["step_ms"][i]]})
    return {
        "rule": {**asdict(ws.rule), "text": ws.rule.text()},
        "n_ranks": len(ws.ranks),
        "first_step": ws.first_step,
        "last_step": ws.last_step,
        "per_rank": [{k: _r(v) if isinstance(v, float) else v for k, v in ws.per_rank[r].items()}
                     for r in ws.ranks if r in ws.per_rank],
        "drifts": [s.to_dict() for s in spans],
        "triggers": triggers,
        "heatmap": {"bin_steps": ws.bin_steps, "bin_first_steps": bins, "rows": labels,
                    "row_ranks": [[b[0], b[-1]] for b in blocks], "step_ms": z["step_ms"],
                    "own_ms": z["own_ms"]},
        "lines": {"bin_first_steps": bins, "peers_own_ms": [_r(v) for v in ws.peers_own_bin], "ranks": outliers},
        "skipped": ws.skipped,
    }


#: A status file is never read past this size.
_MAX_STATUS_BYTES = 16 * 1024 * 1024


def triggered_windows(run_dir: str | Path) -> list[dict[str, Any]]:
    """The run's triggered windows as rank 0 recorded them in its status file (the first readable rank's otherwise):
    window, first_step, last_step, request_id, reason. [] when there is none."""
    import json

    from ..storage import schema

    paths = sorted(Path(run_dir).glob(schema.STATUS_TEMPLATE.replace("{rank:05d}", "*")))
    for p in paths:
        try:
            if p.stat().st_size > _MAX_STATUS_BYTES:
                continue
            doc = json.loads(p.read_bytes())
        except (OSError, ValueError):
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


def watch_report(run_dir: str | Path, rule: DriftRule | None = None) -> dict[str, Any] | None:
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
