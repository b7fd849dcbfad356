"""CPU rule: the training thread runnable but not running — the host's cores are held by other threads or processes.

* ``cpu_contention`` — per rank, the mean over its steps of ``steps.cpu_wait_ms`` (the stepping thread's run-queue
  wait, from the capture's scheduler statistics; unknown for imports and older shards, and then the rule is silent).
  Fires when it reaches ``cpu_wait_min_step_pct`` (10 %) of step time and ``cpu_wait_min_ms`` (1 ms) per step.
  That time is neither the rank's own work nor waiting for a peer (a blocked wait sleeps, it is not runnable). The
  waits move the ranks' arrivals at collectives, which the straggler rule takes as they are: where a named
  straggler's lateness and its own extra work (its lateness with the ranks' waits for a CPU taken out, stragglers'
  ``extra_work_ms``) differ by the floor and a quarter of the lateness, the finding says so — a rank held back by
  its host is late for its host's sake, and its peers held back while it sleeps make it look less late. A rank that
  oversubscribes its own cores (too many intra-op threads or DataLoader workers) is reported here too.
  Ranks that compute on the CPU on a host whose ranks' intra-op threads outnumber the CPUs they may run on (the
  shards' ``cpu_affinity``, ``host_cpus``, ``intra_op_threads``) are reported whatever their measured wait: the
  device itself is shared, and the run-queue wait of the training thread alone understates it (4 ranks on 2 cores
  measured 3–41 % per rank from run to run, once 6–10 % on every rank).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ..types import FindingRules
from .rules import Hit, pct

if TYPE_CHECKING:
    from ..cross.stragglers import Stragglers
    from ..types import RunSummary


def arrival_shift(stragglers: Stragglers | None) -> dict[int, tuple[float, float]]:
    """Named ranks whose lateness and own extra work differ by at least the straggler floor and a quarter of the
    lateness: the ranks' waits for a CPU moved their arrivals. rank -> (lateness, extra work), ms per step."""
    if stragglers is None:
        return {}
    thr = float(stragglers.threshold_ms or 0.0)
    return {int(d.rank): (float(d.lateness_ms), float(d.extra_work_ms)) for d in stragglers.named_rows
            if d.extra_work_ms is not None
            and abs(d.extra_work_ms - d.lateness_ms) >= max(thr, SHIFT_SHARE * abs(d.lateness_ms))}


def oversubscribed(run: RunSummary) -> dict[int, tuple[int, int, int]]:
    """Ranks that compute on the CPU (``device_type`` cpu) on a host whose ranks' intra-op threads outnumber the
    CPUs they may run on: rank -> (the host's ranks, their threads, the CPUs). The shards' ``cpu_affinity``,
    ``host_cpus`` and ``intra_op_threads`` (capture: ``dist_info.cpu_budget``); ranks are grouped by the OS host
    (``real_host``), and ranks bound to CPUs of their own (affinity below the host's) are taken to be bound to
    different ones. Unknown (older shards, imports, GPU ranks, whose threads mostly wait on the device): none."""
    keys = ("cpu_affinity", "host_cpus", "intra_op_threads")
    attrs = run.attrs
    if not all(all(type(a.get(k)) is int for k in keys) and isinstance(a.get("real_host"), str)
               for a in attrs.values()):
        return {}  # a shard without them: the run's hosts are not known
    hosts: dict[str, list[tuple[int, dict[str, Any]]]] = {}
    for r, a in attrs.items():
        hosts.setdefault(a["real_host"], []).append((int(r), a))
    out: dict[int, tuple[int, int, int]] = {}
    for members in hosts.values():
        if not all(a.get("device_type") == "cpu" for _, a in members):
            continue
        threads = sum(a["intra_op_threads"] for _, a in members)
        cpus = min(a["host_cpus"] for _, a in members)
        if any(a["cpu_affinity"] < a["host_cpus"] for _, a in members):
            cpus = min(cpus, sum(a["cpu_affinity"] for _, a in members))
        if threads > cpus:
            out.update({r: (len(members), threads, cpus) for r, _ in members})
    return out


#: A named rank's lateness and extra work that differ by this share of its lateness are said to be moved by the waits.
SHIFT_SHARE = 0.25


def cpu_contention(run: RunSummary, rules: FindingRules, stragglers: Stragglers | None = None) -> list[Hit]:
    shift = arrival_shift(stragglers)
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
    over = oversubscribed(run)
    waits = (w >= rules.cpu_wait_min_ms) & (100.0 * w >= rules.cpu_wait_min_step_pct * s)
    hits = []
    for i in np.flatnonzero(waits | np.isin(ranks, list(over))).tolist():
        r = int(ranks[i])
        hits.append(Hit(r, str(run.hosts.get(r, "?")), pct(float(w[i]), float(s[i])), {
            "cpu_wait_ms_per_step": float(w[i]), "cpu_run_ms_per_step": float(r_ms[i]), "step_ms": float(s[i]),
            "threshold_step_pct": rules.cpu_wait_min_step_pct, "threshold_ms": rules.cpu_wait_min_ms},
            notes={"oversubscribed": over[r]} if r in over else {}))
    if shift:  # the straggler's arrivals moved by the waits: said once, in the text
        r, (late, extra) = max(shift.items(), key=lambda kv: abs(kv[1][1] - kv[1][0]))
        for h in hits:
            h.notes["arrival_shift"] = (r, late, extra)
    return hits


def cpu_contention_text(m, where, worst):
    title = f"Waiting for a CPU on {where}: {m['impact_pct']:.0f} % of step time"
    ev = (f"the training thread was runnable but not running {m['cpu_wait_ms_per_step']:.1f} ms of its "
          f"{m['step_ms']:.1f} ms step (it ran {m['cpu_run_ms_per_step']:.1f} ms): other threads or processes held "
          f"the host's cores. This is neither the rank's own work nor waiting for a peer. Rule: "
          f">= {m['threshold_step_pct']:.0f} % of step time and >= {m['threshold_ms']:.1f} ms per step, or a host "
          "whose CPU ranks' intra-op threads outnumber its cores." + _over_text(worst.notes) + _shift_text(worst.notes))
    advice = ("Give each rank its cores: no more busy ranks per host than cores, intra-op threads per rank "
              "(OMP_NUM_THREADS, torch.set_num_threads) times ranks within the cores, DataLoader workers counted "
              "too; bind ranks to cores (numactl / taskset, torchrun --numa-binding where available); look for other "
              "processes on the host (top, another job sharing the node) and move them off.")
    return title, ev, advice


def _over_text(notes: dict) -> str:
    if "oversubscribed" not in notes:
        return ""
    n, threads, cpus = notes["oversubscribed"]
    return (f" Its host runs {n} rank(s) computing on the CPU with {threads} intra-op thread(s) in all on {cpus} "
            "CPU(s): the cores are oversubscribed.")


def _shift_text(notes: dict) -> str:
    if "arrival_shift" not in notes:
        return ""
    r, late, extra = notes["arrival_shift"]
    who = "its peers' waits for a CPU delayed their arrivals" if extra > late else "its own waits delayed it"
    return (f" It moves the arrivals at collectives: straggler rank {r} arrives {late:.1f} ms late per step while its "
            f"own work is {extra:.1f} ms more than its peers' ({who}).")
