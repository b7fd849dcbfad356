"""The cross-rank phase under MPI: the straggler analysis, the collectives table, the critical path and some
what-if estimates run on MPI process 1 while rank 0 builds the rest; the pipelines go to whichever of the two is
free first.

Once the run is summarised (``analysis/summarize``), MPI rank 0 holds the run summary and the other processes are
idle. The straggler analysis is the largest part of :func:`~.build.build_report` that the step graph, the critical
path and the what-ifs do not read (at 1,024 LLM-shaped ranks 0.9–1.0 s, most of it sorts of its 1.39 M instance
rows); the collectives table (0.09 s there) reads the same rows and is read by neither either. Rank 0 sends what
they and the pipelines read (:func:`helper_inputs`: ≈ 150 MB of numpy columns, sent as out-of-band buffers) to
process 1, builds the step graph and the what-if estimates meanwhile, and takes the results where the findings
first need them. The critical path reads the step graph alone (``graph.path_report.path_of``): rank 0 sends process 1
the graph as soon as it is built (≈ 100 MB of numpy columns, out of band, without waiting for process 1 to take it),
and process 1 replays it once its own analyses are done — at 1,024 LLM-shaped ranks 0.5–0.9 s that rank 0's share,
the longer of the two, no longer holds. Rank 0 then sends the measured chained replay of its what-if estimator
(``graph.whatif.Estimator.replayed``) with the what-ifs that read the graph alone (communication overlapped, the
heaviest collective faster: ``reads_graph_only``); process 1 estimates those while rank 0 estimates the others, and
rank 0's estimator takes their gains (≈ 0.15 s a what-if there). The results are the objects a serial run
computes (the MPI tests compare the reports).

The pipelines (0.09 s there) read neither the graph nor the straggler rows, so either process can build them,
and which one finishes its own share first depends on the run's shape. Whichever is first builds them: rank 0,
done with its share, tells process 1 so (*free*); process 1, done with its share, builds them unless rank 0's
*free* has arrived, and tells rank 0 which it chose (*claim*). Rank 0 builds them unless process 1's claim has
arrived and says it does: the two never both skip them, and at worst (the messages cross) both build them and rank
0 keeps its own.

The exchange never leaves a process waiting: rank 0 always sends process 1 either the inputs or a release (also
when summarising or reporting fails); after an offer each side sends the other its one *free* or *claim*, rank 0
always sends the graph and the replay, or None in their place (when it fails before they are made), and rank 0
always receives the answer (also when the report then fails). When process 1 fails at any part, rank 0 logs one
warning and computes what it lacks itself.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ..cross.comm_table import CommRow, comm_table
from ..cross.pipeline import Pipeline, pipelines
from ..cross.stragglers import Stragglers, find_stragglers
from ..cross.stragglers.inputs import StragglerInputs, straggler_inputs
from ..graph.path_report import CriticalPathReport, path_of
from ..graph.whatif import Change, Estimator, Replayed

if TYPE_CHECKING:
    from ..align.p2p import P2PPairs
    from ..graph.critical_path import StepGraph
    from ..cross.stragglers import StragglerRule
    from ..types import RunSummary

log = logging.getLogger(__name__)

__all__ = ["Handover", "HelperRun", "Helped", "Offload", "helped", "helper_inputs"]

#: Columns of the matched instances and of the collective rows that the collectives table reads (comm_table.py).
INSTANCE_COLUMNS = ("inst", "pg", "op_id", "n_ranks", "last_rank", "skew_ns")
TABLE_ROW_COLUMNS = ("rank", "step", "pg", "op_id", "start_ns", "end_ns", "exposed_ns", "bytes")


@dataclass
class HelperRun(StragglerInputs):
    """What process 1 reads, by the RunSummary's field names: the straggler analysis's inputs, with the matched
    instances, the collective-row columns, the groups and the names the collectives table reads, and the
    point-to-point pairs the pipelines read."""

    p2p: P2PPairs | None = None
    process_groups: list[dict[str, Any]] = field(default_factory=list)
    names: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=object))


def helper_inputs(run: RunSummary) -> HelperRun:
    """The part of `run` process 1's analyses read (views of its arrays, no copies)."""
    base = straggler_inputs(run)
    inst, rows = run.collectives.instances, run.collective_rows
    base.collectives.instances = {k: inst[k] for k in INSTANCE_COLUMNS if k in inst}
    base.collective_rows.update({k: rows[k] for k in TABLE_ROW_COLUMNS if k in rows})
    return HelperRun(**vars(base), p2p=run.p2p, process_groups=list(run.process_groups), names=run.names)


@dataclass
class Helped:
    """Process 1's results: the straggler analysis, the collectives table, the critical path of the graph rank 0
    sent, and — when it built them — the pipelines."""

    stragglers: Stragglers
    collectives: list[CommRow]
    pipelines: list[Pipeline] | None = None
    pipelines_error: str | None = None  # process 1 claimed the pipelines and could not build them
    critical_path: CriticalPathReport | None = None  # None: no graph came, or (with the error) it failed
    critical_path_error: str | None = None
    gains: list[np.ndarray] | None = None  # of the what-ifs rank 0 sent, in its order (None: none came, or failed)
    gains_error: str | None = None


