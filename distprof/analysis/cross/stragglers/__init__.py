"""Stragglers: who arrives late at collectives, and how much waiting it causes the others.

Instances. Per process group and window, the k-th exec collective (``comms.role == 1``, ``comms.seq == k``) of every
rank is one instance (the run summary's matched collectives). For rank r in instance i (times on the aligned clock):

* arrival ``a_ri`` = start of its exec event (``gloo:*`` on the worker thread, the NCCL kernel on the stream);
* **lateness** ``ℓ_ri = a_ri − median_{r'≠r} a_r'i`` — how much later r arrived than a typical peer. (Measured from
  the *earliest* peer instead, every lateness would grow by the jitter of the fastest of N−1 noisy ranks.)
  ``behind_first = a_ri − min_r' a_r'i`` is the wait r imposed on the earliest rank;
* the **last arriver** ``L_i`` (largest a); its **blame** ``B_i = Σ_{r≠L_i} (a_{L_i,i} − a_ri)`` — the waiting it
  caused the others (Scalasca's "Wait at N×N", summed over the waiting ranks); its **lead**
  ``a_{L_i,i} − (second-latest arrival)`` — how much earlier the collective could have started without it.

A rank's lateness **in a step** is its largest ℓ over the step's instances. Its **CPU-wait excess** before an
arrival (``held_back_ms``) is how much longer than the instance's other members its training thread waited for a CPU
(runnable, not running: ``cpu/samples``, analysis.cpuwait) between the end of its previous collective and this
arrival (``cpu_wait_before``) — the share of that lateness the host's scheduler caused. The naming rule below uses
the lateness less it (``lateness_not_cpu_wait_ms``; the mean lateness stays what the trace shows, and
``cpu_wait_excess_ms`` is their difference): beside one busy process on 2 cores, a balanced 4-rank DDP run had a rank
late 22.8 ms in most steps whose own work equalled its peers' and whose thread had waited 24 ms per step longer for a
CPU; such a rank is reported by ``cpu_contention``, not as the rank to fix. The wait is taken only up to each
arrival, since the rank's previous collective: a rank slowed by a sleep before its FSDP2 all-gathers competes for the
cores after them while its blocked peers do not, and a wait summed over its whole step (the step boundaries'
``steps.cpu_wait_opt_ms``) unnamed it in 7 runs of 7. Without samples, or where collectives run on a device (a
kernel's start, which a CPU wait delays only when its stream has run dry), nothing is taken off and the step
boundaries' wait is reported beside the lateness. Collectives outside every step (a checkpoint after the loop) are left out when the run has steps; in a run
without any, each instance is a step of its own. A rank that starts its backward X ms late is then ≈X late per step however many bucket all-reduces
follow — also when its peers' later buckets start late themselves because their worker thread was still waiting in
the first one. Per rank: ``mean_lateness_ms`` (mean over its steps of its step lateness), ``mean_instance_lateness_ms``
(mean ℓ over instances), ``late_fraction`` (share of its instances where it arrived last), ``late_step_fraction``
(share of its steps whose lateness reaches the threshold), ``blame_ms`` (Σ B where it arrived last),
``blame_ms_per_step``, ``lost_ms_per_step`` (mean over its steps of its largest lead: the wall time the step lost).

Clock-free cross-check (durations only, no clock alignment): a collective ends at about the same time on all ranks,
so ``median_{r'≠r} d_r'i − d_ri`` estimates ℓ (``clock_free_lateness_ms``, per step the largest, averaged over steps)
and ``d_ri − min_r' d_r'i`` is how long r waited (``clock_free_wait_ms``, DeepSpeed's "straggler effect").
Naming rule (:class:`StragglerRule`): lateness that is large, consistent across steps, and seen by both measures.

* The **floor** ``threshold_ms = max(min_lateness_ms, residual_factor × largest per-host clock residual,
  step_fraction × median step time)``: below it, lateness cannot be told from clock error and scheduling grain.
* A rank's **excess** in a step ``e_rs = ℓ_rs − median_{r'≠r} ℓ_r's``: its step lateness beyond the typical other
  rank's. The latest of a step's many collectives is late by chance on every rank (the maximum of noisy values); the
  excess takes that bias out, and its sign says who was late. With **two ranks** this is explicit: the excess is one
  rank's step lateness minus the other's (``e_0s = −e_1s``), so one rank late is the other early and only one of
  them can be in excess; with one collective per step it is twice the arrival gap.
* The rank is **named** iff (1) its mean lateness (less its CPU-wait excess) ≥ the floor; (2) its excess ≥ the
  floor in at least ``min_late_fraction`` of its steps (arrival order consistent across steps); (3) over its steps, either
  *steadily late*: the lower one-sided confidence bound of its mean excess (Student's t, ``confidence`` for the whole
  run: the error rate is split over the ranks, Bonferroni) ≥ the floor — lateness that comes and goes with
  scheduling noise has a wide bound and is not named, however large one step's was — or *often far out*: its excess
  is ≥ ``outlier_z`` × the run's step-to-step noise (1.4826 × the median absolute deviation of each rank's excess
  around its own median, pooled over ranks) in ≥ ``min_late_fraction`` of its steps and in at least two (a rank 20 ms
  late in 4 of 6 steps of a run whose ranks otherwise agree to 0.3 ms); with a single step, its excess ≥
  ``single_step_factor`` × the floor and ≥ ``jitter_factor`` × the arrival jitter (the ranks' ordinary scatter:
  1.4826 × the median absolute deviation of arrivals within an instance, the median over instances, taken over the
  ranks of one host and over all ranks, the smaller; needs three ranks); (4) the clock-free cross-check confirms it:
  its clock-free lateness ≥ ``clock_free_factor`` × its mean lateness, so a clock error cannot name a rank.
  **Own work** is the other way to be named: per step whose first sync event is a collective, the rank's work
  before it (its step start to its arrival: the step graph's first segment, on its own clock) less its wait for a
  CPU there (``cpu/samples``, analysis.cpuwait; unknown: nothing taken off), over the median of the same segment on
  the instance's other members (``own_excess_ms``, median ``own_excess_median_ms``). The arrival lateness carries
  every rank's noise since the previous collective (the optimizer, the host's scheduler); this segment carries only
  the rank's own work, and with the CPU waits taken off, not the time the host's other processes held its cores:
  beside one busy process on 2 cores its per-step spread between two ranks falls from 5–17 ms to 2–4 ms. It is
  consistent when it passes (2) and (3) as above, or — robust to the odd step a rank spent held off the CPU — its
  median is ≥ the floor and it is positive in more steps than chance allows (one-sided sign test at the rule's
  confidence, Bonferroni: with no excess a rank is as often above its peers' median as below; ``own_sign_p``). A
  rank whose own work is consistently longer is named although its peers' own noise (a slower optimizer step)
  hides it in the arrivals: it is the rank that does more, and severity follows what it costs. Durations on one
  rank's clock need no clock check (4). Later segments are not compared: after the first collective they also hold
  hand-overs from communication threads that were still busy, and what a rank did meanwhile is hidden in that wait.
  ``clock_free.agrees`` says whether the clock-free measure's most-late rank is a named one (or, with nobody named,
  the same rank as the aligned measure's).

**Cost** (what severity follows): ``cost_ms_per_step`` — per step, the largest lead of the rank over the latest rank
that is not named (what the step would gain if the named ranks arrived with the others), averaged over its steps.
For one straggler this is ``lost_ms_per_step``; ranks late together share the cost instead of hiding it in each
other's leads. Hosts: a host's arrival is its last rank's; the same rule (excess, consistency, bound) names slow hosts
(only when there are at least two hosts). Every rank of a slow node is late in most steps, so all of them are named
although each arrives last only part of the time.
"""

