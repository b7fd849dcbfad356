"""The cross-rank phase under MPI: the straggler analysis runs on MPI process 1 while rank 0 builds the rest.

Once the run is summarised (``analysis/summarize``), MPI rank 0 holds the run summary and the other processes are
idle. The straggler analysis is the largest part of :func:`~.build.build_report` that the step graph, the critical
path, the pipelines and the collectives table do not read (at 1,024 LLM-shaped ranks 3.3 s of 5.6, most of it its
1.39 M instance rows), so rank 0 sends what it reads (:func:`..cross.stragglers.inputs.straggler_inputs`, ≈ 100 MB
of numpy columns, sent as out-of-band buffers) to process 1, builds those meanwhile, and takes the result where the
findings first need it. The result is the same object a serial run computes (the MPI tests compare the reports).

The exchange never leaves a process waiting: rank 0 always sends process 1 either the inputs or a release (also
when summarising or reporting fails), and always receives what it asked for (also when the report then fails).
When process 1 fails, rank 0 logs one warning and computes the analysis itself.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from ..cross.stragglers import find_stragglers
from ..cross.stragglers.inputs import straggler_inputs

if TYPE_CHECKING:
    from collections.abc import Callable

    from ..cross.stragglers import StragglerRule, Stragglers
    from ..types import RunSummary

log = logging.getLogger(__name__)

__all__ = ["StragglerOffload"]

#: Message tag of this exchange (the summaries' gather uses its own).
_TAG = 7302
#: The MPI process that runs the straggler analysis.
HELPER = 1


class StragglerOffload:
    """Context manager around summarising and reporting on every MPI process (``comm`` None: serial, a no-op).

    On rank 0: :meth:`offer` sends the run's straggler inputs to process 1 and returns the function
    :func:`~.build.build_report` calls for the result; leaving the context releases process 1 if nothing was
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

    def __enter__(self) -> StragglerOffload:
        return self

    def __exit__(self, *exc) -> None:
        if self.comm is None or self.me != 0:
            return
        if self._state == "idle":
            self.comm.send(None, dest=HELPER, tag=_TAG)
            self._state = "released"
        elif self._state == "offered":  # the report failed before asking: the helper's answer is read all the same
            self._receive()

    def offer(self, run: RunSummary, rule: StragglerRule | None = None) -> Callable[[], Stragglers] | None:
        """On rank 0: hand the straggler analysis of `run` to process 1; the function that returns its result (None
        without a second process: the report computes it)."""
        if self.comm is None or self.me != 0:
            return None
        self.comm.send((straggler_inputs(run), rule), dest=HELPER, tag=_TAG)
        self._state = "offered"

        def result() -> Stragglers:
            kind, payload = self._receive()
            if kind == "ok":
                return payload
            log.warning("MPI process %d could not run the straggler analysis (%s): rank 0 runs it instead",
                        HELPER, payload)
            return find_stragglers(run, rule=rule)

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
            answer: tuple[str, Any] = ("ok", find_stragglers(inputs, rule=rule))
        except Exception as e:  # noqa: BLE001 -- rank 0 computes it instead, and says so
            answer = ("error", f"{type(e).__name__}: {e}")
        del inputs, request
        self.comm.send(answer, dest=0, tag=_TAG)
