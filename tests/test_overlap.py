"""Overlap (HTA definition: |comm ∩ compute| / |comm|) and exposed communication, hand-computed."""

from __future__ import annotations

import pytest
from test_breakdown import ddp_run, one_rank_cpu_step

from distprof.analysis.summarize.engine import summarize_merged
from distprof.analysis.cross.overlap import overlap_by_rank, overlap_by_step


def test_overlap_hand_computed_cpu():
    (o,) = overlap_by_rank(summarize_merged(one_rank_cpu_step()))
    # K = [55,85) = 30 ms, K ∩ C = [55,60) = 5 ms, exposed = [60,85) = 25 ms, step 100 ms
    assert o.mode == "cpu"
    assert (o.comm_ms, o.overlapped_ms, o.exposed_comm_ms) == pytest.approx((30, 5, 25))
    assert o.overlap_pct == pytest.approx(100 * 5 / 30)
    assert o.exposed_pct == pytest.approx(25.0)


def test_ddp_two_buckets_hand_computed():
    # per step: forward [0,10); bucket 1: mm [10,15), enqueue [15,15.06), gloo [15.02,17.02);
    # bucket 2: mm [15.06,20.06), enqueue [20.06,20.12), gloo [20.08,22.08); optimizer [22.09,23.09).
    # K = 4 ms; K ∩ C = [15.06,17.02) = 1.96 ms; exposed = [15.02,15.06) + [20.08,22.08) = 2.04 ms
    rows = overlap_by_rank(summarize_merged(ddp_run(2, n_steps=1)))
    for o in rows:
        assert o.comm_ms == pytest.approx(4.0)
        assert o.overlapped_ms == pytest.approx(1.96)
        assert o.exposed_comm_ms == pytest.approx(2.04)
        assert o.overlap_pct == pytest.approx(49.0)


def test_bucket_size_moves_overlap():
    # one big bucket: its all-reduce starts after the whole backward -> nothing to overlap with
    one = overlap_by_rank(summarize_merged(ddp_run(2, n_steps=2, buckets=1)))
    many = overlap_by_rank(summarize_merged(ddp_run(2, n_steps=2, buckets=4)))
    assert all(o.overlap_pct == pytest.approx(0.0) for o in one)
    assert all(m.overlap_pct > 50 for m in many)


def test_waiting_for_a_straggler_is_exposed():
    rows = {o.rank: o for o in overlap_by_rank(summarize_merged(ddp_run(4, n_steps=2, late_rank=3, late_ms=20)))}
    # fast ranks: K = [15.02, 42.08) (both all-reduces wait 20 ms for rank 3); the main thread is in a
    # non-communication op only during the second backward mm [15.06, 20.06) -> exposed 27.06 - 5 = 22.06
    for r in (0, 1, 2):
        assert rows[r].exposed_comm_ms_per_step == pytest.approx(22.06)
    assert rows[3].exposed_comm_ms_per_step == pytest.approx(2.04)


def test_no_communication_gives_none():
    run = one_rank_cpu_step()
    run.comms = {k: v[:0] for k, v in run.comms.items()}
    (o,) = overlap_by_rank(summarize_merged(run))
    assert o.comm_ms == 0 and o.overlap_pct is None

    per_step = overlap_by_step(summarize_merged(run).steps)
    assert per_step["overlap_pct"].size == 1 and per_step["overlap_pct"][0] != per_step["overlap_pct"][0]  # NaN
