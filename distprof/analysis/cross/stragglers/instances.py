"""Collective instances: each rank's arrival at the same collective, its lateness, and the waiting it caused.

Per process group and window, the k-th exec collective (``comms.role == 1``, ``comms.seq == k``) of every rank is
one instance (the run summary's matched collectives). For rank r in instance i (times on the aligned clock):

* arrival ``a_ri`` = start of its exec event (``gloo:*`` on the worker thread, the NCCL kernel on the stream);
* **lateness** ``ℓ_ri = a_ri − median_{r'≠r} a_r'i`` — how much later r arrived than a typical peer. (Measured from
  the *earliest* peer instead, every lateness would grow by the jitter of the fastest of N−1 noisy ranks.)
  ``behind_first = a_ri − min_r' a_r'i`` is the wait r imposed on the earliest rank;
* the **last arriver** ``L_i`` (largest a); its **blame** ``B_i = Σ_{r≠L_i} (a_{L_i,i} − a_ri)`` — the waiting it
  caused the others (Scalasca's "Wait at N×N", summed over the waiting ranks); its **lead**
  ``a_{L_i,i} − (second-latest arrival)`` — how much earlier the collective could have started without it.

Collectives outside every step (a checkpoint after the loop) are left out when the run has steps; in a run without
any, each instance is a step of its own.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import numpy as np

from .clock_free import clock_free_lateness_ns
from .cpu_wait import cpu_wait_before
from .peers import group_bounds, median_of_others

if TYPE_CHECKING:
    from ...types import RunSummary

logger = logging.getLogger(__name__)

__all__ = ["Table", "blame_ms", "collective_instances", "inside_steps"]

#: Columns by name, one row per (instance, rank).
Table = dict[str, np.ndarray]

NS_PER_MS = 1e6


def collective_instances(run: RunSummary) -> Table:
    """One row per (instance, rank), sorted by (instance, arrival).

    Columns: ``inst`` (0..n−1), ``window``, ``pg``, ``seq``, ``rank``, ``step``, ``arrival_ns``, ``dur_ns``, ``pos``
    (arrival order, 0 = first), ``n_ranks``, ``lateness_ns`` (vs the median of the others, float), ``behind_first_ns``,
    ``is_last``, ``lead_ns`` (last arriver only: its arrival − the second-latest; else 0), ``clock_free_lateness_ns``
    (median of the others' durations − own, float), ``cpu_wait_before_ns`` (:func:`cpu_wait_before`, NaN unknown).
    Instances seen on fewer than two ranks are dropped; a rank seen twice in one instance keeps its first row. With a
    steps selection, only collectives inside the selected steps.
    """
    m, step = _selected_members(run)
    if m["inst"].size == 0:
        return _empty_instances()
    inst = np.asarray(m["inst"], np.int64)
    rank = np.asarray(m["rank"], np.int64)
    keep = _kept_members(inst, rank)
    if not np.any(keep):
        return _empty_instances()
    cols = _member_columns(run, m, step, rank, keep)
    _, inst = np.unique(inst[keep], return_inverse=True)  # renumber 0..n-1
    inst = inst.reshape(-1)
    o = np.lexsort((cols["arrival_ns"], inst))
    inst = inst[o]
    cols = {k: v[o] for k, v in cols.items()}
    return {"inst": inst.astype(np.int64), **cols, **_arrival_columns(inst, cols)}


def _selected_members(run: RunSummary) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """The matched collectives' members and each one's step, only those inside the steps selection if there is one."""
    m = run.collectives.members
    step = np.asarray(run.collective_rows["step"], np.int64)[np.asarray(m["row"], np.int64)]
    if run.steps_selection is not None:
        lo, hi = run.steps_selection
        inside = (step >= lo) & (step <= hi)
        m = {k: np.asarray(v)[inside] for k, v in m.items()}
        step = step[inside]
    return m, step


def _kept_members(inst: np.ndarray, rank: np.ndarray) -> np.ndarray:
    """Which members to keep: a rank's first row in an instance (members are sorted by (inst, rank)), of instances
    seen on at least two ranks."""
    dup = np.r_[False, (inst[1:] == inst[:-1]) & (rank[1:] == rank[:-1])]
    if np.any(dup):
        logger.warning("%d duplicate (instance, rank) exec collectives ignored", int(dup.sum()))
    keep = ~dup
    keep &= np.bincount(inst[keep], minlength=int(inst.max()) + 1)[inst] >= 2
    return keep


def _member_columns(run: RunSummary, m: dict[str, np.ndarray], step: np.ndarray, rank: np.ndarray,
                    keep: np.ndarray) -> Table:
    """The kept members' own columns: where they ran, when they started, how long they took, their CPU wait."""
    arrival = np.asarray(m["start_ns"], np.int64)[keep]
    return {
        "window": np.asarray(m["window"], np.int64)[keep],
        "pg": np.asarray(m["pg"], np.int64)[keep],
        "seq": np.asarray(m["seq"], np.int64)[keep],
        "rank": rank[keep],
        "step": step[keep],
        "arrival_ns": arrival,
        "dur_ns": np.asarray(m["end_ns"], np.int64)[keep] - arrival,
        "cpu_wait_before_ns": cpu_wait_before(run)[np.asarray(m["row"], np.int64)][keep],
    }


def _arrival_columns(inst: np.ndarray, cols: Table) -> Table:
    """The columns set against the instance's other members, for rows sorted by (instance, arrival)."""
    a = cols["arrival_ns"]
    first, n, pos = group_bounds(inst)
    is_last = pos == n - 1
    second = a[np.maximum(first + n - 2, first)]
    rel = a - a[first]  # int64 ns after the first arrival: exact in float64, unlike epoch ns
    return {
        "pos": pos.astype(np.int64),
        "n_ranks": n.astype(np.int64),
        "lateness_ns": rel - median_of_others(first, n, pos, rel),
        "behind_first_ns": rel,
        "is_last": is_last,
        "lead_ns": np.where(is_last, a - second, 0),
        "clock_free_lateness_ns": clock_free_lateness_ns(inst, first, n, cols["dur_ns"]),
    }


def _empty_instances() -> Table:
    z = np.zeros(0, np.int64)
    out = {k: z.copy() for k in ("inst", "window", "pg", "seq", "rank", "step", "arrival_ns", "dur_ns", "pos",
                                 "n_ranks", "behind_first_ns", "lead_ns")}
    out.update({"lateness_ns": np.zeros(0), "clock_free_lateness_ns": np.zeros(0), "is_last": np.zeros(0, bool),
                "cpu_wait_before_ns": np.zeros(0)})
    return out


def inside_steps(t: Table) -> Table:
    """The instances inside recorded steps, when there are any: collectives outside every step (a checkpoint's
    all-gathers after the loop) belong to no step and are left out; without any step each instance is its own."""
    inside = t["step"] >= 0
    if inside.all() or not inside.any():
        return t
    n_out = np.bincount(t["inst"], weights=(~inside).astype(float))
    keep = n_out[t["inst"]] == 0  # whole instances: every rank inside a step
    _, inst = np.unique(t["inst"][keep], return_inverse=True)
    out = {k: v[keep] for k, v in t.items()}
    out["inst"] = inst.reshape(-1).astype(np.int64)
    return out


def blame_ms(t: Table, n_inst: int) -> np.ndarray:
    """Per instance row: the last arriver's blame, Σ over the instance of (its behind_first − each one's) (ms);
    0 on the other rows."""
    inst = t["inst"]
    behind = t["behind_first_ns"] / NS_PER_MS
    n_in = np.bincount(inst, minlength=n_inst)
    blame_inst = n_in * behind[t["is_last"]] - np.bincount(inst, weights=behind, minlength=n_inst)  # rows by inst
    return np.where(t["is_last"], blame_inst[inst], 0.0)
