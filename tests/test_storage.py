"""Shard files: atomic writes that survive SIGKILL, version checks, portable gzip, column reads."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import h5py
import numpy as np
import pytest

from distprof.errors import BadShardError, ShardFormatError
from distprof.storage import find_shards, read_shard, schema
from distprof.storage.validate import check_shard
from distprof.storage.writer import remove_orphans, write_shard
from shard_edit import drop_column, set_column, to_column_layout


def _tables(n: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    t = {name: schema.empty_table(name) for name in schema.TABLES}
    ev = schema.empty_table("events", n)
    ev["ts_ns"] = np.sort(rng.integers(0, 10**9, n)) + 1_700_000_000 * 10**9
    ev["dur_ns"] = rng.integers(1, 10**5, n)
    ev["name_id"] = rng.integers(0, 3, n).astype(np.uint32)
    ev["step"] = (np.arange(n) * 3 // n).astype(np.int32)
    t["events"] = ev
    return t


def _attrs(rank=0, window=0, **kw):
    a = {"run_id": "r1", "rank": rank, "world_size": 2, "local_rank": rank, "host": "h", "device": "cpu",
         "backend": "gloo", "torch_version": "x", "distprof_version": "y", "window": window, "first_step": 0,
         "last_step": 2, "config": {"schedule": {"active": 3}}, "timings": {"extract_s": 0.1}}
    a.update(kw)
    return a


@pytest.mark.parametrize("codec", ["zstd", "gzip"])
def test_roundtrip_and_column_reads(tmp_path, codec):
    tables = _tables(100_000)
    path = tmp_path / schema.SHARD_TEMPLATE.format(rank=1, window=0)
    size = write_shard(path, tables, ["a", "b", "ü"], _attrs(rank=1), codec=codec)
    assert size == path.stat().st_size and size < 100_000 * 10  # compressed well below raw 53 B/event
    s = read_shard(path)
    assert s.rank == 1 and s.attrs["config"] == {"schedule": {"active": 3}} and s.attrs["codec"] == codec
    assert "write_s" in s.attrs["timings"] and s.attrs["timings"]["extract_s"] == 0.1
    assert list(s.names) == ["a", "b", "ü"]
    got = s.table("events", ["ts_ns", "step"])
    assert set(got) == {"ts_ns", "step"}
    assert np.array_equal(got["ts_ns"], tables["events"]["ts_ns"])
    with h5py.File(path) as f:
        ds = f["events"]  # one compound dataset, a field per column
        assert ds.chunks == (schema.CHUNK_ROWS,) and ds.shuffle
        assert ("gzip" if codec == "gzip" else "32015") in ds._filters  # 32015 = Zstd
        assert set(ds.dtype.names) == set(schema.TABLES["events"])
        assert np.array_equal(ds.fields("ts_ns")[:], tables["events"]["ts_ns"])


def test_gzip_shards_open_with_plain_h5py(tmp_path):
    path = tmp_path / "rank00000.w0000.h5"
    write_shard(path, _tables(1000), ["a", "b", "c"], _attrs(), codec="gzip")
    code = f"import h5py; f = h5py.File({str(path)!r}); print(f['events']['ts_ns'][:3].sum() > 0)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True"


def test_newer_major_version_is_refused(tmp_path):
    path = tmp_path / "rank00000.w0000.h5"
    write_shard(path, _tables(10), ["a", "b", "c"], _attrs())
    with h5py.File(path, "r+") as f:
        f.attrs["schema_version"] = "3.0"
    with pytest.raises(ShardFormatError, match=r"rank00000.w0000.h5: schema_version 3.0 is newer .* upgrade"):
        read_shard(path)


def test_minor_version_tolerated_but_missing_columns_rejected(tmp_path):
    """A newer minor version may add things (ignored); it never drops a column: a shard without one is damaged."""
    path = tmp_path / "rank00000.w0000.h5"
    write_shard(path, _tables(10), ["a", "b", "c"], _attrs(new_attr=1))
    with h5py.File(path, "r+") as f:
        f.attrs["schema_version"] = "2.7"
        set_column(f, "events/new_column", np.zeros(10))
    assert check_shard(path).attrs["new_attr"] == 1
    assert np.array_equal(read_shard(path).table("events")["ts_ns"], _tables(10)["events"]["ts_ns"])
    with h5py.File(path, "r+") as f:
        drop_column(f, "events/corr_id")
    with pytest.raises(BadShardError, match=r"rank00000.w0000.h5: table /events has no column 'corr_id'"):
        check_shard(path)


def test_schema_1_0_threads_read_device_minus_one(tmp_path):
    """A 1.0 shard has no threads.device: its threads read as OS threads' -1, never as device 0."""
    path = tmp_path / "rank00000.w0000.h5"
    t = _tables(10)
    th = schema.empty_table("threads", 2)
    th["tid"] = np.array([11, 7])
    th["device"] = np.array([-1, 0])
    t["threads"] = th
    write_shard(path, t, ["a", "b", "c"], _attrs())
    to_column_layout(path, "1.0")
    with h5py.File(path, "r+") as f:
        del f["threads/device"]
    check_shard(path)  # a column a later minor version added may be absent
    got = read_shard(path).table("threads")
    assert got["tid"].tolist() == [11, 7] and got["device"].tolist() == [-1, -1]