from __future__ import annotations

import functools
import logging
import math
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ...groupstats import group_median, rank_step_values

Table = dict[str, np.ndarray]

if TYPE_CHECKING:
    from ...graph.critical_path import StepGraph
    from ...types import RunSummary

logger = logging.getLogger(__name__)

__all__ = ["StragglerRule", "collective_instances", "find_stragglers", "threshold_ms", "arrival_jitter_ms"]

NS_PER_MS = 1e6
_MAD_TO_SIGMA = 1.4826


@dataclass(frozen=True)
class StragglerRule:
    """Thresholds of the naming rule (see the module docstring)."""

    min_lateness_ms: float = 1.0
    residual_factor: float = 3.0
    step_fraction: float = 0.02
    min_late_fraction: float = 0.5
    confidence: float = 0.99
    single_step_factor: float = 2.0
    jitter_factor: float = 1.5
    clock_free_factor: float = 0.5
    outlier_z: float = 4.0

    def text(self) -> str:
        return (
            f"a rank is named if its lateness (per step: latest arrival at the step's collectives minus the median of "
            f"the other ranks' arrivals, less how much longer it waited for a CPU before them) is at least the floor max({self.min_lateness_ms:g} ms, "
            f"{self.residual_factor:g} x max clock residual, {self.step_fraction:g} x median step time), the "
            f"clock-free estimate from durations confirms it, and it is consistent across steps: either that lateness "
            f"exceeds the other ranks' by the floor in >= {self.min_late_fraction:.0%} of its steps and, over steps, "
            f"the lower confidence bound of that excess ({self.confidence:.0%} for the run, Bonferroni over ranks) is "
            f"above the floor or the excess is an outlier (>= {self.outlier_z:g} x the run's step-to-step noise) in "
            f">= {self.min_late_fraction:.0%} of its steps and at least 2 (one step: {self.single_step_factor:g} x "
            f"the floor and {self.jitter_factor:g} x the arrival jitter); or if its own work before each step's first "
            f"collective (its waits for a CPU left out) exceeds its peers' the same way, or by a median above the floor "
            f"in more steps than chance allows (sign test at the same confidence)"
        )


def _t_tail(t: float, df: int) -> float:
    """P(T > t) for Student's t with integer df ≥ 1 and t ≥ 0 (the closed forms in cos θ, θ = atan(t/√df))."""
    if df > 400:  # normal limit, within 1e-3 relative here
        return 0.5 * math.erfc(t / math.sqrt(2))
    th = math.atan(t / math.sqrt(df))
    c2, term = math.cos(th) ** 2, 1.0
    if df % 2:
        acc = 0.0
        if df > 1:
            acc = term = 1.0
            for k in range(3, df - 1, 2):
                term *= c2 * (k - 1) / k
                acc += term
            acc *= math.sin(th) * math.cos(th)
        inside = 2 / math.pi * (th + acc)
    else:
        acc = 1.0
        for k in range(2, df - 1, 2):
            term *= c2 * (k - 1) / k
            acc += term
        inside = math.sin(th) * acc
    return max(0.0, (1.0 - inside) / 2)


