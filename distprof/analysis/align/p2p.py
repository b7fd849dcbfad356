"""Point-to-point transfers matched sender to receiver (never as collectives).

Rows the capture numbered (``comms.p2p_seq``: the call's number per group, peer and direction, counted from the
job's start) pair exactly: the k-th send from r to p is the k-th receive at p from r, whichever windows the two sides
recorded them in. Other rows (imported traces, older shards): every rank's executed ``send``/``recv``
(``summary.p2p_rows``) is keyed by (window, process group, sender,
receiver): a send by r to peer p is (w, g, r, p), a receive by p from r is (w, g, r, p). Within a key the k-th send
(by start time) is the (k + d)-th receive — the order c10d itself guarantees between two ranks of a group, d the
shift between where the two ranks' windows begin (a stage may post its first receive before its recording starts),
chosen per key so that no receive completes before its send began and receives complete nearest their sends (a
blocking receive completes at its end; an async one's event is only its posting). A peer the
capture could not name (imported traces, ``recv`` from any source) is the other member when its group has two; else
the row stays unmatched and is counted. A transfer whose partner fell just outside the partner's window (left over at the
start or end of its key after the shift: stages start and stop recording at different points of an iteration) is
counted apart, as ``n_edge``.

Per pair (aligned clock): the **receiver's wait** ``max(0, send start − receive start)`` — it posted its receive
and waited for a late sender — and the **sender's wait** ``max(0, receive start − send start)`` (a rendezvous send
that waits for its receiver; on gloo a send returns early and this is only the time the data waited).
"""

from __future__ import annotations

import numpy as np

from ..groupstats import unique_rows
from ..types import P2PPairs

__all__ = ["match_p2p"]

Table = dict[str, np.ndarray]
NS_PER_MS = 1e6


def _fill_peers(rank: np.ndarray, pg: np.ndarray, peer: np.ndarray,
                group_ranks: dict[int, list[int]]) -> np.ndarray:
    peer = peer.astype(np.int64).copy()
    for i in np.flatnonzero(peer < 0).tolist():
        members = group_ranks.get(int(pg[i])) or []
        if len(members) == 2 and int(rank[i]) in members:
            peer[i] = members[0] if members[1] == rank[i] else members[1]
    return peer


#: Most shift tried between a key's sends and its receives (transfers): windows of two stages may begin a whole
#: step of micro-batches apart (a stage's step starts at its first forward, after it posted that step's receives).
MAX_SHIFT = 16
#: A receive event shorter than this is only its posting (an async ``irecv`` / batched receive): its end says nothing
#: about when the data came.
POSTING_NS = 200_000
#: Clock error and timestamp lateness allowed when checking that a receive did not end before its send began.
SLACK_NS = 200_000
#: Shifts whose blocking receives complete within this of the best one's are told apart by their steps.
LAG_TIE_MS = 0.5


def _shift_cost(a: np.ndarray, b: np.ndarray, start: np.ndarray, end: np.ndarray) -> tuple[float, float]:
    """How wrong pairing sends `a` with receives `b` looks: (share of blocking receives that completed before their
    send began, median over blocking receives of how long after both sides arrived they completed, in ms). A
    receive that blocked (its event lasts) completes at its end, right after the later of it and its send; a short
    event may be only the posting of an async receive and says nothing."""
    blocking = end[b] - start[b] >= POSTING_NS
    if not blocking.any():
        return 0.0, 0.0
    a, b = a[blocking], b[blocking]
    early = end[b] < start[a] - SLACK_NS
    lag = np.abs(end[b] - np.maximum(start[a], start[b]))
    return float(early.mean()), float(np.median(lag)) / 1e6


