"""CLI misuse: bad flags, huge ranges, missing or odd directories. One line and exit 2, or a result bounded by what
the run holds; never a traceback, never an allocation by a number the user typed, never a hang."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time

import pytest
from reliability_helpers import one_error_line, run_cli
from shard_factory import WORLD_SIZE, good_run

#: address-space limit of the processes that get absurd ranges: what the run needs, far below what the ranges ask
MEMORY_LIMIT = 2 << 30


@pytest.fixture(scope="module")
def good_run_dir(tmp_path_factory):
    """A valid 3-rank run (shard_factory.good_run) for the tests of this module to copy or read."""
    return good_run(tmp_path_factory.mktemp("good"))


def _limited(argv: list, timeout: float = 60) -> subprocess.CompletedProcess:
    """Run ``distprof ARGV`` in a real process with MEMORY_LIMIT bytes of address space."""
    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))

    return subprocess.run([sys.executable, "-m", "distprof", *map(str, argv)], capture_output=True, text=True,
                          timeout=timeout, preexec_fn=limit)


@pytest.mark.timeout(120)
def test_huge_rank_and_window_ranges_are_clipped_to_the_run(good_run_dir, tmp_path):
    """Measured: export --ranks 0-99999999999 grew to 24 GB; timeline --ranks 0-999999999 ran for minutes."""
    t0 = time.monotonic()
    p = _limited(["export", good_run_dir, "-o", tmp_path / "k", "--ranks", "0-99999999999", "--no-progress"])
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr[-2000:]
    assert len(list((tmp_path / "k").glob("rank-*.json.gz"))) == WORLD_SIZE
    p = _limited(["timeline", good_run_dir, "-o", tmp_path / "t.json", "--ranks", "0-999999999", "--window",
                  "0-99999999999999", "--steps", "0:99999999999999999999", "--max-events", str(10**18),
                  "--no-progress"])
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr[-2000:]
    doc = json.loads((tmp_path / "t.json").read_text())
    assert doc["otherData"]["distprof"]["selection"]["ranks"] == list(range(WORLD_SIZE))
    for argv, phrase in ((["--ranks", "50-99999999999"], "--ranks 50-99999999999: covers none of this run's rank(s) 0-2"),
                         (["--window", "3-99999999999"], "--window 3-99999999999: covers none of this run's window(s) 0")):
        p = _limited(["timeline", good_run_dir, "-o", tmp_path / "t2.json", *argv, "--no-progress"])
        assert p.returncode == 2 and phrase in one_error_line(p.stderr)
    assert time.monotonic() - t0 < 100


@pytest.mark.timeout(60)
@pytest.mark.parametrize("argv, phrase", [
    (["timeline", "{run}", "-o", "{tmp}/t.json", "--ranks", "7"], "--ranks 7: not in this run"),
    (["timeline", "{run}", "-o", "{tmp}/t.json", "--ranks", "-3"], "--ranks '-3': expected a list"),
    (["timeline", "{run}", "-o", "{tmp}/t.json", "--ranks", "5-2"], "--ranks '5-2': expected a list"),
    (["timeline", "{run}", "-o", "{tmp}/t.json", "--ranks", ","], "--ranks ',': names nothing"),
    (["timeline", "{run}", "-o", "{tmp}/t.json", "--max-events", "-5"], "--max-events -5"),
    (["export", "{run}", "-o", "{tmp}/k", "--ranks", "1e9"], "--ranks '1e9': expected a list"),
    (["export", "{run}", "-o", "{tmp}/k", "--ranks", "99999999999"], "rank(s) 99999999999 not in run"),
    (["report", "{run}", "--steps", "99999999999:"], "--steps '99999999999:': step ids end at"),
    (["report", "{run}", "--steps", "7:3"], "--steps '7:3': need 0 <= A <= B"),
    (["report", "{run}", "--steps", "50:60"], "no window covers steps 50..60"),
    (["report", "{run}", "--peak-tflops", "inf"], "--peak-tflops inf: must be a positive"),
    (["report", "{run}", "--peak-tflops", "nan"], "--peak-tflops nan: must be a positive"),
    (["report", "{run}", "--top", "-1"], "--top -1: must be >= 0"),
    (["report", "{tmp}/nope"], "no such run directory"),
    (["report", "{tmp}"], "no shard files"),
    (["report", "{run}/rank00000.w0000.h5"], "no such run directory"),
    (["timeline", "{run}", "-o", "{tmp}/missing/t.json"], "does not exist"),
    (["report", "{run}", "--html", "{tmp}/missing/r.html"], "does not exist"),
    (["import", "{tmp}/nope.json", "-o", "{tmp}/r"], "nope.json: no such file or directory"),
    (["import", "{tmp}", "-o", "{tmp}/r"], "no *.json or *.json.gz trace files"),
    (["import", "/dev/null", "-o", "{tmp}/r"], "/dev/null: not a regular file or a directory"),
])
def test_misuse_is_one_error_line(good_run_dir, tmp_path, argv, phrase):
    rc, out, err = run_cli([a.format(run=good_run_dir, tmp=tmp_path) for a in argv] + ["--no-progress"])
    assert rc == 2 and out == ""
    assert phrase in one_error_line(err), err


@pytest.mark.timeout(60)
def test_huge_numbers_that_only_bound_work_are_accepted(good_run_dir, tmp_path):
    rc, out, err = run_cli(["report", good_run_dir, "--top", str(10**12), "--peak-tflops", "1e300",
                            "--steps", ":99999999999", "--no-progress"])
    assert rc == 0, err
    assert "ranks on" in out


@pytest.mark.timeout(60)
@pytest.mark.parametrize("argv", [["report"], ["report", "x", "--bogus"], ["timeline", "x", "--max-events", "many"],
                                  ["nonsense"], ["report", "x", "--color", "purple"], ["import", "x"]])
def test_argparse_misuse_is_usage_and_exit_2_without_traceback(argv):
    p = subprocess.run([sys.executable, "-m", "distprof", *argv], capture_output=True, text=True, timeout=50)
    assert p.returncode == 2 and "Traceback" not in p.stderr and p.stderr.startswith("usage: distprof")
