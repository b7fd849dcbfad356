"""The timeline's budget: what a cut keeps of a selection too big for one file, and the flags for the rest.

Keep the first whole steps (all ranks) that fit; else the first step with the first ranks that fit; else, in one
rank's step, drop the shortest events (memory samples are thinned evenly when they alone would fill half the budget).
:class:`Cut` says what was kept and the selections that show the rest; :func:`decide_cut` is the pure decision on the
per-(rank, step) costs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from ..analysis.names import rank_ranges

__all__ = ["Cut", "decide_cut", "format_ranges"]


@dataclass
class Cut:
    """What the budget removed from the selection, and how to get the rest."""

    budget: int
    needed: int  # trace events the whole selection needs (upper bound: flows counted as 2 per collective member)
    stage: str  # "none", "steps", "ranks", "short_events"
    steps_selected: list[int] = field(default_factory=list)
    steps_kept: list[int] = field(default_factory=list)
    ranks_selected: list[int] = field(default_factory=list)
    ranks_kept: list[int] = field(default_factory=list)
    outside_steps_dropped: int = 0  # events/samples outside every step, dropped with the cut
    short_dropped: int = 0  # events dropped as the shortest
    min_dur_ns: int = 0  # shortest event kept when short events were dropped
    memory_stride: int = 1  # every k-th memory sample kept
    #: selections that show the rest, each {"steps": (a, b) | None, "ranks": [..] | None}; all of it with
    #: ``max_events = needed``.
    rest: list[dict[str, Any]] = field(default_factory=list)

    @property
    def happened(self) -> bool:
        return self.stage != "none"

    def describe(self) -> str:
        """One plain sentence on what was cut (empty when nothing was)."""
        if not self.happened:
            return ""
        parts = [f"the selection needs ~{self.needed:,} trace events, over the budget of {self.budget:,}"]
        if self.stage == "steps":
            parts.append(f"kept steps {_span(self.steps_kept)} ({len(self.steps_kept)} of {len(self.steps_selected)}"
                         f" steps, all {len(self.ranks_kept)} ranks)")
        else:
            parts.append(f"kept step {_span(self.steps_kept)} of {_span(self.steps_selected)}" if self.steps_kept
                         else "kept no step boundaries (the run has no steps)")
            parts[-1] += f" on rank(s) {format_ranges(self.ranks_kept)} of {format_ranges(self.ranks_selected)}"
        if self.outside_steps_dropped:
            parts.append(f"dropped {self.outside_steps_dropped:,} events/samples outside every step")
        if self.short_dropped:
            parts.append(f"dropped the {self.short_dropped:,} shortest events (kept those >= "
                         f"{self.min_dur_ns / 1e3:g} µs)")
        if self.memory_stride > 1:
            parts.append(f"kept 1 memory sample in {self.memory_stride}")
        return "; ".join(parts)

    def flags(self, selection: dict[str, Any]) -> tuple[list[str], str]:
        """Command-line flags (after ``distprof timeline RUN_DIR -o FILE``) for each part of the rest, and for all of
        the selection in one file. `selection` is :attr:`TimelinePlan.selection`."""

        def fmt(ranks, steps, max_events) -> str:
            out = []
            if selection.get("windows"):
                out += ["--window", format_ranges(selection["windows"])]
            if ranks:
                out += ["--ranks", format_ranges(ranks)]
            if steps:
                out += ["--steps", f"{steps[0]}:{steps[1]}"]
            out += ["--max-events", str(max_events)]
            if selection.get("launch_flows"):
                out.append("--launch-flows")
            return " ".join(out)

        rest = [fmt(r.get("ranks") or selection.get("ranks"), r.get("steps") or selection.get("steps"), self.budget)
                for r in self.rest]
        return rest, fmt(selection.get("ranks"), selection.get("steps"), self.needed)

    def to_dict(self, selection: dict[str, Any] | None = None) -> dict[str, Any]:
        rest_flags, all_flags = self.flags(selection or {})
        return {
            "stage": self.stage, "budget": self.budget, "needed": self.needed, "text": self.describe(),
            "steps_selected": _span(self.steps_selected), "steps_kept": _span(self.steps_kept),
            "ranks_selected": format_ranges(self.ranks_selected), "ranks_kept": format_ranges(self.ranks_kept),
            "outside_steps_dropped": self.outside_steps_dropped, "short_dropped": self.short_dropped,
            "min_dur_ns": self.min_dur_ns, "memory_stride": self.memory_stride,
            "rest_flags": rest_flags, "all_flags": all_flags,
        }


def decide_cut(cut: Cut, cost: np.ndarray, units: list[int], sel_ranks: list[int], room: int) -> None:
    """Shrink the selection to `room` trace events: whole steps, then ranks, then the shortest events."""
    in_cost = cost[:, 1:]
    col = in_cost.sum(0)
    k = int(np.searchsorted(np.cumsum(col), room, side="right")) if len(units) else 0
    if k >= 1:
        cut.stage = "steps"
        cut.steps_kept = units[:k]
        cut.ranks_kept = list(sel_ranks)
        cut.rest = [{"steps": c, "ranks": None} for c in _chunks(units[k:], col[k:], room)]
    else:
        cut.steps_kept = units[:1]
        per_rank = in_cost[:, 0] if len(units) else cost[:, 0]
        j = int(np.searchsorted(np.cumsum(per_rank), room, side="right"))
        cut.stage = "ranks" if j >= 1 else "short_events"
        j = max(j, 1)
        cut.ranks_kept = list(sel_ranks[:j])
        rest_ranks = sel_ranks[j:]
        step1 = (units[0], units[0]) if units else None
        for chunk in _rank_chunks(rest_ranks, per_rank[j:], room):
            cut.rest.append({"steps": step1, "ranks": chunk})
        if len(units) > 1:
            cut.rest += [{"steps": c, "ranks": None} for c in _chunks(units[1:], col[1:], room)]
    cut.outside_steps_dropped = int(cost[:, 0].sum()) if units else 0


def _chunks(units: Sequence[int], col: np.ndarray, room: int) -> list[tuple[int, int]]:
    """Consecutive step ranges whose cost fits `room` (a step alone over it is a range of its own)."""
    out, start, acc, prev = [], None, 0, None
    for u, c in zip(units, col.tolist()):
        if start is not None and acc + c > room:
            out.append((start, prev))
            start, acc = None, 0
        if start is None:
            start = u
        acc += c
        prev = u
    if start is not None:
        out.append((start, prev))
    return out


def _rank_chunks(ranks: Sequence[int], cost: np.ndarray, room: int) -> list[list[int]]:
    out, cur, acc = [], [], 0
    for r, c in zip(ranks, cost.tolist()):
        if cur and acc + c > room:
            out.append(cur)
            cur, acc = [], 0
        cur.append(int(r))
        acc += c
    if cur:
        out.append(cur)
    return out


def format_ranges(values: Sequence[int]) -> str:
    """[0, 1, 2, 5] -> "0-2,5" (the --ranks syntax)."""
    return rank_ranges(values, sep=",")


def _span(steps: Sequence[int]) -> str:
    if not steps:
        return ""
    return str(steps[0]) if len(steps) == 1 else f"{steps[0]}..{steps[-1]}"
