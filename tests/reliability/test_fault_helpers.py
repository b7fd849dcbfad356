"""Table tests of the fault tests' own clock arithmetic: a wrong helper there fails a good job or passes a hung one."""

from __future__ import annotations

import time

import pytest
from fault_jobs import distprof_traceback, seconds_since_log_time, sigterm_sent_at


def local_epoch(h: int, m: int, s: float) -> float:
    """Epoch seconds of today's local h:m:s (the helper reads the time of day in local time, as torchrun logs it)."""
    base = time.mktime((2026, 12, 7, h, m, int(s), 0, 0, -1))
    return base + (s % 1)


@pytest.mark.parametrize("now,sent,elapsed", [
    ((0, 10, 12.0009), 611.497, 0.5039),       # the second rolled over between the log line and now
    ((0, 0, 1.0), 86399.5, 1.5),               # the log line before midnight, now after it
    ((23, 59, 59.0), 86398.0, 1.0),
    ((12, 0, 0.25), 43200.75, -0.5),           # a log clock ahead of now reads negative, not as nearly a day
])
def test_seconds_since_log_time(now, sent, elapsed):
    assert seconds_since_log_time(sent, local_epoch(*now)) == pytest.approx(elapsed, abs=1e-6)


def test_sigterm_sent_at_reads_torchrun_log_clock():
    line = ("W1207 00:10:11.497000 10921 site-packages/torch/.../api.py:1028] Sending process 10925 closing signal "
            "SIGTERM")
    assert sigterm_sent_at("noise\n" + line + "\n") == pytest.approx(611.497)
    assert sigterm_sent_at("no signal here") is None


def _tb(*files: str) -> str:
    return "Traceback (most recent call last):\n" + "".join(f'  File "{f}", line 1, in x\n' for f in files)


@pytest.mark.parametrize("stderr, found", [
    # the script's own exception, through the launcher's frames only: not distprof's
    (_tb("/x/distprof/launch.py", "/x/distprof/rank_entry.py", "/job/train.py"), None),
    (_tb("/x/distprof/launch.py", "/x/distprof/capture/profiler.py"), 'File "/x/distprof/capture/profiler.py"'),
    ("Exception in thread distprof-writer:\n", "Exception in thread distprof"),
    ("", None),
])
def test_a_traceback_is_distprofs_only_beyond_the_launchers_frames(stderr, found):
    assert distprof_traceback(stderr) == found
