"""Forged shards built to exhaust a reader: a decompression bomb with every chunk present, JSON nested past any
recursion limit, attributes of 100 MB, a recorded error of megabytes. Each is one line naming the file and skipped
(``--strict``: refused, exit 2); the rest of the run is reported; no reader allocates by what the file claims;
report.json stays bounded. Every command runs in its own process under an address-space limit, so a reader that
allocates by a forged size fails here with MemoryError instead of taking the machine."""

from __future__ import annotations

import json
import resource
import subprocess
import sys

import h5py
import hdf5plugin
import numpy as np
import pytest
from conftest import job_env
from reliability_helpers import one_error_line
from shard_edit import get_attr, set_attr, to_column_layout
from shard_factory import BAD_NAME, good_run

from distprof.storage import schema

pytestmark = pytest.mark.timeout(180)

#: address space of the reading processes: what a 3-rank run needs, far below what the forgeries claim
MEMORY_LIMIT = 3 << 30
BOMB_ROWS = 2**31  # 2.1e9 rows per column: 15.6 GiB of /events as read, from a file of a few MB


def _cli(argv: list, timeout: float = 120) -> subprocess.CompletedProcess:
    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))

    return subprocess.run([sys.executable, "-m", "distprof", *map(str, argv)], capture_output=True, text=True,
                          timeout=timeout, preexec_fn=limit, env=job_env())


def _zero_chunk(dtype: np.dtype, rows: int, tmp) -> tuple[int, bytes]:
    """(filter mask, bytes) of one compressed chunk of `rows` zeros with the writer's filters (shuffle + Zstd)."""
    path = tmp / f"chunk-{dtype.itemsize}-{len(dtype.names or ())}-{dtype.str.strip('<>|')}.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("c", data=np.zeros(rows, dtype), chunks=(rows,), shuffle=True, **hdf5plugin.Zstd(clevel=3))
    with h5py.File(path, "r") as f:
        return f["c"].id.read_direct_chunk((0,))


def _bomb_dataset(parent, name: str, dt: np.dtype, tmp):
    """Dataset `name` declaring BOMB_ROWS rows of `dt`, every chunk in the file (one compressed chunk of zeros,
    copied)."""
    rows = 1 << 20
    ds = parent.create_dataset(name, shape=(BOMB_ROWS,), dtype=dt, chunks=(rows,), shuffle=True,
                               **hdf5plugin.Zstd(clevel=3))
    mask, data = _zero_chunk(dt, rows, tmp)
    for i in range(BOMB_ROWS // rows):
        ds.id.write_direct_chunk((i * rows,), data, mask)


def _bomb(shard, tmp, layout: str) -> None:
    """/events declares BOMB_ROWS rows and every chunk of them is in the file — one compound dataset (2.x), or every
    column of the group (``v1``, as older captures wrote); attribute timings agrees, as a careful forger would make
    it."""
    if layout == "v1":
        to_column_layout(shard)
    with h5py.File(shard, "r+") as f:
        if layout == "v1":
            ev = f["events"]
            for col, dt in schema.TABLES["events"].items():
                del ev[col]
                _bomb_dataset(ev, col, dt, tmp)
        else:
            dt = f["events"].dtype
            del f["events"]
            _bomb_dataset(f, "events", dt, tmp)
        timings = json.loads(get_attr(f, "timings"))
        timings["n_events"] = BOMB_ROWS
        set_attr(f, "timings", json.dumps(timings))


@pytest.fixture(scope="module", params=["2.x", "v1"])
def bomb_run(tmp_path_factory, request):
    tmp = tmp_path_factory.mktemp("bomb")
    run = good_run(tmp)
    _bomb(run / BAD_NAME, tmp, request.param)
    return run


def test_a_decompression_bomb_is_one_line_and_skipped(bomb_run, tmp_path):
    """Measured before: 'Unable to allocate 15.6 GiB' and a traceback in report, timeline and export. Now the
    table's size as read is checked against what the file stores before anything is read."""
    size = (bomb_run / BAD_NAME).stat().st_size
    assert size < 64 << 20, size
    phrase = "/events claims 2,147,483,648 rows"
    for argv in (["report", bomb_run, "--json", tmp_path / "r.json"],
                 ["timeline", bomb_run, "-o", tmp_path / "t.json"],
                 ["export", bomb_run, "-o", tmp_path / "k"]):
        p = _cli([*argv, "--no-progress"])
        assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr[-3000:]
        assert phrase in p.stderr and "decompression bomb" in p.stderr, p.stderr[-2000:]
    rep = json.loads((tmp_path / "r.json").read_text())
    assert rep["run"]["ranks_present"] == [0, 2]
    assert any(phrase in s["reason"] for s in rep["skipped_shards"])
    p = _cli(["report", bomb_run, "--strict", "--no-progress"])
    assert p.returncode == 2 and phrase in one_error_line(p.stderr) and "--strict" in p.stderr


def _with_attr(tmp_path, key: str, value) -> object:
    run = good_run(tmp_path)
    with h5py.File(run / BAD_NAME, "r+") as f:
        set_attr(f, key, value)
    return run


DEEP = "[" * 100_000 + "]" * 100_000


@pytest.mark.parametrize("key, value, phrase", [
    ("config", DEEP, "attribute 'config' is not valid JSON (nested deeper than 64 levels)"),
    ("process_groups", "[" * 200 + "]" * 200, "attribute 'process_groups' is not valid JSON (nested deeper than"),
    ("host", "h" * 100_000_000, "attribute 'host' holds 100,000,000 characters, more than the 255"),
    ("backend_config", "b" * 5_000_000, "attribute 'backend_config' holds 5,000,000 characters"),
    ("sim_clock", "0" * (1 << 24), "attribute 'sim_clock' holds 16,777,216 characters"),
], ids=["deep-json", "deep-json-200", "host-100MB", "other-5MB", "json-16MB"])
def test_forged_attributes_are_one_line_and_skipped(tmp_path, key, value, phrase):
    """Measured before: deep JSON raised RecursionError past the decoder (a traceback); a 100 MB host made the
    stragglers analysis allocate 3.73 GiB (its host column widened to the longest name); other huge attributes made
    report.json 100-200 MB. Now each is one line, the shard is skipped, the other ranks are reported."""
    run = _with_attr(tmp_path, key, value)
    p = _cli(["report", run, "--json", tmp_path / "r.json", "--no-progress"])
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr[-3000:]
    assert phrase in p.stderr, p.stderr[-2000:]
    rep = (tmp_path / "r.json").read_text()
    assert len(rep) < 1 << 20 and json.loads(rep)["run"]["ranks_present"] == [0, 2]
    p = _cli(["report", run, "--strict", "--no-progress"])
    assert p.returncode == 2 and phrase in one_error_line(p.stderr)


def test_report_json_copies_a_bounded_part_of_a_recorded_error(tmp_path):
    """An error message of 3 MB recorded in a shard (within what a shard may hold): the shard is read, report.json
    quotes a bounded part of it (measured before: all of it, report.json > 3 MB)."""
    run = _with_attr(tmp_path, "errors", json.dumps([{"stage": "write", "message": "E" * 3_000_000}]))
    p = _cli(["report", run, "--json", tmp_path / "r.json", "--no-progress"])
    assert p.returncode == 0, p.stderr[-2000:]
    rep = json.loads((tmp_path / "r.json").read_text())
    assert rep["run"]["ranks_present"] == [0, 1, 2]
    assert (tmp_path / "r.json").stat().st_size < 200_000
    assert any("rank 1: write: EEE" in w and len(w) < 1000 for w in rep["warnings"]), rep["warnings"]
