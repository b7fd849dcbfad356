"""A process group's ranks as a shard stores them: a list, or three integers where they form a range.

Every shard lists each group its rank belongs to, the world group included, so a list per group makes every
shard grow with the job (16,384 ranks: 118 kB of root attributes per shard, parsed and checked for every shard of
the run, ranks × ranks in all). Since schema 2.1 the writer stores a group whose ranks are an increasing
arithmetic run — the world group, a mesh's rows and columns — as ``"ranks_range": [start, stop, step]`` (Python's
``range``) instead of ``"ranks"``; the reader turns it back into the list, one shared list per distinct range
(``validate._check_process_groups``). Shorter lists stay lists. A reader before 2.1 sees such a group without its
ranks and falls back to the ranks seen in it.
"""

from __future__ import annotations

from typing import Any

__all__ = ["RANGE_KEY", "RANGE_MIN", "compact_groups", "range_of"]

#: The group key of the range form.
RANGE_KEY = "ranks_range"
#: Lists shorter than this stay lists (a range saves nothing there).
RANGE_MIN = 16


def range_of(ranks: Any) -> list[int] | None:
    """[start, stop, step] when `ranks` (a list of ints) is ``list(range(start, stop, step))`` with step ≥ 1 and at
    least RANGE_MIN ranks; None otherwise."""
    if not isinstance(ranks, list) or len(ranks) < RANGE_MIN or not all(type(r) is int for r in ranks):
        return None
    start, step = ranks[0], ranks[1] - ranks[0]
    if step < 1:
        return None
    stop = ranks[-1] + 1
    return [start, stop, step] if ranks == list(range(start, stop, step)) else None


def compact_groups(groups: Any) -> Any:
    """The `groups` (a shard's ``process_groups``) as the shard stores them: each one whose ranks form a range with
    ``ranks_range`` instead of ``ranks``; anything else as it is."""
    if not isinstance(groups, list):
        return groups
    out = []
    for g in groups:
        rng = range_of(g.get("ranks")) if isinstance(g, dict) else None
        if rng is not None:
            g = {**{k: v for k, v in g.items() if k != "ranks"}, RANGE_KEY: rng}
        out.append(g)
    return out
