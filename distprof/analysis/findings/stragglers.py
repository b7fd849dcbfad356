"""Straggler rules, from the stragglers analysis and its root causes.

* ``straggler_rank`` — every rank the stragglers analysis names (its naming rule and threshold are in
  ``straggler_info.rule``) and that no ``straggler_host`` finding covers. Impact (severity follows the cost): its
  ``cost_ms_per_step`` — what the steps lose to it, its lead over the latest rank that is not named — / median step
  time. Advice follows its root cause (``[idle]`` or a slower op).
* ``straggler_host`` — a host whose ranks are late together (impact: the largest cost of its named ranks / median
  step time): at least two ranks, of which ≥ ``host_min_fraction``
  (75 %) are named stragglers, on a run that spans at least two hosts. (The stragglers host table alone is not
  enough: a host's arrival is its latest rank's, so one late rank makes its host late.) Its lateness and share of
  late collectives come from the stragglers host table; the ranks it covers get no ``straggler_rank`` finding.
"""

from __future__ import annotations

import numpy as np

from ..cross.rootcause import IDLE_NAME, RootCause, RootCauseOp
from ..cross.stragglers import StragglerHost, StragglerRank, Stragglers
from ..names import display_name, rank_ranges
from ..types import FindingRules
from .finding import Finding
from .rules import pct


def straggler_findings(stragglers: Stragglers, root_cause: list[RootCause], hosts: dict[int, str],
                        median_step_ms: float, rules: FindingRules) -> list[Finding]:
    """The ``straggler_host`` findings, then a ``straggler_rank`` finding per named rank that no host finding covers
    (see the module docstring); `hosts` maps each rank to its host, `root_cause` is ``root_cause(run, named)``."""
    ranks = {d.rank: d for d in stragglers.ranks}
    thr = stragglers.threshold_ms
    out, covered = _host_findings(stragglers, ranks, hosts, median_step_ms, rules, thr)
    rc = {d.rank: d for d in root_cause}
    for d in stragglers.ranks:
        if d.named and d.rank not in covered:
            ops = rc[d.rank].ops if d.rank in rc else []
            out.append(_rank_finding(d, ops, len(ranks), median_step_ms, rules, thr))
    return out


def _host_findings(stragglers: Stragglers, ranks: dict[int, StragglerRank], hosts: dict[int, str],
                   median_step_ms: float, rules: FindingRules, thr: float | None) -> tuple[list[Finding], set[int]]:
    """(A ``straggler_host`` finding per host whose ranks are late together, the named ranks those findings cover)."""
    out: list[Finding] = []
    covered: set[int] = set()
    n_hosts = len(set(hosts.values()))
    host_rows = {h.host: h for h in stragglers.info.hosts}
    by_host: dict[str, list[int]] = {}
    for r, h in hosts.items():
        by_host.setdefault(h, []).append(r)
    for host, members in sorted(by_host.items()):
        late = [r for r in members if r in ranks and ranks[r].named]
        if n_hosts < 2 or len(members) < 2 or len(late) < rules.host_min_fraction * len(members):
            continue
        covered.update(late)
        out.append(_host_finding(host, members, late, host_rows.get(host), ranks, median_step_ms, rules, thr))
    return out, covered


def _host_finding(host: str, members: list[int], late: list[int], h: StragglerHost | None,
                  ranks: dict[int, StragglerRank], median_step_ms: float, rules: FindingRules,
                  thr: float | None) -> Finding:
    """The ``straggler_host`` finding of one host: its ranks `members`, of which `late` are named; `h` is its row of
    the stragglers host table (None when it has none)."""
    lat = (h.lateness_ms if h is not None else 0.0) or (
        float(np.mean([ranks[r].lateness_ms for r in late])) if late else 0)
    late_fraction = (h.late_fraction if h is not None else 0.0) or 0.0
    n_steps = max((ranks[r].n_steps for r in members if r in ranks), default=0)
    blame = (h.blame_ms / max(n_steps, 1) if h is not None else
             sum(ranks[r].blame_ms_per_step for r in members if r in ranks))
    cost = max((float(ranks[r].cost_ms_per_step) for r in late), default=float(lat))
    impact = pct(cost, median_step_ms)
    n_others = max(len(ranks) - len(members), 1)
    return Finding(
        id="straggler_host", severity=rules.severity(impact), rank=None, host=host,
        title=f"Slow host {host}: ranks {rank_ranges(members, sep=',')} are late together",
        evidence=(f"{len(late)} of its {len(members)} ranks are named stragglers; the host arrives "
                  f"{lat:.1f} ms after the other hosts on average (last in "
                  f"{100 * late_fraction:.0f} % of collectives); the steps lose {cost:.1f} ms "
                  f"to it ({impact:.0f} % of the {median_step_ms:.1f} ms median step) and the ranks of the "
                  f"other hosts wait {blame / n_others:.1f} ms each per step for it on average. Rule: >= "
                  f"{100 * rules.host_min_fraction:.0f} % of its ranks (at least 2) are named "
                  f"stragglers, on a run with at least 2 hosts."),
        advice=("The node itself is slower: check it for thermal or power throttling (nvidia-smi -q -d "
                "PERFORMANCE), other jobs or processes, a different device, driver or CPU model, and its "
                "network link; exclude it from the job (e.g. Slurm --exclude) until fixed."),
        metrics={"lateness_ms": float(lat), "late_fraction": float(late_fraction),
                 "blame_ms_per_step": float(blame), "wait_ms_per_step_each": blame / n_others,
                 "cost_ms_per_step": cost, "n_ranks": float(len(members)),
                 "n_late_ranks": float(len(late)), "impact_pct": impact, "median_step_ms": median_step_ms,
                 "threshold_ms": float(thr or 0.0), "threshold_host_fraction": rules.host_min_fraction},
    )


