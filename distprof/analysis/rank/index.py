"""Facts about one rank's events that several analyses need, computed once (``RankIndex.build``).

* ``main_tid``: the rank's main (stepping) thread — the ``threads`` row with role main, else the thread that records
  most ``ProfilerStep#N`` annotations, else None.
* ``comm_tids``: its communication-worker threads (``threads`` role comm_worker: gloo's ``pt_gloo_runloop``).
* ``is_exec``: per event, whether it executes communication (``comms.role == exec``).
* ``is_step``: per event, whether it is a ``ProfilerStep#N`` annotation.
* ``device_rank``: whether the rank has device events (its compute and idle are measured on the device).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from ...storage.schema import ROLE_EXEC, THREAD_COMM, THREAD_MAIN
from ..load.rankdata import RankData
from .nameflags import STEP, has, name_flags

logger = logging.getLogger(__name__)

from ..names import STEP_PREFIX

__all__ = ["RankIndex", "step_name_mask", "main_thread"]


def step_name_mask(names: np.ndarray, prefix: str = STEP_PREFIX) -> np.ndarray:
    """Boolean mask over the string table: names starting with `prefix` (one Python call per name, not per event)."""
    return np.fromiter((str(n).startswith(prefix) for n in names), dtype=bool, count=len(names))


def main_thread(threads: dict[str, np.ndarray], tid: np.ndarray, is_step: np.ndarray,
                device: np.ndarray) -> int | None:
    """The main thread of one rank: the ``threads`` row with role main, else the ``ProfilerStep`` thread."""
    hit = np.asarray(threads.get("tid", np.zeros(0, np.int64)))[
        np.asarray(threads.get("role", np.zeros(0, np.uint8))) == THREAD_MAIN]
    if hit.size:
        return int(hit[0])
    steps = tid[is_step & (device < 0)]
    if steps.size:
        vals, counts = np.unique(steps, return_counts=True)
        return int(vals[np.argmax(counts)])
    return None


@dataclass
class RankIndex:
    rank: int
    main_tid: int | None
    comm_tids: np.ndarray
    is_exec: np.ndarray
    is_step: np.ndarray
    device_rank: bool
    name_flags: np.ndarray  # per name of the rank's string table (nameflags bits)

    @classmethod
    def build(cls, rd: RankData) -> "RankIndex":
        ev = rd.events
        n = ev["ts_ns"].shape[0]
        is_exec = np.zeros(n, dtype=bool)
        rows = np.asarray(rd.comms["row"], dtype=np.int64)
        exec_rows = rows[np.asarray(rd.comms["role"]) == ROLE_EXEC]
        bad = (exec_rows < 0) | (exec_rows >= n)
        if np.any(bad):
            logger.warning("rank %d: %d communication rows point outside the events table; ignored", rd.rank,
                           int(bad.sum()))
            exec_rows = exec_rows[~bad]
        is_exec[exec_rows] = True
        name_id = np.asarray(ev["name_id"], dtype=np.int64) if "name_id" in ev else np.zeros(n, np.int64)
        flags = name_flags(rd.names)
        is_step = has(flags, STEP)[name_id] if len(rd.names) else np.zeros(n, bool)
        tid = np.asarray(ev["tid"], np.int64) if "tid" in ev else np.zeros(n, np.int64)
        device = np.asarray(ev["device"]) if "device" in ev else np.full(n, -1)
        th = rd.threads
        comm_tids = np.asarray(th.get("tid", np.zeros(0, np.int64)))[
            np.asarray(th.get("role", np.zeros(0, np.uint8))) == THREAD_COMM]
        return cls(rank=rd.rank, main_tid=main_thread(th, tid, is_step, device), comm_tids=comm_tids,
                   is_exec=is_exec, is_step=is_step, device_rank=bool(np.any(device >= 0)), name_flags=flags)
