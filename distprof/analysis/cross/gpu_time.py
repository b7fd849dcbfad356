"""GPU time of every device rank of a run: each rank's temporal breakdown and overlap (``rank.gpu_time``), taken
from the summaries, or computed again from each rank's events for another selection (steps, HTA's last-step drop,
HTA's whole-µs rounding), one rank at a time.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import TYPE_CHECKING

from ..load.rankdata import filter_steps, read_rank
from ..rank.gpu_time import GpuTime, rank_gpu_time

if TYPE_CHECKING:
    from ..types import RunSummary

logger = logging.getLogger(__name__)

__all__ = ["gpu_time"]


def gpu_time(run: "RunSummary", *, steps: tuple[int, int] | None = None, drop_last_step: bool = False,
             whole_us: bool = False) -> list[GpuTime]:
    """:func:`rank_gpu_time` of every device rank of a summarised run. The defaults come from the summaries; other
    selections read each device rank's events again, one rank at a time."""
    if steps is None and not drop_last_step and not whole_us:
        return [s.gpu_time for _, s in sorted(run.ranks.items()) if s.gpu_time is not None]
    out = []
    for r in sorted(r for r, s in run.ranks.items() if s.device_rank):
        rd = read_rank(run.catalog, r)
        if run.steps_selection is not None:
            rd = replace(rd, **filter_steps({t: rd.table(t) for t in ("events", "comms", "steps", "memory", "threads",
                                                                        "cuda_memory", "cuda_memory_blocks")},
                                            *run.steps_selection))
        g = rank_gpu_time(rd, steps=steps, drop_last_step=drop_last_step, whole_us=whole_us)
        if g is not None:
            out.append(g)
    return out