@functools.lru_cache(maxsize=4096)
def t_quantile(alpha: float, df: int) -> float:
    """The t with P(T > t) = alpha (one-sided, 0 < alpha < 0.5) for Student's t with df ≥ 1, by bisection."""
    lo, hi = 0.0, 1.0
    while _t_tail(hi, df) > alpha:
        hi *= 2
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _t_tail(mid, df) > alpha else (lo, mid)
    return hi


def _median_of_others(first: np.ndarray, n: np.ndarray, pos: np.ndarray, x: np.ndarray) -> np.ndarray:
    """For rows sorted by (group, x): median of the group's x without the row itself (rows of groups with n ≥ 2)."""
    m = n - 1  # values left
    lo = (m - 1) // 2
    hi = m // 2

    def rem(j: np.ndarray) -> np.ndarray:  # j-th smallest of the others
        return x[first + j + (j >= pos)]

    return (rem(lo).astype(np.float64) + rem(hi).astype(np.float64)) / 2


def collective_instances(run: RunSummary) -> Table:
    """One row per (instance, rank), sorted by (instance, arrival).

    Columns: ``inst`` (0..n−1), ``window``, ``pg``, ``seq``, ``rank``, ``step``, ``arrival_ns``, ``dur_ns``, ``pos``
    (arrival order, 0 = first), ``n_ranks``, ``lateness_ns`` (vs the median of the others, float), ``behind_first_ns``,
    ``is_last``, ``lead_ns`` (last arriver only: its arrival − the second-latest; else 0), ``clock_free_lateness_ns``
    (median of the others' durations − own, float), ``cpu_wait_before_ns`` (:func:`cpu_wait_before`, NaN unknown). Instances seen on fewer than two ranks are dropped; a rank seen
    twice in one instance keeps its first row. With a steps selection, only collectives inside the selected steps.
    """
    m = run.collectives.members
    step = np.asarray(run.collective_rows["step"], np.int64)[np.asarray(m["row"], np.int64)]
    if run.steps_selection is not None:
        lo, hi = run.steps_selection
        inside = (step >= lo) & (step <= hi)
        m = {k: np.asarray(v)[inside] for k, v in m.items()}
        step = step[inside]
    if m["inst"].size == 0:
        return _empty_instances()
    inst = np.asarray(m["inst"], np.int64)
    rank = np.asarray(m["rank"], np.int64)
    # members are sorted by (inst, rank): drop repeated ranks
    dup = np.r_[False, (inst[1:] == inst[:-1]) & (rank[1:] == rank[:-1])]
    if np.any(dup):
        logger.warning("%d duplicate (instance, rank) exec collectives ignored", int(dup.sum()))
    keep = ~dup
    keep &= np.bincount(inst[keep], minlength=int(inst.max()) + 1)[inst] >= 2
    if not np.any(keep):
        return _empty_instances()
    arrival = np.asarray(m["start_ns"], np.int64)[keep]
    cols = {
        "window": np.asarray(m["window"], np.int64)[keep],
        "pg": np.asarray(m["pg"], np.int64)[keep],
        "seq": np.asarray(m["seq"], np.int64)[keep],
        "rank": rank[keep],
        "step": step[keep],
        "arrival_ns": arrival,
        "dur_ns": np.asarray(m["end_ns"], np.int64)[keep] - arrival,
        "cpu_wait_before_ns": cpu_wait_before(run)[np.asarray(m["row"], np.int64)][keep],
    }
    _, inst = np.unique(inst[keep], return_inverse=True)  # renumber 0..n-1
    inst = inst.reshape(-1)
    o = np.lexsort((arrival, inst))
    inst = inst[o]
    cols = {k: v[o] for k, v in cols.items()}
    a = cols["arrival_ns"]
    first_of = np.flatnonzero(np.r_[True, inst[1:] != inst[:-1]])
    n_of = np.diff(np.r_[first_of, inst.size])
    first, n = first_of[inst], n_of[inst]
    pos = np.arange(inst.size) - first
    is_last = pos == n - 1
    second = a[np.maximum(first + n - 2, first)]
    rel = a - a[first]  # int64 ns after the first arrival: exact in float64, unlike epoch ns
    # clock-free: median of the others' durations, durations sorted within the instance
    d = cols["dur_ns"]
    od = np.lexsort((d, inst))
    d_sorted = d[od]
    d_pos = np.empty(inst.size, np.int64)
    d_pos[od] = np.arange(inst.size) - first[od]
    cf = _median_of_others(first, n, d_pos, d_sorted) - d
    return {
        "inst": inst.astype(np.int64),
        **cols,
        "pos": pos.astype(np.int64),
        "n_ranks": n.astype(np.int64),
        "lateness_ns": rel - _median_of_others(first, n, pos, rel),
        "behind_first_ns": rel,
        "is_last": is_last,
        "lead_ns": np.where(is_last, a - second, 0),
        "clock_free_lateness_ns": cf,
    }


def _empty_instances() -> Table:
    z = np.zeros(0, np.int64)
    out = {k: z.copy() for k in ("inst", "window", "pg", "seq", "rank", "step", "arrival_ns", "dur_ns", "pos",
                                 "n_ranks", "behind_first_ns", "lead_ns")}
    out.update({"lateness_ns": np.zeros(0), "clock_free_lateness_ns": np.zeros(0), "is_last": np.zeros(0, bool),
                "cpu_wait_before_ns": np.zeros(0)})
    return out


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


