"""Per-rank measures: a rank's lateness, blame and cost over its steps and instances, and whether it is named.

Per rank: ``mean_lateness_ms`` (mean over its steps of its step lateness, :mod:`.cells`), ``mean_instance_lateness_ms``
(mean ℓ over instances), ``late_fraction`` (share of its instances where it arrived last), ``late_step_fraction``
(share of its steps whose lateness reaches the threshold), ``blame_ms`` (Σ B where it arrived last),
``blame_ms_per_step``, ``lost_ms_per_step`` (mean over its steps of its largest lead: the wall time the step lost),
``lateness_not_cpu_wait_ms`` and ``cpu_wait_excess_ms`` (:mod:`.cpu_wait`), the clock-free measures
(:mod:`.clock_free`), its own work (:mod:`.own_work`) and its cost (:mod:`.cost`). Whether it is named follows the
rule (:mod:`.rule`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from .cells import Cells, excess
from .clock_free import clock_free_wait_ms
from .consistency import Consistency, consistency
from .cost import cost_ms
from .cpu_wait import step_lateness
from .instances import blame_ms
from .own_work import OwnWork, own_work

if TYPE_CHECKING:
    from ...graph.critical_path import StepGraph
    from ...types import RunSummary
    from .instances import Table
    from .rule import StragglerRule

__all__ = ["RankMeasures", "rank_measures"]

NS_PER_MS = 1e6


@dataclass
class RankMeasures:
    """Per rank (arrays indexed like ``ranks``), and the (step, rank) cells and instance rows behind them (ms)."""

    ranks: np.ndarray  # the ranks seen in an instance, sorted
    skey: np.ndarray  # per instance row: its step (−1 − its instance outside every step)
    cells: Cells  # (step, rank) cells
    c_lat: np.ndarray  # per cell: the rank's lateness in the step
    c_exc: np.ndarray  # per cell: its excess over the other ranks' (less its CPU-wait excess)
    c_blame: np.ndarray  # per cell: its blame in the step
    blame_row: np.ndarray  # per instance row: the last arriver's blame, else 0
    cons: Consistency  # parts (2) and (3) of the rule on the lateness
    den: np.ndarray  # its steps, at least 1
    mean_lat: np.ndarray  # over its steps: lateness
    mean_own: np.ndarray  # lateness less the CPU-wait excess
    mean_cpu: np.ndarray  # CPU-wait excess
    late_steps: np.ndarray  # share of steps whose lateness reaches the floor
    lost: np.ndarray  # largest lead
    cf_lat: np.ndarray  # clock-free lateness
    cnt: np.ndarray  # its instances
    inst_lat: np.ndarray  # over its instances: lateness
    late_frac: np.ndarray  # share where it arrived last
    blame: np.ndarray  # Σ blame
    max_behind: np.ndarray  # largest behind_first
    cf_wait_mean: np.ndarray  # clock-free wait
    confirmed: np.ndarray  # (4): the clock-free lateness confirms the lateness
    own: OwnWork  # its own work before each step's first collective
    named: np.ndarray
    cost: np.ndarray  # cost per step


def rank_measures(run: RunSummary, t: Table, thr: float, rule: StragglerRule, jitter: float,
                  graph: StepGraph | None = None) -> RankMeasures:
    """The per-rank measures of a non-empty instance table, with the floor ``thr`` and the arrival jitter (ms)."""
    n_inst = int(t["inst"].max()) + 1
    ranks, ridx = np.unique(t["rank"], return_inverse=True)
    ridx = ridx.reshape(-1)
    nr = ranks.size
    blame_row = blame_ms(t, n_inst)
    # (step, rank) cells; a collective outside every step (step −1) is a step of its own
    skey = np.where(t["step"] >= 0, t["step"], -1 - t["inst"])
    cells = Cells(skey, ridx, nr)
    c_lat, c_own, c_cpu = step_lateness(run, t, cells, t["lateness_ns"] / NS_PER_MS, ranks)
    c_exc = excess(cells, c_own)
    cons = consistency(cells, c_exc, nr, thr, rule, rule.jitter_factor * jitter)
    den = np.maximum(cons.n_steps, 1)
    steps = _step_means(t, cells, den, nr, thr, c_lat, c_own, c_cpu)
    per_inst = _instance_means(t, ridx, nr, n_inst, blame_row)
    mean_lat, mean_own, cf_lat = steps[0], steps[1], steps[5]
    confirmed = cf_lat >= rule.clock_free_factor * mean_lat
    own = own_work(run, ranks, thr, rule, graph)
    named = ((mean_own >= thr) & cons.passes & confirmed) | own.passes
    cost = np.bincount(cells.group, weights=cells.max(cost_ms(t, named[ridx])), minlength=nr) / den
    return RankMeasures(ranks, skey, cells, c_lat, c_exc, cells.sum(blame_row), blame_row, cons, den, *steps,
                        *per_inst, confirmed, own, named, cost)


def _step_means(t: Table, cells: Cells, den: np.ndarray, nr: int, thr: float, c_lat: np.ndarray,
                c_own: np.ndarray, c_cpu: np.ndarray) -> tuple[np.ndarray, ...]:
    """Per rank, means over its steps: (lateness, lateness less CPU-wait excess, CPU-wait excess, share of steps
    late by the floor, largest lead, clock-free lateness)."""
    def mean(v: np.ndarray) -> np.ndarray:
        return np.bincount(cells.group, weights=v, minlength=nr) / den

    return (mean(c_lat), mean(c_own), mean(c_cpu), mean((c_lat >= thr).astype(float)),
            mean(cells.max(t["lead_ns"] / NS_PER_MS)), mean(cells.max(t["clock_free_lateness_ns"] / NS_PER_MS)))


def _instance_means(t: Table, ridx: np.ndarray, nr: int, n_inst: int,
                    blame_row: np.ndarray) -> tuple[np.ndarray, ...]:
    """Per rank, over its instances: (count, mean lateness, share arrived last, Σ blame, largest behind_first, mean
    clock-free wait)."""
    cnt = np.bincount(ridx, minlength=nr).astype(np.float64)

    def mean(v: np.ndarray) -> np.ndarray:
        return np.bincount(ridx, weights=v, minlength=nr) / np.maximum(cnt, 1)

    max_behind = np.zeros(nr)
    np.maximum.at(max_behind, ridx, t["behind_first_ns"] / NS_PER_MS)
    return (cnt, mean(t["lateness_ns"] / NS_PER_MS), mean(t["is_last"].astype(float)),
            np.bincount(ridx, weights=blame_row, minlength=nr), max_behind, mean(clock_free_wait_ms(t, n_inst)))
