"""Findings: the common causes of slow distributed training, detected per rank, each with its numbers and usual fix.

    fs = findings(run, stragglers=find_stragglers(run), root_cause=rc)      # run: a RunSummary
    text = verdict(summary, stragglers, rc, fs)

Every rule measures a share of step time "at stake" (``metrics["impact_pct"]``); severity follows from it:
**high** ≥ 25 %, **medium** ≥ 10 %, else **low** (``FindingRules.high_pct`` / ``medium_pct``). Findings are sorted by
severity, then impact. A rule that fires on at least half of the ranks (and more than one) gives one finding for
them all, else one per rank (see :mod:`.rules`). Each rule is documented, with its thresholds (defaults of
:class:`FindingRules`), in the module that holds it:

* ``straggler_rank``, ``straggler_host`` — :mod:`.stragglers`
* ``exposed_comm`` — :mod:`.communication`
* ``input_wait`` — :mod:`.input_wait`
* ``cpu_contention`` — :mod:`.cpu`
* ``cpu_time`` — :mod:`.cpu_time`
* ``device_idle``, ``host_sync`` — :mod:`.device`
* ``tiny_ops`` — :mod:`.ops`
* ``memory_churn`` — :mod:`.memory`
* ``pipeline_bubble`` — :mod:`.pipeline`
* ``uneven_steps`` — :mod:`.uneven`

The rules read the per-rank numbers of :mod:`.measures` (helpers in :mod:`.events`); thresholds, severity and the
grouping of hits into findings are in :mod:`.rules`.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import numpy as np

from ..cross.pipeline import Pipeline
from ..cross.pipeline import pipelines as find_pipelines
from ..types import FindingRules
from .communication import exposed_comm, exposed_comm_text
from .cpu import cpu_contention, cpu_contention_text
from .cpu_time import cpu_time, cpu_time_text
from .device import device_idle, device_idle_text, host_sync, host_sync_text
from .input_wait import input_wait, input_wait_text
from .memory import memory_churn, memory_churn_text
from .ops import tiny_ops, tiny_ops_text
from .finding import SEVERITY_ORDER, Finding
from .pipeline import pipeline_comm, pipeline_findings
from .rules import group
from .stragglers import straggler_findings
from .uneven import loop_ends, uneven_steps

if TYPE_CHECKING:
    from ..cross.rootcause import RootCause
    from ..cross.stragglers import Stragglers
    from ..types import RunSummary

logger = logging.getLogger(__name__)

__all__ = ["Finding", "findings"]


def findings(
    run: RunSummary,
    *,
    stragglers: Stragglers,
    root_cause: list[RootCause],
    rules: FindingRules | None = None,
    pipelines: list[Pipeline] | None = None,
    exposed_advice: str | None = None,
) -> list[Finding]:
    """Every finding of every rule (see the rule modules, indexed above), most severe first.

    `stragglers` is ``find_stragglers(run)``, `root_cause` ``root_cause(run, named)``'s list, `pipelines`
    ``pipeline.pipelines(run)``'s (computed here when not given). The per-rank
    measures were taken when the run was summarised (``tiny_op_us`` of the rules given then).
    """
    rules = rules or FindingRules()
    ms = [s.measures for _, s in sorted(run.ranks.items()) if s.measures is not None]
    if not ms:
        return []
    n = len(ms)
    step_ms = np.asarray(run.steps["step_ms"], np.float64)
    median_step = float(np.median(step_ms)) if step_ms.size else 0.0
    pipes = pipelines if pipelines is not None else find_pipelines(run)
    out = straggler_findings(stragglers, root_cause, dict(run.hosts), median_step, rules)
    out += pipeline_findings(pipes, rules)
    out += group("exposed_comm", exposed_comm(ms, rules, stragglers.waits_for_named, pipeline_comm(
        pipes, set(run.ranks_with_collectives))), n, rules,
        lambda m, where, worst: exposed_comm_text(m, where, worst, exposed_advice))
    out += group("input_wait", input_wait(ms, rules), n, rules, input_wait_text)
    out += group("cpu_contention", cpu_contention(run, rules, stragglers), n, rules, cpu_contention_text)
    out += group("cpu_time", cpu_time(run, rules), n, rules, cpu_time_text)
    out += group("device_idle", device_idle(ms, rules), n, rules, device_idle_text)
    out += group("host_sync", host_sync(ms, rules), n, rules, host_sync_text)
    out += group("tiny_ops", tiny_ops(ms, rules), n, rules, tiny_ops_text)
    out += group("memory_churn", memory_churn(ms, rules), n, rules, memory_churn_text)
    out += uneven_steps(loop_ends(run), rules, dict(run.hosts))
    for f in out:
        f.metrics = {k: float(v) for k, v in f.metrics.items() if v is not None}
    out.sort(key=lambda f: (SEVERITY_ORDER[f.severity], -f.impact_pct))
    logger.debug("findings: %s", [(f.id, f.severity, f.rank) for f in out])
    return out
