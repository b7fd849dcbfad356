"""Collective instances: each rank's arrival at the same collective, and its lateness there.

Per process group and window, the k-th exec collective (``comms.role == 1``, ``comms.seq == k``) of every rank is
one instance (the run summary's matched collectives). For rank r in instance i (times on the aligned clock):

* arrival ``a_ri`` = start of its exec event (``gloo:*`` on the worker thread, the NCCL kernel on the stream), end
  ``z_ri`` its end;
* **lateness** ``ℓ_ri = a_ri − median_{r'≠r} a_r'i`` — how much later r arrived than a typical peer (measured from
  the *earliest* peer instead, every lateness would grow by the jitter of the fastest of N−1 noisy ranks);
* the **last arriver** (largest a) and its **lead** ``a_last − (second-latest arrival)``, how much earlier the
  collective could have started without it.

Collectives outside every step (a checkpoint after the loop) are left out when the run has steps; in a run without
any, each instance is a step of its own.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Callable

import numpy as np

from ...groupstats import sort_within, unique_inverse
from ...narrow import narrow
from .clock_free import clock_free_lateness_ns
from .peers import group_bounds, median_of_others

if TYPE_CHECKING:
    from ...types import RunSummary

logger = logging.getLogger(__name__)

__all__ = ["Table", "collective_instances", "inside_steps", "step_keys"]

#: Columns by name, one row per (instance, rank).
Table = dict[str, np.ndarray]

_INT_COLUMNS = ("inst", "window", "pg", "seq", "rank", "step", "row", "arrival_ns", "end_ns", "dur_ns", "pos",
                "n_ranks", "behind_first_ns", "lead_ns")


#: The columns the straggler analysis reads (find.py and the modules it calls): it asks for these only, so the table it
#: holds through the analysis leaves out six (1,024 LLM-shaped ranks: 44 MB of its 130 over 1.39 M rows).
ANALYSIS_COLUMNS = frozenset({"inst", "rank", "step", "row", "window", "arrival_ns", "end_ns", "is_last",
                              "behind_first_ns", "lateness_ns", "clock_free_lateness_ns"})


def collective_instances(run: RunSummary, *, columns: frozenset[str] | None = None) -> Table:
    """One row per (instance, rank), sorted by (instance, arrival). `columns`: only these (and ``inst``), the others
    not computed or dropped once read; None: every column.

    Columns: ``inst`` (0..n−1), ``window``, ``pg``, ``seq``, ``rank``, ``step``, ``row`` (its row of
    ``run.collective_rows``), ``arrival_ns``, ``end_ns``, ``dur_ns``, ``pos`` (arrival order, 0 = first), ``n_ranks``,
    ``lateness_ns`` (vs the median of the others, float), ``behind_first_ns``, ``is_last``, ``lead_ns`` (last arriver
    only: its arrival − the second-latest; else 0), ``clock_free_lateness_ns`` (median of the others' durations −
    own, float). Instances seen on fewer than two ranks are dropped; a rank seen twice in one instance keeps its first
    row. With a steps selection, only collectives inside the selected steps.
    """
    want = (lambda k: True) if columns is None else (lambda k: k == "inst" or k in columns)
    t = _instances(run, want)
    return t if columns is None else {k: v for k, v in t.items() if want(k)}


def _instances(run: RunSummary, want: Callable[[str], bool]) -> Table:
    m, step = _selected_members(run)
    if m["inst"].size == 0:
        return _empty_instances()
    inst = np.asarray(m["inst"], np.int64)
    rank = np.asarray(m["rank"])  # compared only: as the members hold it (int32), no copy
    keep = _kept_members(inst, rank)
    if not np.any(keep):
        return _empty_instances()
    _, inst = unique_inverse(inst[keep])  # renumber 0..n-1
    take = np.flatnonzero(keep)
    o = sort_within(inst.reshape(-1), np.asarray(m["start_ns"])[take])
    inst = narrow(inst.reshape(-1)[o])
    take = take[o]  # each column is gathered once, in its final order: no second copy of the table
    del o, keep
    cols = {k: np.asarray(m[src])[take].astype(_NARROW.get(k, np.int64), copy=False) for k, src in _MEMBER_COLUMNS
            if want(k) or k in ("arrival_ns", "end_ns")}  # (the times: every arrival column reads them)
    cols["rank"], cols["step"] = narrow(rank[take]), narrow(step[take])
    if "row" in cols:
        cols["row"] = narrow(cols["row"])
    del rank, step, take  # the members' order is done with: freed before the arrival columns' temporaries
    cols["dur_ns"] = cols["end_ns"] - cols["arrival_ns"]
    arrival = _arrival_columns(inst, cols, want)  # (it lets the durations go when not asked for)
    return {"inst": inst, **cols, **arrival}


#: Columns only compared, sorted on or listed, never in arithmetic: int32 (1.39 M rows at 1,024 LLM-shaped ranks).
#: The ids and indices ``inst``, ``rank``, ``step`` and ``row`` are int32 too where their values fit (narrow.py):
#: keys built from them widen first (``groupstats.rank_step_values``, ``lateness.Cells``).
_NARROW = {"window": np.int32, "pg": np.int32, "seq": np.int32, "pos": np.int32, "n_ranks": np.int32}

#: Columns taken from the matched collectives' members: (column, member column).
_MEMBER_COLUMNS = (("window", "window"), ("pg", "pg"), ("seq", "seq"), ("row", "row"), ("arrival_ns", "start_ns"),
                   ("end_ns", "end_ns"))


def _selected_members(run: RunSummary) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """The matched collectives' members and each one's step, only those inside the steps selection if there is one."""
    m = run.collectives.members
    step = narrow(np.asarray(run.collective_rows["step"], np.int64)[np.asarray(m["row"], np.int64)])
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


def _arrival_columns(inst: np.ndarray, cols: Table, want: Callable[[str], bool]) -> Table:
    """The columns set against the instance's other members, for rows sorted by (instance, arrival) (those `want`
    takes: the others are not made)."""
    a = cols["arrival_ns"]
    first, n, pos = group_bounds(inst)
    # the clock-free lateness first, and the durations let go after it when not asked for: its sort is then not
    # held beside the arrival lateness's columns (1.39 M rows at 1,024 LLM-shaped ranks, 11 MB per column)
    clock_free = clock_free_lateness_ns(inst, first, n, cols["dur_ns"])
    if not want("dur_ns"):
        del cols["dur_ns"]
    is_last = pos == n - 1
    rel = a - a[first]  # int64 ns after the first arrival: exact in float64, unlike epoch ns
    out = {"pos": pos.astype(np.int32) if want("pos") else None,
           "n_ranks": n.astype(np.int32) if want("n_ranks") else None,
           "lateness_ns": rel - median_of_others(first, n, pos, rel),
           "behind_first_ns": rel, "is_last": is_last,
           "lead_ns": np.where(is_last, a - a[np.maximum(first + n - 2, first)], 0) if want("lead_ns") else None,
           "clock_free_lateness_ns": clock_free}
    return {k: v for k, v in out.items() if v is not None}


def _empty_instances() -> Table:
    out = {k: np.zeros(0, _NARROW.get(k, np.int64)) for k in _INT_COLUMNS}
    out.update({"lateness_ns": np.zeros(0), "clock_free_lateness_ns": np.zeros(0), "is_last": np.zeros(0, bool)})
    return out


def inside_steps(t: Table) -> Table:
    """The instances inside recorded steps, when there are any: collectives outside every step (a checkpoint's
    all-gathers after the loop) belong to no step and are left out; without any step each instance is its own."""
    inside = t["step"] >= 0
    if inside.all() or not inside.any():
        return t
    n_out = np.bincount(t["inst"], weights=(~inside).astype(float))
    keep = n_out[t["inst"]] == 0  # whole instances: every rank inside a step
    _, inst = unique_inverse(t["inst"][keep])
    out = {k: v[keep] for k, v in t.items()}
    out["inst"] = narrow(inst.reshape(-1))
    return out


def step_keys(t: Table) -> np.ndarray:
    """Per row: its step, or −1 − its instance for a collective outside every step (then a step of its own)."""
    return np.where(t["step"] >= 0, t["step"], -1 - t["inst"])
