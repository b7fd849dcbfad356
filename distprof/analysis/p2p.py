"""Point-to-point transfers matched sender to receiver (never as collectives).

Every rank's executed ``send``/``recv`` (``summary.p2p_rows``) is keyed by (window, process group, sender,
receiver): a send by r to peer p is (w, g, r, p), a receive by p from r is (w, g, r, p). Within a key the k-th send
(by start time) is the k-th receive — the order c10d itself guarantees between two ranks of a group. A peer the
capture could not name (imported traces, ``recv`` from any source) is the other member when its group has two; else
the row stays unmatched and is counted.

Per pair (aligned clock): the **receiver's wait** ``max(0, send start − receive start)`` — it posted its receive
and waited for a late sender — and the **sender's wait** ``max(0, receive start − send start)`` (a rendezvous send
that waits for its receiver; on gloo a send returns early and this is only the time the data waited).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

__all__ = ["P2PPairs", "match_p2p"]

Table = dict[str, np.ndarray]
NS_PER_MS = 1e6


@dataclass
class P2PPairs:
    """Matched transfers (columns of equal length, aligned times) and what could not be matched."""

    window: np.ndarray
    pg: np.ndarray
    src: np.ndarray  # sender's global rank
    dst: np.ndarray  # receiver's global rank
    send_start_ns: np.ndarray
    send_end_ns: np.ndarray
    recv_start_ns: np.ndarray
    recv_end_ns: np.ndarray
    send_step: np.ndarray
    recv_step: np.ndarray
    bytes: np.ndarray
    n_sends: int = 0
    n_recvs: int = 0
    n_unmatched: int = 0  # sends or receives without a partner row (a rank missing, a window cut)
    n_unknown_peer: int = 0  # rows whose peer is not known and cannot be inferred
    examples: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return int(self.src.size)

    @property
    def recv_wait_ns(self) -> np.ndarray:
        return np.maximum(self.send_start_ns - self.recv_start_ns, 0)

    @property
    def send_wait_ns(self) -> np.ndarray:
        return np.maximum(self.recv_start_ns - self.send_start_ns, 0)


def _empty() -> P2PPairs:
    z = np.zeros(0, np.int64)
    return P2PPairs(*(z.copy() for _ in range(11)))


def _fill_peers(rank: np.ndarray, pg: np.ndarray, peer: np.ndarray,
                group_ranks: dict[int, list[int]]) -> np.ndarray:
    peer = peer.astype(np.int64).copy()
    for i in np.flatnonzero(peer < 0).tolist():
        members = group_ranks.get(int(pg[i])) or []
        if len(members) == 2 and int(rank[i]) in members:
            peer[i] = members[0] if members[1] == rank[i] else members[1]
    return peer


def _ordinal(key: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Position of each row among the rows of its key, by time."""
    o = np.lexsort((t, key))
    k = key[o]
    first = np.r_[0, np.flatnonzero(k[1:] != k[:-1]) + 1] if k.size else np.zeros(0, np.int64)
    pos = np.empty(k.size, np.int64)
    starts = np.repeat(first, np.diff(np.r_[first, k.size]))
    pos[o] = np.arange(k.size) - starts
    return pos


def match_p2p(rows: Table, group_ranks: dict[int, list[int]]) -> P2PPairs:
    """Pair every rank's sends with its peers' receives. `rows`: rank, window, pg, peer, is_recv, bytes, start_ns,
    end_ns, step (aligned times) of every rank."""
    n = int(np.asarray(rows.get("rank", ())).size)
    if n == 0:
        return _empty()
    rank = np.asarray(rows["rank"], np.int64)
    pg = np.asarray(rows["pg"], np.int64)
    recv = np.asarray(rows["is_recv"], bool)
    peer = _fill_peers(rank, pg, np.asarray(rows["peer"], np.int64), group_ranks)
    known = peer >= 0
    src = np.where(recv, peer, rank)
    dst = np.where(recv, rank, peer)
    win = np.asarray(rows["window"], np.int64)
    start = np.asarray(rows["start_ns"], np.int64)
    keys = np.stack([win, pg, src, dst], axis=1)
    _, kid = np.unique(keys, axis=0, return_inverse=True)
    kid = kid.reshape(-1)
    code = kid * 2 + recv  # sends and receives of one key numbered apart
    k = _ordinal(code, start)
    big = np.int64(n + 1)
    pair_code = kid * big + k
    s_idx = np.flatnonzero(known & ~recv)
    r_idx = np.flatnonzero(known & recv)
    _, si, ri = np.intersect1d(pair_code[s_idx], pair_code[r_idx], assume_unique=True, return_indices=True)
    s, r = s_idx[si], r_idx[ri]
    o = np.lexsort((start[s], win[s]))
    s, r = s[o], r[o]
    end = np.asarray(rows["end_ns"], np.int64)
    step = np.asarray(rows["step"], np.int64)
    nbytes = np.asarray(rows["bytes"], np.int64)
    unmatched = int(s_idx.size + r_idx.size - 2 * s.size)
    examples = []
    if unmatched:
        lone = np.setdiff1d(np.r_[s_idx, r_idx], np.r_[s, r])
        for i in lone[:3].tolist():
            what = (f"rank {rank[i]} received from rank {peer[i]}" if recv[i] else
                    f"rank {rank[i]} sent to rank {peer[i]}")
            examples.append(f"{what} (group {pg[i]}, window {win[i]}) with no matching "
                            f"{'send' if recv[i] else 'receive'} on the peer")
    return P2PPairs(
        window=win[s], pg=pg[s], src=rank[s], dst=rank[r], send_start_ns=start[s], send_end_ns=end[s],
        recv_start_ns=start[r], recv_end_ns=end[r], send_step=step[s], recv_step=step[r],
        bytes=np.where(nbytes[s] >= 0, nbytes[s], nbytes[r]), n_sends=int((~recv).sum()), n_recvs=int(recv.sum()),
        n_unmatched=unmatched, n_unknown_peer=int((~known).sum()), examples=examples,
    )
