"""CPU-time rule: a rank's training thread needs more CPU time per step than its peers' for the same step.

* ``cpu_time`` — per rank, the mean over its steps of ``steps.cpu_run_ms`` (the stepping thread's time on a CPU,
  from the capture's scheduler statistics; unknown for imports and older shards, and then the rule is silent) against
  the median of the other ranks' means. Fires when it is at least ``RATIO`` (1.2) times theirs and the excess is at
  least ``MIN_STEP_PCT`` (5 %) of its step time (impact: that excess / step time): its CPU ran the work slower (a core
  shared with another process, throttled, or a slower CPU), or the rank does more host work than its peers (an uneven
  batch, rank-0-only logging). Its page faults per step (``steps.page_faults``) are stated when they exceed the
  others' median by ``PAGE_FAULTS_MIN`` and ``PAGE_FAULTS_RATIO`` times: the kernel mapping memory anew every step (an
  allocator returning memory to the system and taking it back). This is evidence beside a straggler, never part of the
  straggler rule.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..cross.stragglers.peers import median_of_others
from .rules import Hit, pct

if TYPE_CHECKING:
    from ..types import FindingRules, RunSummary

__all__ = ["cpu_time", "cpu_time_text"]

#: A rank needs at least this many times its peers' CPU time per step, and the excess this share of its step.
RATIO = 1.2
MIN_STEP_PCT = 5.0
#: Page faults are stated once they exceed the peers' median by this many per step and this factor.
PAGE_FAULTS_MIN = 1000
PAGE_FAULTS_RATIO = 2.0


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
    return u, mean, median_of_others(np.zeros(u.size, np.int64), np.full(u.size, u.size), pos, mean[o])


def cpu_time(run: RunSummary, rules: FindingRules) -> list[Hit]:
    ranks, mine, others = _rank_means(run, "cpu_run_ms")
    if ranks.size < 2:
        return []
    _, step, _ = _rank_means(run, "step_ms")
    fr, f_mine, f_others = _rank_means(run, "page_faults")
    faults = {int(r): (float(a), float(b)) for r, a, b in zip(fr.tolist(), f_mine.tolist(), f_others.tolist())}
    hits = []
    for i, r in enumerate(ranks.tolist()):
        excess = float(mine[i] - others[i])
        impact = pct(excess, float(step[i])) if i < step.size else 0.0
        if others[i] > 0 and mine[i] >= RATIO * others[i] and impact >= MIN_STEP_PCT:
            pf, pf_others = faults.get(int(r), (np.nan, np.nan))
            hits.append(Hit(int(r), str(run.hosts.get(int(r), "?")), impact, {
                "cpu_run_ms_per_step": float(mine[i]), "others_cpu_run_ms_per_step": float(others[i]),
                "ratio": float(mine[i] / others[i]), "step_ms": float(step[i]), "threshold_ratio": RATIO,
                "threshold_step_pct": MIN_STEP_PCT,
                "page_faults_per_step": pf if np.isfinite(pf) else -1.0,
                "others_page_faults_per_step": pf_others if np.isfinite(pf_others) else -1.0}))
    return hits


def cpu_time_text(m, where, worst):
    title = f"More CPU time per step on {where}: {m['ratio']:.2f}x its peers'"
    ev = (f"the training thread ran {m['cpu_run_ms_per_step']:.1f} ms on a CPU per step against the other ranks' "
          f"median of {m['others_cpu_run_ms_per_step']:.1f} ms ({m['impact_pct']:.0f} % of its {m['step_ms']:.1f} ms "
          f"step): its CPU ran the work slower (a core shared with another process, throttled, or a slower CPU), or "
          f"it does more host work than its peers." + _faults_text(m) +
          f" Rule: >= {m['threshold_ratio']:g}x the others' CPU time and the excess >= "
          f"{m['threshold_step_pct']:.0f} % of step time.")
    advice = ("Compare this rank's host with its peers' (CPU model and frequency, throttling, other processes on its "
              "cores: top, taskset) and its work (batch or sequence lengths, rank-specific logging or evaluation); "
              "bind ranks to cores (numactl / taskset).")
    return title, ev, advice


def _faults_text(m) -> str:
    mine, others = m["page_faults_per_step"], m["others_page_faults_per_step"]
    if mine < 0 or others < 0 or mine - others < PAGE_FAULTS_MIN or mine < PAGE_FAULTS_RATIO * others:
        return ""
    return (f" It took {mine:,.0f} page faults per step against the others' median of {others:,.0f}: the kernel "
            f"mapped memory for it anew every step (an allocator returning memory to the system and taking it back; "
            f"on CPU, torch's huge pages THP_MEM_ALLOC_ENABLE=1 or a fixed MALLOC_MMAP_THRESHOLD_ keep it).")
