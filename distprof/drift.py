"""The drift rule of ``--watch`` (numpy only, no torch): shared by the live watch on rank 0 (``capture/watch.py``)
and the whole-run watch section of the report (``analysis/report/watch.py``).

**Own work.** A rank that waits in a collective for a late peer has a long step too, so comparing step times flags
the victims with the culprit. The rule compares *own work* instead: the step's wall time minus the time it waited at
synchronisation points (capture/syncpoints.py) — on the host (``comm_ms``: ``Work.wait`` of every collective and
point-to-point call made from Python, the functional collectives' ``wait_tensor``, the end of backward where DDP's
reducer waits for its buckets) or on the device (``dev_comm_ms``: NCCL collectives' active time), whichever is
larger (on NCCL the host hardly blocks; a host wait such as a barrier's holds the device's inside it). The late rank
arrives last and hardly waits, the others wait for it: their own work stays what it was, the late rank's grows.

**The rule** (:class:`DriftRule`), per step: a rank drifts when its own work exceeds the median of the *other* ranks'
(leave-one-out, so that with two ranks the peer is the other one) by more than ``threshold`` (a fraction) and by at
least ``min_ms``; a drift *starts* once that holds for ``steps`` consecutive steps (from the first of them) and *ends*
after ``steps`` consecutive steps without it (at the last step that held). The same :class:`DriftTracker` runs live
on rank 0 (fed the steps every rank has published) and over the saved series in the report.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["DriftRule", "DriftSpan", "DriftTracker", "own_ms", "peer_median", "flag_drift"]


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
    """Own work per row of the watch series (ms): wall time minus the time waiting at synchronisation points, on the
    host or on the device (NCCL), whichever is larger."""
    waited = rows["comm_ms"].astype(np.float64)
    if "dev_comm_ms" in (rows.dtype.names or ()):
        waited = np.fmax(waited, rows["dev_comm_ms"])  # NaN (not measured) leaves the host's
    return np.maximum(rows["step_ms"].astype(np.float64) - waited, 0.0)


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
