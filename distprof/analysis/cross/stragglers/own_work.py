"""Own work: the rank's work before each step's first collective, over its peers' — the other way to be named.

Per step whose first sync event is a collective, the rank's work before it (its step start to its arrival: the step
graph's first segment, on its own clock) less its wait for a CPU there (``cpu/samples``, analysis.cpuwait; unknown:
nothing taken off), over the median of the same segment on the instance's other members (``own_excess_ms``, median
``own_excess_median_ms``). The arrival lateness carries every rank's noise since the previous collective (the
optimizer, the host's scheduler); this segment carries only the rank's own work, and with the CPU waits taken off,
not the time the host's other processes held its cores: beside one busy process on 2 cores its per-step spread
between two ranks falls from 5–17 ms to 2–4 ms. It is consistent when it passes (2) and (3) of the rule
(:mod:`.consistency`), or — robust to the odd step a rank spent held off the CPU — its median is ≥ the floor and it
is positive in more steps than chance allows (one-sided sign test at the rule's confidence, Bonferroni: with no
excess a rank is as often above its peers' median as below; ``own_sign_p``, :mod:`.sign_test`). A rank whose own
work is consistently longer is named although its peers' own noise (a slower optimizer step) hides it in the
arrivals: it is the rank that does more, and severity follows what it costs. Durations on one rank's clock need no
clock check (4). Later segments are not compared: after the first collective they also hold hand-overs from
communication threads that were still busy, and what a rank did meanwhile is hidden in that wait.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ...graph.critical_path import KIND_COLL, step_graph
from ...groupstats import group_median
from .cells import Cells
from .consistency import consistency
from .peers import excess_by
from .sign_test import _binomial_half_tail

if TYPE_CHECKING:
    from ...graph.critical_path import StepGraph
    from ...types import RunSummary
    from .rule import StragglerRule

__all__ = ["OwnWork", "own_work", "own_work_excess"]

NS_PER_MS = 1e6


def own_work_excess(run: RunSummary, graph: StepGraph | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per rank-step whose first sync event is a collective: (rank, step, excess ms) of its own work before it — the
    step graph's first work segment (its step start to its arrival) less its wait for a CPU there where the samples
    know it — over the median of the same segment of the instance's other members (the same collective: the same
    work before it in a data- or tensor-parallel group)."""
    g = graph if graph is not None else step_graph(run)
    first = np.flatnonzero((g.ev_kind == KIND_COLL) & (g.ev_group >= 0) & (g.ev_prev < 0))
    wait = g.ev_cpu_wait[first] if g.ev_cpu_wait is not None else np.zeros(first.size)
    own = (g.ev_gap[first] - np.nan_to_num(wait)) / NS_PER_MS
    grp = g.ev_group[first]
    shared = np.bincount(grp, minlength=int(grp.max()) + 1)[grp] >= 2 if grp.size else np.zeros(0, bool)
    rows, exc = first[shared], excess_by(grp[shared], own[shared])
    return g.ev_rank[rows].astype(np.int64), g.ev_step[rows].astype(np.int64), exc


@dataclass
class OwnWork:
    """Per rank: its own-work excess over its steps (:func:`own_work_excess`) and whether it is consistent."""

    n_steps: np.ndarray
    mean_excess: np.ndarray  # NaN without steps
    median_excess: np.ndarray
    excess_bound: np.ndarray  # lower confidence bound of the mean (NaN with fewer than 2 steps)
    positive_fraction: np.ndarray  # share of its steps with a positive excess
    sign_p: np.ndarray  # one-sided sign test: P(at least that many positive steps | no excess), 1 when unknown
    passes: np.ndarray


def own_work(run: RunSummary, ranks: np.ndarray, thr: float, rule: StragglerRule,
             graph: StepGraph | None = None) -> OwnWork:
    """Whether each rank's own work before its steps' first collective (:func:`own_work_excess`) exceeds its peers'
    consistently: the consistency test on the mean (excess ≥ the floor in most steps, lower confidence bound above
    it), or — robust to the odd step a rank spent held off the CPU, which widens that bound — its median excess ≥
    the floor and more positive steps than chance allows (one-sided sign test at the rule's confidence, Bonferroni
    over ranks: with no excess a rank's own work is as often above its peers' median as below)."""
    r, st, exc = own_work_excess(run, graph)
    keep = np.isin(r, ranks)
    r, st, exc = r[keep], st[keep], exc[keep]
    nr = ranks.size
    cells = Cells(st, np.searchsorted(ranks, r), nr)
    c_exc = np.full(cells.n, np.nan)
    c_exc[cells.idx] = exc
    cons = consistency(cells, c_exc, nr, thr, rule, np.inf)
    g = cells.group
    n = np.bincount(g, minlength=nr)
    pos = np.bincount(g, weights=(c_exc > 0).astype(float), minlength=nr).astype(np.int64)
    med = np.where(n > 0, group_median(g, c_exc, nr) if g.size else np.zeros(nr), np.nan)
    alpha = (1 - rule.confidence) / max(int(np.count_nonzero(n)), 1)
    p = np.array([_binomial_half_tail(int(k), int(m)) for k, m in zip(pos, n)])
    robust = (n > 0) & (med >= thr) & (p <= alpha)
    return OwnWork(n, np.where(n > 0, cons.mean_excess, np.nan), med, cons.excess_bound,
                   pos / np.maximum(n, 1), p, (n > 0) & (cons.passes | robust))
