"""Point-to-point calls as the script made them, and their join onto the trace's send/recv events.

The profiler's ``c10d::send`` / ``c10d::recv_`` ops carry the peer only as a group-local rank in their concrete
inputs, and no group at all; gloo's ``gloo:send`` / ``gloo:recv`` carry neither. The capture therefore records each
call of ``ProcessGroup.send`` / ``recv`` / ``recv_anysource`` — the one point ``send``, ``isend``, ``recv``,
``irecv``, ``batch_isend_irecv`` and ``torch.distributed.pipelining`` all go through — as a :class:`P2PCalls` row:
when (``time.time_ns``, the profiler's clock), on which OS thread, which direction, the peer's *global* rank (−1 for
any source), the group's name (``pg_name``, the same on every rank) and its number per (group, peer, direction).

:func:`join` gives every send/recv event of the trace the call that made it: the latest call on the same thread and
in the same direction that started at or before the event (a call starts just before its ``c10d::`` op, whose
``gloo:`` event nests inside it). Kernels (``ncclDevKernel_SendRecv``) take the peer of the op that launched them
(the launch context of :mod:`.tables`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["P2P_OPS", "P2PCalls", "join"]

#: Canonical op names (``classify.normalize_op``) of point-to-point transfers.
P2P_OPS = frozenset({"send", "recv"})


@dataclass(frozen=True)
class P2PCalls:
    """One row per ``ProcessGroup.send``/``recv`` call (columns of equal length)."""

    t_ns: np.ndarray  # int64, time.time_ns() just before the call
    tid: np.ndarray  # int64, OS thread id
    is_recv: np.ndarray  # bool
    peer: np.ndarray  # int32, the peer's global rank; -1: any source / unknown
    pg: np.ndarray  # object (str), the group's pg_name
    seq: np.ndarray  # int64, the call's number per (group, peer, direction) since the job began; -1 unknown

    @classmethod
    def empty(cls) -> P2PCalls:
        z = np.zeros(0, np.int64)
        return cls(z, z.copy(), np.zeros(0, bool), np.zeros(0, np.int32), np.zeros(0, dtype=object), z.copy())

    @classmethod
    def from_rows(cls, rows: list[tuple[int, int, bool, int, str, int]]) -> P2PCalls:
        """From (t_ns, tid, is_recv, peer, pg_name, seq) tuples."""
        if not rows:
            return cls.empty()
        t, tid, rec, peer, pg, seq = zip(*rows)
        return cls(np.asarray(t, np.int64), np.asarray(tid, np.int64), np.asarray(rec, bool),
                   np.asarray(peer, np.int32), np.asarray(pg, dtype=object), np.asarray(seq, np.int64))

    def __len__(self) -> int:
        return int(self.t_ns.size)


def join(calls: P2PCalls, ts: np.ndarray, tid: np.ndarray, is_recv: np.ndarray) -> np.ndarray:
    """Index into `calls` of the call that made each event (−1: none on its thread and direction before it)."""
    ts, tid, is_recv = np.asarray(ts, np.int64), np.asarray(tid, np.int64), np.asarray(is_recv, bool)
    out = np.full(ts.size, -1, np.int64)
    if not len(calls) or not ts.size:
        return out
    # one sorted key space: (tid, direction) groups, time inside each
    keys = np.unique(np.r_[calls.tid * 2 + calls.is_recv, tid * 2 + is_recv])
    c_key = np.searchsorted(keys, calls.tid * 2 + calls.is_recv)
    e_key = np.searchsorted(keys, tid * 2 + is_recv)
    o = np.lexsort((calls.t_ns, c_key))
    ck, ct = c_key[o], calls.t_ns[o]
    # the last call with key == e_key and t <= ts: search in (key, t) order
    lo = np.searchsorted(ck, e_key, side="left")
    hi = np.searchsorted(ck, e_key, side="right")
    pos = lo + np.array([np.searchsorted(ct[a:b], t, side="right") for a, b, t in zip(lo, hi, ts)], np.int64) - 1
    ok = pos >= lo
    out[ok] = o[pos[ok]]
    return out
