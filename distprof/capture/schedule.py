"""The profiling schedule as a pure function of the global step: every rank computes the same action."""

from __future__ import annotations

from enum import Enum

from ..config import ScheduleConfig


class Action(Enum):
    NONE = "none"
    WARMUP = "warmup"
    RECORD = "record"
    RECORD_AND_SAVE = "record_and_save"


def action_at(cfg: ScheduleConfig, step: int) -> Action:
    """Action for global step `step` (0-based), with torch.profiler.schedule's semantics."""
    if step < cfg.skip_first:
        return Action.NONE
    step -= cfg.skip_first
    if cfg.repeat > 0 and step >= cfg.cycle * cfg.repeat:
        return Action.NONE
    pos = step % cfg.cycle
    if pos < cfg.wait:
        return Action.NONE
    if pos < cfg.wait + cfg.warmup:
        return Action.WARMUP
    return Action.RECORD if pos < cfg.cycle - 1 else Action.RECORD_AND_SAVE


def window_of(cfg: ScheduleConfig, step: int) -> int | None:
    """Index of the window that records `step`, or None when the step is not recorded."""
    if action_at(cfg, step) not in (Action.RECORD, Action.RECORD_AND_SAVE):
        return None
    return (step - cfg.skip_first) // cfg.cycle


def window_steps(cfg: ScheduleConfig, window: int) -> tuple[int, int]:
    """First and last global step (inclusive) recorded by window `window`."""
    first = cfg.skip_first + window * cfg.cycle + cfg.wait + cfg.warmup
    return first, first + cfg.active - 1


def steps_needed(cfg: ScheduleConfig) -> int | None:
    """Iterations a job must run for every window to finish (None when repeat=0: unbounded)."""
    if cfg.repeat == 0:
        return None
    return cfg.skip_first + cfg.cycle * cfg.repeat


def to_torch(cfg: ScheduleConfig):
    """A callable torch.profiler.profile accepts as `schedule` (step -> ProfilerAction)."""
    from torch.profiler import ProfilerAction

    table = {
        Action.NONE: ProfilerAction.NONE,
        Action.WARMUP: ProfilerAction.WARMUP,
        Action.RECORD: ProfilerAction.RECORD,
        Action.RECORD_AND_SAVE: ProfilerAction.RECORD_AND_SAVE,
    }

    def schedule_fn(step: int):
        return table[action_at(cfg, step)]

    return schedule_fn
