"""Clock alignment across hosts: pure functions from clock-sync samples and matched collectives.

Model (Score-P style, docs/shard-format.md §/clock): for each host other than the reference, each window's ping-pongs
give one offset at the window start (phase 0) and one at its end (phase 1) (:func:`phase_offsets`); in between the
offset is linear (piecewise per window, :func:`fit_segments`). A recorded time ``t`` of a rank on that host in window
``w`` becomes

    aligned = t + rint(offset_w + slope_w · (t − t_w))

A phase measured under CPU contention can be off by hundreds of µs; over a window of a fraction of a second that
would turn into a drift of hundreds of ppm. So every phase estimate carries an uncertainty (how much its best round
trip exceeds the host's best) and the lines are weighted least-squares fits with a prior on the drift (0 ± 50 ppm
globally; each window centred on the host's global drift).

Ranks on one host share its clock (``clock_role`` member → its leader's samples); the reference host has offset 0.
Hosts without samples (imported traces, failed sync) are aligned from matched collectives instead: the median of
(end on the reference host − end on this host) over synchronising collectives, per window. Afterwards the alignment is
checked: no rank can finish a synchronising collective before the last rank entered it, so
``max(0, max_start − min_end)`` per instance is a clock error the model failed to remove (the *residual*).

The :class:`~distprof.analysis.types.HostClock` summaries hold the offset at the first window's segment start and the
drift of the host's global line; the piecewise model (:class:`ClockModel`) is what the run summary and load_run apply.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

from ..types import HostClock, RankClockInfo
from .matching import Collectives, realign

log = logging.getLogger(__name__)

Table = dict[str, np.ndarray]

#: Share of lowest-RTT samples kept per phase, and the minimum kept (for the "median-rtt" estimator).
KEEP_FRACTION = 0.25
MIN_KEEP = 3
#: Offset estimators: "min-delay" (default) or "median-rtt" (median offset of the lowest-RTT samples).
ESTIMATORS = ("min-delay", "median-rtt")
#: Prior on a host's drift (1 σ, ppm): quartz oscillators run within ±50 ppm, NTP-disciplined ones within a few.
DRIFT_PRIOR_PPM = 50.0
#: Floor of a phase estimate's uncertainty (ns): the systematic send/recv asymmetry measured on one host (2–7 µs).
MIN_UNCERTAINTY_NS = 2_000.0
#: A clock step (NTP stepping a clock, a VM migrating): a host's offset changes between two consecutive phase
#: estimates by more than STEP_MIN_NS plus STEP_SIGMAS times their uncertainties plus STEP_DRIFT_PPM (ten times the
#: drift prior) over the time between them — what no drift explains.
STEP_MIN_NS = 1_000_000
STEP_SIGMAS = 6.0
STEP_DRIFT_PPM = 10 * DRIFT_PRIOR_PPM


def phase_offsets(
    samples: Table,
    *,
    estimator: str = "min-delay",
    keep_fraction: float = KEEP_FRACTION,
    min_keep: int = MIN_KEEP,
) -> Table:
    """One offset estimate per phase from NTP-style samples of one rank and window.

    The offset is the value to add to local times to get the reference clock. Estimators:

    * ``"min-delay"`` (default): ``(min(t_remote − t_send) − min(t_recv − t_remote)) / 2``: the least-delayed ping and
      the least-delayed pong, possibly from different samples; assumes equal minimum one-way delays. It is the
      midpoint of the interval every sample's causality allows, so outliers on either leg never move it.
    * ``"median-rtt"``: median of ``t_remote − (t_send + t_recv)/2`` over the lowest-RTT samples (``keep_fraction``,
      at least ``min_keep``). Under CPU contention the kept set still holds asymmetric samples: on a 4-process /
      2-core run it was 0.55 ms off where min-delay was 0.11 ms off (and 6 vs 9 µs in a quiet phase).

    A clock that stepped while a phase's samples were taken (negative round trips, offsets further apart than their
    round trips allow) leaves only the samples on the window's side of the step (:func:`_one_side_of_a_step`).

    Returns columns phase u1, t_local_ns i8 (median local midpoint), offset_ns f8 (chosen estimator),
    offset_median_ns f8 (median-rtt, for diagnostics), rtt_min_ns i8, rtt_eff_ns i8 (min ping + min pong delay: the
    best round trip the phase allows), n i8 (samples), n_kept i8 (median-rtt's kept), stepped b1 (a step was seen
    in the phase) — one row per phase present.
    """
    if estimator not in ESTIMATORS:
        raise ValueError(f"estimator={estimator!r}: choose one of {', '.join(ESTIMATORS)}")
    phase = np.asarray(samples.get("phase", np.zeros(0)), dtype=np.int64)
    cols = ("phase", "t_local_ns", "offset_ns", "offset_median_ns", "rtt_min_ns", "rtt_eff_ns", "n", "n_kept",
            "stepped")
    out: dict[str, list] = {k: [] for k in cols}
    if len(phase) == 0:
        return _phase_table(out)
    send = np.asarray(samples["t_send_ns"], dtype=np.int64)
    recv = np.asarray(samples["t_recv_ns"], dtype=np.int64)
    remote = np.asarray(samples["t_remote_ns"], dtype=np.int64)
    rtt = recv - send
    ok = rtt >= 0  # a negative round trip: the leader's clock stepped back during it
    # differences in int64 before going to float: epoch ns do not fit a double exactly
    ping = remote - send  # = one-way delay + offset
    pong = recv - remote  # = one-way delay − offset
    offset = (ping - pong).astype(np.float64) / 2.0
    for ph in np.unique(phase[ok]):  # at most 2 phases
        idx = np.flatnonzero(ok & (phase == ph))
        idx, stepped = _one_side_of_a_step(idx, rtt, ping, pong, int(ph))
        k = min(len(idx), max(min_keep, int(np.ceil(keep_fraction * len(idx)))))
        kept = idx[np.argsort(rtt[idx], kind="stable")[:k]]
        med = float(np.median(offset[kept]))
        pmin, qmin = int(ping[idx].min()), int(pong[idx].min())
        mid_rel = np.median((send[idx] - send[idx[0]]).astype(np.float64) + rtt[idx] / 2.0)
        out["phase"].append(int(ph))
        out["t_local_ns"].append(int(send[idx[0]] + int(round(mid_rel))))
        out["offset_ns"].append((pmin - qmin) / 2.0 if estimator == "min-delay" else med)
        out["offset_median_ns"].append(med)
        out["rtt_min_ns"].append(int(rtt[idx].min()))
        out["rtt_eff_ns"].append(pmin + qmin)
        out["n"].append(len(idx))
        out["n_kept"].append(k)
        out["stepped"].append(stepped or bool((rtt[phase == ph] < 0).any()))
    return _phase_table(out)


def _one_side_of_a_step(idx: np.ndarray, rtt: np.ndarray, ping: np.ndarray, pong: np.ndarray,
                        phase: int) -> tuple[np.ndarray, bool]:
    """The samples `idx` of one phase, or when a clock stepped while they were taken, those on the window's side of
    the step (phase 0, the window's start: after it; phase 1, its end: before it), and whether it did.

    Each sample's offset is within half its round trip of the truth, so two samples of one clock differ by at most
    half their round trips added; a sample further than that and STEP_MIN_NS from the tightest sample (least round
    trip) since the last step is the first after a new one. Comparing with the tightest sample, not the previous one:
    a sample whose round trip spans the step has a round trip as long as the step and an offset half-way, within
    its bound of both sides, and bridged consecutive comparisons (a 5 s step went unseen, and its phase's estimate
    mixed both sides)."""
    if len(idx) < 2:  # in the order they were taken (a clock stepped back makes local times ambiguous)
        return idx, False
    off = (ping[idx] - pong[idx]).astype(np.float64) / 2.0
    half = rtt[idx].astype(np.float64) / 2.0
    jumps, ref = [], 0
    for j in range(1, len(idx)):
        if abs(off[j] - off[ref]) - (half[j] + half[ref]) > STEP_MIN_NS:
            jumps.append(j)
            ref = j
        elif half[j] < half[ref]:
            ref = j
    if not jumps:
        return idx, False
    return (idx[jumps[-1]:] if phase == 0 else idx[:jumps[0]]), True


def _phase_table(d: dict[str, list]) -> Table:
    dt = {"phase": np.uint8, "t_local_ns": np.int64, "offset_ns": np.float64, "offset_median_ns": np.float64,
          "rtt_min_ns": np.int64, "rtt_eff_ns": np.int64, "n": np.int64, "n_kept": np.int64, "stepped": np.bool_}
    return {k: np.asarray(v, dtype=dt[k]) for k, v in d.items()}


def uncertainties(estimates: Mapping[int, Table], min_ns: float = MIN_UNCERTAINTY_NS) -> dict[int, np.ndarray]:
    """Uncertainty (ns) of each phase estimate of one host: half the excess of its best round trip over the host's.

    A phase whose least-delayed ping and pong add up to the host's best round trip is as good as the link allows
    (``min_ns``); one that only got slow round trips (contention) can be off by up to half the excess.
    """
    effs = [np.asarray(e["rtt_eff_ns"], dtype=np.float64) for e in estimates.values() if len(e["phase"])]
    if not effs:
        return {}
    every = np.concatenate(effs)
    floor = float(every[every >= 0].min()) if (every >= 0).any() else 0.0  # a round trip is never negative: an
    # estimate whose best ping and pong add up to less mixed two sides of a clock step, and must not set the floor
    return {w: np.where(eff < 0, np.abs(eff), np.maximum(min_ns, (eff - floor) / 2.0))
            for w, e in estimates.items() for eff in [np.asarray(e["rtt_eff_ns"], dtype=np.float64)]}


@dataclass(frozen=True)
class Segment:
    """aligned = t + rint(offset_ns + slope · (t − t_ref_ns)) for one host and window (slope = drift_ppm · 1e-6)."""

    t_ref_ns: int
    offset_ns: float
    slope: float = 0.0

    def apply(self, t: np.ndarray) -> np.ndarray:
        t = np.asarray(t, dtype=np.int64)
        return t + np.rint(self.offset_ns + self.slope * (t - self.t_ref_ns).astype(np.float64)).astype(np.int64)


def _fit_line(t: np.ndarray, o: np.ndarray, u: np.ndarray, slope_prior: float, slope_sigma: float) -> Segment:
    """Weighted least squares o ≈ a + b (t − t0) with weights 1/u² and a Gaussian prior b ~ N(slope_prior, σ²)."""
    t0 = int(t.min())
    x = (t - t0).astype(np.float64) / 1e9  # seconds (ns/s slopes keep the normal equations well conditioned)
    w = 1.0 / np.square(np.asarray(u, dtype=np.float64))
    # normal equations of [a (ns), b (ns/s)] with the prior as one more observation on b
    s0, s1, s2 = w.sum(), (w * x).sum(), (w * x * x).sum()
    r0, r1 = (w * o).sum(), (w * x * o).sum()
    p = 1.0 / (slope_sigma * 1e9) ** 2
    a, b = np.linalg.solve(np.array([[s0, s1], [s1, s2 + p]]), np.array([r0, r1 + p * slope_prior * 1e9]))
    return Segment(t0, float(a), float(b) / 1e9)


def fit_segments(
    estimates: Mapping[int, Table],
    *,
    drift_prior_ppm: float = DRIFT_PRIOR_PPM,
    min_uncertainty_ns: float = MIN_UNCERTAINTY_NS,
) -> tuple[dict[int, Segment], Segment | None]:
    """Per-window segments from one host's phase estimates (window -> phase_offsets table), and a global line.

    Global line: weighted least squares through every phase estimate (weights 1/uncertainty², see
    :func:`uncertainties`) with a prior drift 0 ± ``drift_prior_ppm``. Each window: the same fit over its own phases
    with the prior centred on the global drift — with two good phases the segment passes through both; a phase
    measured under contention is outweighed instead of bending the drift by hundreds of ppm; a window with one
    phase takes that offset and the global drift.
    """
    est = {w: e for w, e in estimates.items() if len(e["phase"])}
    if not est:
        return {}, None
    unc = uncertainties(est, min_uncertainty_ns)
    sigma = max(drift_prior_ppm, 1e-6) * 1e-6
    t_all = np.concatenate([np.asarray(e["t_local_ns"], dtype=np.int64) for e in est.values()])
    o_all = np.concatenate([np.asarray(e["offset_ns"], dtype=np.float64) for e in est.values()])
    u_all = np.concatenate([unc[w] for w in est])
    glob = _fit_line(t_all, o_all, u_all, 0.0, sigma)
    segs = {w: _fit_line(np.asarray(e["t_local_ns"], dtype=np.int64), np.asarray(e["offset_ns"], dtype=np.float64),
                         unc[w], glob.slope, sigma)
            for w, e in est.items()}
    return segs, glob


@dataclass
class ClockModel:
    """Piecewise alignment per (host, window), plus the per-host summaries (``RunSummary.clock``)."""

    reference_host: str
    rank_host: dict[int, str]
    hosts: dict[str, HostClock]
    segments: dict[tuple[str, int], Segment] = field(default_factory=dict)
    fallback: dict[str, Segment] = field(default_factory=dict)  # host -> line used for windows without a segment
    warnings: list[str] = field(default_factory=list)
    steps: list["ClockStep"] = field(default_factory=list)  # clock steps found in the samples
    #: windows left out of every cross-rank analysis: a host's clock stepped while they were recorded (why)
    left_out: dict[int, str] = field(default_factory=dict)

    def segment(self, host: str, window: int) -> Segment:
        seg = self.segments.get((host, window)) or self.fallback.get(host)
        return seg if seg is not None else Segment(0, 0.0, 0.0)

    def _params(self, rank: np.ndarray, window: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per row (rank, window): the segment's t_ref, offset and slope, through a (host, window) parameter table.
        Ranks the model does not know get the identity."""
        rank = np.asarray(rank, dtype=np.int64)
        window = np.asarray(window, dtype=np.int64)
        hosts = sorted(set(self.rank_host.values()))
        h_idx = {h: i + 1 for i, h in enumerate(hosts)}  # 0 = unknown rank: identity
        r_max = int(max(rank.max(), max(self.rank_host, default=0))) + 1
        host_of = np.zeros(r_max, dtype=np.int64)
        for r, h in self.rank_host.items():
            if r < r_max:
                host_of[r] = h_idx[h]
        wins, wi = _window_index(window)
        n_w = len(wins)
        tref = np.zeros((len(hosts) + 1) * n_w, dtype=np.int64)  # row-major (host, window) tables, flat
        off = np.zeros(tref.size, dtype=np.float64)
        slope = np.zeros(tref.size, dtype=np.float64)
        for h, i in h_idx.items():  # per host × window present
            for j, w in enumerate(wins):
                seg = self.segment(h, int(w))
                tref[i * n_w + j], off[i * n_w + j], slope[i * n_w + j] = seg.t_ref_ns, seg.offset_ns, seg.slope
        cell = host_of[rank] * n_w + wi
        return tref[cell], off[cell], slope[cell]

    def align_all(self, rank: np.ndarray, window: np.ndarray, *ts: np.ndarray) -> tuple[np.ndarray, ...]:
        """:meth:`align` of several time columns of the same rows (a member's start and end): the rows' segment
        parameters are looked up once."""
        if len(np.asarray(rank)) == 0:
            return tuple(np.asarray(t, dtype=np.int64).copy() for t in ts)
        params = self._params(rank, window)
        return tuple(_aligned(np.asarray(t, dtype=np.int64), *params) for t in ts)

    def slopes(self, rank: np.ndarray, window: np.ndarray) -> np.ndarray:
        """Per row (rank, window): the slope of its segment (aligned duration = recorded duration × (1 + slope))."""
        if len(np.asarray(rank)) == 0:
            return np.zeros(0)
        return self._params(rank, window)[2]

    def align(self, rank: np.ndarray, window: np.ndarray, t: np.ndarray) -> np.ndarray:
        """Aligned times for rows (rank, window, recorded t): vectorised through a (host, window) parameter table.

        Ranks the model does not know keep their times.
        """
        t = np.asarray(t, dtype=np.int64)
        if len(t) == 0:
            return t.copy()
        return _aligned(t, *self._params(rank, window))


def _aligned(t: np.ndarray, tref: np.ndarray, off: np.ndarray, slope: np.ndarray) -> np.ndarray:
    """Recorded times `t` on the reference clock, from each row's segment parameters."""
    dt = (t - tref).astype(np.float64)
    return t + np.rint(off + slope * dt).astype(np.int64)


#: Windows are numbered from 0: up to this many, a row's window index comes from a lookup table, not a sort.
_WINDOW_LUT = 1 << 20


def _window_index(window: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct windows, sorted, and each row's index among them (``np.unique(.., return_inverse=True)``; by a
    count and a lookup table where the numbers are small: a sort of every member row cost 0.04 s at 1.4 M rows)."""
    lo, hi = int(window.min()), int(window.max())
    if lo < 0 or hi >= _WINDOW_LUT:
        wins, wi = np.unique(window, return_inverse=True)
        return wins, wi.reshape(-1)
    wins = np.flatnonzero(np.bincount(window, minlength=hi + 1))
    lut = np.zeros(hi + 1, np.int64)
    lut[wins] = np.arange(wins.size)
    return wins, lut[window]


def reference_of(infos: Mapping[int, RankClockInfo]) -> tuple[int, str | None]:
    """(reference rank, its host): from clock_reference attributes, else the lowest rank.

    When the reference rank has no shard its host is found through the ranks that follow it as their clock leader;
    the host is None when none of its ranks has data (samples of other hosts still refer to its clock).
    """
    refs = [i.reference for i in infos.values() if i.reference is not None]
    if refs:
        ref = int(np.bincount(np.asarray(refs)).argmax())
        if ref in infos:
            return ref, infos[ref].host
        for i in sorted(infos.values(), key=lambda i: i.rank):
            if i.leader == ref:
                return ref, i.host
        return ref, None
    low = min(infos)
    return low, infos[low].host


def _reference(infos: Mapping[int, RankClockInfo], samples: Mapping[tuple[int, int], Table],
               rank_host: Mapping[int, str], warnings: list[str]) -> tuple[int, str]:
    """The reference rank and host: the declared one, a stand-in name for its host when none of that host's ranks
    has data but samples refer to its clock (a warning), else the lowest rank with data."""
    ref_rank, ref_host = reference_of(infos)
    if ref_host is None:
        if any(r in rank_host for (r, _w) in samples):
            # samples still refer to the reference's clock: align to it, though none of its host's ranks has data
            ref_host = f"(host of rank {ref_rank})"
            warnings.append(f"no shard from the clock reference rank {ref_rank} or its host: hosts are aligned to "
                            "its clock through their samples")
        else:
            ref_rank = min(infos)
            ref_host = rank_host[ref_rank]
    return ref_rank, ref_host


def _host_phase_estimates(keys: Sequence[tuple[int, int]], infos: Mapping[int, RankClockInfo],
                          samples: Mapping[tuple[int, int], Table], estimator: str) -> tuple[dict[int, Table], int]:
    """Per window, the phase offsets of the samples `keys` (a host's leaders', in `samples`' order) against their
    reference (see :func:`phase_offsets`), and how many samples went into them."""
    est: dict[int, Table] = {}
    n_samples = 0
    for r, w in keys:
        tab = samples[(r, w)]
        if r in infos and infos[r].reference is not None and "peer" in tab and len(tab["peer"]):
            peer_ok = np.asarray(tab["peer"]) == infos[r].reference
            tab = {k: np.asarray(v)[peer_ok] for k, v in tab.items()}
        e = phase_offsets(tab, estimator=estimator)
        if len(e["phase"]):
            prev = est.get(w)
            est[w] = e if prev is None else {k: np.concatenate([prev[k], e[k]]) for k in e}
            n_samples += int(e["n"].sum())
    return est, n_samples


@dataclass(frozen=True)
class ClockStep:
    """A host's offset to the reference changed by `jump_ns` (its clock jumped by −`jump_ns`) between two consecutive
    phase estimates: after window `before`'s phase `phase_before` and by window `after`'s phase `phase_after` (the
    same window: it stepped while it was recorded)."""

    host: str
    before: int
    phase_before: int
    after: int
    phase_after: int
    jump_ns: float

    @property
    def inside(self) -> bool:
        return self.before == self.after

    def describe(self) -> str:
        """'host h1 +5.000 s inside window 7': how far the host's clock jumped (its offset moved the other way)."""
        where = (f"inside window {self.after}" if self.inside else
                 f"between window {self.before} and window {self.after}")
        return f"host {self.host} {-self.jump_ns / 1e9:+.3f} s {where}"


def find_steps(h: str, est: Mapping[int, Table], unc: Mapping[int, np.ndarray]) -> tuple[list[ClockStep], dict]:
    """Clock steps of host `h` (see STEP_MIN_NS) in its phase estimates `est` (window -> table) with uncertainties
    `unc`; and the epoch (0, 1, ... : the stretch between steps) of each (window, phase row)."""
    # in the order they were taken: by window, then phase (a clock stepped back makes local times ambiguous)
    rows = sorted((w, int(e["phase"][i]), int(e["t_local_ns"][i]), i) for w, e in est.items()
                  for i in range(len(e["phase"])))
    steps: list[ClockStep] = []
    epoch: dict[tuple[int, int], int] = {}
    prev = None
    for w, ph, t, i in rows:
        if prev is not None:
            wp, php, tp, ip = prev
            d_o = float(est[w]["offset_ns"][i] - est[wp]["offset_ns"][ip])
            tol = (STEP_MIN_NS + STEP_SIGMAS * (float(unc[w][i]) + float(unc[wp][ip]))
                   + STEP_DRIFT_PPM * 1e-6 * abs(t - tp))
            if abs(d_o) > tol:
                steps.append(ClockStep(h, wp, php, w, ph, d_o))
        epoch[(w, i)] = len(steps)
        prev = (w, ph, t, i)
    return steps, epoch


def _epoch_estimates(est: Mapping[int, Table], epoch: dict, e: int) -> dict[int, Table]:
    """The phase estimates of epoch `e` only (a window cut by a step keeps its rows on each side)."""
    out = {}
    for w, tab in est.items():
        keep = np.array([epoch[(w, i)] == e for i in range(len(tab["phase"]))], dtype=bool)
        if keep.any():
            out[w] = {k: np.asarray(v)[keep] for k, v in tab.items()}
    return out


def _fit_host(model: ClockModel, h: str, est: dict[int, Table], n_samples: int, ranks: list[int],
              drift_prior_ppm: float) -> None:
    """Host `h`'s segments, fallback line and HostClock in `model`, fitted from its phase estimates `est`. A clock
    step splits them into epochs fitted on their own; a window the step cut is left out (``model.left_out``)."""
    steps, epoch = find_steps(h, est, uncertainties(est))
    segs: dict[int, Segment] = {}
    lines: list[tuple[int, Segment]] = []
    for e in range(len(steps) + 1):
        part = _epoch_estimates(est, epoch, e)
        if not part:
            continue
        seg_e, glob_e = fit_segments(part, drift_prior_ppm=drift_prior_ppm)
        for w, sg in seg_e.items():
            segs.setdefault(w, sg)  # a window cut by a step: its start's epoch (it is left out anyway)
        lines.append((sum(len(t["phase"]) for t in part.values()), glob_e))
    glob = max(lines, key=lambda x: x[0])[1]  # the drift of the longest stretch without a step
    for w, sg in segs.items():
        model.segments[(h, w)] = sg
    model.fallback[h] = glob
    model.steps.extend(steps)
    for st in steps:
        if st.inside:
            model.left_out.setdefault(st.after, st.describe())
    s0 = segs[min(segs)]
    model.hosts[h] = HostClock(host=h, offset_ns=s0.offset_ns, drift_ppm=glob.slope * 1e6, t_ref_ns=s0.t_ref_ns,
                               method="ping-pong", n_samples=n_samples, ranks=ranks)
    log.debug("host %s: offset %.0f ns, drift %.3f ppm, %d samples, %d clock step(s), best round trip %d ns", h,
              s0.offset_ns, glob.slope * 1e6, n_samples, len(steps),
              min(int(e["rtt_eff_ns"].min()) for e in est.values()))


def steps_warning(model: ClockModel) -> str | None:
    """The one warning naming every clock step found, and what was done about it (None without a step)."""
    if not model.steps:
        return None
    named = "; ".join(st.describe() for st in model.steps[:6]) + (
        f" and {len(model.steps) - 6} more" if len(model.steps) > 6 else "")
    out = (f"clock step(s) (an offset change no drift explains: NTP stepping a clock, a VM migrating): {named}; "
           "each host is aligned separately on either side of a step")
    if model.left_out:
        out += (f"; window(s) {', '.join(str(w) for w in sorted(model.left_out))} (recorded while a clock stepped) "
                "are left out of the cross-rank analyses")
    return out


def drop_windows(table: Table, windows: Mapping[int, str] | set[int]) -> Table:
    """`table` without its rows of `windows` (column ``window``); itself when there is nothing to drop."""
    if not windows or "window" not in table or not len(table["window"]):
        return table
    keep = ~np.isin(np.asarray(table["window"]), np.fromiter(windows, dtype=np.int64))
    return table if keep.all() else {k: np.asarray(v)[keep] for k, v in table.items()}


def estimate_clocks(
    infos: Mapping[int, RankClockInfo],
    samples: Mapping[tuple[int, int], Table],
    collectives: Collectives | None = None,
    *,
    names: np.ndarray | None = None,
    estimator: str = "min-delay",
    drift_prior_ppm: float = DRIFT_PRIOR_PPM,
) -> ClockModel:
    """Build the clock model of a run.

    infos: rank -> RankClockInfo for every rank with data.
    samples: (rank, window) -> /clock/samples columns (only ranks that have samples).
    collectives: matched instances on **raw** times (for the fallback and the residual check); names: global string
    table (to pick synchronising ops).
    estimator, drift_prior_ppm: see :func:`phase_offsets` and :func:`fit_segments`.
    """
    rank_host = {r: i.host for r, i in infos.items()}
    hosts = sorted(set(rank_host.values()))
    host_ranks: dict[str, list[int]] = {h: [] for h in hosts}  # one pass (a pass per host was hosts x ranks)
    for r, h in sorted(rank_host.items()):
        host_ranks[h].append(r)
    warnings: list[str] = []
    _ref_rank, ref_host = _reference(infos, samples, rank_host, warnings)
    model = ClockModel(reference_host=ref_host, rank_host=rank_host, hosts={}, warnings=warnings)

    if ref_host in host_ranks:
        method = "single-host" if len(hosts) == 1 else "reference"
        model.hosts[ref_host] = HostClock(host=ref_host, offset_ns=0.0, method=method, ranks=host_ranks[ref_host])
    no_samples: list[str] = []
    by_rank, order = _keys_by_rank(samples)  # per host, its ranks' samples alone: a pass over every sample per
    for h in hosts:                          # host was quadratic (2,048 hosts x 16,384 samples: 1 s)
        if h == ref_host:
            continue
        leaders = _leaders(h, host_ranks[h], infos, by_rank)
        keys = sorted((k for r in leaders for k in by_rank[r]), key=order.__getitem__)
        est, n_samples = _host_phase_estimates(keys, infos, samples, estimator)
        if not est:
            no_samples.append(h)
            continue
        _fit_host(model, h, est, n_samples, host_ranks[h], drift_prior_ppm)

    if no_samples:
        _from_collectives(model, no_samples, host_ranks, collectives, names, drift_prior_ppm)

    if collectives is not None and len(collectives):
        residuals(model, collectives, names=names)
    note = steps_warning(model)
    if note:
        model.warnings.append(note)
    return model


def _keys_by_rank(samples: Mapping[tuple[int, int], Table]
                  ) -> tuple[dict[int, list[tuple[int, int]]], dict[tuple[int, int], int]]:
    """rank -> its keys of `samples` (in their order), and key -> its position in `samples`."""
    by_rank: dict[int, list[tuple[int, int]]] = {}
    order: dict[tuple[int, int], int] = {}
    for i, k in enumerate(samples):
        order[k] = i
        by_rank.setdefault(k[0], []).append(k)
    return by_rank, order


def _leaders(host: str, ranks: Sequence[int], infos, by_rank: Mapping[int, list]) -> set[int]:
    """Ranks whose samples give this host's clock: the declared leader(s), else any rank of the host with samples
    (`by_rank`: each rank's sample keys, :func:`_keys_by_rank`)."""
    with_samples = {r for r in ranks if by_rank.get(r)}
    declared = {infos[r].leader for r in ranks if infos[r].leader is not None}
    chosen = with_samples & declared
    return chosen or with_samples


def _sync_instances(c: Collectives, names, left_out: Mapping[int, str] | None = None) -> np.ndarray:
    """The complete, consistent (and, where names say so, synchronising) instances, outside the `left_out` windows
    (a clock stepped while they were recorded)."""
    ok = c.instances["complete"] & c.instances["consistent"]
    if left_out:
        ok = ok & ~np.isin(c.instances["window"], np.fromiter(left_out, dtype=np.int64))
    if names is not None:
        sync = c.sync_mask(names)
        if (ok & sync).any():
            return ok & sync
    return ok


def _host_aggregates(c: Collectives, rank_host: Mapping[int, str], use: np.ndarray, hosts: set[str]
                     ) -> dict[str, np.ndarray]:
    """Per used instance where `hosts` have ranks: those ranks' latest start, earliest end and median end.

    Times are relative to the instance's raw ``end_min`` (float ns), so epoch ns never go through a double.
    Returns {"inst", "window", "start_max", "end_min", "end_med"}.
    """
    return _aggregates(c, use, _member_codes(c, {r: 0 for r, h in rank_host.items() if h in hosts}), 1)[0]


def _per_host_aggregates(c: Collectives, rank_host: Mapping[int, str], use: np.ndarray, hosts: Sequence[str]
                         ) -> dict[str, dict[str, np.ndarray]]:
    """:func:`_host_aggregates` of each host of `hosts` alone, in one pass over the members (a pass per host sorted
    every member again: hosts x members)."""
    code = {h: i for i, h in enumerate(hosts)}
    of_rank = {r: code[h] for r, h in rank_host.items() if h in code}
    return dict(zip(hosts, _aggregates(c, use, _member_codes(c, of_rank), len(hosts))))


def _member_codes(c: Collectives, code_of_rank: Mapping[int, int]) -> np.ndarray:
    """Per member: its rank's code (−1: none)."""
    m = c.members
    ranks_u = np.unique(m["rank"])
    of = np.array([code_of_rank.get(int(r), -1) for r in ranks_u], dtype=np.int64)
    return of[np.searchsorted(ranks_u, m["rank"])] if len(m["rank"]) else np.zeros(0, np.int64)


def _aggregates(c: Collectives, use: np.ndarray, codes: np.ndarray, n_codes: int) -> list[dict[str, np.ndarray]]:
    """Per code 0..n_codes−1, per used instance where members have that code: their latest start, earliest end and
    median end, relative to the instance's raw ``end_min``."""
    m = c.members
    sel = (codes >= 0) & use[m["inst"]] if len(codes) else np.zeros(0, bool)
    inst, code = m["inst"][sel], codes[sel]
    if len(inst) == 0:
        z = np.zeros(0)
        return [{"inst": np.zeros(0, np.int64), "window": np.zeros(0, np.int64), "start_max": z, "end_min": z,
                 "end_med": z} for _ in range(n_codes)]
    base = c.instances["end_min"][inst]
    s_rel = (m["start_ns"][sel] - base).astype(np.float64)
    e_rel = (m["end_ns"][sel] - base).astype(np.float64)
    order = np.lexsort((e_rel, inst, code))
    inst, code, s_rel, e_rel = inst[order], code[order], s_rel[order], e_rel[order]
    first = np.flatnonzero(np.r_[True, (inst[1:] != inst[:-1]) | (code[1:] != code[:-1])])
    cnt = np.diff(np.r_[first, len(inst)])
    med = (e_rel[first + (cnt - 1) // 2] + e_rel[first + cnt // 2]) / 2.0  # sorted runs: middle one or two
    ids = inst[first]
    start_max, end_min = np.maximum.reduceat(s_rel, first), e_rel[first]
    window = c.instances["window"][ids].astype(np.int64)
    bounds = np.searchsorted(code[first], np.arange(n_codes + 1))
    return [{"inst": ids[lo:hi], "window": window[lo:hi], "start_max": start_max[lo:hi], "end_min": end_min[lo:hi],
             "end_med": med[lo:hi]} for lo, hi in zip(bounds[:-1].tolist(), bounds[1:].tolist())]


#: Floor of the uncertainty of a collective-based window offset (ns).
MIN_COLLECTIVE_UNCERTAINTY_NS = 10_000.0


def _window_offsets(h: str, d: np.ndarray, lower: np.ndarray, upper: np.ndarray, win: np.ndarray, t_h: np.ndarray,
                    empty_windows: list[str]) -> tuple[list[int], np.ndarray, np.ndarray, np.ndarray]:
    """Per window of host `h`'s shared instances: its id, reference time (the median instance's own clock), offset
    (the median of `d` clipped into [`lower`, `upper`]) and uncertainty. A window whose interval is empty is named
    in `empty_windows`."""
    w_ids, t_w, o_w, u_w = [], [], [], []
    for w in np.unique(win):  # per window
        sel = win == w
        est = float(np.median(d[sel]))
        lo, hi = float(lower[sel].max()), float(upper[sel].min())
        if lo <= hi:
            est = min(max(est, lo), hi)
            unc = (hi - lo) / 2.0
        else:
            empty_windows.append(f"{h} window {int(w)}")
            mad = float(np.median(np.abs(d[sel] - np.median(d[sel]))))
            unc = 1.4826 * mad / np.sqrt(sel.sum()) if sel.sum() > 1 else float(np.ptp(d[sel]) or 1e6)
        ts = np.sort(t_h[sel])
        w_ids.append(int(w))
        t_w.append(int(ts[len(ts) // 2]))
        o_w.append(est)
        u_w.append(max(unc, MIN_COLLECTIVE_UNCERTAINTY_NS))
    return w_ids, np.asarray(t_w, np.int64), np.asarray(o_w), np.asarray(u_w)


def _align_host_by_collectives(model: ClockModel, h: str, a: Collectives, h_agg: dict[str, np.ndarray],
                               r_agg: dict[str, np.ndarray], ranks: list[int], drift_prior_ppm: float,
                               empty_windows: list[str]) -> None:
    """Host `h`'s segments, fallback line and HostClock in `model` from the instances (`a`; its own aggregates
    `h_agg`, the anchors' `r_agg`) it shares with the anchors; method "none" and a warning when it shares none."""
    common, i_r, i_h = np.intersect1d(r_agg["inst"], h_agg["inst"], return_indices=True)
    if len(common) == 0:
        model.hosts[h] = HostClock(host=h, offset_ns=0.0, method="none", ranks=ranks)
        model.warnings.append(
            f"host {h}: no clock-sync samples and no collective shared with the aligned hosts; "
            "its times are not aligned")
        return
    d = r_agg["end_med"][i_r] - h_agg["end_med"][i_h]
    upper = r_agg["end_min"][i_r] - h_agg["start_max"][i_h]
    lower = r_agg["start_max"][i_r] - h_agg["end_min"][i_h]
    # this host's own clock at each instance (for the segments' reference times)
    t_h = a.instances["end_min"][common] + np.rint(h_agg["end_med"][i_h]).astype(np.int64)
    w_ids, t_arr, o_arr, u_arr = _window_offsets(h, d, lower, upper, h_agg["window"][i_h], t_h, empty_windows)
    glob = _fit_line(t_arr, o_arr, u_arr, 0.0, max(drift_prior_ppm, 1e-6) * 1e-6)
    for w, t, o in zip(w_ids, t_arr, o_arr):
        model.segments[(h, w)] = Segment(int(t), float(o), glob.slope)
    model.fallback[h] = glob
    s0 = model.segments[(h, w_ids[0])]
    model.hosts[h] = HostClock(host=h, offset_ns=s0.offset_ns, drift_ppm=glob.slope * 1e6, t_ref_ns=s0.t_ref_ns,
                               method="collectives", n_samples=int(len(common)), ranks=ranks)


def _from_collectives(model: ClockModel, hosts: list[str], host_ranks, c: Collectives | None, names,
                      drift_prior_ppm: float = DRIFT_PRIOR_PPM) -> None:
    """Align hosts without samples from synchronising collectives shared with aligned hosts, per window.

    Anchors: the reference host and the hosts aligned by samples (on aligned times). Per instance: d = median end on
    the anchors − median end on this host (ends of a collective agree across
    ranks). Per window: the median of d, clipped into the interval causality allows — an offset o must let no rank
    finish before the last one entered: o ≤ end_min(anchors) − start_max(h) and o ≥ start_max(anchors) − end_min(h) for
    every instance. Drift: the same weighted fit with a prior as for samples (uncertainty = half the causal interval,
    or the spread of d when the interval is empty).
    """
    ref = model.reference_host
    if c is None or len(c) == 0:
        for h in hosts:
            model.hosts[h] = HostClock(host=h, offset_ns=0.0, method="none", ranks=host_ranks[h])
        model.warnings.append(
            f"no clock-sync samples and no matched collectives for host(s) {', '.join(hosts)}: their times are not "
            "aligned to the reference host (cross-host timings may be off by the clock offset)")
        return
    use = _sync_instances(c, names, model.left_out)
    # anchor: every rank already on the reference clock (reference host, hosts aligned by samples), aligned times;
    # the hosts to align still have identity segments, so `a` holds their raw times
    anchors = {ref} | {h for h, hc in model.hosts.items() if hc.method == "ping-pong"}
    a = realign(c, model.align_all)
    r_agg = _host_aggregates(a, model.rank_host, use, anchors)
    empty_windows: list[str] = []
    per_host = _per_host_aggregates(a, model.rank_host, use, hosts)
    for h in hosts:
        _align_host_by_collectives(model, h, a, per_host[h], r_agg, host_ranks[h], drift_prior_ppm, empty_windows)
    aligned = [h for h in hosts if model.hosts[h].method == "collectives"]
    if aligned:
        model.warnings.append(
            f"no clock-sync samples for host(s) {', '.join(aligned)} (imported traces or a failed sync): aligned from "
            "collective end times instead (typically good to 0.1–1 ms; worse on oversubscribed CPUs)")
    if empty_windows:
        model.warnings.append(
            "collective times admit no causal clock offset for " + ", ".join(empty_windows[:5])
            + ": instances may be mismatched or the clock stepped inside the window; used the median end difference")


def residuals(model: ClockModel, c: Collectives, *, names: np.ndarray | None = None) -> dict[str, tuple[float, float]]:
    """Causality check after alignment; fills HostClock.residual_us / residual_max_us. Returns host -> (median, max) µs.

    For each complete, consistent synchronising instance, host h's violation is
    max(0, max_start(all) − min_end(h), max_start(h) − min_end(all)): some rank finished before the last one entered.
    """
    if c is None or len(c) == 0:
        return {}
    a = realign(c, model.align_all)
    use = _sync_instances(a, names, model.left_out)
    m, ins = a.members, a.instances
    out: dict[str, tuple[float, float]] = {}
    ranks_u = np.unique(m["rank"])
    hosts = list(model.hosts)
    code = {h: i for i, h in enumerate(hosts)}
    host_of = np.array([code.get(model.rank_host.get(int(r), ""), -1) for r in ranks_u], dtype=np.int64)
    mh = host_of[np.searchsorted(ranks_u, m["rank"])]
    keep = np.flatnonzero(use[m["inst"]] & (mh >= 0))
    keep = keep[np.argsort(mh[keep], kind="stable")]  # the members grouped by host, once (not a pass per host)
    bounds = np.searchsorted(mh[keep], np.arange(len(hosts) + 1))
    for k, h in enumerate(hosts):  # per host
        sel = keep[bounds[k]:bounds[k + 1]]
        if not sel.size:
            continue
        hc = model.hosts[h]
        inst = m["inst"][sel]
        s, e = m["start_ns"][sel], m["end_ns"][sel]
        order = np.argsort(inst, kind="stable")
        inst, s, e = inst[order], s[order], e[order]
        first = np.flatnonzero(np.r_[True, inst[1:] != inst[:-1]])
        ids = inst[first]
        h_smax = np.maximum.reduceat(s, first)
        h_emin = np.minimum.reduceat(e, first)
        v = np.maximum.reduce([np.zeros(len(ids), np.int64), ins["start_max"][ids] - h_emin,
                               h_smax - ins["end_min"][ids]])
        med, mx = float(np.median(v)) / 1e3, float(v.max()) / 1e3
        hc.residual_us, hc.residual_max_us = med, mx
        out[h] = (med, mx)
    return out
