"""Point-to-point transfers: the call join in build_tables, and sender -> receiver pairing (exact and by order)."""

from __future__ import annotations

import numpy as np

from distprof.analysis.align.p2p import match_p2p
from distprof.events.p2p import P2PCalls, join

MS = 1_000_000


def rows(*items):
    """items: (rank, is_recv, peer, start_ms, end_ms, seq) -> the p2p rows table (window 0, group 0, step 0)."""
    cols = list(zip(*items))
    n = len(items)
    return {"rank": np.array(cols[0]), "is_recv": np.array(cols[1], bool), "peer": np.array(cols[2]),
            "start_ns": (np.array(cols[3]) * MS).astype(np.int64), "end_ns": (np.array(cols[4]) * MS).astype(np.int64),
            "p2p_seq": np.array(cols[5]), "window": np.zeros(n, np.int64), "pg": np.zeros(n, np.int64),
            "step": np.zeros(n, np.int64), "bytes": np.full(n, 64, np.int64)}


def test_join_takes_the_latest_call_on_the_thread_and_direction():
    calls = P2PCalls.from_rows([(100, 7, False, 1, "0", 0), (200, 7, True, 1, "0", 0), (300, 7, False, 1, "0", 1),
                                (150, 8, False, 3, "5", 0)])
    # events: a send at 120 and 310 on thread 7, a receive at 250 on thread 7, a send at 160 on thread 8, a send
    # before any call
    idx = join(calls, np.array([120, 310, 250, 160, 50]), np.array([7, 7, 7, 8, 7]),
               np.array([False, False, True, False, False]))
    assert idx.tolist() == [0, 2, 1, 3, -1]


