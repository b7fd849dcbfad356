"""The typed report: every section a record (:mod:`distprof.record`), handed to the renderers whole.

    report = build_report(run)          # Report
    report.stragglers[0].rank           # attributes, not keys
    doc = report.to_json()              # what report.json holds (docs/report-format.md)
    same = Report.from_json(doc)        # and back

The sections' records live with the analyses that make them (``cross``, ``graph``, ``findings``, ``report.watch``);
this module holds the report itself and the sections only the report makes: the run, its clocks, the step table,
the point-to-point counts and the shards left out. A report built from a ``--watch`` series alone (no shard) has the
run, the watch section and the warnings; every other section is None (and left out of the JSON).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterator

import numpy as np

from ... import _version
from ...record import Record, RecordError, not_json, omit_if_none
from ..cross.annotations import Annotation
from ..cross.comm_table import CommRow
from ..cross.imbalance import Imbalance
from ..cross.memory_timeline import MemoryTimeline
from ..cross.mfu import MfuRow
from ..cross.overlap import OverlapRow
from ..cross.parallelism import Parallelism
from ..cross.pipeline import Pipeline
from ..cross.rootcause import RootCause
from ..cross.step_summary import StepSummary
from ..cross.stragglers import StragglerInfo, StragglerRank
from ..findings.finding import Finding
from ..graph.path_report import CriticalPathReport
from ..graph.whatif import WhatIf
from ..rank.breakdown import BREAKDOWN_COLUMNS
from ..rank.gpu_time import GpuTime
from .schema import REPORT_FORMAT, REPORT_VERSION
from .watch_section import WatchSection

__all__ = ["ClockRow", "P2PCounts", "Report", "RunInfo", "SkippedShardRow", "StepTable", "STEP_COLUMNS", "STEP_UNITS"]


@dataclass
class RunInfo(Record):
    """The report's ``run`` section: the ranks, hosts, devices and steps the run holds."""

    id: str
    world_size: int
    ranks_present: list[int] = field(default_factory=list)
    ranks_missing: list[int] = field(default_factory=list)
    hosts: dict[str, str] = field(default_factory=dict)  # "<rank>" -> host
    n_hosts: int = 0
    devices: list[str] = field(default_factory=list)
    backend: list[str] = field(default_factory=list)
    device_ranks: list[int] = field(default_factory=list)
    windows: list[int] = field(default_factory=list)
    first_step: int | None = None
    last_step: int | None = None
    n_steps: int = 0
    step_unit: str | None = omit_if_none()  # what a step is when not ProfilerStep# (imported traces without them)


#: What an imported trace's steps are when it has no ProfilerStep# (``importers.units``), in words.
STEP_UNITS = {"whole_trace": "the whole trace (no ProfilerStep# in it)",
              "user_region": "its top-level user regions (no ProfilerStep# in it)",
              "graph_replay": "its CUDA-graph replays (no ProfilerStep# in it)"}


@dataclass
class ClockRow(Record):
    """One host's clock alignment to the reference (``HostClock`` without its reference time)."""

    offset_ns: float
    drift_ppm: float
    residual_us: float | None
    residual_max_us: float | None
    method: str
    n_samples: int
    ranks: list[int] = field(default_factory=list)


@dataclass
class P2PCounts(Record):
    """The point-to-point pairs matched, and what was left unmatched (``P2PPairs``)."""

    n_pairs: int = 0
    n_sends: int = 0
    n_recvs: int = 0
    n_unmatched: int = 0
    n_edge: int = 0
    n_unknown_peer: int = 0


@dataclass
class SkippedShardRow(Record):
    """A shard left out of the run, and why (one line)."""

    path: str
    reason: str


#: The step table's columns: the breakdown's, and the step's overlap (%).
STEP_COLUMNS = tuple(BREAKDOWN_COLUMNS) + ("overlap_pct",)
_INT_COLUMNS = {"rank": np.int32, "window": np.int32, "step": np.int32, "start_ns": np.int64, "end_ns": np.int64,
                "flops": np.int64, "peak_mem_bytes": np.int64}
STEP_DTYPE = np.dtype([(c, _INT_COLUMNS.get(c, np.float64)) for c in STEP_COLUMNS])


