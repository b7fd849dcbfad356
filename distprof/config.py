"""Capture configuration: one dataclass, validated on construction, every field also a DISTPROF_* variable."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any, Mapping

from .errors import ConfigError

STEP_MODES = ("optimizer", "manual")
CODECS = ("zstd", "gzip")
#: "steps": the wait/warmup/active cycles below; "none": no window of its own, only triggered ones (`distprof trigger`).
SCHEDULE_KINDS = ("steps", "none")


@dataclass(frozen=True)
class ScheduleConfig:
    """Which global steps are profiled. Same meaning as torch.profiler.schedule.

    Steps ``skip_first`` .. are grouped in cycles of ``wait`` idle, ``warmup`` warm-up and ``active`` recorded steps;
    ``repeat`` cycles (0 = until the job ends). ``kind="none"`` records no window of its own: only windows asked for
    by ``distprof trigger`` (which take ``warmup`` warm-up steps and, unless the request says otherwise, ``active``
    recorded steps).
    """

    wait: int = 3
    warmup: int = 2
    active: int = 5
    repeat: int = 1
    skip_first: int = 0
    kind: str = "steps"

    def __post_init__(self) -> None:
        if self.kind not in SCHEDULE_KINDS:
            raise ConfigError(f"schedule={self.kind!r}: choose one of {', '.join(SCHEDULE_KINDS)}")
        bad = [
            f"{k}={getattr(self, k)} (need >= {lo})"
            for k, lo in (("wait", 0), ("warmup", 0), ("active", 1), ("repeat", 0), ("skip_first", 0))
            if not isinstance(getattr(self, k), int) or getattr(self, k) < lo
        ]
        if bad:
            raise ConfigError("invalid profiling schedule: " + ", ".join(bad))

    @property
    def cycle(self) -> int:
        return self.wait + self.warmup + self.active


#: The most steps a trigger may put between now and its window (``--trigger-margin``, ``distprof trigger --in``).
MAX_TRIGGER_MARGIN = 1_000_000


@dataclass(frozen=True)
class ProfileConfig:
    """Everything the capture needs. Build from the CLI (`distprof.launch`), the API, or the environment."""

    out: str = "distprof"
    run_id: str | None = None
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    flops: bool = True
    memory: bool = True
    shapes: bool = True  # needed for collective message sizes on gloo
    stack: bool = False
    step_on: str = "optimizer"
    strict: bool = False
    codec: str = "zstd"
    sync_rounds: int = 16
    sync_timeout_s: float = 30.0
    memory_history: bool = False  # CUDA only: allocator history per window (torch.cuda.memory._record_memory_history)
    memory_history_entries: int = 100_000  # its ring buffer: the most alloc/free entries kept per window
    trigger: bool = True  # answer `distprof trigger` (rank 0 looks for a request file, the others at the store)
    trigger_poll_s: float = 0.5  # how often rank 0 looks for a request; the others check the store at least this
    # far apart, more with many ranks (capture/trigger.py: check_interval_s)
    trigger_margin: int = 3  # fewest steps between rank 0 seeing a request and its window's first (warm-up) step
    cpu_sample_ms: float = 1.0  # how often a side thread samples the training thread's CPU waits while recording; 0 off
    watch: bool = False  # a few timings of every step on every rank, and a window when a rank drifts (docs/watch.md)
    watch_interval_s: float = 2.0  # how often each rank flushes its series and publishes its own work
    watch_threshold: float = 0.2  # a rank drifts when its own work exceeds the others' median by this fraction ...
    watch_steps: int = 10  # ... for this many consecutive steps
    watch_cooldown_s: float = 300.0  # at most one window asked for by the watch per this many seconds

    def __post_init__(self) -> None:
        if self.step_on not in STEP_MODES:
            raise ConfigError(f"step_on={self.step_on!r}: choose one of {', '.join(STEP_MODES)}")
        if self.codec not in CODECS:
            raise ConfigError(f"codec={self.codec!r}: choose one of {', '.join(CODECS)}")
        if self.sync_rounds < 1:
            raise ConfigError(f"sync_rounds={self.sync_rounds}: need >= 1")
        if self.sync_timeout_s <= 0:
            raise ConfigError(f"sync_timeout_s={self.sync_timeout_s}: need > 0")
        if not isinstance(self.memory_history_entries, int) or self.memory_history_entries < 1:
            raise ConfigError(f"memory_history_entries={self.memory_history_entries!r}: need an integer >= 1")
        if not (self.cpu_sample_ms == 0 or 0.2 <= self.cpu_sample_ms <= 1000):
            raise ConfigError(f"cpu_sample_ms={self.cpu_sample_ms}: need 0 (off) or milliseconds in 0.2..1000")
        if self.schedule.kind == "none" and not self.trigger:
            raise ConfigError("--schedule none records only triggered windows, and --no-trigger turns them off: "
                              "nothing would be recorded; drop one of them")
        if not 0.05 <= self.trigger_poll_s <= 3600:
            raise ConfigError(f"trigger_poll_s={self.trigger_poll_s}: need a number of seconds in 0.05..3600")
        if not 0.05 <= self.watch_interval_s <= 3600:
            raise ConfigError(f"watch_interval_s={self.watch_interval_s}: need a number of seconds in 0.05..3600")
        if not (0 < self.watch_threshold <= 100):
            raise ConfigError(f"watch_threshold={self.watch_threshold}: need a fraction > 0 (0.2: 20 % above the "
                              "other ranks' median)")
        if not isinstance(self.watch_steps, int) or not 1 <= self.watch_steps <= 100_000:
            raise ConfigError(f"watch_steps={self.watch_steps!r}: need an integer in 1..100000")
        if not 0 <= self.watch_cooldown_s <= 1e7:
            raise ConfigError(f"watch_cooldown_s={self.watch_cooldown_s}: need a number of seconds >= 0")
        if not isinstance(self.trigger_margin, int) or not 0 <= self.trigger_margin <= MAX_TRIGGER_MARGIN:
            raise ConfigError(f"trigger_margin={self.trigger_margin!r}: need an integer in 0..{MAX_TRIGGER_MARGIN}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# ---- environment ---------------------------------------------------------------------------------------------

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def env_name(key: str) -> str:
    return "DISTPROF_" + key.upper()


def parse_bool(value: str, name: str) -> bool:
    v = value.strip().lower()
    if v in _TRUE:
        return True
    if v in _FALSE:
        return False
    raise ConfigError(f"{name}={value!r}: expected one of 1/0, true/false, yes/no, on/off")


def parse_int(value: str, name: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"{name}={value!r}: expected an integer") from None


def parse_float(value: str, name: str) -> float:
    try:
        return float(value)
    except ValueError:
        raise ConfigError(f"{name}={value!r}: expected a number") from None


def _parse_str(value: str, name: str) -> str | None:
    return value or None  # an empty variable means unset


#: option -> its field of ScheduleConfig (``schedule`` is the kind: ``--schedule none`` / DISTPROF_SCHEDULE=none)
_SCHEDULE_FIELDS = {"wait": "wait", "warmup": "warmup", "active": "active", "repeat": "repeat",
                    "skip_first": "skip_first", "schedule": "kind"}
_SCHEDULE_KEYS = tuple(_SCHEDULE_FIELDS)
#: option -> parser of its DISTPROF_* variable; schedule keys go into ScheduleConfig, the rest into ProfileConfig.
_PARSERS = {
    **{k: parse_int for k in _SCHEDULE_KEYS if k != "schedule"},
    "schedule": _parse_str,
    **{k: parse_bool for k in ("flops", "memory", "shapes", "stack", "strict", "memory_history", "trigger",
                                     "watch")},
    **{k: _parse_str for k in ("out", "run_id", "step_on", "codec")},
    "sync_rounds": parse_int,
    "sync_timeout_s": parse_float,
    "memory_history_entries": parse_int,
    "cpu_sample_ms": parse_float,
    "trigger_poll_s": parse_float,
    "trigger_margin": parse_int,
    "watch_interval_s": parse_float,
    "watch_threshold": parse_float,
    "watch_steps": parse_int,
    "watch_cooldown_s": parse_float,
}


def config_from_mapping(values: Mapping[str, Any], environ: Mapping[str, str] | None = None) -> ProfileConfig:
    """Build a config: explicit `values` (None = unset) win over DISTPROF_* variables, which win over defaults."""
    env = os.environ if environ is None else environ
    unknown = sorted(set(values) - set(_PARSERS))
    if unknown:
        raise ConfigError(f"unknown option(s) {', '.join(unknown)}; known: {', '.join(sorted(_PARSERS))}")
    top: dict[str, Any] = {}
    sched: dict[str, Any] = {}
    for key, parse in _PARSERS.items():
        v = values.get(key)
        if v is None and env_name(key) in env:
            v = parse(env[env_name(key)], env_name(key))
        if v is not None and v != "":
            if key in _SCHEDULE_FIELDS:
                sched[_SCHEDULE_FIELDS[key]] = v
            else:
                top[key] = v
    return ProfileConfig(schedule=ScheduleConfig(**sched), **top)
