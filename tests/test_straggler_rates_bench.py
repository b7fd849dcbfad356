"""benchmarks/straggler_rates.py judges the reported lateness against the delay asked for and against how late the
slow rank really was by the job's own clock: the slow rank's logged values (time asleep, when it reached the step's
first collective) minus the other ranks', over the recorded steps only (the job's --sleep-log files)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
import straggler_rates as sr  # noqa: E402

RECORDED = range(sr.WAIT + sr.WARMUP, sr.WAIT + sr.WARMUP + 4)


def _logs(tmp_path: Path, per_rank: dict[int, list[float]]) -> Path:
    """The job's logs: `per_rank` as the time asleep, and as the time the rank reached its sync point (ms → ns)."""
    for rank, slept in per_rank.items():
        (tmp_path / f"slept.rank{rank}.json").write_text(
            json.dumps({"slept_ms": slept, "sync_ns": [int(1e12 + x * 1e6) for x in slept]}))
    return tmp_path


def _steps(recorded: float, other: float, n: int = 12) -> list[float]:
    return [recorded if i in RECORDED else other for i in range(n)]


@pytest.mark.parametrize("per_rank, expected", [
    # the slow rank's sleeps minus the other's, recorded steps only (the others carry a 90 ms outlier)
    ({0: _steps(40.2, 40.2), 1: _steps(43.5, 130.0)}, 3.3),
    # the median over the other ranks, then over the steps
    ({0: _steps(40.0, 40.0), 1: _steps(42.5, 42.5), 2: _steps(40.2, 40.2), 3: _steps(40.4, 40.4)}, 2.3),
    # a balanced job: nothing slept beyond the others
    ({0: _steps(40.3, 40.3), 1: _steps(40.3, 40.3)}, 0.0),
    # a job shorter than the window: the steps both logs hold
    ({0: [40.0] * 6, 1: [40.0] * 5 + [45.0]}, 5.0),
])
def test_the_slow_ranks_extra_in_the_recorded_steps(tmp_path, per_rank, expected):
    assert sr.job_measures(_logs(tmp_path, per_rank), active=len(RECORDED)) == (pytest.approx(expected),
                                                                                pytest.approx(expected))


@pytest.mark.parametrize("per_rank", [{}, {0: [40.0] * 12}, {1: [42.0] * 12}])
def test_without_both_ranks_logs_there_is_no_measure(tmp_path, per_rank):
    assert sr.job_measures(_logs(tmp_path, per_rank), active=4) == (None, None)


def _outcome(delay_ms: float, lateness_ms: float | None, job_ms: float | None) -> sr.Outcome:
    return sr.Outcome("fsdp2", 10, 5.0, delay_ms, 65.0, [1], lateness_ms, None, 1.0, None, job_ms)


@pytest.mark.parametrize("delay, lateness, job, ok_asked, ok_job", [
    (3.0, 3.4, 3.3, False, True),   # the job measured 3.3 ms: 3.4 is within 10 % of it, not of 3.0
    (3.0, 3.2, 3.3, True, True),
    (3.0, 2.6, 3.3, False, False),
    (3.0, 2.8, 2.3, True, False),   # near the delay asked, but not what the job measured
    (3.0, 3.2, None, True, False),  # runs kept without the logs: only the delay asked
    (3.0, None, 3.3, False, False),  # the report gave the rank no lateness
    (0.0, 0.0, None, False, False),  # balanced runs have no lateness to judge
])
def test_lateness_is_judged_against_the_delay_asked_and_the_jobs_own(delay, lateness, job, ok_asked, ok_job):
    o = _outcome(delay, lateness, job)
    assert (o.lateness_ok, o.lateness_ok_job) == (ok_asked, ok_job)
