"""What the straggler analysis reads of a run: the part of a :class:`RunSummary` that :func:`.find.find_stragglers`
needs, as one record another MPI process can be sent (``analysis/report/parallel.py``).

:func:`straggler_inputs` takes those fields by the same names, so the analysis runs on either unchanged: the matched
collectives' members (without op and size, which it never reads), the collective rows' step and CPU-wait columns, the
steps table, the steps selection, each rank's device type and host, and the hosts' clock residuals. At 1,024
LLM-shaped ranks that is ≈ 100 MB of numpy columns, against the run summary's ≈ 430 MB.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from ...types import HostClock, RunSummary

__all__ = ["MatchedMembers", "StragglerInputs", "straggler_inputs"]

Table = dict[str, np.ndarray]

#: Member columns the analysis reads (instances.py, blame.py, extra_work.py).
MEMBER_COLUMNS = ("inst", "rank", "window", "pg", "seq", "row", "start_ns", "end_ns")
#: Collective-row columns it reads: each member's step, and the CPU wait at either end (extra_work.py).
ROW_COLUMNS = ("rank", "step", "cpu_wait_at_start_ns", "cpu_wait_at_end_ns")


@dataclass
class MatchedMembers:
    """The matched collectives' members (``Collectives.members``), the only part of the matching the analysis reads;
    ``instances``: columns of the instances, for what else runs on the inputs (``report/parallel.py``)."""

    members: Table
    instances: Table = field(default_factory=dict)


@dataclass
class StragglerInputs:
    """The fields of a RunSummary the straggler analysis reads, by the same names."""

    collectives: MatchedMembers
    collective_rows: Table
    steps: Table
    steps_selection: tuple[int, int] | None
    attrs: dict[int, dict[str, Any]]  # rank -> {"device_type": ...}
    hosts: dict[int, str]
    clock: dict[str, HostClock] = field(default_factory=dict)


def straggler_inputs(run: RunSummary) -> StragglerInputs:
    """The part of `run` the straggler analysis reads (views of its arrays, no copies)."""
    m, cr = run.collectives.members, run.collective_rows
    return StragglerInputs(
        collectives=MatchedMembers({k: np.asarray(m[k]) for k in MEMBER_COLUMNS if k in m}),
        collective_rows={k: np.asarray(cr[k]) for k in ROW_COLUMNS if k in cr},
        steps=dict(run.steps), steps_selection=run.steps_selection,
        attrs={int(r): {"device_type": a.get("device_type", "cpu")} for r, a in run.attrs.items()},
        hosts=dict(run.hosts), clock=dict(run.clock))
