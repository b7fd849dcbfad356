"""Straggler rules, from the stragglers analysis and its root causes.

* ``straggler_rank`` — every rank the stragglers analysis names (its naming rule and threshold are in
  ``straggler_info.rule``) and that no ``straggler_host`` finding covers. Impact: its mean lateness / median step
  time. Advice follows its root cause (``[idle]`` or a slower op).
* ``straggler_host`` — a host whose ranks are late together: at least two ranks, of which ≥ ``host_min_fraction``
  (75 %) are named stragglers, on a run that spans at least two hosts. (The stragglers host table alone is not
  enough: a host's arrival is its latest rank's, so one late rank makes its host late.) Its lateness and share of
  late collectives come from the stragglers host table; the ranks it covers get no ``straggler_rank`` finding.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..names import display_name, rank_ranges
from ..rootcause import IDLE_NAME
from .rules import FindingRules, pct


def straggler_findings(stragglers: dict[str, Any], root_cause: list[dict], hosts: dict[int, str],
                        median_step_ms: float, rules: FindingRules) -> list[dict[str, Any]]:
    ranks = {d["rank"]: d for d in stragglers.get("ranks", [])}
    named = [d for d in stragglers.get("ranks", []) if d.get("named")]
    thr = (stragglers.get("rule") or {}).get("threshold_ms")
    out: list[dict[str, Any]] = []
    n_hosts = len(set(hosts.values()))
    covered: set[int] = set()
    host_rows = {h["host"]: h for h in stragglers.get("hosts", [])}
    by_host: dict[str, list[int]] = {}
    for r, h in hosts.items():
        by_host.setdefault(h, []).append(r)
    for host, members in sorted(by_host.items()):
        late = [r for r in members if r in ranks and ranks[r].get("named")]
        h = host_rows.get(host, {})
        if n_hosts < 2 or len(members) < 2 or len(late) < rules.host_min_fraction * len(members):
            continue
        covered.update(late)
        lat = h.get("mean_lateness_ms") or (float(np.mean([ranks[r]["mean_lateness_ms"] for r in late])) if late else 0)
        blame = sum(ranks[r]["blame_ms_per_step"] for r in members if r in ranks)
        impact = pct(lat, median_step_ms)
        out.append({
            "id": "straggler_host", "severity": rules.severity(impact), "rank": None, "host": host,
            "title": f"Slow host {host}: ranks {rank_ranges(members, sep=',')} are late together",
            "evidence": (f"{len(late)} of its {len(members)} ranks are named stragglers; the host arrives "
                         f"{lat:.1f} ms after the other hosts on average (last in "
                         f"{100 * (h.get('late_fraction') or 0):.0f} % of collectives) and its ranks cost the others "
                         f"{blame:.1f} ms of waiting per step ({impact:.0f} % of the {median_step_ms:.1f} ms median "
                         f"step). Rule: >= {100 * rules.host_min_fraction:.0f} % of its ranks (at least 2) are named "
                         f"stragglers, on a run with at least 2 hosts."),
            "advice": ("The node itself is slower: check it for thermal or power throttling (nvidia-smi -q -d "
                       "PERFORMANCE), other jobs or processes, a different device, driver or CPU model, and its "
                       "network link; exclude it from the job (e.g. Slurm --exclude) until fixed."),
            "metrics": {"mean_lateness_ms": float(lat), "late_fraction": float(h.get("late_fraction") or 0.0),
                        "blame_ms_per_step": float(blame), "n_ranks": float(len(members)),
                        "n_late_ranks": float(len(late)), "impact_pct": impact, "median_step_ms": median_step_ms,
                        "threshold_ms": float(thr or 0.0), "threshold_host_fraction": rules.host_min_fraction},
        })
    rc = {d["rank"]: d for d in root_cause}
    for d in named:
        r = d["rank"]
        if r in covered:
            continue
        impact = pct(d["mean_lateness_ms"], median_step_ms)
        ops = (rc.get(r) or {}).get("ops") or []
        cause = "; ".join(f"{display_name(o['name'])} +{o['excess_ms_per_step']:.1f} ms/step ({o['rank_ms_per_step']:.1f} vs "
                          f"{o['others_median_ms_per_step']:.1f})" for o in ops[:3])
        top = ops[0] if ops else None
        if top is None:
            advice = ("Compare this rank with its peers in the timeline (distprof timeline) to see where it loses "
                      "time; check its host for CPU contention or throttling.")
        elif top["name"] == IDLE_NAME:
            advice = (f"Rank {r} spends its extra time outside any recorded op: look for work that only this rank "
                      "does (logging, checkpointing, evaluation, data loading on the main thread, time.sleep, garbage "
                      "collection) and for CPU contention on its host (other processes, OMP_NUM_THREADS, CPU "
                      "affinity).")
        else:
            advice = (f"Rank {r}'s {display_name(top['name'])} is slower than on its peers: check for uneven work (batch or "
                      "sequence lengths per rank; balance the sampler), a slower or throttled device, or CPU "
                      "contention on its host.")
        out.append({
            "id": "straggler_rank", "severity": rules.severity(impact), "rank": r, "host": d.get("host"),
            "title": f"Straggler: rank {r} (host {d.get('host')}) is late in {100 * d['late_fraction']:.0f} % of "
                     f"collectives",
            "evidence": (f"rank {r} arrives {d['mean_lateness_ms']:.1f} ms after the median of the other ranks per "
                         f"step ({impact:.0f} % of the {median_step_ms:.1f} ms median step), late in "
                         f"{100 * d['late_step_fraction']:.0f} % of steps; the others wait "
                         f"{d['blame_ms_per_step']:.1f} ms per step for it in total"
                         + (f"; it differs most in: {cause}" if cause else "")
                         + f". Rule: the stragglers naming rule (threshold {thr or 0:.2f} ms, see straggler_info)."),
            "advice": advice,
            "metrics": {"mean_lateness_ms": d["mean_lateness_ms"], "late_fraction": d["late_fraction"],
                        "late_step_fraction": d["late_step_fraction"], "blame_ms_per_step": d["blame_ms_per_step"],
                        "lost_ms_per_step": d["lost_ms_per_step"], "impact_pct": impact,
                        "median_step_ms": median_step_ms, "threshold_ms": float(thr or 0.0),
                        **({"top_excess_ms_per_step": top["excess_ms_per_step"]} if top else {})},
        })
    return out
