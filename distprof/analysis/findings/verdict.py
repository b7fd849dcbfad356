"""The verdict: one or two plain sentences that say what limits the run, from the analyses already done.

Order of precedence:

1. No recorded step: say so and where to look.
2. The most severe finding leads (findings are ordered by severity, then impact). When it is a slow host
   (``straggler_host``) or a named straggler rank: who is late, in how many steps, what it costs — its own extra work
   per step (``extra_work_ms``; its lateness where that is unknown) and how much shorter the steps would be without it
   (the finding's what-if gain, ``estimated_gain_ms_per_step``; else the measured cost) — and its root cause: the
   ``[idle]`` pseudo-op as "more time outside any recorded op", else the slowest op as "runs N x slower than its
   peers"; a second sentence names the top other finding when it is of high severity. When another
   finding is more severe than any straggler, it leads and the straggler follows as the second sentence.
3. No straggler but matched collectives: "No straggler: ranks arrive within X ms of each other" (X = the largest mean
   lateness of any rank), then the top finding, else the largest part of the step-time summary.
4. No collective (one rank, or nothing matched): the mean step time and its largest part, then the top finding.

A finding is phrased with its own headline number and unit, as in its title (``tiny_ops``: share of
kernel time on a device rank, of op time on a CPU rank; ``device_idle``: share of step time, with the largest cause).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..cross.rootcause import IDLE_NAME
from ..names import display_name
from .device import dominant_idle_cause

if TYPE_CHECKING:
    from ..cross.rootcause import RootCause
    from ..cross.step_summary import StepSummary
    from ..cross.stragglers import StragglerRank, Stragglers
    from .finding import Finding

__all__ = ["verdict"]

_PARTS = (("compute_pct", "compute"), ("exposed_comm_pct", "exposed communication"), ("idle_pct", "idle"),
          ("memcpy_pct", "memory copies"), ("other_pct", "other work"))


def _phrase(f: Finding) -> str:
    """A finding as a clause, with the finding's own headline number and unit (as in its title)."""
    m = f.metrics
    imp = m.get("impact_pct")
    where = "" if f.rank is None else f" on rank {f.rank}"
    if f.id == "exposed_comm":
        return f"{imp:.0f} % of step time{where} is exposed communication"
    if f.id == "input_wait":
        return f"{imp:.0f} % of step time{where} is spent waiting for input"
    if f.id == "cpu_contention":
        return f"the training thread{where} waits for a CPU {imp:.0f} % of step time (other work holds the cores)"
    if f.id == "device_idle":
        cause = dominant_idle_cause(m)
        return (f"no kernel or copy runs on the device{where} for {imp:.0f} % of step time"
                + (f", mostly {cause[1]}" if cause else ""))
    if f.id == "host_sync":
        return (f"the host{where} blocks in {m.get('syncs_per_step', 0):.1f} device synchronisations per step "
                f"({m.get('sync_ms_per_step', 0):.2f} ms), after which the device idles {imp:.0f} % of step time")
    if f.id == "tiny_ops":
        op = "kernel" if m.get("device_rank", 0) >= 0.5 else "op"
        return (f"{m.get('tiny_share_pct', 0):.0f} % of {op} time{where} is in {op}s under "
                f"{m.get('threshold_us', 100):.0f} us ({'launch' if op == 'kernel' else 'dispatch'} overhead)")
    if f.id == "memory_churn":
        return f"memory churns{where} ({m.get('allocs_per_step', 0):.0f} allocations per step)"
    return f.title[0].lower() + f.title[1:]


def _largest_part(summary: StepSummary) -> str:
    parts = [(getattr(summary, k), label) for k, label in _PARTS if getattr(summary, k) is not None]
    if not parts:
        return ""
    pct, label = max(parts)
    return f"{pct:.0f} % of step time is {label}"