class StepTable:
    """One row per rank-step (a numpy record array of ``STEP_COLUMNS``; float columns NaN where unknown), in the
    order of ``RunSummary.steps``. Its JSON form is a list of one object per row (NaN as null)."""

    def __init__(self, rows: np.ndarray | None = None):
        self.rows = np.zeros(0, STEP_DTYPE) if rows is None else np.asarray(rows, STEP_DTYPE)

    @classmethod
    def from_columns(cls, columns: dict[str, np.ndarray]) -> StepTable:
        n = len(columns["step"])
        rows = np.zeros(n, STEP_DTYPE)
        for c in STEP_COLUMNS:
            rows[c] = columns[c]
        return cls(rows)

    def __len__(self) -> int:
        return int(self.rows.size)

    def __getitem__(self, column: str) -> np.ndarray:
        return self.rows[column]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, StepTable) and self.to_json() == other.to_json()

    def __iter__(self) -> Iterator[np.void]:
        return iter(self.rows)

    def to_json(self) -> list[dict[str, Any]]:
        return [row for part in self.json_parts(max(self.rows.size, 1)) for row in part]

    def json_parts(self, rows: int) -> Iterator[list[dict[str, Any]]]:
        """The JSON form `rows` rows at a time: a writer never holds every row's object at once (at 16k ranks the
        whole list was 10× the text it makes)."""
        for lo in range(0, self.rows.size, rows):
            part = self.rows[lo:lo + rows]
            cols = {c: part[c].tolist() for c in STEP_COLUMNS}
            yield [{c: (None if isinstance(v[i], float) and not math.isfinite(v[i]) else v[i])
                    for c, v in cols.items()} for i in range(part.size)]

    @classmethod
    def from_json(cls, doc: Any, where: str = "steps") -> StepTable:
        if not isinstance(doc, list):
            raise RecordError(f"{where}: expected a list, got {type(doc).__name__}")
        rows = np.zeros(len(doc), STEP_DTYPE)
        for i, rec in enumerate(doc):
            if not isinstance(rec, dict):
                raise RecordError(f"{where}[{i}]: expected an object, got {type(rec).__name__}")
            for c in STEP_COLUMNS:
                v = rec.get(c)
                if v is None and c in _INT_COLUMNS:
                    raise RecordError(f"{where}[{i}]: missing key {c!r}")
                rows[i][c] = np.nan if v is None else v
        return cls(rows)


@dataclass(kw_only=True)
class Report(Record):
    """Everything the analyses found in one run (docs/report-format.md); what every renderer takes."""

    format: str = REPORT_FORMAT
    report_version: str = REPORT_VERSION
    distprof_version: str = _version.__version__
    verdict: str
    findings: list[Finding]
    run: RunInfo
    clock: dict[str, ClockRow] | None = omit_if_none()  # host -> its alignment
    summary: StepSummary | None = omit_if_none()
    steps: StepTable | None = omit_if_none()
    stragglers: list[StragglerRank] | None = omit_if_none()
    straggler_info: StragglerInfo | None = omit_if_none()
    root_cause: list[RootCause] | None = omit_if_none()
    parallelism: Parallelism | None = omit_if_none()
    collectives: list[CommRow] | None = omit_if_none()
    pipelines: list[Pipeline] | None = omit_if_none()
    p2p: P2PCounts | None = omit_if_none()
    overlap: list[OverlapRow] | None = omit_if_none()
    critical_path: CriticalPathReport | None = omit_if_none()
    whatif: list[WhatIf] | None = omit_if_none()
    imbalance: Imbalance | None = omit_if_none()
    mfu: list[MfuRow] | None = omit_if_none()
    gpu_time: list[GpuTime] | None = omit_if_none()
    annotations: list[Annotation] | None = omit_if_none()
    warnings: list[str] = field(default_factory=list)
    skipped_shards: list[SkippedShardRow] | None = omit_if_none()
    mfu_note: str | None = omit_if_none()  # why there is no MFU (no known device peak)
    watch: WatchSection | None = omit_if_none()  # a --watch run's whole series
    memory: MemoryTimeline | None = not_json(default=None)  # for the HTML report only: not in report.json

    @property
    def has_analyses(self) -> bool:
        """False for a report of a --watch series alone (no shard was recorded)."""
        return self.summary is not None
