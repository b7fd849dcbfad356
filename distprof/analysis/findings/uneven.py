"""Uneven loops: ranks whose training loop ended before the others'.

* ``uneven_steps`` — a rank ran fewer training steps than the others: its status file counts fewer steps than the
  most any rank ran (the whole loop; only where every rank's status file says it closed cleanly), or, in a recorded
  window, its last step comes before the latest rank's and its shard was cut short (the script ended mid-window)
  while a rank that went on finished the window (or every rank closed cleanly: windows all cut short a step apart
  are a termination signal's doing).
  For the rest of the loop the other ranks trained without it: with DDP's or ZeroRedundancyOptimizer's ``Join`` the
  rank that ran out only shadows their collectives (counted: its collectives after its last step in the window).
  Impact: the share of the ranks' loop spent with a rank that had stopped, Σ (most steps − a rank's steps) /
  (ranks × most steps) — which is also how much shorter the loop would be with the batches spread evenly (the mean
  over ranks instead of the most). From the status files where they count it, else from the window's steps. One
  finding for the run (the rank with the fewest steps named; every early rank counted); it measures the loop, not
  a step, so no what-if gain per step is given.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..names import rank_ranges
from .finding import Finding

if TYPE_CHECKING:
    from ..types import FindingRules, RunSummary

__all__ = ["LoopEnds", "loop_ends", "uneven_steps"]

#: The longest list of early ranks a finding spells out.
_MAX_RANKS_TEXT = 60


@dataclass
class LoopEnds:
    """Where each rank's loop ended, as far as the run tells (see the module docstring)."""

    steps: dict[int, int]  # rank -> training steps it ran (status files), empty when they do not count them
    window: int | None  # the recorded window where a rank stopped first, if any
    window_steps: tuple[int, int] | None  # that window's first and last step on the ranks that ran on
    last_step: dict[int, int]  # rank -> its last step in that window (the ranks that stopped early in it)
    shadow_collectives: dict[int, int]  # early rank -> its collectives after its last step in that window
    window_ranks: int = 0  # ranks with steps in that window

    @classmethod
    def from_status(cls, steps: dict[int, int]) -> LoopEnds:
        """The status files' counts alone (a run without shards: a --watch run that recorded no window)."""
        return cls(dict(steps), None, None, {}, {})


def _window_ends(run: RunSummary) -> tuple[int | None, tuple[int, int] | None, dict[int, int], int]:
    """The first window in which a rank whose window was cut short has its last step before the latest rank's (and a
    rank that went on to it finished the window, or every rank closed cleanly): the window, its first and last step,
    the early ranks' last steps, the ranks with steps in it."""
    cat = run.catalog
    st = run.steps
    if cat is None or not cat.cut_short or not len(st["step"]):
        return None, None, {}, 0
    beside_finished = cat.cut_beside_finished()
    rank, window, step = (np.asarray(st[k], np.int64) for k in ("rank", "window", "step"))
    for w in np.unique(window).tolist():
        m = window == w
        ranks, inv = np.unique(rank[m], return_inverse=True)
        last = np.full(ranks.size, np.iinfo(np.int64).min)
        np.maximum.at(last, inv, step[m])  # each rank's last step, in one pass (16,384 ranks: no per-rank scan)
        top = int(last.max())
        cut = np.fromiter(((x, w) in cat.cut_short for x in ranks.tolist()), bool, ranks.size)
        early = (last < top) & cut
        # every rank's window cut short at different steps is a signal's or a failure's doing unless every rank
        # closed cleanly (the status files' counts) or a rank that went on finished the window
        if early.any() and (cat.steps_seen or w in beside_finished):
            return (int(w), (int(step[m].min()), top),
                    dict(zip(ranks[early].tolist(), last[early].tolist())), int(ranks.size))
    return None, None, {}, 0


def _after_last_step(run: RunSummary, window: int, last: dict[int, int]) -> dict[int, int]:
    """Early rank -> its collectives in `window` outside every step and after its last step's end (raw clock)."""
    out = {}
    for r, s in last.items():
        rs = run.ranks.get(r)
        if rs is None:
            continue
        steps, coll = rs.steps, rs.collectives
        in_w = np.asarray(steps["window"]) == window
        if not in_w.any() or not len(coll["step"]):
            continue
        end = int(np.asarray(steps["end_ns"], np.int64)[in_w].max())
        c = (np.asarray(coll["window"]) == window) & (np.asarray(coll["step"]) < 0) \
            & (np.asarray(coll["start_ns"], np.int64) > end)
        out[r] = int(c.sum())
    return out


def loop_ends(run: RunSummary) -> LoopEnds:
    """Where each rank's loop ended: the status files' step counts and the first window a rank stopped early in."""
    steps = dict(run.catalog.steps_seen) if run.catalog is not None else {}
    window, span, last, n_ranks = _window_ends(run)
    shadow = _after_last_step(run, window, last) if window is not None else {}
    return LoopEnds(steps, window, span, last, shadow, n_ranks)