def _cause(rc: RootCause | None) -> str:
    ops = rc.ops if rc is not None else []
    if not ops:
        return ""
    bits = []
    idle = next((o for o in ops if o.name == IDLE_NAME), None)
    if idle is not None and idle is ops[0]:
        bits.append(f"it spends {idle.excess_ms_per_step:.1f} ms more per step than its peers outside any "
                    f"recorded op")
    op = next((o for o in ops if o.name != IDLE_NAME), None)
    if op is not None and (not bits or op.excess_ms_per_step >= 0.1 * ops[0].excess_ms_per_step):
        base = op.others_median_ms_per_step
        ratio = op.rank_ms_per_step / base if base > 0 else None
        how = (f"runs {ratio:.1f}x slower than its peers" if ratio is not None and ratio < 100
               else f"takes {op.excess_ms_per_step:.1f} ms more per step than on its peers")
        bits.append(f"its {display_name(op.name)} {how}")
    return ", and ".join(bits)


def _costs(f: Finding | None, cost_ms: float) -> str:
    """What fixing a straggler would gain: the what-if's shorter step, else the measured cost."""
    gain = f.estimated_gain_ms_per_step if f is not None else None
    if gain is not None:
        return f"the steps would be {gain:.1f} ms shorter without it"
    return f"the steps lose {cost_ms:.1f} ms to it"


def _straggler_sentence(host_f: Finding | None, named: list[StragglerRank], rc: dict[int, RootCause],
                        findings: list[Finding]) -> str:
    if host_f is not None:
        m = host_f.metrics
        return (f"host {host_f.host} is slow: its ranks arrive {m['lateness_ms']:.1f} ms late together in "
                f"{100 * m['late_fraction']:.0f} % of collectives, and "
                + _costs(host_f, m.get("cost_ms_per_step", m["lateness_ms"])))
    if not named:
        return ""
    d = named[0]
    f = next((x for x in findings if x.id == "straggler_rank" and x.rank == d.rank), None)
    what = (f"it does {d.extra_work_ms:.1f} ms more work per step than its peers before the step's collectives"
            if d.extra_work_ms is not None else
            f"it arrives {d.lateness_ms:.1f} ms after its peers at the step's collectives")
    first = (f"rank {d.rank} on host {d.host} is a straggler in {100 * d.late_step_fraction:.0f} % of steps: {what}, "
             f"and {_costs(f, d.cost_ms_per_step)}")
    cause = _cause(rc.get(d.rank))
    if cause:
        first += f"; {cause}"
    if len(named) > 1:
        first += f" (also late: rank{'s' if len(named) > 2 else ''} " \
                 f"{', '.join(str(x.rank) for x in named[1:4])}{', ...' if len(named) > 4 else ''})"
    return first


def _cap(text: str) -> str:
    return text[0].upper() + text[1:]


def verdict(summary: StepSummary, stragglers: Stragglers, root_cause: list[RootCause], findings: list[Finding]) -> str:
    """One or two sentences (see the module docstring)."""
    if not summary.n_rank_steps:
        return ("No recorded steps: nothing to analyse (check the capture schedule --wait/--warmup/--active and that "
                "the script calls optimizer.step()).")
    strag_ids = ("straggler_rank", "straggler_host")
    others = [f for f in findings if f.id not in strag_ids]
    top = others[0] if others else None
    host_f = next((f for f in findings if f.id == "straggler_host"), None)
    rc = {d.rank: d for d in root_cause}
    first = _straggler_sentence(host_f, stragglers.named_rows, rc, findings)
    if first:
        lead = findings[0] if findings else None
        if lead is not None and lead.id not in strag_ids:  # a more severe finding than any straggler leads
            return f"{_cap(_phrase(lead))}. Also, {first}."
        text = _cap(first) + "."
        if top is not None and top.severity == "high":
            text += f" Also, {_phrase(top)}."
        return text
    tail = _phrase(top) if top is not None else _largest_part(summary)
    ranks = stragglers.ranks
    if stragglers.info.n_instances and ranks:
        within = max(0.0, max(float(d.lateness_ms or 0.0) for d in ranks))
        head = f"No straggler: ranks arrive within {within:.1f} ms of each other"
    else:
        head = f"Steps take {summary.step_ms_mean or 0:.1f} ms on average"
    return f"{head}; {tail}." if tail else f"{head}."
