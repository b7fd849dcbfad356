"""Collectives per process group and op: how many, how big, how long, how much of it the ranks waited, who was late.

One row per (group kind, op). A **group kind** is what a job's many groups of one mesh dimension share: the
groups' description (``mesh_tp`` for every tensor-parallel group of a DeviceMesh, ``default_pg``), else each group by
its name. Per row, over the ranks and the recorded steps (inside the steps selection; collectives outside every
step left out):

* ``calls_per_step``, ``bytes_per_step`` (known sizes only), ``ms_per_step`` (exec durations), ``exposed_ms_per_step``
  (the part of them the rank spent waiting and doing nothing else: ``summary._exposed_in``) — means per rank and
  step;
* ``slowest_rank`` — the rank that entered the row's matched instances last most often, ``slowest_share`` that
  share, and ``median_skew_ms`` — the median spread of arrivals per instance.

Rows are sorted by exposed time, then time. Pure: reads ``RunSummary.collective_rows`` and ``collectives``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ...record import Record
from ..groupstats import unique_inverse
from ..narrow import narrow

if TYPE_CHECKING:
    from collections.abc import Callable

    from ..types import RunSummary

__all__ = ["CommRow", "comm_table", "group_kind"]

NS_PER_MS = 1e6


@dataclass
class CommRow(Record):
    """One (group kind, op): see the module docstring."""

    group: str  # the group kind (see the module docstring)
    n_groups: int
    group_size: int  # ranks per group (the largest)
    op: str
    n_ranks: int
    calls_per_step: float
    bytes_per_step: float | None
    ms_per_step: float
    exposed_ms_per_step: float
    slowest_rank: int | None
    slowest_share: float | None
    median_skew_ms: float | None


def group_kind(g: dict[str, Any]) -> str:
    desc = str(g.get("desc") or "")
    return desc if desc and desc not in ("undefined", "None") else f"group {g.get('name', g.get('index'))}"


def comm_table(run: RunSummary) -> list[CommRow]:
    rows = run.collective_rows
    if not rows["rank"].size:
        return []
    step = np.asarray(rows["step"], np.int64)
    keep = step >= 0
    if run.steps_selection is not None:
        lo, hi = run.steps_selection
        keep &= (step >= lo) & (step <= hi)
    if not keep.any():
        return []
    groups = {int(g["index"]): g for g in run.process_groups}
    kind_of = {i: group_kind(g) for i, g in groups.items()}
    # ids as the rows hold them (int32, uint32: compared only, no int64 copies of 1.4 M rows at 1,024 LLM-shaped ranks)
    pg, op, rank = (np.asarray(rows[k])[keep] for k in ("pg", "op_id", "rank"))
    dur = np.asarray(rows["end_ns"], np.int64)[keep] - np.asarray(rows["start_ns"], np.int64)[keep]
    dur = dur / NS_PER_MS
    exposed = np.asarray(rows.get("exposed_ns", np.zeros(keep.size)), np.float64)[keep] / NS_PER_MS
    nbytes = np.asarray(rows["bytes"], np.int64)[keep]
    st = run.steps
    have, n_steps = np.unique(np.asarray(st["rank"], np.int64), return_counts=True)  # one pass, not one per rank
    steps_of = dict(zip(have.tolist(), n_steps.tolist()))
    names, kinds = _kind_of_rows(pg, lambda g: kind_of.get(g, f"group {g}" if g >= 0 else "unknown group"))
    last = _last_arrivers(run, keep)
    out = []
    for k, kind in enumerate(names):
        for o in np.unique(op[kinds == k]).tolist():
            m = (kinds == k) & (op == o)
            ranks = np.unique(rank[m])
            rank_steps = max(sum(steps_of.get(int(r), 0) for r in ranks.tolist()), 1)
            known = m & (nbytes >= 0)
            members = [g for i, g in groups.items() if kind_of[i] == kind]
            lr = last.get((kind, int(o)))
            out.append(CommRow(
                group=kind, n_groups=max(len(members), 1),
                group_size=max((len(g.get("ranks") or []) for g in members), default=int(ranks.size)),
                op=str(run.names[o]), n_ranks=int(ranks.size), calls_per_step=float(m.sum() / rank_steps),
                bytes_per_step=float(nbytes[known].sum() / rank_steps) if known.any() else None,
                ms_per_step=float(dur[m].sum() / rank_steps), exposed_ms_per_step=float(exposed[m].sum() / rank_steps),
                slowest_rank=lr[0] if lr else None, slowest_share=lr[1] if lr else None,
                median_skew_ms=lr[2] if lr else None))
    out.sort(key=lambda r: (-r.exposed_ms_per_step, -r.ms_per_step, r.group, r.op))
    return out


def _kind_of_rows(pg: np.ndarray, kind: Callable[[int], str]) -> tuple[list[str], np.ndarray]:
    """The group kinds (sorted) and each row's index among them, `kind` asked once per distinct process group (not
    per row: 1.4 M collective rows at 1,024 LLM-shaped ranks)."""
    pgs, of_row = unique_inverse(pg)
    names, of_pg = np.unique(np.array([kind(int(g)) for g in pgs.tolist()], dtype=str), return_inverse=True)
    return names.tolist(), narrow(of_pg.reshape(-1))[of_row.reshape(-1)]


def _last_arrivers(run: RunSummary, keep_row: np.ndarray) -> dict[tuple[str, int], tuple[int, float, float]]:
    """(group kind, op id) -> (rank entering last most often, that share, median arrival spread ms), over the
    instances whose every member row is kept (inside the selected steps)."""
    inst = run.collectives.instances
    if not len(inst.get("inst", ())):
        return {}
    mem = run.collectives.members
    out_rows = ~keep_row[np.asarray(mem["row"], np.int64)]
    inside = np.bincount(np.asarray(mem["inst"], np.int64), weights=out_rows.astype(float),
                         minlength=len(inst["inst"])) == 0
    groups = {int(g["index"]): group_kind(g) for g in run.process_groups}
    names, kinds = _kind_of_rows(np.asarray(inst["pg"], np.int64), lambda g: groups.get(g, f"group {g}"))
    out = {}
    for k, kind in enumerate(names):
        for o in np.unique(np.asarray(inst["op_id"])[kinds == k]).tolist():
            m = (kinds == k) & (np.asarray(inst["op_id"]) == o) & (np.asarray(inst["n_ranks"]) >= 2) & inside
            if not m.any():
                continue
            lr = np.asarray(inst["last_rank"])[m]
            vals, counts = np.unique(lr, return_counts=True)
            k = int(np.argmax(counts))
            out[(kind, int(o))] = (int(vals[k]), float(counts[k] / m.sum()),
                                   float(np.median(np.asarray(inst["skew_ns"])[m])) / NS_PER_MS)
    return out
