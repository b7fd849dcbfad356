"""Test-only simulation of several hosts on one machine (documented in docs/shard-format.md).

DISTPROF_SIM_HOSTS=0,0,1,1     rank i lives on simulated host sim-host<h>, h = i-th entry
DISTPROF_SIM_CLOCKS=0,3.25@40  simulated host h has clock offset (s) and optional drift (ppm)
DISTPROF_SIM_CLOCKS=0,0/5@6    ... and steps: host 1's clock jumps +5 s 6 s after its process started (NTP stepping
                               it); several steps: 0/5@6/-0.5@9

Every timestamp the rank records becomes t + offset + drift·1e-6·(t − t0) + the jumps of the steps at or before t;
t0 is midnight UTC of the day the rank started, or DISTPROF_SIM_T0_NS. A step's time counts from the start of the
rank's process (``/proc/self/stat``), or, with DISTPROF_SIM_STEP_ORIGIN=FILE, from the epoch nanoseconds a test
writes into FILE while the job runs (no step happens before the file exists): every rank reads the same origin.
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
    steps: tuple[tuple[float, float], ...] = ()  # (seconds after the origin, jump in s): the clock stepped
    origin_file: str | None = None  # where the steps' origin is read from (None: the process's start)

    @property
    def is_identity(self) -> bool:
        return self.offset_s == 0.0 and self.drift_ppm == 0.0 and not self.steps

    def apply(self, t: np.ndarray | int):
        """Map true CLOCK_REALTIME ns to this simulated host's clock (arrays or scalars)."""
        if self.is_identity:
            return t
        steps = self.step_times()
        if isinstance(t, (int, np.integer)):
            jumps = sum(j for at, j in steps if int(t) >= at)
            return int(t) + round(self.offset_s * 1e9 + self.drift_ppm * 1e-6 * (int(t) - self.t0_ns) + jumps * 1e9)
        t = np.asarray(t, dtype=np.int64)
        corr = self.offset_s * 1e9 + self.drift_ppm * 1e-6 * (t - self.t0_ns).astype(np.float64)
        for at, j in steps:
            corr = corr + np.where(t >= at, j * 1e9, 0.0)
        return t + np.rint(corr).astype(np.int64)

    def step_times(self) -> list[tuple[int, float]]:
        """(true time in ns from which, jump in s) of each step whose origin is known yet."""
        if not self.steps:
            return []
        origin = step_origin_ns(self.origin_file)
        return [] if origin is None else [(origin + round(after * 1e9), j) for after, j in self.steps]

    def to_dict(self) -> dict:
        out = {"offset_s": self.offset_s, "drift_ppm": self.drift_ppm, "t0_ns": self.t0_ns}
        if self.steps:
            out["steps"] = [[at, j] for at, j in self.step_times()]
        return out


_ORIGINS: dict[str, int] = {}


def step_origin_ns(path: str | None) -> int | None:
    """The origin the steps count from: the process's start, or the epoch ns in `path` once it exists (kept)."""
    if path is None:
        return process_start_ns()
    if path not in _ORIGINS:
        try:
            with open(path, "rb") as fh:
                _ORIGINS[path] = int(fh.read().strip())
        except (OSError, ValueError):
            return None
    return _ORIGINS[path]


def process_start_ns() -> int:
    """When this process started (CLOCK_REALTIME ns, to the kernel's 10 ms ticks); the import of this module where
    /proc says nothing."""
    global _STARTED_NS
    if _STARTED_NS is None:
        _STARTED_NS = _read_process_start()
    return _STARTED_NS


_STARTED_NS: int | None = None


def _read_process_start() -> int:
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
        steps = tuple(sorted((float(after), float(jump)) for jump, after in (spec.split("@") for spec in step_specs)))
    except ValueError:
        raise ConfigError(
            f"DISTPROF_SIM_CLOCKS entry {entry!r}: expected OFFSET_S[@DRIFT_PPM][/JUMP_S@AFTER_S...], e.g. 3.25@40 "
            "or 0/5@6"
        ) from None
    t0_raw = env.get("DISTPROF_SIM_T0_NS")
    t0 = int(t0_raw) if t0_raw else (time.time_ns() // DAY_NS) * DAY_NS
    return SimClock(offset_s, drift_ppm, t0, steps, env.get("DISTPROF_SIM_STEP_ORIGIN") or None)
