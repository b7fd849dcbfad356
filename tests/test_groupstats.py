"""groupstats.unique_rows: the distinct rows of integer columns, as np.unique(axis=0) gives them, from one 1-D sort;
groupstats.sort_within: each group's rows by value, in np.lexsort's order, from two unstable sorts."""

import numpy as np
import pytest

from distprof.analysis.groupstats import sort_within, unique_inverse, unique_rows


@pytest.mark.parametrize("seed", range(20))
def test_unique_rows_is_numpys_unique_of_rows(seed):
    rng = np.random.default_rng(seed)
    n, k = int(rng.integers(1, 400)), int(rng.integers(1, 4))
    cols = [rng.integers(-5 if j else 0, int(rng.integers(1, 60)), n) for j in range(k)]
    uk, inv = unique_rows(cols)
    ref, ref_inv = np.unique(np.stack(cols, axis=1), axis=0, return_inverse=True)
    assert [list(c) for c in uk] == [list(ref[:, j]) for j in range(k)]
    assert list(inv) == list(ref_inv.reshape(-1))


def test_columns_too_wide_to_pack_take_numpys_path():
    big = np.array([1 << 40, 0, 1 << 40, 5], np.int64)
    other = np.array([3, 1 << 30, 3, -(1 << 30)], np.int64)
    uk, inv = unique_rows((big, other, big))
    assert [list(c) for c in uk] == [[0, 5, 1 << 40], [1 << 30, -(1 << 30), 3], [0, 5, 1 << 40]]
    assert list(inv) == [2, 0, 2, 1]


def test_no_rows():
    uk, inv = unique_rows((np.zeros(0, np.int64), np.zeros(0, np.int64)))
    assert len(uk) == 2 and uk[0].size == 0 and inv.size == 0


def _values(rng, kind, n):
    """Values of one kind, with many ties: small ints, rounded floats with NaNs, wide ints, signed zeros."""
    if kind == "small":
        return rng.integers(0, 5, n)
    if kind == "nan":
        v = rng.normal(size=n).round(1)
        v[rng.random(n) < 0.2] = np.nan
        return v
    if kind == "wide":
        return rng.integers(-(1 << 40), 1 << 40, n)
    return np.where(rng.random(n) < 0.5, -0.0, 0.0)


@pytest.mark.parametrize("later_first", [False, True])
@pytest.mark.parametrize("kind", ["small", "nan", "wide", "zeros"])
@pytest.mark.parametrize("seed", range(8))
def test_sort_within_is_lexsorts_order(seed, kind, later_first):
    """By group, then value (NaN last); equal values in index order, or reversed with later_first — the order
    np.lexsort gives, ties included (the straggler analysis takes the first or the last row of a tie)."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 500))
    g = rng.integers(-5, int(rng.integers(1, 30)), n)
    v = _values(rng, kind, n)
    ref = np.lexsort((-np.arange(n), v, g)) if later_first else np.lexsort((v, g))
    assert sort_within(g, v, later_first=later_first).tolist() == ref.tolist()


def test_sort_within_edge_cases():
    assert sort_within(np.zeros(0, np.int64), np.zeros(0)).size == 0
    assert sort_within(np.array([3]), np.array([1.0])).tolist() == [0]
    # a key too wide for an int64 (groups spread over 2^61, many distinct values): np.lexsort itself
    g = np.array([1 << 61, 0, 1 << 61, 0], np.int64)
    v = np.array([2.0, 1.0, 0.5, 1.0])
    assert sort_within(g, v).tolist() == [1, 3, 2, 0]
    assert sort_within(g, v, later_first=True).tolist() == [3, 1, 2, 0]
    # float groups are not packed: np.lexsort's order all the same
    assert sort_within(np.array([1.5, 0.5, 1.5]), np.array([1, 1, 0])).tolist() == [1, 2, 0]


@pytest.mark.parametrize("dtypes", [(np.int32, np.uint32, np.int64), (np.uint64, np.int8, np.bool_),
                                    (np.float64, np.int16, np.uint8)])
def test_unique_rows_of_mixed_dtypes_is_np_unique(dtypes):
    """The key is built in place from columns of any integer dtype (and integral floats): the rows and the inverse
    are np.unique's over the columns as int64."""
    rng = np.random.default_rng(5)
    cols = [rng.integers(0, 2 if t is np.bool_ else 50, 300).astype(t) for t in dtypes]
    got, inv = unique_rows(cols)
    want, winv = np.unique(np.stack([c.astype(np.int64) for c in cols], 1), axis=0, return_inverse=True)
    assert all(np.array_equal(g, want[:, j]) for j, g in enumerate(got))
    assert np.array_equal(inv, winv.reshape(-1))


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.uint32, np.int8, bool])
@pytest.mark.parametrize("size", [0, 1, 7, 5_000])
@pytest.mark.parametrize("narrow", [False, True])
def test_unique_inverse_is_np_unique(dtype, size, narrow):
    rng = np.random.default_rng(size)
    hi = 2 if dtype is bool else 100
    key = rng.integers(-50 if np.dtype(dtype).kind == "i" else 0, hi, size).astype(dtype)
    u, inv = unique_inverse(key, narrow=narrow)
    want_u, want_inv = np.unique(key, return_inverse=True)
    assert u.dtype == want_u.dtype and np.array_equal(u, want_u)
    assert np.array_equal(inv, want_inv.reshape(-1))
    assert inv.dtype == (np.int32 if narrow and size else np.int64)  # int64 unless asked: callers multiply it