def _ranks_text(ranks: list[int]) -> str:
    listed = rank_ranges(ranks, sep=",")
    return (f"rank {listed}" if len(ranks) == 1 else f"ranks {listed}" if len(listed) <= _MAX_RANKS_TEXT
            else f"{len(ranks)} ranks")


def uneven_steps(ends: LoopEnds, rules: FindingRules, hosts: dict[int, str]) -> list[Finding]:
    """The ``uneven_steps`` finding (see the module docstring) of where the ranks' loops ended (:func:`loop_ends`),
    or none; `hosts`: rank -> host, where known."""
    counts = ends.steps
    most = max(counts.values()) if counts else 0
    early_loop = sorted(r for r, n in counts.items() if n < most)
    if not early_loop and not ends.last_step:
        return []
    if early_loop:  # the whole loop, from the status files
        n = np.array(list(counts.values()), np.float64)
        impact = 100.0 * float((most - n).sum()) / (n.size * most)
        worst = min(early_loop, key=lambda r: (counts[r], r))
        early = early_loop
        metrics = {"min_steps": float(counts[worst]), "max_steps": float(most), "mean_steps": float(n.mean()),
                   "n_ranks_counted": float(n.size)}
    else:  # the window only
        first, top = ends.window_steps
        span = top - first + 1
        n_ranks = ends.window_ranks
        sat_out = {r: top - s for r, s in ends.last_step.items()}
        impact = 100.0 * sum(sat_out.values()) / (n_ranks * span)
        worst = min(ends.last_step, key=lambda r: (ends.last_step[r], r))
        early = sorted(ends.last_step)
        metrics = {"window_steps": float(span), "steps_sat_out": float(sat_out[worst]),
                   "n_ranks_counted": float(n_ranks)}
    shadow = ends.shadow_collectives
    metrics.update({"impact_pct": impact, "n_ranks": float(len(early)), "worst_rank": float(worst),
                    "shadow_collectives": float(shadow.get(worst, 0))})
    if ends.window is not None:
        metrics.update({"window": float(ends.window), "window_last_step": float(ends.window_steps[1]),
                        "rank_last_step": float(ends.last_step.get(worst, ends.window_steps[1]))})
    title, evidence, advice = _text(metrics, early, ends)
    host = hosts.get(worst) if len(early) == 1 else None
    return [Finding("uneven_steps", rules.severity(impact), worst if len(early) == 1 else None, host, title,
                    evidence, advice, metrics)]


def _text(m: dict[str, float], early: list[int], ends: LoopEnds) -> tuple[str, str, str]:
    who = _ranks_text(early)
    one = len(early) == 1
    worst = int(m["worst_rank"])
    others = "the other rank" if m["n_ranks_counted"] - len(early) == 1 else "the other ranks"
    if "max_steps" in m:
        few, most = int(m["min_steps"]), int(m["max_steps"])
        title = (f"Uneven loops: {who} ran {few} training steps, {others} {most}" if one else
                 f"Uneven loops: {who} ran fewer training steps than {others} (rank {worst}: {few}, against {most})")
        ev = (f"{_cap(who)}'s training loop ended after {few if one else 'as few as ' + str(few)} steps and the "
              f"longest after {most} (the ranks' status files): for the last {most - few} steps {others} trained "
              f"without {'it' if one else 'them'}")
        gain = (f"with the batches spread evenly the loop would take {m['mean_steps']:.0f} steps instead of {most} "
                f"({m['impact_pct']:.0f} % less)")
    else:
        last, top = int(m["rank_last_step"]), int(m["window_last_step"])
        title = (f"Uneven loops: {who}'s loop ended at step {last}, {top - last} steps before {others}' (step {top})"
                 if one else
                 f"Uneven loops: {who} ended their loop before {others} (rank {worst} at step {last}, the others at "
                 f"step {top})")
        ev = (f"in window {int(m['window'])} (steps {ends.window_steps[0]}-{top}) {who}'s last step is "
              f"{last if one else 'at most ' + str(last)} and the script's end cut "
              f"{'its shard' if one else 'their shards'} short, while {others} went on to step {top}")
        gain = f"in the recorded window {m['impact_pct']:.0f} % of the ranks' steps were sat out"
        ev = _cap(ev)
    n_sh = int(m["shadow_collectives"])
    if n_sh:
        ev += (f"; after its last step in the window rank {worst} still took part in {n_sh} of their collectives "
               "without a step of its own (DDP's or ZeroRedundancyOptimizer's Join shadowing them)")
    ev += (f". Impact: {m['impact_pct']:.0f} % of the ranks' loop was spent with a rank that had stopped (over "
           "ranks, the steps each did not run, over ranks x the most steps). Rule: a rank's loop ends before the "
           "others' (its status file, or a window cut short by the script's end).")
    advice = ("Give every rank the same number of batches: a DistributedSampler (it pads the ranks' shares to "
              "equal length; drop_last=True trims them instead), or, for an IterableDataset, split the stream "
              "evenly and stop every rank when the first runs out (all_reduce a 'done' flag each step). Join keeps "
              f"uneven inputs from hanging the job, not the other ranks from working alone: {gain}.")
    return title, ev, advice


def _cap(text: str) -> str:
    return text[0].upper() + text[1:]
