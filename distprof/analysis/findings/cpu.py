"""CPU rule: the training thread runnable but not running — the host's cores are held by other threads or processes.

* ``cpu_contention`` — per rank, the mean over its steps of ``steps.cpu_wait_ms`` (the stepping thread's run-queue
  wait, from the capture's scheduler statistics; unknown for imports and older shards, and then the rule is silent).
  Fires when it reaches ``cpu_wait_min_step_pct`` (10 %) of step time and ``cpu_wait_min_ms`` (1 ms) per step.
  That time is neither the rank's own work nor waiting for a peer (a blocked wait sleeps, it is not runnable). A
  rank held back this way more than its peers is still named a straggler when it arrives late (it is late, and
  freeing its cores is what would gain); its finding states the extra wait. A rank that oversubscribes its own
  cores (too many intra-op threads or DataLoader workers) is reported here too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .rules import FindingRules, Hit, pct

if TYPE_CHECKING:
    from ..runsummary import RunSummary


def cpu_contention(run: RunSummary, rules: FindingRules) -> list[Hit]:
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
            "threshold_step_pct": rules.cpu_wait_min_step_pct, "threshold_ms": rules.cpu_wait_min_ms}))
    return hits


def cpu_contention_text(m, where, worst):
    title = f"Waiting for a CPU on {where}: {m['impact_pct']:.0f} % of step time"
    ev = (f"the training thread was runnable but not running {m['cpu_wait_ms_per_step']:.1f} ms of its "
          f"{m['step_ms']:.1f} ms step (it ran {m['cpu_run_ms_per_step']:.1f} ms): other threads or processes held "
          f"the host's cores. This is neither the rank's own work nor waiting for a peer. Rule: "
          f">= {m['threshold_step_pct']:.0f} % of step time and >= {m['threshold_ms']:.1f} ms per step.")
    advice = ("Give each rank its cores: no more busy ranks per host than cores, intra-op threads per rank "
              "(OMP_NUM_THREADS, torch.set_num_threads) times ranks within the cores, DataLoader workers counted "
              "too; bind ranks to cores (numactl / taskset, torchrun --numa-binding where available); look for other "
              "processes on the host (top, another job sharing the node) and move them off.")
    return title, ev, advice