def arrival_jitter_ms(run: RunSummary, t: Table) -> float:
    """The ranks' ordinary arrival scatter (σ estimate, ms): see the module docstring. 0 when it cannot be estimated."""
    if t["inst"].size == 0:
        return 0.0
    a = t["arrival_ns"] - t["arrival_ns"][t["pos"] == 0][t["inst"]]  # small numbers: relative to the first arrival
    a = a.astype(np.float64) / NS_PER_MS
    estimates = []
    host_of = np.array([str(run.hosts.get(int(r), "?")) for r in t["rank"]], dtype=object).astype(str)
    _, hidx = np.unique(host_of, return_inverse=True)
    keys = [(t["inst"], 3)]  # with 2 arrivals the MAD is half the gap: a straggler would set its own threshold
    if int(hidx.max()) > 0:  # several hosts: a slow host's ranks agree with each other
        keys.insert(0, (t["inst"] * (int(hidx.max()) + 1) + hidx.reshape(-1), 2))
    for key, min_n in keys:
        _, g = np.unique(key, return_inverse=True)
        g = g.reshape(-1)
        ng = int(g.max()) + 1
        med, cnt = group_median(g, a, ng), np.bincount(g, minlength=ng)
        mad = group_median(g, np.abs(a - med[g]), ng)
        ok = cnt >= min_n
        if np.any(ok):
            estimates.append(_MAD_TO_SIGMA * float(np.median(mad[ok])))
    return min(estimates) if estimates else 0.0


def threshold_ms(run: RunSummary, rule: StragglerRule, jitter_ms: float = 0.0) -> tuple[float, dict[str, float]]:
    """The lateness floor and its parts (ms); the arrival jitter is reported with it (it only counts for one step)."""
    residuals = [hc.residual_us for hc in run.clock.values() if hc.residual_us is not None]
    residual_ms = max(residuals) / 1e3 if residuals else 0.0
    st = run.steps
    step_ms = (np.asarray(st["end_ns"], np.int64) - np.asarray(st["start_ns"], np.int64)) / NS_PER_MS
    median_step_ms = float(np.median(step_ms)) if step_ms.size else 0.0
    parts = {
        "min_lateness_ms": rule.min_lateness_ms,
        "clock_residual_ms": residual_ms,
        "from_clock_residual_ms": rule.residual_factor * residual_ms,
        "median_step_ms": median_step_ms,
        "from_step_time_ms": rule.step_fraction * median_step_ms,
        "arrival_jitter_ms": jitter_ms,
        "from_jitter_ms": rule.jitter_factor * jitter_ms,
    }
    thr = max(parts["min_lateness_ms"], parts["from_clock_residual_ms"], parts["from_step_time_ms"])
    return thr, parts


@dataclass
class Consistency:
    """Per group (rank or host) over its steps: excess lateness statistics and the naming test's parts."""

    n_steps: np.ndarray
    mean_excess: np.ndarray
    excess_bound: np.ndarray  # lower one-sided confidence bound of the mean excess (NaN with one step)
    excess_step_fraction: np.ndarray  # share of its steps with excess >= the floor
    outlier_step_fraction: np.ndarray  # share of its steps with excess >= max(floor, outlier_z × step noise)
    step_noise_ms: float  # robust σ of a group's excess around its own median, pooled over groups
    passes: np.ndarray  # (2) and (3) of the rule


def excess(cells: "_Cells", c_lat: np.ndarray) -> np.ndarray:
    """Per (step, group) cell: its lateness minus the median of the other groups' lateness in that step."""
    return excess_by(cells.step, c_lat)


