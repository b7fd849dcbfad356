"""How long the training thread ran and how long it waited for a CPU, from the kernel's scheduler statistics.

``/proc/thread-self/schedstat`` holds three numbers for the calling thread: time on a CPU (ns), time **runnable but
waiting on a run queue** (ns) and the number of time slices. The difference of two samples at step boundaries says
how much of a step the thread could not run because other threads or processes held the host's cores — time that
is neither the rank's own work nor waiting for a peer (which is sleeping, not runnable). The analysis reports
oversubscribed hosts (the ``cpu_contention`` finding) and can replay the steps without that wait (``NoCpuWait``).

The file is opened once, on the thread to be measured (the fd stays bound to that thread), and re-read with one
``pread`` per step boundary (a few µs). Where it does not exist (not Linux, a kernel without ``CONFIG_SCHED_INFO``)
or a read fails, samples are None and the shard's columns say unknown (-1); a sample never raises.
"""

from __future__ import annotations

import logging
import os

import numpy as np

log = logging.getLogger(__name__)

__all__ = ["ThreadCpu", "step_columns"]

PATH = "/proc/thread-self/schedstat"


class ThreadCpu:
    """Samples of one thread's (run ns, run-queue wait ns); open it on that thread."""

    def __init__(self, path: str = PATH):
        self._fd: int | None = None
        try:
            self._fd = os.open(path, os.O_RDONLY)
        except OSError as e:
            log.debug("distprof: no scheduler statistics (%s): CPU waits unknown", e)
            return
        if self.sample() is None:
            self.close()

    def sample(self) -> tuple[int, int] | None:
        fd = self._fd
        if fd is None:
            return None
        try:
            parts = os.pread(fd, 128, 0).split()
            return int(parts[0]), int(parts[1])
        except (OSError, ValueError, IndexError):
            return None

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass


def step_columns(step_ids, marks: dict[int, tuple[int, int] | None] | None, *, since_previous: bool = False):
    """The steps table's ``cpu_run_ns`` and ``cpu_wait_ns``: per step k, sample at the start of step k+1 minus the
    sample at its start (marks: step -> sample at its start); -1 where either is missing or they go backwards.
    `since_previous`: sample k minus sample k−1 instead (marks taken inside each step: its optimizer step's start)."""
    ids = np.asarray(step_ids, np.int64)
    run = np.full(ids.size, -1, np.int64)
    wait = np.full(ids.size, -1, np.int64)
    for i, k in enumerate(ids.tolist()):
        a, b = ((marks or {}).get(k - 1), (marks or {}).get(k)) if since_previous else \
            ((marks or {}).get(k), (marks or {}).get(k + 1))
        if a is None or b is None or b[0] < a[0] or b[1] < a[1]:
            continue
        run[i], wait[i] = b[0] - a[0], b[1] - a[1]
    return run, wait
