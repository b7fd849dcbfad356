"""How long the training thread ran and how long it waited for a CPU, from the kernel's scheduler statistics.

``/proc/thread-self/schedstat`` holds three numbers for the calling thread: time on a CPU (ns), time **runnable but
waiting on a run queue** (ns) and the number of time slices. The difference of two samples at step boundaries says
how much of a step the thread could not run because other threads or processes held the host's cores — time that
is neither the rank's own work nor waiting for a peer (which is sleeping, not runnable). The analysis reports
oversubscribed hosts (the ``cpu_contention`` finding) and can replay the steps without that wait (``NoCpuWait``).

The file is opened once, on the thread to be measured (the fd stays bound to that thread), and re-read with one
``pread`` per step boundary (a few µs); at each step's start the training thread's page faults
(``/proc/thread-self/stat``: minor and major, the kernel mapping memory the thread touched) are read beside them, one
more ``pread``. Where a file does not exist (not Linux, a kernel without ``CONFIG_SCHED_INFO``) or a read fails,
samples are None (faults −1) and the shard's columns say unknown (-1); a sample never raises.

:class:`WaitSampler` reads the same numbers of the training thread from a side thread every ``--cpu-sample-ms``
while a window records (the shard's ``cpu/samples`` table): the analysis interpolates them to the thread's wait for
a CPU within any stretch of a step, e.g. its own work before a collective (per step boundary it is only known over
the whole step). Each sample is one ``pread`` and a clock read; the side thread sleeps between them and never takes
a lock the training thread holds.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from array import array

import numpy as np

log = logging.getLogger(__name__)

__all__ = ["ThreadCpu", "WaitSampler", "drop_flat", "step_columns", "step_faults"]

PATH = "/proc/thread-self/schedstat"


class ThreadCpu:
    """Samples of one thread's (run ns, run-queue wait ns, page faults); open it on that thread. The faults (minor
    + major, from ``/proc/thread-self/stat``) are read only with `faults` and are −1 when unknown."""

    def __init__(self, path: str = PATH, faults: bool = False):
        self._fd: int | None = None
        self._stat: int | None = None
        try:
            self._fd = os.open(path, os.O_RDONLY)
        except OSError as e:
            log.debug("distprof: no scheduler statistics (%s): CPU waits unknown", e)
            return
        if faults:
            try:
                self._stat = os.open(os.path.join(os.path.dirname(path), "stat"), os.O_RDONLY)
            except OSError as e:
                log.debug("distprof: no thread stat (%s): page faults unknown", e)
        if self.sample() is None:
            self.close()

    def sample(self, faults: bool = True) -> tuple[int, int, int] | None:
        """(run ns, wait ns, page faults); the faults are read only when opened with them and asked for (else −1)."""
        fd = self._fd
        if fd is None:
            return None
        try:
            parts = os.pread(fd, 128, 0).split()
            return int(parts[0]), int(parts[1]), self._faults() if faults else -1
        except (OSError, ValueError, IndexError):
            return None

    def _faults(self) -> int:
        """minflt + majflt of the thread (fields 10 and 12 of its stat; the name before them may hold spaces)."""
        fd = self._stat
        if fd is None:
            return -1
        try:
            rest = os.pread(fd, 1024, 0).rpartition(b")")[2].split()
            return int(rest[7]) + int(rest[9])
        except (OSError, ValueError, IndexError):
            return -1

    def close(self) -> None:
        for name in ("_fd", "_stat"):
            fd = getattr(self, name)
            setattr(self, name, None)
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass


#: A sample whose read took longer than this (the thread was preempted in it) is dropped: its time is uncertain.
MAX_SAMPLE_NS = 200_000
#: Reads tried for the sample at a window's start and end (each a few µs of the training thread's time).
EDGE_TRIES = 5


class WaitSampler:
    """Samples (``time.time_ns()``, run ns, wait ns) of thread `tid` every `period_s` on a daemon thread while
    :meth:`resume`-d; :meth:`take` hands over what was gathered. At most `max_samples` are kept between two takes
    (later ones are dropped: the window's end goes unknown, nothing grows without bound). Never raises."""

    def __init__(self, tid: int, period_s: float, max_samples: int = 1 << 20):
        self._period = period_s
        self._max = max_samples
        self._lock = threading.Lock()
        self._buf = (array("q"), array("q"), array("q"))
        self._on = threading.Event()
        self._stop = False
        self._thread: threading.Thread | None = None
        self._cpu = ThreadCpu(f"/proc/self/task/{tid}/schedstat")
        if self._cpu._fd is None:
            return
        self._thread = threading.Thread(target=self._loop, name="distprof-cpu-sampler", daemon=True)
        self._thread.start()

    @property
    def active(self) -> bool:
        return self._thread is not None

    def _add(self, tries: int = 1) -> None:
        """One sample; up to `tries` reads where the thread is held off the CPU mid-read (when it read is then not
        known): the samples at a window's start and end are tried again, so that they cover its steps (a rank
        beside 8 busy processes lost its first one and began 2.4 ms after its first step)."""
        for _ in range(tries):
            t0 = time.time_ns()
            s = self._cpu.sample()
            t1 = time.time_ns()
            if s is None:
                return
            if t1 - t0 <= MAX_SAMPLE_NS:
                break
        else:
            return
        t = (t0 + t1) // 2
        with self._lock:
            buf = self._buf
            if len(buf[0]) < self._max:
                buf[0].append(t)
                buf[1].append(s[0])
                buf[2].append(s[1])

    def _loop(self) -> None:
        try:
            while not self._stop:
                if not self._on.wait(0.5):
                    continue
                self._add()
                time.sleep(self._period)
        except Exception as e:  # noqa: BLE001 -- the windows go on without samples
            log.debug("distprof: CPU sampler stopped: %s", e)

    def resume(self) -> None:
        """Sample from now on (one sample at once, from the caller)."""
        if self._thread is not None:
            self._add(tries=EDGE_TRIES)
            self._on.set()

    def pause(self) -> None:
        self._on.clear()

    def take(self) -> dict[str, np.ndarray]:
        """One sample now, then everything since the last take, as the ``cpu/samples`` columns, in the order taken
        (the writer sorts them, off the training thread: :func:`drop_flat`)."""
        if self._thread is not None and self._on.is_set():
            self._add(tries=EDGE_TRIES)
        with self._lock:
            buf, self._buf = self._buf, (array("q"), array("q"), array("q"))
        t, r, w = (np.frombuffer(b, np.int64) if len(b) else np.zeros(0, np.int64) for b in buf)  # no copy
        return {"t_ns": t, "run_ns": r, "wait_ns": w}

    def close(self) -> None:
        self._stop = True
        self._on.set()
        if self._thread is not None:
            self._thread.join(timeout=1.0)
        self._cpu.close()


def drop_flat(samples: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The samples sorted by time, their counters made monotone, without those whose wait equals both neighbours':
    interpolating the wait between the ones kept gives exactly the same values (it was flat there), and a thread that
    mostly runs or sleeps waits rarely.

    Two threads take samples (the sampler, and the training thread at a window's edges), each timed at its read's
    midpoint; where their reads overlap, the later read can have the earlier midpoint (a CI run: 1.5 µs apart, the
    wait 27 µs lower in the later-timed one). Run and wait only grow, so the earlier-timed sample is given the running
    maximum: off by at most what the thread ran and waited while the two reads overlapped."""
    o = np.argsort(np.asarray(samples["t_ns"]), kind="stable")
    samples = {k: np.asarray(v)[o] for k, v in samples.items()}
    for k in ("run_ns", "wait_ns"):
        if samples[k].size:
            samples[k] = np.maximum.accumulate(samples[k])
    w = samples["wait_ns"]
    if w.size < 3:
        return samples
    keep = np.ones(w.size, bool)
    keep[1:-1] = ~((w[1:-1] == w[:-2]) & (w[1:-1] == w[2:]))
    return {k: np.asarray(v)[keep] for k, v in samples.items()}


def step_faults(step_ids, marks: dict[int, tuple[int, ...] | None] | None,
                ends: dict[int, tuple[int, ...] | None] | None = None) -> np.ndarray:
    """The steps table's ``page_faults``: per step k, the training thread's page faults from its start to its end
    (the marks' third number; `ends` as in :func:`step_columns`); -1 where either is missing or unknown."""
    ids = np.asarray(step_ids, np.int64)
    out = np.full(ids.size, -1, np.int64)
    for i, k in enumerate(ids.tolist()):
        a, b = (marks or {}).get(k), _end_of(k, marks, ends)
        if a is None or b is None or len(a) < 3 or len(b) < 3 or a[2] < 0 or b[2] < a[2]:
            continue
        out[i] = b[2] - a[2]
    return out


def _end_of(k: int, marks, ends):
    """Step k's end sample: its own (taken before torch's profiler step) where there is one, else step k+1's start."""
    b = (ends or {}).get(k)
    return b if b is not None else (marks or {}).get(k + 1)


def step_columns(step_ids, marks: dict[int, tuple[int, ...] | None] | None, *, since_previous: bool = False,
                 ends: dict[int, tuple[int, ...] | None] | None = None):
    """The steps table's ``cpu_run_ns`` and ``cpu_wait_ns``: per step k, the sample at its end minus the sample at its
    start (marks: step -> sample at its start, taken as torch's profiler step has begun the step's span; `ends`: step
    -> sample at its end, taken before torch's profiler step ends the span — so that starting or stopping the trace
    is in no step, as in the spans —, else step k+1's start); -1 where either is missing or they go backwards.
    `since_previous`: sample k minus sample k−1 instead (marks taken inside each step: its optimizer step's start)."""
    ids = np.asarray(step_ids, np.int64)
    run = np.full(ids.size, -1, np.int64)
    wait = np.full(ids.size, -1, np.int64)
    for i, k in enumerate(ids.tolist()):
        a, b = ((marks or {}).get(k - 1), (marks or {}).get(k)) if since_previous else \
            ((marks or {}).get(k), _end_of(k, marks, ends))
        if a is None or b is None or b[0] < a[0] or b[1] < a[1]:
            continue
        run[i], wait[i] = b[0] - a[0], b[1] - a[1]
    return run, wait
