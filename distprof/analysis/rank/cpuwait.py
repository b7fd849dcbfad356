"""The training thread's wait for a CPU at any instant of a recorded window, from the shard's ``cpu/samples``.

The capture's side thread samples the thread's cumulative run-queue wait (capture/schedstat.py: time runnable but
not running, because other threads or processes held the host's cores) every ``--cpu-sample-ms`` while a window
records. :func:`wait_at` interpolates it linearly to given times on the rank's own clock; the wait within a stretch
of a step is the difference of two such values (its error is at most the wait gathered within the two sampling
periods around its ends, which a loaded host can stretch: beside 8 busy processes on 2 cores the side thread went
over a second without running). Times before the first sample, after the last, or in a gap longer than
``MAX_GAP_NS`` are unknown: NaN. (The training thread samples each window's begin and end itself, so a pause
between windows, which holds no step, is bounded by samples on both sides.)
"""

from __future__ import annotations

import numpy as np

__all__ = ["wait_at", "MAX_GAP_NS"]

#: Samples further apart than this are not interpolated between (a sampler period is 1 ms; a starved one missed
#: over a second beside 8 busy processes on 2 cores: the estimate is coarser there, its error still bounded by the
#: wait within the gap).
MAX_GAP_NS = 60_000_000_000


def wait_at(samples: dict[str, np.ndarray] | None, t_ns: np.ndarray) -> np.ndarray:
    """Cumulative CPU wait (ns, float) of the training thread at each time of `t_ns` (raw clock), NaN unknown."""
    t = np.asarray(t_ns, np.int64)
    out = np.full(t.size, np.nan)
    if samples is None or len(samples.get("t_ns", ())) < 2 or t.size == 0:
        return out
    st = np.asarray(samples["t_ns"], np.int64)
    w = np.asarray(samples["wait_ns"], np.int64)
    o = np.argsort(st, kind="stable")
    st, w = st[o], w[o]
    t0 = int(st[0])
    x = (st - t0).astype(np.float64)  # relative: exact in float64, unlike epoch ns
    q = (t - t0).astype(np.float64)
    i = np.searchsorted(x, q, side="right")
    inside = (i > 0) & (i < x.size)
    ii = np.clip(i, 1, x.size - 1)
    gap = x[ii] - x[ii - 1]
    on_sample = (i > 0) & (x[np.maximum(i - 1, 0)] == q)
    ok = (inside & (gap <= MAX_GAP_NS)) | on_sample
    out[ok] = np.interp(q[ok], x, w.astype(np.float64))
    return out
