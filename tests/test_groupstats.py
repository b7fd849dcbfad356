"""groupstats.unique_rows: the distinct rows of integer columns, as np.unique(axis=0) gives them, from one 1-D sort."""

import numpy as np
import pytest

from distprof.analysis.groupstats import unique_rows


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
