"""The stragglers analysis end to end: instances, lateness, the rule, blame and cost, the report's tables.

:func:`find_stragglers` runs the steps in order — the instances inside steps (:mod:`.instances`), each rank's
lateness per step (:mod:`.lateness`), the floor and the naming rule (:mod:`.rule`, confirmed by :mod:`.clock_free`
on several hosts), extra work (:mod:`.extra_work`), blame (:mod:`.blame`), cost (:mod:`.cost`), the rows
(:mod:`.rows`) and the host table (:mod:`.hosts`) — and returns them as one :class:`.result.Stragglers`.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING

import numpy as np

from ...groupstats import group_median, unique_inverse
from ...narrow import narrow
from .blame import Waits, union_ms, waits
from .clock_free import clock_free_check
from .cost import cost_ms
from .extra_work import cpu_wait_before_ns, extra_work_ms
from .hosts import host_table
from .instances import ANALYSIS_COLUMNS, Table, collective_instances, inside_steps, step_keys
from .lateness import Cells, StepLateness, step_lateness
from .result import StragglerInfo, StragglerRuleInfo, Stragglers
from .rows import RankFigures, cells_record, per_step, rank_rows
from .rule import StragglerRule, floor_ms, late_in_steps, step_noise_ms

if TYPE_CHECKING:
    from ...types import RunSummary
    from .inputs import StragglerInputs

__all__ = ["find_stragglers"]

NS_PER_MS = 1e6


def find_stragglers(run: RunSummary | StragglerInputs, *, rule: StragglerRule | None = None) -> Stragglers:
    """Rank and host straggler tables, per-step stragglers and the naming rule (see :mod:`.result`). `run` is the run
    summary, or the part of it the analysis reads (:mod:`.inputs`, what another MPI process is sent)."""
    rule = rule or StragglerRule()
    t = inside_steps(collective_instances(run, columns=ANALYSIS_COLUMNS))
    if t["inst"].size == 0:
        thr, parts = floor_ms(run, rule, 0.0)
        return Stragglers([], StragglerInfo(_rule_info(rule, thr, parts)))
    # each column of the instance rows (1.39 M at 1,024 LLM-shaped ranks) is let go once its last reader is done,
    # so the blame's unions below do not hold the whole table beside them
    before = cpu_wait_before_ns(run, t)
    _drop(t, "row", "window")
    ranks, ridx = unique_inverse(t["rank"])
    ridx = narrow(ridx.reshape(-1))
    skey = step_keys(t)
    _drop(t, "step")
    cells = Cells(skey, ridx, ranks.size)  # (step, rank) cells; a collective outside every step is a step of its own
    sl = step_lateness(cells, t.pop("lateness_ns") / NS_PER_MS)
    thr, parts = floor_ms(run, rule, step_noise_ms(cells, sl.raw, ranks.size))
    w = waits(t, skey)
    _drop(t, "arrival_ns", "end_ns", "rank")
    extra = extra_work_ms(t["inst"], before, sl)  # per cell, read by the rank figures and the cells record
    del before
    blamed = union_ms((w.waiter, w.culprit, w.skey), w.lo, w.hi)  # per (waiter, culprit, step): read twice below
    f = _figures(run, t, ridx, ranks, cells, sl, thr, rule, w, extra, blamed)
    info = StragglerInfo(_rule_info(rule, thr, parts), n_instances=int(t["inst"].max()) + 1)
    rows = rank_rows(f, {int(r): str(h) for r, h in run.hosts.items()})
    info.named = [d.rank for d in rows if d.named]
    info.clock_free = clock_free_check(ranks, f.lateness, f.clock_free, _confirmed(run, f, rule), f.late,
                                       info.named)
    (_, culprit, step), ms = blamed
    c_blame = _cell_values(cells, ranks, culprit, step, ms)
    info.per_step, info.changes = per_step(cells, sl.lateness, c_blame, ranks, thr)
    info.hosts = host_table(run, t, skey, w, thr, rule, ranks, ridx)
    info.cells = cells_record(cells, sl.lateness, extra, ranks)
    return Stragglers(rows, info, waits_for_named=_waits_for(w, ranks, f.n_steps, info.named))


def _drop(t: Table, *columns: str) -> None:
    """Let the instance table's `columns` go: nothing after this reads them."""
    for k in columns:
        del t[k]