def test_numbered_transfers_pair_exactly_across_window_edges():
    # rank 1 recorded receives 1..3, rank 0 sends 0..2: only 1 and 2 pair, whatever the times say
    r = rows((0, False, 1, 0, 0.1, 0), (0, False, 1, 10, 10.1, 1), (0, False, 1, 20, 20.1, 2),
             (1, True, 0, 5, 10.2, 1), (1, True, 0, 15, 20.2, 2), (1, True, 0, 25, 30.2, 3))
    p = match_p2p(r, {})
    assert p.src.tolist() == [0, 0] and p.dst.tolist() == [1, 1]
    assert (p.send_start_ns // MS).tolist() == [10, 20]
    assert (p.recv_wait_ns / MS).tolist() == [5.0, 5.0]  # posted at 5 and 15, sent at 10 and 20
    assert p.n_edge == 2 and p.n_unmatched == 0


def test_unnumbered_blocking_receives_pair_with_the_send_they_waited_for():
    # an older shard (no numbers): rank 1's first recorded receive (posted at 5, done at 10.2) got the send at 10,
    # the send at 0 went to a receive posted before rank 1's window; pairing by order alone would be off by one
    r = rows((0, False, 1, 0, 0.1, -1), (0, False, 1, 10, 10.1, -1), (0, False, 1, 20, 20.1, -1),
             (0, False, 1, 30, 30.1, -1),
             (1, True, 0, 5, 10.2, -1), (1, True, 0, 15, 20.2, -1), (1, True, 0, 25, 30.2, -1))
    p = match_p2p(r, {})
    assert (p.send_start_ns // MS).tolist() == [10, 20, 30]
    assert (p.recv_start_ns // MS).tolist() == [5, 15, 25]
    assert p.n_edge == 1 and p.n_unmatched == 0


def test_peer_inferred_in_a_two_member_group_and_unknown_counted():
    r = rows((0, False, -1, 0, 0.1, -1), (1, True, -1, 0, 0.2, -1), (2, True, -1, 0, 0.2, -1))
    p = match_p2p(r, {0: [0, 1]})
    assert len(p) == 1 and (p.src[0], p.dst[0]) == (0, 1)
    p = match_p2p({k: v[[2]] for k, v in r.items()}, {0: [0, 1, 2]})
    assert len(p) == 0 and p.n_unknown_peer == 1


def test_four_stage_pipeline_order_bubble_and_holder():
    """Ranks 3 -> 1 -> 0 -> 2 form a 4-stage pipeline (stage order is not rank order); 2 micro-batches per step;
    stage 1 (rank 1) is slow: its receivers wait for its sends."""
    from types import SimpleNamespace

    from distprof.analysis.cross.pipeline import pipelines

    chain = [3, 1, 0, 2]
    items = []
    seq = {}
    for step in range(3):
        t0 = step * 1000.0
        for mb in range(2):
            t = t0 + mb * 10
            for k in range(3):  # forward hop k: chain[k] -> chain[k + 1]
                a, b = chain[k], chain[k + 1]
                late = 30.0 if a == 1 else 0.0  # rank 1 sends late
                send = t + 20 * k + late
                n = seq.get((a, b), 0)
                seq[(a, b)] = n + 1
                items += [(a, False, b, send, send + 0.1, n), (b, True, a, t + 20 * k, send + 0.2, n)]
    r = rows(*items)
    r["step"] = np.array([int(x // (1000 * MS)) for x in r["start_ns"]])
    pairs = match_p2p(r, {})
    steps = {"rank": np.repeat(np.arange(4), 3), "step": np.tile(np.arange(3), 4),
             "step_ms": np.full(12, 100.0), "compute_ms": np.array([20.0] * 3 + [60.0] * 3 + [20.0] * 6)}
    run = SimpleNamespace(p2p=pairs, steps_selection=None, steps=steps, hosts={i: "h" for i in range(4)})
    (p,) = pipelines(run)
    assert p.ranks == chain
    assert p.micro_batches == 2
    assert p.ideal_bubble_pct == 100 * 3 / (2 + 3)
    by = {s.rank: s for s in p.stages}
    assert p.holds_rank == 1 and by[0].wait_ms > by[2].wait_ms
    assert p.bottleneck_rank == 1 and p.imbalance_pct > 100


def test_each_pipeline_takes_only_its_own_transfers():
    """Transfers are split by pipeline once (each pipeline's stage order and figures read its own rows, not every
    pipeline's: 256 pipelines of 1,024 ranks spent 6 s re-reading all of them), in their order."""
    from distprof.analysis.cross.pipeline import _by_component

    src = np.array([0, 4, 1, 5, 2, 6, 3, 9])
    dst = np.array([1, 5, 2, 6, 3, 7, 0, 8])
    t = {"src": src, "dst": dst, "ts": np.arange(8) * 10}
    got = {tuple(ranks): rows for ranks, rows in _by_component(t)}
    assert set(got) == {(0, 1, 2, 3), (4, 5, 6, 7), (8, 9)}
    assert got[(0, 1, 2, 3)]["src"].tolist() == [0, 1, 2, 3] and got[(0, 1, 2, 3)]["ts"].tolist() == [0, 20, 40, 60]
    assert got[(4, 5, 6, 7)]["dst"].tolist() == [5, 6, 7] and got[(8, 9)]["src"].tolist() == [9]


def test_rows_left_unpaired_are_a_set_difference():
    """The unpaired rows, and those of them not at a sequence's edge, are np.setdiff1d's answer: distinct, sorted,
    whatever repeats or order the rows and the paired rows come in."""
    from distprof.analysis.align.p2p import _rows_without

    rng = np.random.default_rng(3)
    for n in (0, 1, 7, 50):
        for _ in range(20):
            rows = rng.integers(0, max(n, 1), size=int(rng.integers(0, 2 * n + 1))) if n else np.zeros(0, np.int64)
            a = rng.integers(0, max(n, 1), size=int(rng.integers(0, n + 1))) if n else np.zeros(0, np.int64)
            b = rng.integers(0, max(n, 1), size=int(rng.integers(0, n + 1))) if n else np.zeros(0, np.int64)
            want = np.setdiff1d(np.setdiff1d(rows, a), b)
            got = _rows_without(n, rows, a, b)
            assert got.tolist() == want.tolist() and got.dtype.kind == "i"


def test_stage_medians_are_np_median_per_rank():
    """The pipelines' per-rank medians, all ranks in one sort, are np.median's of each rank's steps: odd and even
    counts, ties, and NaN for a rank whose steps hold one."""
    from distprof.analysis.cross.pipeline import _median_by

    rng = np.random.default_rng(2)
    idx = rng.integers(0, 9, 400)
    v = rng.integers(0, 6, idx.size) / 4
    v[rng.random(idx.size) < 0.01] = np.nan
    got = _median_by(idx, v, 10)
    for g in range(10):
        want = np.median(v[idx == g]) if (idx == g).any() else np.nan
        assert (np.isnan(got[g]) and np.isnan(want)) or got[g] == want, g