def test_unique_inverse_of_floats_is_np_unique():
    key = np.array([2.0, np.nan, 1.0, 2.0, np.nan])
    u, inv = unique_inverse(key)
    want_u, want_inv = np.unique(key, return_inverse=True)
    assert np.array_equal(u, want_u, equal_nan=True) and np.array_equal(inv, want_inv.reshape(-1))


@pytest.mark.parametrize("later_first", [False, True])
@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.uint64, np.uint8, np.bool_])
def test_sort_within_integer_values_keyed_directly(dtype, later_first):
    """Integer values are packed into the key as they are (no ranking sort): nanosecond timestamps, negative and
    unsigned values, ties and all, give np.lexsort's order."""
    rng = np.random.default_rng(3)
    n = 2_000
    g = rng.integers(0, 40, n).astype(np.int32)
    hi = 2 if dtype is np.bool_ else 100
    v = rng.integers(0, hi, n).astype(dtype)
    if np.dtype(dtype).itemsize == 8:
        v = v + dtype(1_700_000_000_000_000_000)  # epoch ns: the key stays in range
    ref = np.lexsort((-np.arange(n), v, g)) if later_first else np.lexsort((v, g))
    assert sort_within(g, v, later_first=later_first).tolist() == ref.tolist()


def test_sort_within_integer_values_too_wide_for_a_direct_key():
    """Values spread over more than the key holds beside the groups, or beyond ±2^62: still np.lexsort's order."""
    v = np.array([1 << 62, -(1 << 62), 5, 1 << 62, 7], np.int64)
    g = np.array([1, 1, 0, 0, 1], np.int64)
    assert sort_within(g, v).tolist() == np.lexsort((v, g)).tolist()
    u = np.array([(1 << 64) - 1, 0, 1 << 63, 3], np.uint64)
    gu = np.array([0, 0, 0, 1])
    assert sort_within(gu, u).tolist() == np.lexsort((u, gu)).tolist()


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.uint64, np.int8])
@pytest.mark.parametrize("spread", ["dense", "sparse", "huge"])
@pytest.mark.parametrize("narrow", [False, True])
def test_unique_inverse_counted_or_sorted_is_np_unique(dtype, spread, narrow):
    """Keys whose span is small beside their count are counted, wider ones sorted, values beyond ±2^62 too: every
    way np.unique's values (its dtype) and inverse."""
    rng = np.random.default_rng(11)
    info = np.iinfo(dtype)
    hi = {"dense": 300, "sparse": 1 << 30, "huge": info.max}[spread]
    hi = min(hi, int(info.max))
    lo = int(info.min) if spread == "huge" else max(int(info.min), -hi if info.min < 0 else 0)
    key = rng.integers(lo, hi, 3_000, dtype=dtype, endpoint=True)
    u, inv = unique_inverse(key, narrow=narrow)
    want_u, want_inv = np.unique(key, return_inverse=True)
    assert u.dtype == want_u.dtype and np.array_equal(u, want_u)
    assert np.array_equal(inv, want_inv.reshape(-1))
    assert inv.dtype == (np.int32 if narrow else np.int64)
