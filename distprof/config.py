"""Capture configuration: one dataclass, validated on construction, every field also a DISTPROF_* variable."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any, Mapping

from .errors import ConfigError
from .runid import check_run_id

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
class TriggerConfig:
    """On-demand windows asked for with ``distprof trigger`` (options ``--trigger``, ``--trigger-poll``,
    ``--trigger-margin``; docs/trigger.md)."""

    enabled: bool = True  # answer `distprof trigger` (rank 0 looks for a request file, the others at the store)
    poll_s: float = 0.5  # how often rank 0 looks for a request; the others check the store at least this far apart,
    # more with many ranks (capture/trigger.py: check_interval_s)
    margin: int = 3  # fewest steps between rank 0 seeing a request and its window's first (warm-up) step

    def __post_init__(self) -> None:
        if not 0.05 <= self.poll_s <= 3600:
            raise ConfigError(f"trigger_poll_s={self.poll_s}: need a number of seconds in 0.05..3600")
        if not isinstance(self.margin, int) or not 0 <= self.margin <= MAX_TRIGGER_MARGIN:
            raise ConfigError(f"trigger_margin={self.margin!r}: need an integer in 0..{MAX_TRIGGER_MARGIN}")


@dataclass(frozen=True)
class WatchConfig:
    """The always-on watch (options ``--watch``, ``--watch-interval``, ``--watch-threshold``, ``--watch-steps``,
    ``--watch-cooldown``; docs/watch.md)."""

    enabled: bool = False  # a few timings of every step on every rank, and a window when a rank drifts
    interval_s: float = 2.0  # how often each rank flushes its series and publishes its own work
    threshold: float = 0.2  # a rank drifts when its own work exceeds the others' median by this fraction ...
    steps: int = 10  # ... for this many consecutive steps
    cooldown_s: float = 300.0  # at most one window asked for by the watch per this many seconds

    def __post_init__(self) -> None:
        if not 0.05 <= self.interval_s <= 3600:
            raise ConfigError(f"watch_interval_s={self.interval_s}: need a number of seconds in 0.05..3600")
        if not (0 < self.threshold <= 100):
            raise ConfigError(f"watch_threshold={self.threshold}: need a fraction > 0 (0.2: 20 % above the "
                              "other ranks' median)")
        if not isinstance(self.steps, int) or not 1 <= self.steps <= 100_000:
            raise ConfigError(f"watch_steps={self.steps!r}: need an integer in 1..100000")
        if not 0 <= self.cooldown_s <= 1e7:
            raise ConfigError(f"watch_cooldown_s={self.cooldown_s}: need a number of seconds >= 0")


#: option (CLI dest, DISTPROF_* variable, shard ``config`` key) -> (section of ProfileConfig, field in it)
SECTION_OPTIONS: dict[str, tuple[str, str]] = {
    "wait": ("schedule", "wait"), "warmup": ("schedule", "warmup"), "active": ("schedule", "active"),
    "repeat": ("schedule", "repeat"), "skip_first": ("schedule", "skip_first"), "schedule": ("schedule", "kind"),
    "trigger": ("trigger", "enabled"), "trigger_poll_s": ("trigger", "poll_s"), "trigger_margin": ("trigger", "margin"),
    "watch": ("watch", "enabled"), "watch_interval_s": ("watch", "interval_s"),
    "watch_threshold": ("watch", "threshold"), "watch_steps": ("watch", "steps"),
    "watch_cooldown_s": ("watch", "cooldown_s"),
}
_SECTIONS = {"schedule": ScheduleConfig, "trigger": TriggerConfig, "watch": WatchConfig}


@dataclass(frozen=True)
class ProfileConfig:
    """Everything the capture needs. Build from the CLI (`distprof.launch`), the API, or the environment.

    The schedule, the trigger and the watch are sections of their own (`ScheduleConfig`, `TriggerConfig`,
    `WatchConfig`); their options keep their flat names on the command line, in DISTPROF_* variables and in the
    shard's ``config`` attribute (`to_dict`, `from_dict`).
    """

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
    trigger: TriggerConfig = field(default_factory=TriggerConfig)
    cpu_sample_ms: float = 1.0  # how often a side thread samples the training thread's CPU waits while recording; 0 off
    watch: WatchConfig = field(default_factory=WatchConfig)
    summaries: bool = True  # the rank's summary computed on the writer thread and stored in its (only) shard

    def __post_init__(self) -> None:
        for name, cls in _SECTIONS.items():
            if not isinstance(getattr(self, name), cls):
                raise ConfigError(f"{name}={getattr(self, name)!r}: need a {cls.__name__}")
        if self.run_id is not None:
            check_run_id(self.run_id)  # one safe directory name (distprof/runid.py)
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
        if self.schedule.kind == "none" and not self.trigger.enabled:
            raise ConfigError("--schedule none records only triggered windows, and --no-trigger turns them off: "
                              "nothing would be recorded; drop one of them")

    def to_dict(self) -> dict[str, Any]:
        """The shard's ``config`` attribute: the schedule nested as ``schedule`` (its ``kind`` included), the trigger's
        and the watch's options flat under their option names (``trigger``, ``trigger_poll_s``, ``watch_threshold``,
        ...), as every shard has had them (docs/shard-format.md)."""
        d: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.name == "schedule":
                d[f.name] = dataclasses.asdict(v)
            elif f.name in ("trigger", "watch"):
                d.update({opt: getattr(v, fld) for opt, (sec, fld) in SECTION_OPTIONS.items() if sec == f.name})
            else:
                d[f.name] = v
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "ProfileConfig":
        """The inverse of `to_dict` (a shard's ``config`` attribute; keys it does not know are left out, those it
        lacks take their defaults)."""
        top = {f.name for f in dataclasses.fields(cls)} - set(_SECTIONS)
        sections: dict[str, dict[str, Any]] = {name: {} for name in _SECTIONS}
        sched = d.get("schedule")
        if isinstance(sched, Mapping):
            known = {f.name for f in dataclasses.fields(ScheduleConfig)}
            sections["schedule"] = {k: v for k, v in sched.items() if k in known}
        for opt, (sec, fld) in SECTION_OPTIONS.items():
            if sec != "schedule" and opt in d:
                sections[sec][fld] = d[opt]
        return cls(**{k: v for k, v in d.items() if k in top},
                   **{name: _SECTIONS[name](**kw) for name, kw in sections.items()})


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


#: option -> parser of its DISTPROF_* variable; section options (SECTION_OPTIONS) go into their section.
_PARSERS = {
    **{k: parse_int for k in ("wait", "warmup", "active", "repeat", "skip_first")},
    "schedule": _parse_str,
    **{k: parse_bool for k in ("flops", "memory", "shapes", "stack", "strict", "memory_history", "trigger",
                                     "watch", "summaries")},
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
    sections: dict[str, dict[str, Any]] = {name: {} for name in _SECTIONS}
    for key, parse in _PARSERS.items():
        v = values.get(key)
        if v is None and env_name(key) in env:
            v = parse(env[env_name(key)], env_name(key))
        if v is not None and v != "":
            if key in SECTION_OPTIONS:
                sec, fld = SECTION_OPTIONS[key]
                sections[sec][fld] = v
            else:
                top[key] = v
    return ProfileConfig(**top, **{name: cls(**sections[name]) for name, cls in _SECTIONS.items()})
