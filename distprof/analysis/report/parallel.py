"""The cross-rank phase under MPI: the straggler analysis and the collectives table run on MPI process 1 while
rank 0 builds the rest.

Once the run is summarised (``analysis/summarize``), MPI rank 0 holds the run summary and the other processes are
idle. The straggler analysis is the largest part of :func:`~.build.build_report` that the step graph, the critical
path and the what-ifs do not read (at 1,024 LLM-shaped ranks 2.5–3.1 s, most of it its 1.39 M instance rows); the
collectives table (0.24 s there) reads the same rows and is read by neither either. Rank 0 sends what the two read
(:func:`helper_inputs`: ≈ 150 MB of numpy columns, sent as out-of-band buffers) to process 1, builds the step
graph, the critical path, the what-if estimates and then the pipelines (0.44 s there; they read the point-to-point
pairs, which process 1 is not sent) meanwhile, and takes the results where the findings first need them. With the
pipelines on rank 0 the two shares end within 0.1 s of each other there (on process 1 they left rank 0 waiting
0.6–0.9 s). The results are the objects a serial run computes (the MPI tests compare the reports).

The exchange never leaves a process waiting: rank 0 always sends process 1 either the inputs or a release (also
when summarising or reporting fails), and always receives what it asked for (also when the report then fails).
When process 1 fails, rank 0 logs one warning and computes the three itself.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ..cross.comm_table import CommRow, comm_table
from ..cross.stragglers import Stragglers, find_stragglers
from ..cross.stragglers.inputs import StragglerInputs, straggler_inputs

if TYPE_CHECKING:
    from collections.abc import Callable

    from ..cross.stragglers import StragglerRule
    from ..types import RunSummary

log = logging.getLogger(__name__)

__all__ = ["HelperRun", "Helped", "Offload", "helped", "helper_inputs"]

#: Columns of the matched instances and of the collective rows that the collectives table reads (comm_table.py).
INSTANCE_COLUMNS = ("inst", "pg", "op_id", "n_ranks", "last_rank", "skew_ns")
TABLE_ROW_COLUMNS = ("rank", "step", "pg", "op_id", "start_ns", "end_ns", "exposed_ns", "bytes")


@dataclass
class HelperRun(StragglerInputs):
    """What process 1 reads, by the RunSummary's field names: the straggler analysis's inputs, with the matched
    instances, the collective-row columns, the groups and the names the collectives table reads."""

    process_groups: list[dict[str, Any]] = field(default_factory=list)
    names: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=object))


def helper_inputs(run: RunSummary) -> HelperRun:
    """The part of `run` process 1's analyses read (views of its arrays, no copies)."""
    base = straggler_inputs(run)
    inst, rows = run.collectives.instances, run.collective_rows
    base.collectives.instances = {k: inst[k] for k in INSTANCE_COLUMNS if k in inst}
    base.collective_rows.update({k: rows[k] for k in TABLE_ROW_COLUMNS if k in rows})
    return HelperRun(**vars(base), process_groups=list(run.process_groups), names=run.names)


@dataclass
class Helped:
    """Process 1's results: what :func:`helped` computes."""

    stragglers: Stragglers
    collectives: list[CommRow]


def helped(run: RunSummary | HelperRun, rule: StragglerRule | None = None) -> Helped:
    """The analyses process 1 runs, on the run summary or on what it is sent (the same results)."""
    return Helped(find_stragglers(run, rule=rule), comm_table(run))

#: Message tag of this exchange (the summaries' gather uses its own).
_TAG = 7302
#: The MPI process that runs the straggler analysis.
HELPER = 1


class Offload:
    """Context manager around summarising and reporting on every MPI process (``comm`` None: serial, a no-op).

    On rank 0: :meth:`offer` sends the run's inputs to process 1 and returns the function
    :func:`~.build.build_report` calls for the results; leaving the context releases process 1 if nothing was
    offered, and collects an unread result. On process 1: :meth:`serve` waits for one request and answers it. Other
    processes do nothing.
    """

    def __init__(self, comm: Any | None):
        self.comm = None
        if comm is not None and comm.Get_size() > HELPER:
            from mpi4py.util import pkl5  # numpy buffers travel out of band: no pickled copy of 100 MB

            self.comm = pkl5.Intracomm(comm)
        self.me = comm.Get_rank() if comm is not None else 0
        self._state = "idle"  # idle -> offered -> collected | released

    def __enter__(self) -> Offload:
        return self

    def __exit__(self, *exc) -> None:
        if self.comm is None or self.me != 0:
            return
        if self._state == "idle":
            self.comm.send(None, dest=HELPER, tag=_TAG)
            self._state = "released"
        elif self._state == "offered":  # the report failed before asking: the helper's answer is read all the same
            self._receive()

    def offer(self, run: RunSummary, rule: StragglerRule | None = None) -> Callable[[], Helped] | None:
        """On rank 0: hand the straggler analysis and the collectives table of `run` to process 1;
        the function that returns their results (None without a second process: the report computes them)."""
        if self.comm is None or self.me != 0:
            return None
        self.comm.send((helper_inputs(run), rule), dest=HELPER, tag=_TAG)
        self._state = "offered"

        def result() -> Helped:
            kind, payload = self._receive()
            if kind == "ok":
                return payload
            log.warning("MPI process %d could not run the straggler analysis and the collectives table (%s): "
                        "rank 0 runs them instead", HELPER, payload)
            return helped(run, rule)

        return result

    def _receive(self) -> tuple[str, Any]:
        self._state = "collected"
        return self.comm.recv(source=HELPER, tag=_TAG)

    def serve(self) -> None:
        """On process 1: wait for rank 0's request, run the analysis, send the result back (an error as a message:
        rank 0 then runs it itself). Returns at once on every other process, and when rank 0 released it."""
        if self.comm is None or self.me != HELPER:
            return
        request = self.comm.recv(source=0, tag=_TAG)
        if request is None:
            return
        inputs, rule = request
        try:
            answer: tuple[str, Any] = ("ok", helped(inputs, rule))
        except Exception as e:  # noqa: BLE001 -- rank 0 computes it instead, and says so
            answer = ("error", f"{type(e).__name__}: {e}")
        del inputs, request
        self.comm.send(answer, dest=0, tag=_TAG)
