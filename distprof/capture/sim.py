"""Test-only simulation of several hosts on one machine (documented in docs/shard-format.md).

DISTPROF_SIM_HOSTS=0,0,1,1     rank i lives on simulated host sim-host<h>, h = i-th entry
DISTPROF_SIM_CLOCKS=0,3.25@40  simulated host h has clock offset (s) and optional drift (ppm)
DISTPROF_SIM_CLOCKS=0,0/5@6    ... and steps: host 1's clock jumps +5 s 6 s after its process started (NTP stepping
                               it); several steps: 0/5@6/-0.5@9

Every timestamp the rank records becomes t + offset + drift·1e-6·(t − t0) + the jumps of the steps at or before t;
t0 is midnight UTC of the day the rank started, or DISTPROF_SIM_T0_NS. A step's time counts from the start of the
rank's process (``/proc/self/stat``), so every rank of a simulated host should be one process started at once (as
torchrun starts them: within milliseconds).
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
    steps: tuple[tuple[int, float], ...] = ()  # (true time in ns from which, jump in s): the clock stepped

    @property
    def is_identity(self) -> bool:
        return self.offset_s == 0.0 and self.drift_ppm == 0.0 and not self.steps

    def apply(self, t: np.ndarray | int):
        """Map true CLOCK_REALTIME ns to this simulated host's clock (arrays or scalars)."""
        if self.is_identity:
            return t
        if isinstance(t, (int, np.integer)):
            jumps = sum(j for at, j in self.steps if int(t) >= at)
            return int(t) + round(self.offset_s * 1e9 + self.drift_ppm * 1e-6 * (int(t) - self.t0_ns) + jumps * 1e9)
        t = np.asarray(t, dtype=np.int64)
        corr = self.offset_s * 1e9 + self.drift_ppm * 1e-6 * (t - self.t0_ns).astype(np.float64)
        for at, j in self.steps:
            corr = corr + np.where(t >= at, j * 1e9, 0.0)
        return t + np.rint(corr).astype(np.int64)

    def to_dict(self) -> dict:
        out = {"offset_s": self.offset_s, "drift_ppm": self.drift_ppm, "t0_ns": self.t0_ns}
        if self.steps:
            out["steps"] = [[at, j] for at, j in self.steps]
        return out


def process_start_ns() -> int:
    """When this process started (CLOCK_REALTIME ns, to the kernel's 10 ms ticks); the import of this module where
    /proc says nothing."""
    try:
        with open("/proc/self/stat", "rb") as fh:
            start_ticks = int(fh.read().rsplit(b")", 1)[1].split()[19])  # field 22, starttime
        with open("/proc/stat", "rb") as fh:
            btime = next(int(ln.split()[1]) for ln in fh if ln.startswith(b"btime "))
        return int((btime + start_ticks / os.sysconf("SC_CLK_TCK")) * 1e9)
    except (OSError, ValueError, IndexError, StopIteration):
        return _IMPORTED_NS


_IMPORTED_NS = time.time_ns()


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
    base, *step_specs = entry.split("/")
    off, _, drift = base.partition("@")
    try:
        offset_s = float(off) if off else 0.0
        drift_ppm = float(drift) if drift else 0.0
        start = process_start_ns() if step_specs else 0
        steps = tuple(sorted((start + round(float(after) * 1e9), float(jump))
                             for jump, after in (spec.split("@") for spec in step_specs)))
    except ValueError:
        raise ConfigError(
            f"DISTPROF_SIM_CLOCKS entry {entry!r}: expected OFFSET_S[@DRIFT_PPM][/JUMP_S@AFTER_S...], e.g. 3.25@40 "
            "or 0/5@6"
        ) from None
    t0_raw = env.get("DISTPROF_SIM_T0_NS")
    t0 = int(t0_raw) if t0_raw else (time.time_ns() // DAY_NS) * DAY_NS
    return SimClock(offset_s, drift_ppm, t0, steps)