def helped(run: RunSummary | HelperRun, rule: StragglerRule | None = None) -> Helped:
    """The analyses process 1 always runs, on the run summary or on what it is sent (the same results)."""
    return Helped(find_stragglers(run, rule=rule), comm_table(run))


#: Message tags of this exchange (the summaries' gather uses its own): the request and the answer; rank 0's "my
#: share is done"; process 1's "I build the pipelines" (or not); the step graph (or None); the measured replay with
#: the what-ifs to estimate (or None).
_TAG, _FREE, _CLAIM, _GRAPH, _REPLAY = 7302, 7303, 7304, 7305, 7306
#: The MPI process that runs the straggler analysis.
HELPER = 1


class Offload:
    """Context manager around summarising and reporting on every MPI process (``comm`` None: serial, a no-op).

    On rank 0: :meth:`offer` sends the run's inputs to process 1 and returns the :class:`Handover` that
    :func:`~.build.build_report` asks for the results; leaving the context releases process 1 if nothing was
    offered, and completes an unfinished hand-over. On process 1: :meth:`serve` waits for one request and answers
    it. Other processes do nothing.
    """

    def __init__(self, comm: Any | None):
        self.comm = self.raw = None
        if comm is not None and comm.Get_size() > HELPER:
            from mpi4py.util import pkl5  # numpy buffers travel out of band: no pickled copy of 100 MB

            self.comm, self.raw = pkl5.Intracomm(comm), comm  # raw: the one-word free and claim messages
        self.me = comm.Get_rank() if comm is not None else 0
        self._handover: Handover | None = None
        self._released = False

    def __enter__(self) -> Offload:
        return self

    def __exit__(self, *exc) -> None:
        if self.comm is None or self.me != 0:
            return
        if self._handover is not None:
            self._handover.finish()  # the report failed before it took everything: the exchange still completes
        elif not self._released:
            self.comm.send(None, dest=HELPER, tag=_TAG)
            self._released = True

    def offer(self, run: RunSummary, rule: StragglerRule | None = None) -> Handover | None:
        """On rank 0: hand the straggler analysis and the collectives table of `run` (and perhaps the pipelines) to
        process 1; the :class:`Handover` (None without a second process: the report computes them)."""
        if self.comm is None or self.me != 0:
            return None
        # not waited for: process 1 copies the columns while rank 0 builds the step graph (which, like every reader of
        # the run, never writes into them); the hand-over completes the send
        sent = self.comm.isend((helper_inputs(run), rule), dest=HELPER, tag=_TAG)
        self._handover = Handover(self, run, rule, sent)
        return self._handover

    def serve(self) -> None:
        """On process 1: wait for rank 0's request, run the analyses, find the critical path of the graph rank 0
        sends and estimate the what-ifs it sends, build the pipelines if rank 0 is not yet free, and send the
        results back (an error as a message: rank 0 then runs them itself). Returns at once on every other process,
        and when rank 0 released it."""
        if self.comm is None or self.me != HELPER:
            return
        request = self.comm.recv(source=0, tag=_TAG)
        if request is None:
            return
        inputs, rule = request
        # posted now, tested below: it sees rank 0's free if it has come (a bare iprobe can miss it on its first poll)
        free = self.raw.irecv(source=0, tag=_FREE)
        try:
            got: Helped | None = helped(inputs, rule)
            answer: tuple[str, Any] = ("ok", got)
        except Exception as e:  # noqa: BLE001 -- rank 0 computes it instead, and says so
            got, answer = None, ("error", f"{type(e).__name__}: {e}")
        # rank 0 sends the graph and then the replay (each None where it has none) before it waits for anything
        # from here, and its free after them: taken in that order, as a test of a request makes only some progress
        # through the messages before it
        graph = self.comm.recv(source=0, tag=_GRAPH)
        if graph is not None and got is not None:
            try:
                got.critical_path = path_of(graph)
            except Exception as e:  # noqa: BLE001 -- rank 0 replays it instead, and says so
                got.critical_path_error = f"{type(e).__name__}: {e}"
        replays = self.comm.recv(source=0, tag=_REPLAY)
        if replays is not None and graph is not None and got is not None:
            replayed, changes = replays
            try:
                got.gains = Estimator(None, graph, replayed=replayed).gains(changes)
            except Exception as e:  # noqa: BLE001 -- rank 0 estimates them instead, and says so
                got.gains_error = f"{type(e).__name__}: {e}"
        del graph, replays
        rank_0_free, _ = _arrived(free)
        take = got is not None and not rank_0_free  # rank 0 still busy with its share: build them here
        # sent at once (a one-word message: buffered, and rank 0's receive is posted): an isend can sit here unsent
        # while the pipelines are built, and rank 0, free meanwhile, would build them too
        self.raw.send(take, dest=0, tag=_CLAIM)
        if take:
            try:
                got.pipelines = pipelines(inputs)
            except Exception as e:  # noqa: BLE001 -- rank 0 builds them instead, and says so
                got.pipelines_error = f"{type(e).__name__}: {e}"
        del inputs, request
        self.comm.send(answer, dest=0, tag=_TAG)
        if not rank_0_free:
            free.wait()


