"""What drives the optimizer step, read once from the call stack at the primary optimizer's step.

DeepSpeed's ZeRO engine calls the torch optimizer it wraps from ``DeepSpeedEngine.step``; at that optimizer's step
pre-hook the engine is a caller's ``self``. Its ZeRO stage and communication settings are put on the engine's
data-parallel group (``groups.tag``: the group's entry in each shard's ``process_groups`` gets a ``zero`` object:
``stage``, ``overlap_comm``, ``contiguous_gradients``, ``reduce_bucket_size``, ``allgather_bucket_size``,
``prefetch_bucket_size``), where the analysis names the style and fits its advice to those settings. A trace alone
cannot tell ZeRO-1 from ZeRO-2 (both all-reduce the gradients and all-gather the updated parameters), so the engine is
asked. Looking costs a walk of the caller frames (microseconds), a few times per run at most.
"""

from __future__ import annotations

import logging
from types import FrameType
from typing import Any

from . import groups

log = logging.getLogger(__name__)

#: Caller frames looked at from the optimizer's step hook.
MAX_FRAMES = 40
#: DeepSpeed engine methods read for the ``zero`` tag (each is optional: an older or newer engine may lack one).
_ZERO_SETTINGS = {"overlap_comm": "zero_overlap_comm", "contiguous_gradients": "zero_contiguous_gradients",
                  "reduce_bucket_size": "zero_reduce_bucket_size",
                  "allgather_bucket_size": "zero_allgather_bucket_size",
                  "prefetch_bucket_size": "zero_prefetch_bucket_size"}


def probe(frame: FrameType | None) -> bool:
    """Look up the callers of the optimizer step for a framework distprof knows (DeepSpeed). True when one was found
    and noted. Never raises."""
    try:
        engine = _deepspeed_engine(frame)
        if engine is None:
            return False
        return _note_deepspeed(engine)
    except Exception as e:  # noqa: BLE001 -- metadata only: the step goes on
        log.debug("distprof: reading the framework around the optimizer step failed: %s", e)
        return False


def _deepspeed_engine(frame: FrameType | None) -> Any:
    f, n = frame, 0
    while f is not None and n < MAX_FRAMES:
        if str(f.f_globals.get("__name__", "")).startswith("deepspeed."):
            obj = f.f_locals.get("self")
            if obj is not None and callable(getattr(obj, "zero_optimization_stage", None)):
                return obj
        f, n = f.f_back, n + 1
    return None


def _note_deepspeed(engine: Any) -> bool:
    stage = int(engine.zero_optimization_stage())
    if stage <= 0:
        return False
    tag: dict[str, Any] = {"framework": "deepspeed", "stage": stage}
    for key, method in _ZERO_SETTINGS.items():
        fn = getattr(engine, method, None)
        try:
            value = fn() if callable(fn) else None
        except Exception:  # noqa: BLE001 -- a setting the engine cannot give is left out
            value = None
        if isinstance(value, (bool, int, float)):
            tag[key] = value
    pg = getattr(getattr(engine, "optimizer", None), "dp_process_group", None)
    if pg is None:
        pg = getattr(engine, "data_parallel_group", None)
    return groups.tag(pg, "zero", tag)
