"""Self work: an event's own work less that of the events nested in it (analysis/rank/selftime.py)."""

from __future__ import annotations

import numpy as np

from distprof.analysis.rank import intervals as iv
from distprof.analysis.rank.selftime import own_work_ns, self_work_ns


def _self(spans, track=None, own=None):
    ts = np.array([a for a, _ in spans], np.int64)
    dur = np.array([b - a for a, b in spans], np.int64)
    track = np.zeros(len(spans), np.int64) if track is None else np.asarray(track, np.int64)
    return self_work_ns(ts, dur, track, dur if own is None else np.asarray(own, np.int64)).tolist()


def test_nested_events_hold_their_children_once():
    # step [0,100): forward [5,45) holding linear [10,40) holding addmm [15,35); optimizer [50,95) holding add_ [60,70)
    spans = [(0, 100), (50, 95), (5, 45), (10, 40), (15, 35), (60, 70)]
    assert _self(spans) == [100 - 40 - 45, 45 - 10, 40 - 30, 30 - 20, 20, 10]


def test_tracks_are_apart_and_siblings_that_touch_are_siblings():
    spans = [(0, 100), (0, 50), (50, 100), (10, 20)]
    # (10, 20) is on another track: it is nobody's child there
    assert _self(spans, track=[0, 0, 0, 1]) == [0, 50, 50, 10]


def test_a_child_outlasting_its_parent_counts_for_its_part_inside():
    # the optimizer step [40,80) cut by the step boundary at 42 (a trace from before the fix): step 5 [0,42) holds
    # 2 of its 40 ns; step 6 [42,90) is nested in it by start
    spans = [(0, 42), (40, 80), (42, 90)]
    out = _self(spans)
    assert out[0] == 42 - 2 and all(v >= 0 for v in out)


def test_zero_duration_events_hold_nothing():
    assert _self([(0, 10), (5, 5), (5, 8)]) == [7, 0, 3]


def test_waits_for_communication_are_no_work_and_are_not_taken_twice():
    # main thread: forward [0,100) holding a c10d call [40,90) in which it waited [50,90)
    ts, dur = np.array([0, 40], np.int64), np.array([100, 50], np.int64)
    own = own_work_ns(ts, dur, np.array([True, True]), iv.union([50], [90]))
    assert own.tolist() == [60, 10]
    assert self_work_ns(ts, dur, np.zeros(2, np.int64), own).tolist() == [50, 10]
    # off the main thread, nothing is a wait
    assert own_work_ns(ts, dur, np.array([False, False]), iv.union([50], [90])).tolist() == [100, 50]


def _reference(spans, track):
    """Pure-Python stack walk over properly nested events."""
    out = [b - a for a, b in spans]
    order = sorted(range(len(spans)), key=lambda i: (track[i], spans[i][0], -spans[i][1]))
    stack: list[int] = []
    last_track = None
    for i in order:
        if track[i] != last_track:
            stack, last_track = [], track[i]
        while stack and spans[stack[-1]][1] <= spans[i][0]:
            stack.pop()
        if stack:
            out[stack[-1]] -= spans[i][1] - spans[i][0]
        stack.append(i)
    return out


def _random_tree(rng, lo, hi, depth, out):
    t = lo
    while t < hi and len(out) < 4000:
        a = t + int(rng.integers(0, 5))
        b = min(hi, a + int(rng.integers(1, 60)))
        if a >= b:
            break
        out.append((a, b))
        if depth < 5 and b - a > 4:
            _random_tree(rng, a + 1, b - 1, depth + 1, out)
        t = b + int(rng.integers(0, 3))


def test_matches_a_stack_walk_on_random_nested_traces():
    rng = np.random.default_rng(3)
    spans, track = [], []
    for k in range(3):
        part: list[tuple[int, int]] = []
        _random_tree(rng, 0, 5000, 0, part)
        spans += part
        track += [k] * len(part)
    assert len(spans) > 500
    assert _self(spans, track=track) == _reference(spans, track)
