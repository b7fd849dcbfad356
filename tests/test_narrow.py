"""narrow(): integer columns in 32 bits only where every value fits, the values unchanged."""

import numpy as np
import pytest

from distprof.analysis.narrow import narrow

I32 = np.iinfo(np.int32)


@pytest.mark.parametrize("values, dtype, want", [
    ([0, 1, -1], np.int64, np.int32),
    ([I32.min, I32.max], np.int64, np.int32),
    ([I32.max + 1], np.int64, np.int64),  # one value too wide: the column stays as it is
    ([I32.min - 1, 0], np.int64, np.int64),
    ([], np.int64, np.int32),
    ([7], np.uint32, np.int32),
    ([2**32 - 1], np.uint32, np.uint32),
    ([2**63 - 1], np.uint64, np.uint64),
    ([3], np.int16, np.int16),  # already narrower: unchanged
    ([3], np.int32, np.int32),
    ([1.5], np.float64, np.float64),  # not integers: unchanged
])
def test_narrow_table(values, dtype, want):
    a = np.array(values, dtype)
    got = narrow(a)
    assert got.dtype == want
    assert got.tolist() == a.tolist()


@pytest.mark.parametrize("n, want", [(0, np.int32), (I32.max, np.int32), (I32.max + 1, np.int64)])
def test_index_dtype_table(n, want):
    """Indices 0..n−1 (and −1) in 32 bits exactly while n − 1 fits with room for n itself (a count or an end)."""
    from distprof.analysis.narrow import index_dtype

    assert index_dtype(n) is want


@pytest.mark.parametrize("parts, want", [
    ([np.array([0, 5], np.int32), np.array([7], np.int64), np.array([], np.int64)], np.int32),
    ([np.full(3, -1, np.int8), np.arange(2)], np.int32),  # a small filler cast as the column is made
    ([np.array([I32.max + 1], np.int64), np.array([1], np.int32)], np.int64),  # one value too wide: int64
    ([np.array([], np.int64)], np.int32),
    ([np.array([2**32 - 1], np.uint32), np.array([0], np.int32)], np.int64),
])
def test_narrow_concat_is_narrow_of_the_int64_concatenation(parts, want):
    from distprof.analysis.narrow import narrow_concat

    got = narrow_concat(parts)
    ref = narrow(np.concatenate([p.astype(np.int64) for p in parts]))
    assert got.dtype == want == ref.dtype
    assert got.tolist() == ref.tolist()