def _rule_info(rule: StragglerRule, thr: float, parts: dict[str, float]) -> StragglerRuleInfo:
    return StragglerRuleInfo(text=rule.text(), threshold_ms=thr, **{**parts, **asdict(rule)})


def _confirmed(run: RunSummary, f: RankFigures, rule: StragglerRule) -> np.ndarray:
    """Per rank: whether the clock-free lateness confirms the lateness (always, on a run within one host)."""
    hosts = {str(run.hosts.get(int(r), "?")) for r in f.ranks.tolist()}
    if len(hosts) < 2:
        return np.ones(f.ranks.size, bool)
    return f.clock_free >= rule.clock_free_factor * f.lateness


def _figures(run: RunSummary, t: Table, ridx: np.ndarray, ranks: np.ndarray, cells: Cells, sl: StepLateness,
             thr: float, rule: StragglerRule, w: Waits, extra: np.ndarray,
             blamed: tuple[tuple[np.ndarray, ...], np.ndarray]) -> RankFigures:
    """The per-rank figures, and who the rule names. `blamed`: the union of the waits per (waiting rank, rank waited
    for, step key), as :func:`.blame.union_ms` gives it."""
    nr = ranks.size
    n_steps, late_steps, passes = late_in_steps(cells, sl.lateness, nr, thr, rule)
    den = np.maximum(n_steps, 1)

    def mean(v: np.ndarray) -> np.ndarray:  # over the rank's steps
        return np.bincount(cells.group, weights=v, minlength=nr) / den

    def median(v: np.ndarray) -> np.ndarray:  # over the rank's steps where known
        ok = np.isfinite(v)
        return group_median(cells.group[ok], v[ok], nr)

    cnt = np.bincount(ridx, minlength=nr)
    f = RankFigures(
        ranks=ranks, n_instances=cnt, n_steps=n_steps, lateness=median(sl.lateness), late_steps=late_steps,
        late_fraction=np.bincount(ridx, weights=t["is_last"].astype(float), minlength=nr) / np.maximum(cnt, 1),
        extra_work=median(extra), blame=_summed_by_rank(ranks, blamed[0][1], blamed[1]),
        wait=_wait_per_rank(w, ranks), cost=np.zeros(nr),
        clock_free=median(cells.max(t["clock_free_lateness_ns"] / NS_PER_MS)), late=passes, named=passes)
    f.named = passes & _confirmed(run, f, rule)
    f.cost = mean(cells.max(cost_ms(t, f.named[ridx])))
    return f


def _wait_per_rank(w: Waits, ranks: np.ndarray) -> np.ndarray:
    """Per rank, summed over its steps: its own waits (the union per step of all its waits)."""
    (who, _), ms = union_ms((w.waiter, w.skey), w.lo, w.hi)
    return _summed_by_rank(ranks, who, ms)


def _summed_by_rank(ranks: np.ndarray, who: np.ndarray, ms: np.ndarray) -> np.ndarray:
    """`ms` summed per rank `who` (0 for a rank without any), in the order of `ranks`."""
    if ms.size == 0:
        return np.zeros(ranks.size)
    return np.bincount(np.searchsorted(ranks, who), weights=ms, minlength=ranks.size)


def _cell_values(cells: Cells, ranks: np.ndarray, rank: np.ndarray, step: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Values keyed by (rank, step key), summed into the (step, rank) cells (0 where none)."""
    out = np.zeros(cells.n)
    if v.size == 0:
        return out
    code = cells.step.astype(np.int64) * ranks.size + cells.group
    want = step.astype(np.int64) * ranks.size + np.searchsorted(ranks, rank)
    o = np.argsort(code)
    pos = np.clip(np.searchsorted(code[o], want), 0, code.size - 1)
    hit = code[o][pos] == want
    np.add.at(out, o[pos[hit]], v[hit])
    return out


def _waits_for(w: Waits, ranks: np.ndarray, n_steps: np.ndarray, named: list[int]) -> dict[int, float]:
    """Per rank: its wait for the named ranks per step (each overlapping wait once); empty with nobody named."""
    if not named:
        return {}
    sub = w.subset(np.isin(w.culprit, named))
    per = _wait_per_rank(sub, ranks)
    return {int(r): float(per[i] / max(int(n_steps[i]), 1)) for i, r in enumerate(ranks.tolist())}
