"""GPU time per rank: temporal breakdown (idle / compute / non-compute) and communication/computation overlap.

The same figures as Holistic Trace Analysis' ``get_temporal_breakdown`` and ``get_comm_comp_overlap``, computed on a
rank's device timeline (every stream of the rank together); definitions in docs/gpu-semantics.md:

* GPU events: kernels, memcpy and memset on a device stream (``device >= 0``).
* ``span``: end of the last GPU event − start of the first (HTA's "kernel_time").
* ``idle``: span − |union of GPU events| (no GPU event on any stream).
* ``compute``: |union of computation kernels| (category compute: not communication, not memcpy/memset/sync).
* ``non_compute``: span − compute − idle (only communication or memory ran). The three add up to the span.
* ``overlap_pct``: 100 · |comm ∩ compute| / |comm| with comm = union of communication kernels (NCCL/RCCL and the
  library kernels of :mod:`distprof.events.classify`), i.e. the share of communication time hidden under compute.

Selection: by default every GPU event of the rank in a recorded step (its ``step``: the step that *launched* it, see
:mod:`distprof.events.tables`; a kernel launched before the recording began, or after the last step, belongs to
none, as in HTA). ``steps=(lo, hi)`` keeps GPU events whose step is in ``lo..hi``; ``drop_last_step=True`` keeps
those launched before the rank's last recorded step (HTA's default trace filter, which drops the last
ProfilerStep).
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ..load.rankdata import filter_steps, read_rank

if TYPE_CHECKING:
    from ..types import RunSummary

logger = logging.getLogger(__name__)

from ..rank.gpu_time import rank_gpu_time

__all__ = ["gpu_time"]


def gpu_time(run: "RunSummary", *, steps: tuple[int, int] | None = None, drop_last_step: bool = False,
             whole_us: bool = False) -> list[dict[str, Any]]:
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


