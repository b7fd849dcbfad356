"""What each name of a string table is, for the per-rank analyses: one bit per kind of name, computed once per
distinct name in the process (every rank of a run shares most of its names; a Python call per name and rank would
cost more than the rank's numpy work).

    flags = name_flags(rd.names)           # uint8 per name
    is_step = (flags & STEP).astype(bool)[events["name_id"]]

The predicates themselves live in ``analysis/names.py`` (``STEP_PREFIX``, ``DATALOADER_PREFIX``, ``is_sync_call``,
``is_user_annotation_name``), which depends on nothing.
"""

from __future__ import annotations

import numpy as np

from ..names import (
    DATALOADER_PREFIX,
    STEP_PREFIX,
    is_sync_call,
    is_user_annotation_name,
)

__all__ = ["name_flags", "STEP", "DATALOADER", "SYNC_CALL", "USER_ANNOTATION", "has"]

STEP, DATALOADER, SYNC_CALL, USER_ANNOTATION = 1, 2, 4, 8
#: Distinct names remembered (a bound, so that a process analysing many runs does not grow without end).
_MAX_CACHED = 1 << 20
_cache: dict[str, int] = {}


def _classify(name: str) -> int:
    f = 0
    if name.startswith(STEP_PREFIX):
        f |= STEP
    if name.startswith(DATALOADER_PREFIX):
        f |= DATALOADER
    if is_sync_call(name):
        f |= SYNC_CALL
    if is_user_annotation_name(name):
        f |= USER_ANNOTATION
    return f


def name_flags(names: np.ndarray) -> np.ndarray:
    """The flags of every name of a string table (uint8, same length)."""
    get = _cache.get
    out = np.empty(len(names), np.uint8)
    for i, n in enumerate(names.tolist() if isinstance(names, np.ndarray) else names):
        f = get(n)
        if f is None:
            f = _classify(str(n))
            if len(_cache) >= _MAX_CACHED:
                _cache.clear()
            _cache[n] = f
        out[i] = f
    return out


def has(flags: np.ndarray, bit: int) -> np.ndarray:
    """Boolean mask of the names with `bit` set."""
    return (flags & bit).astype(bool)
