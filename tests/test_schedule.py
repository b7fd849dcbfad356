"""The schedule is a pure step -> action function: table tests, and agreement with torch.profiler.schedule."""

from __future__ import annotations

import pytest

from distprof.capture.schedule import Action, action_at, steps_needed, window_of, window_steps
from distprof.config import ScheduleConfig
from distprof.errors import ConfigError

N, W, R, S = Action.NONE, Action.WARMUP, Action.RECORD, Action.RECORD_AND_SAVE


@pytest.mark.parametrize("cfg, expected", [
    (ScheduleConfig(wait=1, warmup=1, active=3, repeat=1), [N, W, R, R, S, N, N, N]),
    (ScheduleConfig(wait=0, warmup=0, active=1, repeat=2), [S, S, N, N]),
    (ScheduleConfig(wait=1, warmup=0, active=2, repeat=0), [N, R, S, N, R, S, N]),
    (ScheduleConfig(wait=0, warmup=1, active=2, repeat=1, skip_first=2), [N, N, W, R, S, N]),
])
def test_action_table(cfg, expected):
    assert [action_at(cfg, s) for s in range(len(expected))] == expected


@pytest.mark.parametrize("cfg", [
    ScheduleConfig(wait=1, warmup=1, active=3, repeat=1),
    ScheduleConfig(wait=2, warmup=0, active=2, repeat=3, skip_first=1),
    ScheduleConfig(wait=0, warmup=2, active=1, repeat=0),
])
def test_matches_torch_schedule(cfg):
    from torch.profiler import schedule

    ref = schedule(wait=cfg.wait, warmup=cfg.warmup, active=cfg.active, repeat=cfg.repeat, skip_first=cfg.skip_first)
    for step in range(40):
        assert action_at(cfg, step).name == ref(step).name, step


def test_windows():
    cfg = ScheduleConfig(wait=1, warmup=1, active=3, repeat=2, skip_first=1)
    assert window_steps(cfg, 0) == (3, 5) and window_steps(cfg, 1) == (8, 10)
    assert [window_of(cfg, s) for s in range(12)] == [None] * 3 + [0] * 3 + [None] * 2 + [1] * 3 + [None]
    assert steps_needed(cfg) == 11
    assert steps_needed(ScheduleConfig(repeat=0)) is None


def test_invalid_schedule_names_values():
    with pytest.raises(ConfigError, match=r"active=0 \(need >= 1\), wait=-1|wait=-1 \(need >= 0\), active=0"):
        ScheduleConfig(wait=-1, active=0)