def _pair(kid: np.ndarray, s_idx: np.ndarray, r_idx: np.ndarray, start: np.ndarray, end: np.ndarray,
          step: np.ndarray):
    """Per key: the k-th send with the (k + d)-th receive, d chosen so that no blocking receive completes before its
    send (at most 15 %: clock error) and blocking receives complete right after both sides arrived
    (:func:`_shift_cost`, within ``LAG_TIE_MS`` of the best), then so that most pairs fall in the same step, then the
    smallest shift. Returns (send rows, receive rows, rows left over
    at the ends of their key)."""
    so = s_idx[np.lexsort((start[s_idx], kid[s_idx]))]
    ro = r_idx[np.lexsort((start[r_idx], kid[r_idx]))]
    s_b = np.searchsorted(kid[so], np.arange(int(kid.max()) + 2))
    r_b = np.searchsorted(kid[ro], np.arange(int(kid.max()) + 2))
    out_s, out_r, edges = [], [], []
    for k in range(int(kid.max()) + 1):
        ss, rr = so[s_b[k]:s_b[k + 1]], ro[r_b[k]:r_b[k + 1]]
        if not ss.size or not rr.size:
            edges.append(ss)
            edges.append(rr)
            continue
        cands = []
        reach = min(MAX_SHIFT, max(ss.size, rr.size) // 2)
        for d in range(-reach, reach + 1):
            i0, j0 = max(0, -d), max(0, d)
            n = min(ss.size - i0, rr.size - j0)
            if n <= 0:
                continue
            a, b = ss[i0:i0 + n], rr[j0:j0 + n]
            early, lag_ms = _shift_cost(a, b, start, end)
            cands.append((early > 0.15, lag_ms, -float(np.mean(step[a] == step[b])), abs(d), a, b, i0, j0, n))
        ok = [c for c in cands if not c[0]] or cands
        lag_min = min(c[1] for c in ok)
        best = min((c for c in ok if c[1] <= lag_min + LAG_TIE_MS), key=lambda c: (c[2], c[3]))[3:]
        _, a, b, i0, j0, n = best
        out_s.append(a)
        out_r.append(b)
        edges += [ss[:i0], ss[i0 + n:], rr[:j0], rr[j0 + n:]]
    cat = (lambda xs: np.concatenate(xs).astype(np.int64) if xs else np.zeros(0, np.int64))
    return cat(out_s), cat(out_r), cat(edges)


def _pair_numbered(pg, src, dst, seq, recv, numbered) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows the capture numbered: the k-th send from r to p is the k-th receive at p from r (any windows). Returns
    (send rows, receive rows, rows whose partner was not recorded)."""
    idx = np.flatnonzero(numbered)
    if not idx.size:
        z = np.zeros(0, np.int64)
        return z, z, z
    kid = unique_rows((pg[idx], src[idx], dst[idx], seq[idx]))[1]  # one packed key: axis=0 sorts records (90 ms)
    s_rows, r_rows = idx[~recv[idx]], idx[recv[idx]]
    _, si, ri = np.intersect1d(kid[~recv[idx]], kid[recv[idx]], return_indices=True)
    s, r = s_rows[si], r_rows[ri]
    return s, r, _rows_without(pg.size, idx, np.r_[s, r])


def _rows_without(n: int, rows: np.ndarray, *taken: np.ndarray) -> np.ndarray:
    """The distinct `rows` (indices below `n`) in none of `taken`, sorted — what ``np.setdiff1d`` gives, from a mask
    instead of two sorts (≈ 1 M point-to-point rows at 1,024 LLM-shaped ranks)."""
    mask = np.zeros(n, bool)
    mask[rows] = True
    for t in taken:
        mask[t] = False
    return np.flatnonzero(mask)


def match_p2p(rows: Table, group_ranks: dict[int, list[int]]) -> P2PPairs:
    """Pair every rank's sends with its peers' receives. `rows`: rank, window, pg, peer, is_recv, bytes, start_ns,
    end_ns, step (aligned times) of every rank."""
    n = int(np.asarray(rows.get("rank", ())).size)
    if n == 0:
        return P2PPairs.empty()
    rank = np.asarray(rows["rank"], np.int64)
    pg = np.asarray(rows["pg"], np.int64)
    recv = np.asarray(rows["is_recv"], bool)
    peer = _fill_peers(rank, pg, np.asarray(rows["peer"], np.int64), group_ranks)
    known = peer >= 0
    src = np.where(recv, peer, rank)
    dst = np.where(recv, rank, peer)
    win = np.asarray(rows["window"], np.int64)
    start = np.asarray(rows["start_ns"], np.int64)
    kid = unique_rows((win, pg, src, dst))[1]
    end = np.asarray(rows["end_ns"], np.int64)
    seq = np.asarray(rows.get("p2p_seq", np.full(n, -1)), np.int64)
    numbered = known & (seq >= 0)
    s1, r1, e1 = _pair_numbered(pg, src, dst, seq, recv, numbered)
    s_idx = np.flatnonzero(known & ~numbered & ~recv)
    r_idx = np.flatnonzero(known & ~numbered & recv)
    s2, r2, e2 = _pair(kid, s_idx, r_idx, start, end, np.asarray(rows["step"], np.int64))
    s, r, edge_rows = np.r_[s1, s2], np.r_[r1, r2], np.r_[e1, e2]
    s_idx, r_idx = np.flatnonzero(known & ~recv), np.flatnonzero(known & recv)
    step = np.asarray(rows["step"], np.int64)
    nbytes = np.asarray(rows["bytes"], np.int64)
    lone = _rows_without(n, np.r_[s_idx, r_idx], np.r_[s, r])  # unpaired
    inner = _rows_without(n, lone, edge_rows)  # ... and not at a sequence's edge
    unmatched = int(inner.size)
    examples = []
    if unmatched:
        for i in inner[:3].tolist():
            what = (f"rank {rank[i]} received from rank {peer[i]}" if recv[i] else
                    f"rank {rank[i]} sent to rank {peer[i]}")
            examples.append(f"{what} (group {pg[i]}, window {win[i]}) with no matching "
                            f"{'send' if recv[i] else 'receive'} on the peer")
    ev_row = np.asarray(rows["ev_row"], np.int64) if "ev_row" in rows else np.full(n, -1, np.int64)
    return P2PPairs(
        window=win[s], pg=pg[s], src=rank[s], dst=rank[r], send_start_ns=start[s], send_end_ns=end[s],
        recv_start_ns=start[r], recv_end_ns=end[r], send_step=step[s], recv_step=step[r],
        bytes=np.where(nbytes[s] >= 0, nbytes[s], nbytes[r]), n_sends=int((~recv).sum()), n_recvs=int(recv.sum()),
        n_unmatched=unmatched, n_edge=int(lone.size - inner.size), n_unknown_peer=int((~known).sum()),
        examples=examples, send_row=ev_row[s], recv_row=ev_row[r],
    )
