"""The report's ``critical_path`` section: the critical path of every step (:mod:`.critical_path`) summed up — its
length, the ranks and collectives it runs through most, one line per step, and one step's path in full.

    cp = critical_path_report(run)          # CriticalPathReport; cp.ranks[0].rank is the rank on it most
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from ...record import Record, omit_if_none
from .critical_path import CriticalPaths, PathSegment, StepGraph, critical_paths, replay, step_graph

if TYPE_CHECKING:
    from ..types import RunSummary

__all__ = ["CriticalPathReport", "PathComm", "PathRank", "PathStep", "PathStepRank", "PathView",
           "critical_path_report", "path_of", "TOP_RANKS"]

#: Ranks listed per critical-path summary (the report stays small at 1,024 ranks; the rest are counted).
TOP_RANKS = 8


@dataclass
class PathRank(Record):
    """A rank's work on the critical path, the mean per step."""

    rank: int
    ms_per_step: float
    share_pct: float | None  # of the path's mean length
    steps_on_path: int


@dataclass
class PathComm(Record):
    """A collective's (or the point-to-point pairs') transfer time on the critical path, the mean per step."""

    pg: int  # -1 for point-to-point pairs
    op: str  # "p2p" for pairs
    ms_per_step: float
    share_pct: float | None


@dataclass
class PathStepRank(Record):
    rank: int
    ms: float


@dataclass
class PathStep(Record):
    """One step's critical path: its length, its transfers, where it ends, the (up to 3) ranks it runs through most."""

    step: int
    length_ms: float
    transfer_ms: float
    end_rank: int
    ranks: list[PathStepRank] = field(default_factory=list)


@dataclass
class PathView(Record):
    """One step's path (the step of median length), segment by segment in time order."""

    step: int | None
    segments: list[PathSegment] = field(default_factory=list)


@dataclass
class CriticalPathReport(Record):
    """The ``critical_path`` section (docs/report-format.md); a run without steps has only the first keys."""

    n_steps: int
    length_ms_median: float | None
    length_ms_mean: float | None = omit_if_none()
    transfer_ms_per_step: float | None = omit_if_none()
    n_ranks_on_path: int | None = omit_if_none()
    ranks: list[PathRank] = field(default_factory=list)
    comm: list[PathComm] = field(default_factory=list)
    per_step: list[PathStep] = field(default_factory=list)
    view: PathView | None = None
    converged: bool = True
    passes: int | None = omit_if_none()


def critical_path_report(run: RunSummary, *, graph: StepGraph | None = None) -> CriticalPathReport:
    """The report's ``critical_path`` section (docs/report-format.md)."""
    return path_of(graph if graph is not None else step_graph(run))


def path_of(g: StepGraph) -> CriticalPathReport:
    """The ``critical_path`` section of the step graph `g`: it reads nothing else of the run (so another MPI
    process, sent the graph, makes the same section: analysis/report/parallel.py)."""
    rp = replay(g)
    cp = critical_paths(g, rp)
    if cp.steps.size == 0:
        return CriticalPathReport(n_steps=0, length_ms_median=None, converged=rp.converged)
    mean_len = float(cp.length_ms.mean())
    return CriticalPathReport(
        n_steps=int(cp.steps.size), length_ms_median=float(np.median(cp.length_ms)), length_ms_mean=mean_len,
        transfer_ms_per_step=float(cp.transfer_ms.mean()),
        n_ranks_on_path=int(np.count_nonzero(cp.work_ms.mean(axis=0) > 0)), ranks=_ranks(cp, mean_len),
        comm=_comm(cp, mean_len), per_step=_per_step(cp), view=PathView(cp.segments_step, cp.segments),
        converged=rp.converged, passes=rp.passes)


def _share(ms: float, of: float) -> float | None:
    return 100.0 * ms / of if of > 0 else None


def _ranks(cp: CriticalPaths, mean_len: float) -> list[PathRank]:
    """The TOP_RANKS ranks the path runs through most, per step on average."""
    per_rank = cp.work_ms.mean(axis=0)
    order = np.argsort(-per_rank, kind="stable")
    return [PathRank(int(cp.ranks[i]), float(per_rank[i]), _share(float(per_rank[i]), mean_len),
                     int(np.count_nonzero(cp.work_ms[:, i] > 0)))
            for i in order[:TOP_RANKS] if per_rank[i] > 0]


def _comm(cp: CriticalPaths, mean_len: float) -> list[PathComm]:
    rows = [PathComm(k[0], k[1], float(v.mean()), _share(float(v.mean()), mean_len)) for k, v in cp.comm.items()]
    return sorted(rows, key=lambda c: -c.ms_per_step)


def _per_step(cp: CriticalPaths) -> list[PathStep]:
    out = []
    for j in range(cp.steps.size):
        top = np.argsort(-cp.work_ms[j], kind="stable")[:3]
        out.append(PathStep(int(cp.steps[j]), float(cp.length_ms[j]), float(cp.transfer_ms[j]), int(cp.end_rank[j]),
                            [PathStepRank(int(cp.ranks[i]), float(cp.work_ms[j, i])) for i in top
                             if cp.work_ms[j, i] > 0]))
    return out