#: Tests of a pending receive before it counts as not arrived. Each test makes only some progress through the
#: packets that came before the message (MPICH here: a one-word message sent 0.2 s earlier behind the graph's and the
#: replay's large transfers took 27 tests, and one test after a 3 s wait missed one); a test costs ≈ 1 µs, so this
#: is ≈ 10 ms at most, against ≈ 0.15 s for building the pipelines twice when it is missed (the report is the same).
POLLS = 10_000


def _arrived(req: Any) -> tuple[bool, Any]:
    """Whether the message of the posted receive `req` has arrived (up to POLLS tests; never blocks), and the
    message."""
    for _ in range(POLLS):
        done, msg = req.test()
        if done:
            return True, msg
    return False, None


class Handover:
    """Rank 0's side of one offer: :meth:`send_graph` once the step graph is built, :meth:`send_replays` once its
    estimator has replayed it, :meth:`builds_pipelines` when its own share is done, then :meth:`result`."""

    def __init__(self, offload: Offload, run: RunSummary, rule: StragglerRule | None, sent: Any):
        self._o, self._run, self._rule, self._sent = offload, run, rule, sent  # sent: the inputs' pending send
        self._free_sent = False  # rank 0's "free"
        self._claim_req = offload.raw.irecv(source=HELPER, tag=_CLAIM)  # posted now, as in Offload.serve
        self._claim: bool | None = None  # process 1's claim, once received
        self._mine = False  # rank 0 builds the pipelines
        self._answer: tuple | None = None
        self._graph = None  # the pending send of the step graph (or of None)
        self._replays = None  # the pending send of the measured replay and the what-ifs (or of None)

    def send_graph(self, graph: StepGraph | None) -> None:
        """Hand process 1 the step graph for the critical path (None: rank 0 replays it itself). Not waited for:
        process 1 takes it when its own analyses are done. Rank 0 must not change the graph's arrays meanwhile
        (nothing does: the analyses that read it only add cached orders)."""
        if self._graph is None:
            self._graph = self._o.comm.isend(graph, dest=HELPER, tag=_GRAPH)

    def send_replays(self, replayed: Replayed | None, changes: list[Change]) -> None:
        """Hand process 1 the estimator's measured replay of the graph sent and the what-ifs it estimates
        (``whatif.reads_graph_only``); their gains come back in :meth:`result` (``Helped.gains``). None: rank 0
        estimates everything itself."""
        if self._replays is None:
            payload = (replayed, list(changes)) if replayed is not None and changes else None
            self._replays = self._o.comm.isend(payload, dest=HELPER, tag=_REPLAY)

    def builds_pipelines(self) -> bool:
        """Rank 0's share is done: tell process 1, and whether rank 0 builds the pipelines (unless process 1 has
        already said it does)."""
        self._send_free()
        if self._claim is None:
            done, claim = _arrived(self._claim_req)
            if done:
                self._claim = bool(claim)
        self._mine = not self._claim
        return self._mine

    def result(self) -> Helped:
        """Process 1's results, with the pipelines wherever rank 0 does not build them itself (computed here what
        process 1 failed to)."""
        answer = self.finish()
        if answer[0] == "ok":
            got = answer[1]
            if got.pipelines_error is not None and not self._mine:
                log.warning("MPI process %d could not build the pipelines (%s): rank 0 builds them", HELPER,
                            got.pipelines_error)
                got.pipelines = pipelines(self._run)
            if got.critical_path_error is not None:  # the report replays the graph itself (got.critical_path None)
                log.warning("MPI process %d could not find the critical path (%s): rank 0 finds it", HELPER,
                            got.critical_path_error)
            if got.gains_error is not None:  # the report's estimator replays them itself (got.gains None)
                log.warning("MPI process %d could not estimate its what-ifs (%s): rank 0 estimates them", HELPER,
                            got.gains_error)
            return got
        log.warning("MPI process %d could not run the straggler analysis and the collectives table (%s): "
                    "rank 0 runs them instead", HELPER, answer[1])
        return helped(self._run, self._rule)

    def finish(self) -> tuple:
        """Complete the exchange (rank 0's free sent, process 1's claim and answer received); the answer."""
        self._send_free()
        self.send_graph(None)  # when none was sent (the report failed before its graph): process 1 waits for it
        self.send_replays(None, [])  # likewise
        if self._claim is None:
            self._claim = bool(self._claim_req.wait())
        if self._answer is None:
            self._answer = self._o.comm.recv(source=HELPER, tag=_TAG)
            self._sent.wait()
            self._graph.wait()
            self._replays.wait()
        return self._answer

    def _send_free(self) -> None:
        """Sent at once (as process 1's claim: an isend could sit unsent while rank 0 builds the pipelines)."""
        if not self._free_sent:
            self._o.raw.send(True, dest=HELPER, tag=_FREE)
            self._free_sent = True
