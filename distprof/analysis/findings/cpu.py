"""CPU rule: the training thread runnable but not running — the host's cores are held by other threads or processes.

* ``cpu_contention`` — per rank, the mean over its steps of ``steps.cpu_wait_ms`` (the stepping thread's run-queue
  wait, from the capture's scheduler statistics; unknown for imports and older shards, and then the rule is silent).
  Fires when it reaches ``cpu_wait_min_step_pct`` (10 %) of step time and ``cpu_wait_min_ms`` (1 ms) per step.
  That time is neither the rank's own work nor waiting for a peer (a blocked wait sleeps, it is not runnable). A
  rank held back this way more than its peers, late at its collectives by that wait and no more (the stragglers'
  ``cpu_wait_excess_ms`` and ``lateness_not_cpu_wait_ms``), is not named a straggler: the finding says it arrived
  late and why (``late_ms_per_step``, ``held_back_ms_per_step``), since freeing its cores, not its work, is what
  would gain. A rank that oversubscribes its own cores (too many intra-op threads or DataLoader workers) is
  reported here too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..types import FindingRules
from .rules import Hit, pct

if TYPE_CHECKING:
    from ..cross.stragglers import Stragglers
    from ..types import RunSummary


def held_back(stragglers: Stragglers | None) -> dict[int, tuple[float, float]]:
    """Ranks late by at least the straggler floor, not named, whose lateness was mostly waiting longer for a CPU than
    their peers: rank -> (mean lateness, its CPU-wait excess), ms per step."""
    if stragglers is None:
        return {}
    thr = float(stragglers.threshold_ms or 0.0)
    return {int(d.rank): (float(d.mean_lateness_ms), float(d.cpu_wait_excess_ms or 0.0))
            for d in stragglers.ranks
            if not d.named and d.mean_lateness_ms >= thr
            and (d.cpu_wait_excess_ms or 0.0) >= max(thr, 0.5 * d.mean_lateness_ms)}


def cpu_contention(run: RunSummary, rules: FindingRules, stragglers: Stragglers | None = None) -> list[Hit]:
    held = held_back(stragglers)
    st = run.steps
    wait = np.asarray(st.get("cpu_wait_ms", np.zeros(0)), np.float64)
    if wait.size == 0 or not np.isfinite(wait).any():
        return []
    ok = np.isfinite(wait)
    ranks, idx = np.unique(np.asarray(st["rank"], np.int64)[ok], return_inverse=True)
    n = np.bincount(idx)

    def mean(col: np.ndarray) -> np.ndarray:  # per rank over its known rank-steps (NaN run times count as 0)
        return np.bincount(idx, weights=np.nan_to_num(np.asarray(col, np.float64)[ok]), minlength=ranks.size) / n

    w, s = mean(wait), mean(st["step_ms"])
    r_ms = mean(st.get("cpu_run_ms", np.zeros(wait.size)))
    hits = []
    for i in np.flatnonzero((w >= rules.cpu_wait_min_ms) & (100.0 * w >= rules.cpu_wait_min_step_pct * s)).tolist():
        r = int(ranks[i])
        hits.append(Hit(r, str(run.hosts.get(r, "?")), pct(float(w[i]), float(s[i])), {
            "cpu_wait_ms_per_step": float(w[i]), "cpu_run_ms_per_step": float(r_ms[i]), "step_ms": float(s[i]),
            "threshold_step_pct": rules.cpu_wait_min_step_pct, "threshold_ms": rules.cpu_wait_min_ms,
            "late_ms_per_step": held.get(r, (0.0, 0.0))[0], "held_back_ms_per_step": held.get(r, (0.0, 0.0))[1]}))
    return hits


def cpu_contention_text(m, where, worst):
    title = f"Waiting for a CPU on {where}: {m['impact_pct']:.0f} % of step time"
    ev = (f"the training thread was runnable but not running {m['cpu_wait_ms_per_step']:.1f} ms of its "
          f"{m['step_ms']:.1f} ms step (it ran {m['cpu_run_ms_per_step']:.1f} ms): other threads or processes held "
          f"the host's cores. This is neither the rank's own work nor waiting for a peer. Rule: "
          f">= {m['threshold_step_pct']:.0f} % of step time and >= {m['threshold_ms']:.1f} ms per step."
          + _held_back_text(worst.rank, worst.metrics))
    advice = ("Give each rank its cores: no more busy ranks per host than cores, intra-op threads per rank "
              "(OMP_NUM_THREADS, torch.set_num_threads) times ranks within the cores, DataLoader workers counted "
              "too; bind ranks to cores (numactl / taskset, torchrun --numa-binding where available); look for other "
              "processes on the host (top, another job sharing the node) and move them off.")
    return title, ev, advice


def _held_back_text(rank: int, m: dict) -> str:
    if m.get("held_back_ms_per_step", 0.0) <= 0:
        return ""
    return (f" Rank {rank} arrived {m['late_ms_per_step']:.1f} ms late per step at its collectives, "
            f"{m['held_back_ms_per_step']:.1f} ms of it from waiting longer for a CPU than its peers before them: "
            f"the host held it back, its own work was not slower, and it is not named a straggler.")
