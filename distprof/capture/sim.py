"""Test-only simulation of several hosts on one machine (documented in docs/shard-format.md).

DISTPROF_SIM_HOSTS=0,0,1,1     rank i lives on simulated host sim-host<h>, h = i-th entry
DISTPROF_SIM_CLOCKS=0,3.25@40  simulated host h has clock offset (s) and optional drift (ppm)

Every timestamp the rank records becomes t + offset + drift·1e-6·(t − t0); t0 is midnight UTC of the day the rank
started, or DISTPROF_SIM_T0_NS.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Mapping

import numpy as np

from ..errors import ConfigError

DAY_NS = 86_400 * 10**9


@dataclass(frozen=True)
class SimClock:
    offset_s: float = 0.0
    drift_ppm: float = 0.0
    t0_ns: int = 0

    @property
    def is_identity(self) -> bool:
        return self.offset_s == 0.0 and self.drift_ppm == 0.0

    def apply(self, t: np.ndarray | int):
        """Map true CLOCK_REALTIME ns to this simulated host's clock (arrays or scalars)."""
        if self.is_identity:
            return t
        if isinstance(t, (int, np.integer)):
            return int(t) + round(self.offset_s * 1e9 + self.drift_ppm * 1e-6 * (int(t) - self.t0_ns))
        t = np.asarray(t, dtype=np.int64)
        corr = self.offset_s * 1e9 + self.drift_ppm * 1e-6 * (t - self.t0_ns).astype(np.float64)
        return t + np.rint(corr).astype(np.int64)

    def to_dict(self) -> dict:
        return {"offset_s": self.offset_s, "drift_ppm": self.drift_ppm, "t0_ns": self.t0_ns}


def sim_host_index(rank: int, environ: Mapping[str, str] | None = None) -> int | None:
    """Simulated host of `rank`, or None when DISTPROF_SIM_HOSTS is not set."""
    env = os.environ if environ is None else environ
    raw = env.get("DISTPROF_SIM_HOSTS", "").strip()
    if not raw:
        return None
    try:
        hosts = [int(x) for x in raw.split(",")]
    except ValueError:
        raise ConfigError(f"DISTPROF_SIM_HOSTS={raw!r}: expected comma-separated host numbers, e.g. 0,0,1,1") from None
    if rank >= len(hosts):
        raise ConfigError(f"DISTPROF_SIM_HOSTS={raw!r} names {len(hosts)} ranks but rank {rank} exists; add entries")
    return hosts[rank]


def sim_clock(host_index: int | None, environ: Mapping[str, str] | None = None) -> SimClock | None:
    """The simulated clock of a simulated host, or None when DISTPROF_SIM_CLOCKS is not set."""
    env = os.environ if environ is None else environ
    raw = env.get("DISTPROF_SIM_CLOCKS", "").strip()
    if not raw or host_index is None:
        return None
    entries = raw.split(",")
    if host_index >= len(entries):
        raise ConfigError(f"DISTPROF_SIM_CLOCKS={raw!r} has no entry for simulated host {host_index}; add one")
    entry = entries[host_index].strip()
    off, _, drift = entry.partition("@")
    try:
        offset_s = float(off) if off else 0.0
        drift_ppm = float(drift) if drift else 0.0
    except ValueError:
        raise ConfigError(
            f"DISTPROF_SIM_CLOCKS entry {entry!r}: expected OFFSET_S[@DRIFT_PPM], e.g. 3.25@40"
        ) from None
    t0_raw = env.get("DISTPROF_SIM_T0_NS")
    t0 = int(t0_raw) if t0_raw else (time.time_ns() // DAY_NS) * DAY_NS
    return SimClock(offset_s, drift_ppm, t0)
