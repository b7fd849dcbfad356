"""Capture configuration: one dataclass, validated on construction, every field also a DISTPROF_* variable."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any, Mapping

from .errors import ConfigError

STEP_MODES = ("optimizer", "manual")
CODECS = ("zstd", "gzip")


@dataclass(frozen=True)
class ScheduleConfig:
    """Which global steps are profiled. Same meaning as torch.profiler.schedule.

    Steps ``skip_first`` .. are grouped in cycles of ``wait`` idle, ``warmup`` warm-up and ``active`` recorded steps;
    ``repeat`` cycles (0 = until the job ends).
    """

    wait: int = 3
    warmup: int = 2
    active: int = 5
    repeat: int = 1
    skip_first: int = 0

    def __post_init__(self) -> None:
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

    def __post_init__(self) -> None:
        if self.step_on not in STEP_MODES:
            raise ConfigError(f"step_on={self.step_on!r}: choose one of {', '.join(STEP_MODES)}")
        if self.codec not in CODECS:
            raise ConfigError(f"codec={self.codec!r}: choose one of {', '.join(CODECS)}")
        if self.sync_rounds < 1:
            raise ConfigError(f"sync_rounds={self.sync_rounds}: need >= 1")
        if self.sync_timeout_s <= 0:
            raise ConfigError(f"sync_timeout_s={self.sync_timeout_s}: need > 0")

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


_SCHEDULE_KEYS = ("wait", "warmup", "active", "repeat", "skip_first")
_BOOL_KEYS = ("flops", "memory", "shapes", "stack", "strict")


def config_from_mapping(values: Mapping[str, Any], environ: Mapping[str, str] | None = None) -> ProfileConfig:
    """Build a config: explicit `values` (None = unset) win over DISTPROF_* variables, which win over defaults."""
    env = os.environ if environ is None else environ
    known = set(_SCHEDULE_KEYS) | set(_BOOL_KEYS) | {"out", "run_id", "step_on", "codec", "sync_rounds",
                                                      "sync_timeout_s"}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ConfigError(f"unknown option(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    top: dict[str, Any] = {}
    sched: dict[str, Any] = {}

    def pick(key: str, parse):
        v = values.get(key)
        if v is not None:
            return v
        raw = env.get(env_name(key))
        if raw is None:
            return None
        return parse(raw, env_name(key))

    for key in _SCHEDULE_KEYS:
        v = pick(key, parse_int)
        if v is not None:
            sched[key] = v
    for key in _BOOL_KEYS:
        v = pick(key, parse_bool)
        if v is not None:
            top[key] = v
    for key in ("out", "run_id", "step_on", "codec"):
        v = pick(key, lambda raw, _n: raw)
        if v is not None and v != "":
            top[key] = v
    v = pick("sync_rounds", parse_int)
    if v is not None:
        top["sync_rounds"] = v
    v = pick("sync_timeout_s", parse_float)
    if v is not None:
        top["sync_timeout_s"] = v
    return ProfileConfig(schedule=ScheduleConfig(**sched), **top)
