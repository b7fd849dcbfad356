"""Record who each point-to-point call talks to (see :mod:`distprof.events.p2p` for why and how it is joined).

:func:`install` replaces ``ProcessGroup.send``, ``recv`` and ``recv_anysource`` on torch's C++ ``ProcessGroup``
class with thin wrappers: every path of the Python API (``send``, ``isend``, ``recv``, ``irecv``,
``batch_isend_irecv``, P2POp with functions imported before distprof started, ``torch.distributed.pipelining``)
ends in one of them, with the group as ``self`` and the peer as a group rank. Each call is numbered per (group,
peer, direction): the k-th send from r to p is the k-th receive at p from r. A wrapper appends one tuple to a
bounded deque (about a microsecond) and calls the original; nothing it does can raise into the training job. The
profiler :func:`drain`\\ s the calls at each window's end.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from typing import Any

from ..events.p2p import P2PCalls

log = logging.getLogger(__name__)

__all__ = ["install", "uninstall", "drain", "MAX_CALLS"]

#: Calls kept between two drains (oldest dropped first): a pipeline makes a few per micro-batch.
MAX_CALLS = 200_000

_calls: collections.deque = collections.deque(maxlen=MAX_CALLS)
_lock = threading.Lock()
_originals: dict[str, Any] = {}
#: id(group) -> (pg_name, global ranks by group rank); groups live for the job, ids are not reused while they do
_groups: dict[int, tuple[str, list[int]]] = {}
#: (pg_name, peer, is_recv) -> transfers so far: the k-th send from r to p is the k-th receive at p from r (c10d's
#: order between two ranks of a group), so the count pairs them exactly, whatever window each side recorded it in.
_counts: dict[tuple[str, int, bool], int] = {}


def _group(pg: Any) -> tuple[str, list[int]]:
    key = id(pg)
    hit = _groups.get(key)
    if hit is None:
        import torch.distributed as dist

        name = str(pg.group_name)
        try:
            ranks = list(dist.get_process_group_ranks(pg))
        except Exception:  # noqa: BLE001 -- a group torch's registry does not know
            ranks = []
        hit = _groups[key] = (name, ranks)
    return hit


def _record(pg: Any, is_recv: bool, group_peer: Any) -> None:
    try:
        t = time.time_ns()
        name, ranks = _group(pg)
        p = int(group_peer) if group_peer is not None else -1
        peer = ranks[p] if 0 <= p < len(ranks) else (p if not ranks else -1)
        seq = -1
        if peer >= 0:
            key = (name, peer, is_recv)
            seq = _counts.get(key, 0)
            _counts[key] = seq + 1
        _calls.append((t, threading.get_native_id(), is_recv, peer, name, seq))
    except Exception as e:  # noqa: BLE001 -- recording must never break a send
        log.debug("distprof: point-to-point call not recorded: %s", e)


def _peer_arg(args: tuple, kwargs: dict, key: str) -> Any:
    return args[1] if len(args) > 1 else kwargs.get(key)


def _wrap(name: str, orig: Any, is_recv: bool, key: str | None) -> Any:
    def wrapper(self, *args, **kwargs):
        _record(self, is_recv, _peer_arg(args, kwargs, key) if key else None)
        return orig(self, *args, **kwargs)

    wrapper.__name__ = name
    wrapper.__doc__ = getattr(orig, "__doc__", None)
    wrapper.__wrapped__ = orig  # type: ignore[attr-defined]
    return wrapper


def install() -> bool:
    """Wrap the ProcessGroup methods once; False when torch has no such class (then peers stay unknown)."""
    with _lock:
        if _originals:
            return True
        try:
            from torch._C._distributed_c10d import ProcessGroup
        except Exception:  # noqa: BLE001 -- torch built without distributed
            return False
        for name, is_recv, key in (("send", False, "dstRank"), ("recv", True, "srcRank"),
                                   ("recv_anysource", True, None)):
            orig = getattr(ProcessGroup, name, None)
            if orig is None:
                continue
            try:
                setattr(ProcessGroup, name, _wrap(name, orig, is_recv, key))
            except (AttributeError, TypeError) as e:
                log.debug("distprof: cannot wrap ProcessGroup.%s: %s", name, e)
                continue
            _originals[name] = orig
        return bool(_originals)


def uninstall() -> None:
    with _lock:
        if not _originals:
            return
        from torch._C._distributed_c10d import ProcessGroup

        for name, orig in _originals.items():
            setattr(ProcessGroup, name, orig)
        _originals.clear()
        _groups.clear()
        _counts.clear()


def drain() -> P2PCalls:
    """The calls recorded since the last drain (and forget them)."""
    rows = []
    while True:
        try:
            rows.append(_calls.popleft())
        except IndexError:
            break
    return P2PCalls.from_rows(rows)
