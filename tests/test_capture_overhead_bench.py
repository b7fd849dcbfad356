"""benchmarks/capture_overhead.py --quick prints every goal of issue 25 with a CPU ratio, its interval and a verdict.

The benchmark reaches into the running profiler (it takes distprof's per-step work off the training thread and puts
it back, and times its torch profiler's steps): a rename there breaks it, and this test says so."""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import require_slow

ROOT = Path(__file__).resolve().parent.parent
GOALS = ["in a window", "outside windows", "--watch", "window-closing hold", "shard writing", "size"]
LINE = re.compile(r"^  (?P<name>.+?)\s+CPU (?P<r>\S+) \[(?P<lo>\S+), (?P<hi>\S+)\]\s+goal <= (?P<goal>\S+)\s+"
                  r"(?P<verdict>met|NOT MET)")


@pytest.mark.slow
def test_quick_run_prints_every_goal_with_a_finite_ratio_and_interval():
    require_slow("torchrun jobs")
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "capture_overhead.py"), "--quick"], cwd=ROOT,
                       capture_output=True, text=True, timeout=600, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert p.returncode == 0, p.stderr[-3000:]
    rows = {m["name"]: m for m in map(LINE.match, p.stdout.splitlines()) if m}
    for goal in GOALS:
        row = next((m for name, m in rows.items() if name.startswith(goal)), None)
        assert row is not None, f"no goal line for {goal!r}:\n{p.stdout}"
        r, lo, hi = (float(row[k]) for k in ("r", "lo", "hi"))
        assert all(math.isfinite(v) and v > 0 for v in (r, lo, hi)), row.group(0)
        assert lo <= r <= hi, row.group(0)
    assert "side threads' CPU per step" in p.stdout
