"""The unit of analysis of a trace without ``ProfilerStep#N`` spans: what becomes its steps.

``torch.profiler.profile()`` used without a schedule (the tutorial's first examples) and serving engines (SGLang, vLLM)
write traces without ``ProfilerStep#N``. Every per-step analysis needs steps, so the importer makes them, as ordinary
rows of the shard's steps table (numbered 0..n-1), and records which unit it used in the shard attribute
``step_unit``:

* ``profiler_step`` — the trace has ``ProfilerStep#N`` spans on a CPU thread: they are the steps (nothing is made;
  a trace without any event is left without steps, under this name too).
* ``user_region`` — two or more *top-level* user regions (``record_function`` / ``user_annotation`` spans of some
  length, inside no other one) on one CPU thread: each region is a step, from its start to its end.
* ``graph_replay`` — else, two or more CUDA/HIP graph replays (``cudaGraphLaunch``, ``cuGraphLaunch``,
  ``hipGraphLaunch``) on one CPU thread: each replay is a step, from its launch to the next replay's launch (the last
  one to the end of the trace); what ran before the first replay is in no step.
* ``whole_trace`` — else the whole trace is one step (step 0), from its first event's start to its last event's end:
  the unit Holistic Trace Analysis uses for such a trace.

The thread holding the regions or replays is the trace's stepping (main) thread. Device events keep taking the step
of their launch (:mod:`distprof.events.tables`), so a kernel belongs to the region or replay that launched it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from ..events.tables import Columns, Strings
from ..storage import schema

__all__ = ["StepUnits", "step_units", "PROFILER_STEP", "WHOLE_TRACE", "USER_REGION", "GRAPH_REPLAY", "UNITS"]

PROFILER_STEP, USER_REGION, GRAPH_REPLAY, WHOLE_TRACE = "profiler_step", "user_region", "graph_replay", "whole_trace"
#: Every value of the shard attribute ``step_unit``.
UNITS = (PROFILER_STEP, USER_REGION, GRAPH_REPLAY, WHOLE_TRACE)
#: Runtime and driver calls that replay a captured CUDA/HIP graph.
GRAPH_LAUNCH_RE = re.compile(r"^(?:cuda|cu|hip)GraphLaunch(?:_|$)")
_K_ANNOT = schema.KIND_CODE["user_annotation"]
_K_LAUNCH = (schema.KIND_CODE["cuda_runtime"], schema.KIND_CODE["cuda_driver"])
_MIN_UNITS = 2  # fewer regions or replays than this: the whole trace is the unit


@dataclass(frozen=True)
class StepUnits:
    """The steps made for a trace without ProfilerStep spans: ids 0..n-1, starts and ends (ns, sorted by start), the
    unit, the thread they are on (None: the whole trace) and a one-line note for the import's warnings."""

    unit: str
    ids: np.ndarray
    starts: np.ndarray
    ends: np.ndarray
    tid: int | None
    note: str

    @property
    def spans(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return self.ids, self.starts, self.ends


def _top_level(ts: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Indices (into ts) of the spans inside no other span of the list: sorted by start, the longer first on a tie, a
    span is top-level when it starts at or after the furthest end reached before it."""
    o = np.lexsort((-end, ts))
    reach = np.maximum.accumulate(end[o])
    before = np.r_[np.iinfo(np.int64).min, reach[:-1]]
    return np.sort(o[ts[o] >= before])


def _busiest(tids: np.ndarray, prefer: int | None) -> int:
    """The tid that occurs most often in `tids` (`prefer` on a tie)."""
    vals, counts = np.unique(tids, return_counts=True)
    best = vals[counts == counts.max()]
    return int(prefer) if prefer is not None and prefer in best else int(best[0])


def _regions(cols: Columns, names: list[str], main_tid: int | None) -> tuple[int, np.ndarray] | None:
    """(thread, rows) of the top-level user regions of the thread that has most of them, when it has at least two."""
    rows = np.flatnonzero((np.asarray(cols.kind) == _K_ANNOT) & (np.asarray(cols.device) < 0)
                          & (np.asarray(cols.dur) > 0))
    if len(rows) < _MIN_UNITS:
        return None
    not_step = np.array([not s.startswith("ProfilerStep#") for s in names], bool)
    rows = rows[not_step[np.asarray(cols.name_id)[rows]]]
    tops = []
    for t in np.unique(cols.tid[rows]).tolist():
        mine = rows[cols.tid[rows] == t]
        tops.append(mine[_top_level(cols.ts[mine], cols.ts[mine] + cols.dur[mine])])
    if not tops:
        return None
    n = max(len(x) for x in tops)
    best = [x for x in tops if len(x) == n]
    pick = next((x for x in best if int(cols.tid[x[0]]) == main_tid), best[0])
    return (int(cols.tid[pick[0]]), pick) if n >= _MIN_UNITS else None


def _replays(cols: Columns, names: list[str], main_tid: int | None) -> tuple[int, np.ndarray] | None:
    """(thread, rows) of the graph launches of the thread that made most of them, when it made at least two."""
    is_launch = np.array([bool(GRAPH_LAUNCH_RE.match(s)) for s in names], bool)
    if not is_launch.any():
        return None
    rows = np.flatnonzero(np.isin(cols.kind, _K_LAUNCH) & (np.asarray(cols.device) < 0)
                          & is_launch[np.asarray(cols.name_id)])
    if len(rows) < _MIN_UNITS:
        return None
    t = _busiest(cols.tid[rows], main_tid)
    rows = rows[cols.tid[rows] == t]
    rows = rows[np.r_[True, np.diff(cols.ts[rows]) > 0]]  # one replay per start time (steps of no length are none)
    return (t, rows) if len(rows) >= _MIN_UNITS else None


def _trace_span(cols: Columns) -> tuple[int, int]:
    """First start and last end of the trace's events; the end is past every start (a step holds an event whose
    start is before its end)."""
    ts = np.asarray(cols.ts, np.int64)
    end = int((ts + np.asarray(cols.dur, np.int64)).max())
    return int(ts.min()), max(end, int(ts.max()) + 1)


def _shown(name: str) -> str:
    return name if len(name) <= 40 else name[:39] + "…"


def step_units(cols: Columns, strings: Strings, *, has_profiler_steps: bool, main_tid: int | None,
               path: object = "") -> StepUnits | None:
    """The steps to make for a trace without ProfilerStep spans (see the module docstring); None when the trace has
    them (`has_profiler_steps`) or holds no event. `cols` are sorted by ts; `path` names the file in the note."""
    if has_profiler_steps or len(cols.ts) == 0:
        return None
    names = strings.list()
    pre = f"{path}: no ProfilerStep# in the trace"
    found = _regions(cols, names, main_tid)
    if found is not None:
        tid, rows = found
        starts = cols.ts[rows].astype(np.int64)
        ends = starts + cols.dur[rows].astype(np.int64)
        first = _shown(names[int(cols.name_id[rows[0]])])
        note = (f"{pre}: its {len(rows)} top-level user regions on thread {tid} (first: '{first}') are the steps "
                f"0..{len(rows) - 1}")
        return StepUnits(USER_REGION, np.arange(len(rows), dtype=np.int32), starts, ends, tid, note)
    found = _replays(cols, names, main_tid)
    if found is not None:
        tid, rows = found
        starts = cols.ts[rows].astype(np.int64)
        ends = np.r_[starts[1:], _trace_span(cols)[1]].astype(np.int64)
        launch = names[int(cols.name_id[rows[0]])]
        note = (f"{pre}: its {len(rows)} graph replays ({launch} on thread {tid}) are the steps 0..{len(rows) - 1}, "
                "each from its launch to the next one's (the work before the first replay is in no step)")
        return StepUnits(GRAPH_REPLAY, np.arange(len(rows), dtype=np.int32), starts, ends, tid, note)
    lo, hi = _trace_span(cols)
    note = f"{pre}: the whole trace ({(hi - lo) / 1e6:.1f} ms) is analysed as one step (step 0)"
    return StepUnits(WHOLE_TRACE, np.zeros(1, np.int32), np.array([lo], np.int64), np.array([hi], np.int64), None,
                     note)
