from __future__ import annotations

import numpy as np
import pytest

from distprof.analysis.rank import intervals as iv


def _pairs(x: iv.Intervals) -> list[tuple[int, int]]:
    return list(zip(x.s.tolist(), x.e.tolist()))


def test_union_hand_computed():
    # [0,10) and [5,12) overlap, [12,15) touches, [20,20) is empty, [18,19) stands alone; unsorted input
    u = iv.union([12, 0, 20, 5, 18], [15, 10, 20, 12, 19])
    assert _pairs(u) == [(0, 15), (18, 19)]
    assert iv.measure(u) == 16


def test_nested_intervals_counted_once():
    # a parent op and two children (nested cpu_ops)
    u = iv.union([100, 110, 130], [200, 120, 150])
    assert _pairs(u) == [(100, 200)]


def test_intersect_subtract_hand_computed():
    a = iv.union([0, 20], [10, 30])
    b = iv.union([5, 25], [22, 40])
    assert _pairs(iv.intersect(a, b)) == [(5, 10), (20, 22), (25, 30)]
    assert _pairs(iv.subtract(a, b)) == [(0, 5), (22, 25)]
    assert _pairs(iv.subtract(b, a)) == [(10, 20), (30, 40)]
    assert _pairs(iv.intersect(a, iv.empty())) == []
    assert _pairs(iv.subtract(a, iv.empty())) == _pairs(a)


def test_boundaries_touching_between_sets():
    a = iv.union([0], [10])
    b = iv.union([10], [20])
    assert _pairs(iv.intersect(a, b)) == []
    assert _pairs(iv.union_all(a, b)) == [(0, 20)]
    assert _pairs(iv.subtract(a, b)) == [(0, 10)]


def test_measure_in_windows_hand_computed():
    a = iv.union([0, 20, 50], [10, 30, 60])
    got = iv.measure_in_windows(a, [0, 5, 25, 10, 100, 0], [100, 25, 55, 20, 200, 0])
    assert got.tolist() == [30, 10, 10, 0, 0, 0]


def test_large_epoch_timestamps():
    base = 1_790_857_026_000_000_000
    a = iv.union(base + np.array([0, 5]), base + np.array([10, 20]))
    assert _pairs(a) == [(base, base + 20)]
    assert iv.measure_in_windows(a, [base + 15], [base + 100]).tolist() == [5]


@pytest.mark.parametrize("seed", range(40))
def test_against_reference(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 30))
    m = int(rng.integers(0, 30))
    s1 = rng.integers(0, 200, n)
    e1 = s1 + rng.integers(0, 40, n)
    s2 = rng.integers(0, 200, m)
    e2 = s2 + rng.integers(0, 40, m)
    a, a_ref = iv.union(s1, e1), iv.union_ref(s1, e1)
    b, b_ref = iv.union(s2, e2), iv.union_ref(s2, e2)
    assert _pairs(a) == _pairs(a_ref)
    assert _pairs(b) == _pairs(b_ref)
    assert _pairs(iv.intersect(a, b)) == _pairs(iv.intersect_ref(a_ref, b_ref))
    assert _pairs(iv.subtract(a, b)) == _pairs(iv.subtract_ref(a_ref, b_ref))
    assert _pairs(iv.subtract(b, a)) == _pairs(iv.subtract_ref(b_ref, a_ref))
    ws = rng.integers(-10, 250, 7)
    we = ws + rng.integers(0, 80, 7)
    assert iv.measure_in_windows(a, ws, we).tolist() == iv.measure_in_windows_ref(a_ref, ws, we).tolist()
    # inclusion–exclusion
    assert iv.measure(iv.union_all(a, b)) == iv.measure(a) + iv.measure(b) - iv.measure(iv.intersect(a, b))


def test_vectorised_is_fast_enough():
    rng = np.random.default_rng(0)
    s = np.sort(rng.integers(0, 10**12, 500_000))
    e = s + rng.integers(0, 10**6, s.size)
    u = iv.union(s, e)
    v = iv.union(s + 500, e + 700)
    assert iv.measure(iv.intersect(u, v)) <= iv.measure(u)
