"""Integer columns held in 32 bits where their values allow.

The cross-rank tables hold a column per event: at 1,024 LLM-shaped ranks the step graph has 1.5 M events, and each
int64 column of indices or ids (a rank-step row, a rank, a collective instance, a previous event) is 11.6 MB where
int32 holds the same values in half. Arithmetic that could pass 2**31 (keys made of two columns) widens first.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["index_dtype", "narrow", "narrow_concat"]

_LO, _HI = int(np.iinfo(np.int32).min), int(np.iinfo(np.int32).max)


def narrow(a: np.ndarray) -> np.ndarray:
    """The integers `a` as int32 when every value fits (a copy), else `a` itself; other dtypes, and integers already
    as narrow, unchanged."""
    a = np.asarray(a)
    if a.dtype.kind not in "iu" or (a.dtype.itemsize < 4 or a.dtype == np.int32):
        return a
    if a.size == 0 or (int(a.min()) >= _LO and int(a.max()) <= _HI):
        return a.astype(np.int32)
    return a


def narrow_concat(parts: Sequence[np.ndarray]) -> np.ndarray:
    """``narrow(np.concatenate([p.astype(np.int64) for p in parts]))`` for integer `parts`, made without the int64
    concatenation: straight into int32 when every value fits, else int64."""
    parts = [np.asarray(p) for p in parts]
    fits = all(p.size == 0 or (int(p.min()) >= _LO and int(p.max()) <= _HI) for p in parts)
    return np.concatenate(parts, dtype=np.int32 if fits else np.int64, casting="unsafe")


def index_dtype(n: int) -> type:
    """The dtype for indices 0..n−1 (and −1 for none): int32 where they fit, else int64."""
    return np.int32 if n <= _HI else np.int64