def test_column_layout_of_1x_shards_reads_the_same(tmp_path):
    """A 1.x shard (a group of column datasets per table) reads column for column as its 2.x form (one compound
    dataset per table), which HDF5 stores in far less space: it spends ~340 bytes of metadata per dataset."""
    tables = _tables(3000)
    tables["steps"] = schema.empty_table("steps", 3)
    tables["steps"]["step"] = np.arange(3, dtype=np.int32)
    new, old = tmp_path / "rank00000.w0000.h5", tmp_path / "old" / "rank00000.w0000.h5"
    write_shard(new, tables, ["a", "b", "c"], _attrs())
    old.parent.mkdir()
    old.write_bytes(new.read_bytes())
    to_column_layout(old, "1.5")
    a, b = check_shard(new), check_shard(old)
    assert (a.attrs["schema_version"], b.attrs["schema_version"]) == (schema.SCHEMA_VERSION, "1.5")
    for table, cols in schema.TABLES.items():
        got, want = a.table(table), b.table(table)
        for col, dt in cols.items():
            assert got[col].dtype == want[col].dtype == dt and np.array_equal(got[col], want[col]), (table, col)
            assert got[col].flags.c_contiguous
    assert a.table("events", ["step", "ts_ns"])["step"].tolist() == tables["events"]["step"].tolist()
    assert list(a.table("events", ["step", "step"])) == ["step"]  # a column asked for twice is read once
    # sizes compared as h5repack would leave them: the 1.x layout written afresh, not edited in place
    fresh = tmp_path / "fresh.h5"
    with h5py.File(old) as src, h5py.File(fresh, "w", libver=("v110", "v114")) as dst:
        for k, v in src.attrs.items():
            dst.attrs[k] = v
        for name in src:
            src.copy(src[name], dst, name=name)
    assert new.stat().st_size < 0.8 * fresh.stat().st_size


def test_not_a_shard_is_one_clear_line(tmp_path):
    bad = tmp_path / "rank00000.w0000.h5"
    bad.write_bytes(b"garbage")
    with pytest.raises(ShardFormatError, match="rank00000.w0000.h5: not a readable HDF5 file"):
        read_shard(bad)
    with h5py.File(tmp_path / "rank00001.w0000.h5", "w") as f:
        f.attrs["x"] = 1
    with pytest.raises(ShardFormatError, match="not a distprof shard"):
        read_shard(tmp_path / "rank00001.w0000.h5")


WRITER = textwrap.dedent("""
    import sys, numpy as np
    sys.path[:0] = [{root!r}, {root!r} + "/tests"]
    from test_storage import _tables, _attrs
    from distprof.storage.writer import write_shard
    from distprof.storage import schema
    t = _tables(400_000)
    print("ready", flush=True)
    for w in range(1000):
        write_shard({out!r} + "/" + schema.SHARD_TEMPLATE.format(rank=0, window=w), t, ["a", "b", "c"],
                    _attrs(window=w), codec="gzip")
""")


