"""The profiling schedule as a pure function of the global step: every rank computes the same action.

:class:`WindowPlan` adds the windows a trigger asked for (``distprof trigger``, capture/trigger.py) to the static
schedule: every rank adds the same triggered windows in the same order (rank 0 decides, the others learn it through the
c10d store before the window's first step), so the plan stays a function of the step that every rank agrees on.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from ..config import ScheduleConfig


class Action(Enum):
    NONE = "none"
    WARMUP = "warmup"
    RECORD = "record"
    RECORD_AND_SAVE = "record_and_save"


def action_at(cfg: ScheduleConfig, step: int) -> Action:
    """Action for global step `step` (0-based), with torch.profiler.schedule's semantics."""
    if cfg.kind == "none" or step < cfg.skip_first:
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
    """Iterations a job must run for every window to finish (None when repeat=0: unbounded; 0 for kind "none")."""
    if cfg.kind == "none":
        return 0
    if cfg.repeat == 0:
        return None
    return cfg.skip_first + cfg.cycle * cfg.repeat


def static_windows(cfg: ScheduleConfig) -> int | None:
    """How many windows the schedule itself records (None: without end, repeat=0)."""
    if cfg.kind == "none":
        return 0
    return cfg.repeat if cfg.repeat > 0 else None


@dataclass(frozen=True)
class TriggeredWindow:
    """A window a trigger asked for: warm-up from `begin`, recorded steps `first`..`last` (inclusive).

    `plan` is its number among the job's triggered windows (0, 1, ...), the same on every rank; its window index (shard
    name) continues after the schedule's own windows: ``static_windows + plan``.
    """

    plan: int
    index: int
    begin: int
    first: int
    last: int
    request_id: str
    reason: str = ""  # why it was asked for (the watch's drift), empty from `distprof trigger`

    @property
    def steps(self) -> int:
        return self.last - self.first + 1


#: How far a triggered window may be moved past the schedule's windows before the plan gives up.
_MAX_MOVES = 10_000


class WindowPlan:
    """The windows of this job: the static schedule's and the triggered ones (training thread only)."""

    def __init__(self, cfg: ScheduleConfig) -> None:
        self.cfg = cfg
        self.triggered: list[TriggeredWindow] = []  # every triggered window this rank knows, in plan order
        self._recorded: list[TriggeredWindow] = []  # those this rank records (learnt in time), not yet over

    # -- what each step does --------------------------------------------------------------------------------------
    def action(self, step: int) -> Action:
        for t in self._recorded:
            if t.begin <= step <= t.last:
                return Action.WARMUP if step < t.first else Action.RECORD if step < t.last else Action.RECORD_AND_SAVE
        return action_at(self.cfg, step)

    def window(self, step: int) -> int | None:
        """Index of the window that records `step`, or None."""
        for t in self._recorded:
            if t.first <= step <= t.last:
                return t.index
        return window_of(self.cfg, step)

    def busy(self, step: int) -> tuple[int, int, int, int] | None:
        """(window, begin, first, last) of the window warming up or recording at `step`, else None."""
        for t in self._recorded:
            if t.begin <= step <= t.last:
                return t.index, t.begin, t.first, t.last
        if action_at(self.cfg, step) is Action.NONE:
            return None
        w = (step - self.cfg.skip_first) // self.cfg.cycle
        first, last = window_steps(self.cfg, w)
        return w, first - self.cfg.warmup, first, last

    def pending(self, step: int) -> TriggeredWindow | None:
        """A triggered window this rank records that has not ended by `step`."""
        return next((t for t in self._recorded if t.last >= step), None)

    # -- placing and adding triggered windows ---------------------------------------------------------------------
    def place(self, earliest: int, warmup: int, steps: int) -> int | None:
        """The first step a window of `warmup` + `steps` steps can begin at, at or after `earliest`, without
        overlapping a window of the schedule or another triggered one; None when the schedule leaves no such gap."""
        begin = earliest
        length = warmup + steps
        for _ in range(_MAX_MOVES):
            clash = self._clash(begin, begin + length - 1)
            if clash is None:
                return begin
            begin = clash + 1
        return None

    def _clash(self, lo: int, hi: int) -> int | None:
        """The last step of the windows (warm-up included) that overlap steps lo..hi, or None."""
        ends = [t.last for t in self.triggered if t.begin <= hi and t.last >= lo]
        n = static_windows(self.cfg)
        if n != 0:
            c = self.cfg
            s0, span = c.skip_first + c.wait, c.warmup + c.active  # window w occupies s0 + w*cycle .. + span - 1
            w_hi = (hi - s0) // c.cycle
            w_lo = max(0, -((s0 + span - 1 - lo) // c.cycle))  # ceil((lo - s0 - span + 1) / cycle)
            if n is not None:
                w_hi = min(w_hi, n - 1)
            if w_hi >= w_lo:
                ends.append(s0 + w_hi * c.cycle + span - 1)
        return max(ends) if ends else None

    def add(self, t: TriggeredWindow, *, record: bool) -> None:
        """Every rank adds every triggered window in plan order; `record` is False when it learnt of it too late."""
        if t.plan != len(self.triggered):
            raise ValueError(f"triggered window {t.plan} added after {len(self.triggered)} others")
        self.triggered.append(t)
        if record:
            self._recorded = [r for r in self._recorded if r.last >= t.begin] + [t]

    def triggered_window(self, index: int) -> TriggeredWindow | None:
        """The triggered window with this window index, if any."""
        return next((t for t in self.triggered if t.index == index), None)

    def next_index(self) -> int | None:
        """The window index of the next triggered window (None: the schedule's own windows have no end)."""
        n = static_windows(self.cfg)
        return None if n is None else n + len(self.triggered)


def to_torch(plan: "WindowPlan | ScheduleConfig"):
    """A callable torch.profiler.profile accepts as `schedule` (step -> ProfilerAction), asking `plan` each time (a
    WindowPlan's triggered windows count from when they are added)."""
    from torch.profiler import ProfilerAction

    table = {
        Action.NONE: ProfilerAction.NONE,
        Action.WARMUP: ProfilerAction.WARMUP,
        Action.RECORD: ProfilerAction.RECORD,
        Action.RECORD_AND_SAVE: ProfilerAction.RECORD_AND_SAVE,
    }

    action = plan.action if isinstance(plan, WindowPlan) else (lambda step: action_at(plan, step))

    def schedule_fn(step: int):
        return table[action(step)]

    return schedule_fn
