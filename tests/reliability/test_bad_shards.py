"""Bad shards: ``distprof report`` (and timeline, export) names each bad file in one line and analyses the rest;
``--strict`` refuses with one line. Never a traceback, never an allocation by a number the file holds."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from reliability_helpers import one_error_line, run_cli
from shard_factory import BAD_NAME, BAD_SHARDS, TOLERATED, WORLD_SIZE, copy_run, good_run, skipped_path

from distprof.analysis.summarize.merged import load_run

PER_SHARD = sorted(k for k, b in BAD_SHARDS.items() if not b.whole_run)
WHOLE_RUN = sorted(k for k, b in BAD_SHARDS.items() if b.whole_run)
#: one of each family for the commands that load through the same path as report
FAMILIES = ["garbage_after_header_4k", "window_is_a_string", "float_ids", "forged_row_count", "comm_row_out_of_range",
            "corrupt_data_chunk", "duplicate_copy", "other_run", "v1_forged_row_count"]


@pytest.fixture(scope="module")
def good_run_dir(tmp_path_factory):
    """A valid 3-rank run (shard_factory.good_run) for the tests of this module to copy or read."""
    return good_run(tmp_path_factory.mktemp("good"))


def _bad_run(base, tmp_path, kind):
    run = copy_run(base, tmp_path / "run")
    BAD_SHARDS[kind].apply(run / BAD_NAME)
    return run


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", PER_SHARD)
def test_report_names_the_bad_shard_and_reports_the_rest(good_run_dir, tmp_path, kind):
    bad = BAD_SHARDS[kind]
    run = _bad_run(good_run_dir, tmp_path, kind)
    path = skipped_path(run / BAD_NAME, kind)
    rc, out, err = run_cli(["report", run, "--json", tmp_path / "r.json", "--no-progress"])
    assert rc == 0, err
    rep = json.loads((tmp_path / "r.json").read_text())
    (sk,) = rep["skipped_shards"]
    assert sk["path"] == str(path) and re.search(bad.expect, sk["reason"]), sk
    assert "\n" not in sk["reason"]
    # nothing lost: every good shard is analysed
    want = list(range(WORLD_SIZE)) if kind == "duplicate_copy" else [r for r in range(WORLD_SIZE) if r != 1]
    assert rep["run"]["ranks_present"] == want
    assert {s["rank"] for s in rep["steps"]} == set(want)
    # the user sees it: a warning line on stderr, and in report.json / the summary
    named = [ln for ln in err.splitlines() if str(path) in ln or (kind == "other_run" and "different runs" in ln)]
    assert named and all(ln.startswith("distprof: WARNING: ") for ln in named), err
    assert any(str(path) in w or "different runs" in w for w in rep["warnings"])
    assert "Traceback" not in err


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", PER_SHARD)
def test_strict_refuses_a_run_with_a_bad_shard_in_one_line(good_run_dir, tmp_path, kind):
    run = _bad_run(good_run_dir, tmp_path, kind)
    rc, out, err = run_cli(["report", run, "--strict", "--no-progress"])
    assert rc == 2 and out == ""
    line = one_error_line(err)
    assert str(skipped_path(run / BAD_NAME, kind)) in line and re.search(BAD_SHARDS[kind].expect, line), line
    assert "--strict" in line


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", WHOLE_RUN)
def test_a_run_of_only_bad_shards_is_one_error_line(good_run_dir, tmp_path, kind):
    run = copy_run(good_run_dir, tmp_path / "run")
    for p in sorted(run.glob("rank*.h5")):
        BAD_SHARDS[kind].apply(p)
    rc, out, err = run_cli(["report", run, "--no-progress"])
    assert rc == 2
    line = one_error_line(err)
    assert "no usable shard" in line and re.search(BAD_SHARDS[kind].expect, line), line


@pytest.mark.timeout(90)
@pytest.mark.parametrize("kind", FAMILIES)
def test_timeline_and_export_skip_the_same_way(good_run_dir, tmp_path, kind):
    run = _bad_run(good_run_dir, tmp_path, kind)
    path = str(skipped_path(run / BAD_NAME, kind))
    rc, out, err = run_cli(["timeline", run, "-o", tmp_path / "t.json", "--no-progress"])
    assert rc == 0, err
    doc = json.loads((tmp_path / "t.json").read_text())
    assert any(path in w or "different runs" in w for w in doc["otherData"]["distprof"]["warnings"])
    ranks = {e["pid"] for e in doc["traceEvents"] if e.get("ph") == "X"}
    assert len(ranks) == (WORLD_SIZE if kind == "duplicate_copy" else WORLD_SIZE - 1)
    rc, out, err = run_cli(["export", run, "-o", tmp_path / "k", "--no-progress"])
    assert rc == 0, err
    n_files = WORLD_SIZE if kind == "duplicate_copy" else WORLD_SIZE - 1
    assert len(list((tmp_path / "k").glob("rank-*.json.gz"))) == n_files
    assert any(path in ln or "different runs" in ln for ln in err.splitlines())
    for argv in (["timeline", run, "-o", tmp_path / "t2.json"], ["export", run, "-o", tmp_path / "k2"]):
        rc, out, err = run_cli(argv + ["--strict", "--no-progress"])
        assert rc == 2 and path in one_error_line(err)
    assert not (tmp_path / "t2.json").exists()


@pytest.mark.timeout(120)
def test_every_kind_at_once_in_one_real_process(tmp_path):
    """One run whose ranks 1..N each hold a different defect: the real CLI process reports ranks 0 and N+1 (good),
    lists every bad file with its reason, prints no traceback."""
    kinds = PER_SHARD
    ws = len(kinds) + 2
    run = good_run(tmp_path, world_size=ws)
    for i, kind in enumerate(kinds, start=1):
        BAD_SHARDS[kind].apply(run / f"rank{i:05d}.w0000.h5")
    proc = subprocess.run([sys.executable, "-m", "distprof", "report", str(run), "--json", str(tmp_path / "r.json"),
                           "--no-progress"], capture_output=True, text=True, timeout=100)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    rep = json.loads((tmp_path / "r.json").read_text())
    reasons = {sk["path"]: sk["reason"] for sk in rep["skipped_shards"]}
    for i, kind in enumerate(kinds, start=1):
        path = str(skipped_path(run / f"rank{i:05d}.w0000.h5", kind))
        assert re.search(BAD_SHARDS[kind].expect, reasons.pop(path, "")), (kind, path)
    assert not reasons
    present = rep["run"]["ranks_present"]
    assert 0 in present and ws - 1 in present
    assert set(present) == {0, ws - 1} | {i for i, k in enumerate(kinds, start=1) if k == "duplicate_copy"}


def test_bad_utf8_in_the_string_table_is_read_not_rejected(good_run_dir, tmp_path):
    run = copy_run(good_run_dir, tmp_path / "run")
    TOLERATED["bad_utf8_names"](run / BAD_NAME)
    m = load_run(run, progress=False)
    assert m.ranks_present == list(range(WORLD_SIZE)) and not m.skipped_shards
    assert any("\ufffd" in str(n) for n in m.names)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("content", [b"[]", b'{"rank": "x"}', b'{"rank": true, "errors": []}', b"\xff\xfe\x00",
                                     b'{"rank": 1, "errors": {"stage": "write"}}', b'{"rank": 1, "errors": 5}',
                                     b'{"rank": 99999999999999}', b"[" * 100_000, b'{"rank": 1, "errors": [7, null]}'])
def test_bad_status_files_are_ignored(good_run_dir, tmp_path, content):
    """TypeError before on a status file that is a JSON list; KeyError/TypeError on errors that are not a list."""
    run = copy_run(good_run_dir, tmp_path / "run")
    (run / BAD_NAME).unlink()
    (run / "rank00001.status.json").write_bytes(content)
    rc, out, err = run_cli(["report", run, "--no-progress"])
    assert rc == 0 and "rank(s) 1 of 0..2 have no shard" in err