def _rank_finding(d: StragglerRank, ops: list[RootCauseOp], n_ranks: int, median_step_ms: float,
                  rules: FindingRules, thr: float | None) -> Finding:
    """The ``straggler_rank`` finding of a named rank (its stragglers row `d`, its root-cause ops, most first)."""
    r = d.rank
    cost = float(d.cost_ms_per_step)
    impact = pct(cost, median_step_ms)
    wait_each = d.blame_ms_per_step / max(n_ranks - 1, 1)
    top = ops[0] if ops else None
    return Finding(
        id="straggler_rank", severity=rules.severity(impact), rank=r, host=d.host,
        title=f"Straggler: rank {r} (host {d.host}) is late by {d.lateness_ms:.1f} ms in "
              f"{100 * d.late_step_fraction:.0f} % of steps",
        evidence=_rank_evidence(d, ops, n_ranks, wait_each, median_step_ms, thr),
        advice=_rank_advice(r, top),
        metrics={"lateness_ms": d.lateness_ms, "late_fraction": d.late_fraction,
                 "late_step_fraction": d.late_step_fraction, "blame_ms_per_step": d.blame_ms_per_step,
                 "wait_ms_per_step_each": wait_each, "cost_ms_per_step": cost, "impact_pct": impact,
                 "median_step_ms": median_step_ms, "threshold_ms": float(thr or 0.0),
                 **({"extra_work_ms": d.extra_work_ms} if d.extra_work_ms is not None else {}),
                 **({"top_excess_ms_per_step": top.excess_ms_per_step} if top else {})},
    )


def _rank_evidence(d: StragglerRank, ops: list[RootCauseOp], n_ranks: int, wait_each: float, median_step_ms: float,
                   thr: float | None) -> str:
    """What a named rank's finding says: its lateness, its extra work, who waits for it, and where it differs."""
    r = d.rank
    cause = "; ".join(f"{display_name(o.name)} +{o.excess_ms_per_step:.1f} ms/step "
                      f"({o.rank_ms_per_step:.1f} vs {o.others_median_ms_per_step:.1f})" for o in ops[:3])
    extra = ("" if d.extra_work_ms is None else
             f"; its own work before them is {d.extra_work_ms:.1f} ms per step more than its peers' (their waits for "
             f"a CPU taken out)")
    return (f"rank {r} arrives at the step's collectives {d.lateness_ms:.1f} ms after the median of the other "
            f"ranks (median over its {d.n_steps} steps of the {median_step_ms:.1f} ms median step; late by the floor "
            f"in {100 * d.late_step_fraction:.0f} % of them){extra}; "
            + (f"the other rank waits {wait_each:.1f} ms per step for it" if n_ranks == 2 else
               f"each of the other {n_ranks - 1} ranks waits {wait_each:.1f} ms per step for it on average")
            + (f"; it differs most in: {cause}" if cause else "")
            + f". Rule: the stragglers naming rule, floor {thr or 0:.2f} ms (straggler_info.rule).")


def _rank_advice(r: int, top: RootCauseOp | None) -> str:
    if top is None:
        return ("Compare this rank with its peers in the timeline (distprof timeline) to see where it loses time; "
                "check its host for CPU contention or throttling.")
    if top.name == IDLE_NAME:
        return (f"Rank {r} spends its extra time outside any recorded op: look for work that only this rank does "
                "(logging, checkpointing, evaluation, data loading on the main thread, time.sleep, garbage "
                "collection) and for CPU contention on its host (other processes, OMP_NUM_THREADS, CPU affinity).")
    return (f"Rank {r}'s {display_name(top.name)} is slower than on its peers: check for uneven work (batch or "
            "sequence lengths per rank; balance the sampler), a slower or throttled device, or CPU contention on its "
            "host.")
