"""Point-to-point transfers: the call join in build_tables, and sender -> receiver pairing (exact and by order)."""

from __future__ import annotations

import numpy as np

from distprof.analysis.p2p import match_p2p
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