def test_writer_killed_mid_write_leaves_no_partial_final_file(tmp_path):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for trial, delay in enumerate((0.15, 0.6, 1.1)):
        out = tmp_path / f"t{trial}"
        out.mkdir()
        proc = subprocess.Popen([sys.executable, "-c", WRITER.format(root=root, out=str(out))],
                                stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        for p in find_shards(out):  # every file under a final name is complete and readable
            s = read_shard(p)
            assert len(s.table("events", ["ts_ns"])["ts_ns"]) == 400_000
        leftovers = list(out.glob("*.tmp"))
        assert remove_orphans(out, 0) == len(leftovers)
        assert not list(out.glob("*.tmp"))


@pytest.mark.parametrize("gz", [False, True])
def test_atomic_write_all_or_nothing(tmp_path, gz):
    import gzip

    from distprof.atomic import atomic_write

    path = tmp_path / ("out.json.gz" if gz else "out.json")
    with pytest.raises(RuntimeError):
        with atomic_write(path, gzip=gz) as fh:
            fh.write(b"half")
            raise RuntimeError("writer died")
    assert list(tmp_path.iterdir()) == []
    with atomic_write(path, gzip=gz, fsync=True) as fh:
        fh.write(b"whole")
    assert (gzip.decompress(path.read_bytes()) if gz else path.read_bytes()) == b"whole"
    assert [p.name for p in tmp_path.iterdir()] == [path.name]


@pytest.mark.parametrize("text,want", [
    ('{"a": [1, 2.5, "x"], "b": null}', {"a": [1, 2.5, "x"], "b": None}),
    ('{"v": NaN, "w": -Infinity}', None),  # orjson refuses these; the standard decoder reads them as it always did
    ("[" + str(2**70) + "]", [2**70]),
    ('{"a": 1, "a": 2}', {"a": 2}),
])
def test_load_json_reads_what_the_standard_decoder_reads(text, want):
    import math

    from distprof.storage import safefs

    got = safefs.load_json(text)
    if want is None:
        assert math.isnan(got["v"]) and got["w"] == -math.inf
    else:
        assert got == want and safefs.load_json(text.encode()) == want


@pytest.mark.parametrize("text", ["{", "[1,]", "nul", "[" * 100 + "]" * 100, "\ud800"])
def test_load_json_refuses_in_one_line(text):
    from distprof.storage import safefs

    with pytest.raises(safefs.BadJSON):
        safefs.load_json(text, "shard.h5")


def test_group_ranks_stored_as_ranges_read_back_as_lists(tmp_path):
    """2.1: a group whose ranks form a range is stored as [start, stop, step] (every shard lists the world group: at
    16,384 ranks its list was 118 kB of each shard's attributes); a reader gets the same lists back, one shared
    list per range; short and unordered lists stay lists."""
    import json

    from distprof.storage.group_ranks import range_of

    ws = 64
    groups = [{"index": 0, "name": "0", "desc": "default_pg", "ranks": list(range(ws))},
              {"index": 1, "name": "1", "desc": "mesh_dp", "ranks": list(range(3, ws, 8))},  # 8 ranks: a list
              {"index": 2, "name": "2", "desc": "mesh_tp", "ranks": list(range(16, 48, 2))},
              {"index": 3, "name": "3", "desc": "odd", "ranks": list(range(ws - 1, 20, -1))}]  # decreasing
    paths = []
    for rank in (3, 16):
        p = tmp_path / schema.SHARD_TEMPLATE.format(rank=rank, window=0)
        write_shard(p, _tables(100), ["a"], _attrs(rank=rank, world_size=ws, process_groups=groups))
        paths.append(p)
    with h5py.File(paths[0]) as f:
        stored = json.loads(json.loads(f.attrs["attributes"])["process_groups"])
    assert [("ranks" in g, g.get("ranks_range")) for g in stored] == [
        (False, [0, ws, 1]), (True, None), (False, [16, 47, 2]), (True, None)]
    a, b = (check_shard(p).attrs["process_groups"] for p in paths)
    assert a == b == groups and a is not groups
    assert a[0]["ranks"] is b[0]["ranks"]  # one list for every shard with that range
    assert range_of(list(range(5, 200, 7))) == [5, 195, 7] and range_of([0, 1, 2, 4] * 5) is None
    assert range_of([True] * 20) is None and range_of(list(range(10))) is None