def excess_by(key: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Each value minus the median of the other values with the same key (0 subtracted where it is alone)."""
    if key.size == 0:
        return np.zeros(0)
    o = np.lexsort((values, key))
    st, v = key[o], values[o]
    f_of = np.flatnonzero(np.r_[True, st[1:] != st[:-1]])
    n_of = np.diff(np.r_[f_of, st.size])
    gi = np.cumsum(np.r_[True, st[1:] != st[:-1]]) - 1
    first, n = f_of[gi], n_of[gi]
    pos = np.arange(st.size) - first
    ref = np.zeros(st.size)
    many = n >= 2
    ref[many] = _median_of_others(first[many], n[many], pos[many], v)
    out = np.empty(st.size)
    out[o] = v - ref
    return out


def consistency(cells: "_Cells", c_exc: np.ndarray, ng: int, thr: float, rule: StragglerRule,
                single_step_min_ms: float) -> Consistency:
    """The consistency parts of the naming rule for each of ng groups, from per-cell excess lateness."""
    g = cells.group
    n = np.bincount(g, minlength=ng).astype(np.float64)
    den = np.maximum(n, 1)
    mean = np.bincount(g, weights=c_exc, minlength=ng) / den
    ss = np.bincount(g, weights=(c_exc - mean[g]) ** 2, minlength=ng)
    sd = np.sqrt(ss / np.maximum(n - 1, 1))
    alpha = (1 - rule.confidence) / max(int(np.count_nonzero(n)), 1)  # Bonferroni: the run's error rate
    tq = np.array([t_quantile(alpha, int(k) - 1) if k >= 2 else 0.0 for k in n])
    bound = np.where(n >= 2, mean - tq * sd / np.sqrt(den), np.nan)
    frac = np.bincount(g, weights=(c_exc >= thr).astype(float), minlength=ng) / den
    # the run's step-to-step noise: each group's excess around its own median, robustly pooled
    med = group_median(g, c_exc, ng)
    o = np.lexsort((c_exc, g))
    rank_in = np.empty(g.size, np.int64)
    rank_in[o] = np.arange(g.size) - np.r_[0, np.cumsum(n.astype(np.int64))[:-1]][g[o]]
    n_g = n[g].astype(np.int64)
    is_median = (n_g % 2 == 1) & (rank_in == n_g // 2)  # its deviation is 0 by construction: not a sample
    dev = np.abs(c_exc - med[g])[(n_g >= 2) & ~is_median]
    noise = _MAD_TO_SIGMA * float(np.median(dev)) if dev.size else 0.0
    big = c_exc >= max(thr, rule.outlier_z * noise)
    n_big = np.bincount(g, weights=big.astype(float), minlength=ng)
    big_frac = n_big / den
    ok_steady = np.where(n >= 2, bound >= thr, mean >= max(rule.single_step_factor * thr, single_step_min_ms))
    ok_outlier = (n >= 2) & (n_big >= 2) & (big_frac >= rule.min_late_fraction)
    passes = (n > 0) & (frac >= rule.min_late_fraction) & (ok_steady | ok_outlier)
    return Consistency(n, mean, bound, frac, big_frac, noise, passes)


class _Cells:
    """Sparse (step key, group) cells of instance rows, for grouped max/sum without dense grids."""

    def __init__(self, skey: np.ndarray, gidx: np.ndarray, ng: int):
        skeys, sidx = np.unique(skey, return_inverse=True)
        code = sidx.reshape(-1).astype(np.int64) * ng + gidx
        ucode, idx = np.unique(code, return_inverse=True)
        self.idx = idx.reshape(-1)
        self.n = ucode.size
        self.group = (ucode % ng).astype(np.int64)
        self.step = skeys[ucode // ng]

    def max(self, v: np.ndarray) -> np.ndarray:
        out = np.full(self.n, -np.inf)
        np.maximum.at(out, self.idx, v)
        return out

    def sum(self, v: np.ndarray) -> np.ndarray:
        return np.bincount(self.idx, weights=v, minlength=self.n)


def find_stragglers(run: RunSummary, *, rule: StragglerRule | None = None,
                    graph: StepGraph | None = None) -> dict[str, Any]:
    """Rank and host straggler tables, per-step stragglers and the naming rule (a JSON-ready dict).

    Keys: ``rule`` (text, threshold_ms and its parts), ``n_instances``, ``ranks`` (one dict per rank, named first,
    then by cost), ``named`` (ranks named, by cost), ``hosts``, ``per_step``, ``changes`` (steps where the step's
    straggler differs from the previous step's), ``clock_free``.
    """
    rule = rule or StragglerRule()
    t = _inside_steps(collective_instances(run))
    jitter = arrival_jitter_ms(run, t)
    thr, parts = threshold_ms(run, rule, jitter)
    n_inst = int(t["inst"].max()) + 1 if t["inst"].size else 0
    out: dict[str, Any] = {
        "rule": {"text": rule.text(), "threshold_ms": thr, **parts, **asdict(rule)},
        "n_instances": n_inst,
        "ranks": [],
        "named": [],
        "hosts": [],
        "per_step": [],
        "changes": [],
        "clock_free": {"top_rank": None, "top_rank_by_lateness": None, "agrees": None, "named_confirmed": {}},
    }
    if n_inst == 0:
        return out

    inst = t["inst"]
    lat = t["lateness_ns"] / NS_PER_MS
    behind = t["behind_first_ns"] / NS_PER_MS
    ranks, ridx = np.unique(t["rank"], return_inverse=True)
    ridx = ridx.reshape(-1)
    nr = ranks.size
    # blame of the last arriver: Σ over the instance of (behind_last − behind_r)
    n_in = np.bincount(inst, minlength=n_inst)
    blame_inst = n_in * behind[t["is_last"]] - np.bincount(inst, weights=behind, minlength=n_inst)  # rows by inst
    blame_row = np.where(t["is_last"], blame_inst[inst], 0.0)
    dur = t["dur_ns"] / NS_PER_MS
    dmin = np.full(n_inst, np.inf)
    np.minimum.at(dmin, inst, dur)
    cf_wait = dur - dmin[inst]

    # (step, rank) cells; a collective outside every step (step −1) is a step of its own
    skey = np.where(t["step"] >= 0, t["step"], -1 - inst)
    cells = _Cells(skey, ridx, nr)
    c_lat = cells.max(lat)
    held = held_back_ms(t)
    if np.isfinite(held).any():  # the lateness the host's scheduler did not cause: what names a rank
        c_own = cells.max(lat - np.nan_to_num(held))
        c_cpu = c_lat - c_own
    else:  # no samples: the step-boundary wait is reported beside the lateness, not taken out of it
        c_own = c_lat
        c_cpu = _cpu_wait_excess(run, cells, ranks)
    c_exc = excess(cells, c_own)
    c_cf = cells.max(t["clock_free_lateness_ns"] / NS_PER_MS)
    c_lead = cells.max(t["lead_ns"] / NS_PER_MS)
    c_blame = cells.sum(blame_row)
    cr = cells.group
    cons = consistency(cells, c_exc, nr, thr, rule, rule.jitter_factor * jitter)
    out["rule"]["step_noise_ms"] = cons.step_noise_ms
    den = np.maximum(cons.n_steps, 1)
    mean_lat = np.bincount(cr, weights=c_lat, minlength=nr) / den
    mean_own = np.bincount(cr, weights=c_own, minlength=nr) / den
    mean_cpu = np.bincount(cr, weights=c_cpu, minlength=nr) / den
    late_steps = np.bincount(cr, weights=(c_lat >= thr).astype(float), minlength=nr) / den
    lost = np.bincount(cr, weights=c_lead, minlength=nr) / den
    cf_lat = np.bincount(cr, weights=c_cf, minlength=nr) / den
    cnt = np.bincount(ridx, minlength=nr).astype(np.float64)
    inst_lat = np.bincount(ridx, weights=lat, minlength=nr) / np.maximum(cnt, 1)
    late_frac = np.bincount(ridx, weights=t["is_last"].astype(float), minlength=nr) / np.maximum(cnt, 1)
    blame = np.bincount(ridx, weights=blame_row, minlength=nr)
    max_behind = np.zeros(nr)
    np.maximum.at(max_behind, ridx, behind)
    cf_wait_mean = np.bincount(ridx, weights=cf_wait, minlength=nr) / np.maximum(cnt, 1)
    confirmed = cf_lat >= rule.clock_free_factor * mean_lat
    own = _own_work(run, ranks, thr, rule, graph)
    named = ((mean_own >= thr) & cons.passes & confirmed) | own.passes
    cost = np.bincount(cr, weights=cells.max(_cost_ms(t, named[ridx])), minlength=nr) / den
    cpu_ratio = cpu_time_ratios(run)
    faults = page_faults_per_step(run)

    rows = [
        {
            "rank": int(ranks[i]),
            "host": run.hosts.get(int(ranks[i]), "?"),
            "n_instances": int(cnt[i]),
            "n_steps": int(cons.n_steps[i]),
            "blame_ms": float(blame[i]),
            "blame_ms_per_step": float(blame[i] / den[i]),
            "mean_lateness_ms": float(mean_lat[i]),
            "cpu_wait_excess_ms": float(mean_cpu[i]),
            "lateness_not_cpu_wait_ms": float(mean_own[i]),
            "cpu_time_ratio": cpu_ratio.get(int(ranks[i])),
            "page_faults_per_step": faults[int(ranks[i])][0] if int(ranks[i]) in faults else None,
            "others_page_faults_per_step": (faults[int(ranks[i])][1] if int(ranks[i]) in faults
                                            and np.isfinite(faults[int(ranks[i])][1]) else None),
            "mean_excess_ms": float(cons.mean_excess[i]),
            "own_excess_ms": None if own.n_steps[i] == 0 else float(own.mean_excess[i]),
            "own_excess_median_ms": None if own.n_steps[i] == 0 else float(own.median_excess[i]),
            "own_excess_bound_ms": None if np.isnan(own.excess_bound[i]) else float(own.excess_bound[i]),
            "own_positive_fraction": None if own.n_steps[i] == 0 else float(own.positive_fraction[i]),
            "own_sign_p": float(own.sign_p[i]),
            "own_steps_consistent": bool(own.passes[i]),
            "excess_bound_ms": None if np.isnan(cons.excess_bound[i]) else float(cons.excess_bound[i]),
            "excess_step_fraction": float(cons.excess_step_fraction[i]),
            "outlier_step_fraction": float(cons.outlier_step_fraction[i]),
            "mean_instance_lateness_ms": float(inst_lat[i]),
            "max_behind_first_ms": float(max_behind[i]),
            "late_fraction": float(late_frac[i]),
            "late_step_fraction": float(late_steps[i]),
            "lost_ms_per_step": float(lost[i]),
            "cost_ms_per_step": float(cost[i]),
            "clock_free_lateness_ms": float(cf_lat[i]),
            "clock_free_wait_ms": float(cf_wait_mean[i]),
            "named": bool(named[i]),
        }
        for i in range(nr)
    ]
    rows.sort(key=lambda d: (not d["named"], -d["cost_ms_per_step"], -d["blame_ms"], -d["mean_lateness_ms"],
                             d["rank"]))
    out["ranks"] = rows
    out["named"] = [d["rank"] for d in rows if d["named"]]
    top_lat = int(ranks[int(np.argmax(mean_lat))])
    cf_top = int(ranks[int(np.argmax(cf_lat))])
    out["clock_free"] = {
        "top_rank": cf_top,
        "top_rank_by_lateness": top_lat,
        "agrees": (cf_top in out["named"]) if out["named"] else cf_top == top_lat,
        "named_confirmed": {str(int(ranks[i])): bool(confirmed[i]) for i in range(nr)
                            if mean_own[i] >= thr and cons.passes[i]},
    }
    out["per_step"], out["changes"] = _per_step(cells, c_lat, c_exc, c_blame, ranks, thr)
    out["hosts"] = _hosts(run, t, skey, blame_row, thr, rule)
    return out


def _rank_means(run: RunSummary, column: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ranks, each rank's mean of a steps column over its known steps, the median of the other ranks' means; NaN
    with one rank) — ranks without the value are left out."""
    st = run.steps
    v = np.asarray(st.get(column, np.zeros(0)), np.float64)
    ok = np.isfinite(v)
    u, idx = np.unique(np.asarray(st["rank"], np.int64)[ok], return_inverse=True)
    mean = np.bincount(idx, weights=v[ok]) / np.bincount(idx) if u.size else np.zeros(0)
    if u.size < 2:
        return u, mean, np.full(u.size, np.nan)
    o = np.argsort(mean, kind="stable")
    pos = np.empty(u.size, np.int64)
    pos[o] = np.arange(u.size)
    return u, mean, _median_of_others(np.zeros(u.size, np.int64), np.full(u.size, u.size), pos, mean[o])


def page_faults_per_step(run: RunSummary) -> dict[int, tuple[float, float]]:
    """Per rank: (its mean page faults per step, the median of the other ranks' means) from ``steps.page_faults``
    (ranks without the value are left out; with one rank, the other's median is NaN)."""
    u, mean, ref = _rank_means(run, "page_faults")
    return {int(r): (float(m), float(q)) for r, m, q in zip(u.tolist(), mean.tolist(), ref.tolist())}


def cpu_time_ratios(run: RunSummary) -> dict[int, float]:
    """Per rank: its mean CPU time per step (``steps.cpu_run_ms``) over the median of the other ranks' means — how
    much slower its CPU ran the same work when the job is balanced (ranks without the value are left out)."""
    u, mean, ref = _rank_means(run, "cpu_run_ms")
    good = ref > 0
    return {int(r): float(m / q) for r, m, q in zip(u[good].tolist(), mean[good].tolist(), ref[good].tolist())}


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


def _cpu_wait_excess(run: RunSummary, cells: _Cells, ranks: np.ndarray) -> np.ndarray:
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


def own_work_excess(run: RunSummary, graph: StepGraph | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per rank-step whose first sync event is a collective: (rank, step, excess ms) of its own work before it — the
    step graph's first work segment (its step start to its arrival) less its wait for a CPU there where the samples
    know it — over the median of the same segment of the instance's other members (the same collective: the same
    work before it in a data- or tensor-parallel group)."""
    from ...graph.critical_path import KIND_COLL, step_graph

    g = graph if graph is not None else step_graph(run)
    first = np.flatnonzero((g.ev_kind == KIND_COLL) & (g.ev_group >= 0) & (g.ev_prev < 0))
    wait = g.ev_cpu_wait[first] if g.ev_cpu_wait is not None else np.zeros(first.size)
    own = (g.ev_gap[first] - np.nan_to_num(wait)) / NS_PER_MS
    grp = g.ev_group[first]
    shared = np.bincount(grp, minlength=int(grp.max()) + 1)[grp] >= 2 if grp.size else np.zeros(0, bool)
    rows, exc = first[shared], excess_by(grp[shared], own[shared])
    return g.ev_rank[rows].astype(np.int64), g.ev_step[rows].astype(np.int64), exc


@dataclass
class OwnWork:
    """Per rank: its own-work excess over its steps (:func:`own_work_excess`) and whether it is consistent."""

    n_steps: np.ndarray
    mean_excess: np.ndarray  # NaN without steps
    median_excess: np.ndarray
    excess_bound: np.ndarray  # lower confidence bound of the mean (NaN with fewer than 2 steps)
    positive_fraction: np.ndarray  # share of its steps with a positive excess
    sign_p: np.ndarray  # one-sided sign test: P(at least that many positive steps | no excess), 1 when unknown
    passes: np.ndarray


def _binomial_half_tail(k: int, n: int) -> float:
    """P(X ≥ k) for X ~ Binomial(n, 1/2) (exact up to 400 steps, then the normal limit with continuity correction)."""
    if n <= 0 or k <= 0:
        return 1.0
    if n > 400:
        return 0.5 * math.erfc((k - 0.5 - n / 2) / math.sqrt(n / 4) / math.sqrt(2))
    return math.fsum(math.comb(n, j) for j in range(k, n + 1)) / 2.0 ** n


def _own_work(run: RunSummary, ranks: np.ndarray, thr: float, rule: StragglerRule,
              graph: StepGraph | None = None) -> OwnWork:
    """Whether each rank's own work before its steps' first collective (:func:`own_work_excess`) exceeds its peers'
    consistently: the consistency test on the mean (excess ≥ the floor in most steps, lower confidence bound above
    it), or — robust to the odd step a rank spent held off the CPU, which widens that bound — its median excess ≥
    the floor and more positive steps than chance allows (one-sided sign test at the rule's confidence, Bonferroni
    over ranks: with no excess a rank's own work is as often above its peers' median as below)."""
    r, st, exc = own_work_excess(run, graph)
    keep = np.isin(r, ranks)
    r, st, exc = r[keep], st[keep], exc[keep]
    nr = ranks.size
    cells = _Cells(st, np.searchsorted(ranks, r), nr)
    c_exc = np.full(cells.n, np.nan)
    c_exc[cells.idx] = exc
    cons = consistency(cells, c_exc, nr, thr, rule, np.inf)
    g = cells.group
    n = np.bincount(g, minlength=nr)
    pos = np.bincount(g, weights=(c_exc > 0).astype(float), minlength=nr).astype(np.int64)
    med = np.where(n > 0, group_median(g, c_exc, nr) if g.size else np.zeros(nr), np.nan)
    alpha = (1 - rule.confidence) / max(int(np.count_nonzero(n)), 1)
    p = np.array([_binomial_half_tail(int(k), int(m)) for k, m in zip(pos, n)])
    robust = (n > 0) & (med >= thr) & (p <= alpha)
    return OwnWork(n, np.where(n > 0, cons.mean_excess, np.nan), med, cons.excess_bound,
                   pos / np.maximum(n, 1), p, (n > 0) & (cons.passes | robust))


def _inside_steps(t: Table) -> Table:
    """The instances inside recorded steps, when there are any: collectives outside every step (a checkpoint's
    all-gathers after the loop) belong to no step and are left out; without any step each instance is its own."""
    inside = t["step"] >= 0
    if inside.all() or not inside.any():
        return t
    n_out = np.bincount(t["inst"], weights=(~inside).astype(float))
    keep = n_out[t["inst"]] == 0  # whole instances: every rank inside a step
    _, inst = np.unique(t["inst"][keep], return_inverse=True)
    out = {k: v[keep] for k, v in t.items()}
    out["inst"] = inst.reshape(-1).astype(np.int64)
    return out


def _cost_ms(t: Table, named_row: np.ndarray) -> np.ndarray:
    """Per instance row: how much later the rank arrived than the latest rank that is neither it nor named (ms)."""
    inst, a = t["inst"], t["arrival_ns"] - t["arrival_ns"][t["pos"] == 0][t["inst"]]
    n_inst = int(inst.max()) + 1
    ok = ~named_row
    # rows are sorted by (inst, arrival): the latest and second-latest unnamed arrival per instance
    a_ok = np.where(ok, a, -1)
    top1 = np.full(n_inst, -1, np.int64)
    np.maximum.at(top1, inst, a_ok)
    is_top = ok & (a == top1[inst])
    first_top = is_top & ~np.r_[False, is_top[1:] & is_top[:-1] & (inst[1:] == inst[:-1])]
    top2 = np.full(n_inst, -1, np.int64)
    np.maximum.at(top2, inst, np.where(first_top, -1, a_ok))
    ref = np.where(first_top, top2[inst], top1[inst])
    return np.where(ref >= 0, np.maximum(a - ref, 0), 0) / NS_PER_MS


def _per_step(cells: _Cells, c_lat, c_exc, c_blame, ranks, thr) -> tuple[list[dict], list[dict]]:
    """Per recorded step: the rank most in excess, named when its excess reaches the floor; and where that changes."""
    real = cells.step >= 0
    o = np.lexsort((-c_exc[real], cells.step[real]))
    st, lat, exc = cells.step[real][o], c_lat[real][o], c_exc[real][o]
    grp, bl = cells.group[real][o], c_blame[real][o]
    first = np.flatnonzero(np.r_[True, st[1:] != st[:-1]]) if st.size else np.zeros(0, np.int64)
    per_step, changes = [], []
    prev: int | None = None
    for n, k in enumerate(first.tolist()):
        who = int(ranks[grp[k]]) if exc[k] >= thr else None
        per_step.append({"step": int(st[k]), "rank": who, "lateness_ms": float(lat[k]), "excess_ms": float(exc[k]),
                         "blame_ms": float(bl[k]), "latest_rank": int(ranks[grp[k]])})
        if n and who != prev:
            changes.append({"step": int(st[k]), "from_rank": prev, "to_rank": who})
        prev = who
    return per_step, changes


def _hosts(run: RunSummary, t: Table, skey, blame_row, thr, rule) -> list[dict[str, Any]]:
    """Host table: per instance a host's lateness is its latest rank's (vs the median of the other hosts' arrivals)."""
    host_of = np.array([str(run.hosts.get(int(r), "?")) for r in t["rank"]], dtype=object).astype(str)
    hosts, hidx = np.unique(host_of, return_inverse=True)
    hidx = hidx.reshape(-1)
    nh = hosts.size
    blame = np.bincount(hidx, weights=blame_row, minlength=nh)
    ih = _Cells(t["inst"], hidx, nh)  # (instance, host) cells
    a_host = ih.max(t["arrival_ns"] - t["arrival_ns"][t["pos"] == 0][t["inst"]])  # host arrival: its last rank
    last_host = ih.max(t["is_last"].astype(float))
    inst_of = ih.step
    # host lateness per instance: host arrival − median of the other hosts' arrivals
    o = np.lexsort((a_host, inst_of))
    inv = np.empty_like(o)
    inv[o] = np.arange(o.size)
    srt_inst, srt_a = inst_of[o], a_host[o]
    f_of = np.flatnonzero(np.r_[True, srt_inst[1:] != srt_inst[:-1]])
    n_of = np.diff(np.r_[f_of, srt_inst.size])
    gi = np.cumsum(np.r_[True, srt_inst[1:] != srt_inst[:-1]]) - 1
    first, n = f_of[gi], n_of[gi]
    pos = np.arange(srt_inst.size) - first
    h_lat_sorted = np.zeros(srt_inst.size)
    sel = n >= 2
    h_lat_sorted[sel] = (srt_a[sel] - _median_of_others(first[sel], n[sel], pos[sel], srt_a)) / NS_PER_MS
    h_lat = h_lat_sorted[inv]
    inst_first_row = np.unique(t["inst"], return_index=True)[1]
    cells = _Cells(skey[inst_first_row][inst_of], ih.group, nh)
    c_lat = cells.max(h_lat)
    cons = consistency(cells, excess(cells, c_lat), nh, thr, rule, 0.0)
    den = np.maximum(cons.n_steps, 1)
    mean = np.bincount(cells.group, weights=c_lat, minlength=nh) / den
    late_steps = np.bincount(cells.group, weights=(c_lat >= thr).astype(float), minlength=nh) / den
    n_inst_h = np.maximum(np.bincount(ih.group, minlength=nh), 1)
    late_frac = np.bincount(ih.group, weights=last_host, minlength=nh) / n_inst_h
    out = [
        {
            "host": str(hosts[h]),
            "ranks": sorted(int(r) for r, hn in run.hosts.items() if hn == hosts[h]),
            "blame_ms": float(blame[h]),
            "mean_lateness_ms": float(mean[h]),
            "mean_excess_ms": float(cons.mean_excess[h]),
            "excess_bound_ms": None if np.isnan(cons.excess_bound[h]) else float(cons.excess_bound[h]),
            "late_fraction": float(late_frac[h]),
            "late_step_fraction": float(late_steps[h]),
            "named": bool(nh >= 2 and mean[h] >= thr and cons.passes[h]),
        }
        for h in range(nh)
    ]
    out.sort(key=lambda d: (not d["named"], -d["blame_ms"], d["host"]))
    return out
