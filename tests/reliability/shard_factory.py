"""Bad shards for the reliability tests: real HDF5 files, each a valid synthetic shard (tests/synth.py) with one defect.

    run = good_run(tmp_path)                       # 3 ranks, 1 window: rank0000{0,1,2}.w0000.h5
    bad = BAD_SHARDS["float_ids"]
    bad.apply(run / "rank00001.w0000.h5")          # edits (or replaces) that file in place; any rank's file
    re.search(bad.expect, reason)                  # a pattern the one-line reason must match

Every kind is something a real run directory can hold: a file cut short or overwritten, a shard from an older or a
foreign writer, a forged one. ``whole_run`` kinds damage every shard (a report then has nothing left to read).
"""

from __future__ import annotations

import json
import random
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import h5py
import hdf5plugin  # noqa: F401  -- Zstd filter for the shards synth.py writes
import numpy as np

from shard_edit import column, del_attr, drop_column, get_attr, set_attr, set_column, to_column_layout
from synth import make_run

WORLD_SIZE = 3
BAD_RANK = 1
BAD_NAME = f"rank{BAD_RANK:05d}.w0000.h5"
_RANK_RE = re.compile(r"rank(\d+)\.w")


def good_run(out: Path, run_id: str = "good", world_size: int = WORLD_SIZE) -> Path:
    """A small valid run (each rank on a host of its own, so each has clock samples; one window of 3 steps);
    returns its directory."""
    return make_run(out, world_size=world_size, hosts=list(range(world_size)), run_id=run_id, n_layers=1,
                    buckets=(65536,)).run_dir


def copy_run(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


@dataclass(frozen=True)
class BadKind:
    apply: Callable[[Path], None]
    expect: str  # regular expression the reason matches (re.search)
    whole_run: bool = False  # damages every shard of the run, not just BAD_NAME
    at_read: bool = False  # found only when its data is read (not by the metadata check)


def _edit(fn: Callable[[h5py.File], None]) -> Callable[[Path], None]:
    def apply(path: Path) -> None:
        with h5py.File(path, "r+") as f:
            fn(f)
    return apply


def _attr(key: str, value) -> Callable[[Path], None]:
    return _edit(lambda f: set_attr(f, key, value))


def _del_attr(key: str) -> Callable[[Path], None]:
    return _edit(lambda f: del_attr(f, key))


def _del(name: str) -> Callable[[Path], None]:
    return _edit(lambda f: f.__delitem__(name))


def _del_column(name: str) -> Callable[[Path], None]:
    """Field `table/column` removed from its table (one compound dataset)."""
    return _edit(lambda f: drop_column(f, name))


def _replace(name: str, make: Callable[[np.ndarray], np.ndarray]) -> Callable[[Path], None]:
    """Column `name` (``table/column``, or the string table) replaced by what `make` gives from its values."""
    def fn(f: h5py.File) -> None:
        if isinstance(f[name.rsplit("/", 1)[0]], h5py.Dataset):
            set_column(f, name, make(column(f, name)))
            return
        data = make(f[name][()])
        del f[name]
        f[name] = data
    return _edit(fn)


def _v1(fn: Callable[[h5py.File], None]) -> Callable[[Path], None]:
    """`fn` applied to the shard as a 1.x capture wrote it (a group of column datasets per table)."""
    def apply(path: Path) -> None:
        to_column_layout(path, "1.5")
        _edit(fn)(path)
    return apply


def _garbage_from(at: int | float) -> Callable[[Path], None]:
    """Deterministic random bytes over the file from `at` on (a byte offset, or a share of the file's size; a valid
    HDF5 header before it)."""
    def apply(path: Path) -> None:
        b = path.read_bytes()
        offset = int(len(b) * at) if isinstance(at, float) else at
        assert offset < len(b), f"{path} has {len(b)} bytes: nothing to damage from {offset}"
        rnd = random.Random(offset)
        path.write_bytes(b[:offset] + bytes(rnd.randrange(256) for _ in range(len(b) - offset)))
    return apply


def _truncate(frac: float) -> Callable[[Path], None]:
    def apply(path: Path) -> None:
        b = path.read_bytes()
        path.write_bytes(b[: int(len(b) * frac)])
    return apply


def _corrupt_chunk(name: str) -> Callable[[Path], None]:
    """Overwrite the compressed bytes of dataset `name`'s first chunk: the metadata stays valid, decompression
    fails."""
    def apply(path: Path) -> None:
        with h5py.File(path, "r") as f:
            info = f[name].id.get_chunk_info(0)
        with open(path, "r+b") as fh:
            fh.seek(info.byte_offset)
            fh.write(b"\xff" * info.size)
    return apply


def _forged_rows(f: h5py.File) -> None:
    """/events claims 10^12 rows (48 TB) of which no chunk was ever written."""
    dt = f["events"].dtype
    del f["events"]
    f.create_dataset("events", shape=(10**12,), dtype=dt, chunks=(65536,))


def _v1_forged_rows(f: h5py.File) -> None:
    """1.x: /events/dur_ns claims 10^12 rows (8 TB) of which no chunk was ever written."""
    del f["events/dur_ns"]
    f["events"].create_dataset("dur_ns", shape=(10**12,), dtype="i8", chunks=(65536,))


def _v1_forged_all(f: h5py.File) -> None:
    n = 10**12
    for col in list(f["events"]):
        dt = f["events"][col].dtype
        del f["events"][col]
        f["events"].create_dataset(col, shape=(n,), dtype=dt, chunks=(65536,))


def _external(f: h5py.File) -> None:
    n, dt = f["events"].shape[0], f["events"].dtype
    del f["events"]
    f.create_dataset("events", shape=(n,), dtype=dt, external=[("/dev/zero", 0, n * dt.itemsize)])


def _v1_external(f: h5py.File) -> None:
    n = f["events/ts_ns"].shape[0]
    del f["events/ts_ns"]
    f["events"].create_dataset("ts_ns", shape=(n,), dtype="i8", external=[("/dev/zero", 0, n * 8)])


def _table_of_ints(f: h5py.File) -> None:
    n = f["events"].shape[0]
    del f["events"]
    f["events"] = np.zeros(n, "i8")


def _wide_rows(f: h5py.File) -> None:
    """Every row of /events carries a 4,800-byte field (a forged type): refused before a row is read."""
    n = f["events"].shape[0]
    set_column(f, "events/padding", np.zeros((n, 600), "i8"))


def _format_twice(f: h5py.File) -> None:
    doc = json.loads(f.attrs["attributes"])
    doc["format"] = "distprof-shard"
    f.attrs["attributes"] = json.dumps(doc)


def _v1_float_ids(f: h5py.File) -> None:
    ids = f["events/name_id"][()]
    del f["events/name_id"]
    f["events/name_id"] = ids + 0.5


def _external_link(path: Path) -> None:
    other = path.with_name("elsewhere.data")
    with h5py.File(other, "w") as g:
        g["names"] = np.array([b"x"], dtype=h5py.string_dtype())
    with h5py.File(path, "r+") as f:
        del f["strings"]
        f["strings"] = h5py.ExternalLink(other.name, "/")


def _v1_unequal(f: h5py.File) -> None:
    a = f["events/dur_ns"][()]
    del f["events/dur_ns"]
    f["events/dur_ns"] = a[: len(a) // 2]


def _bad_utf8_names(f: h5py.File) -> None:
    names = [s for s in f["strings/names"][()]]
    names[0] = b"\xff\xfe broken"
    del f["strings/names"]
    f["strings"].create_dataset("names", data=np.array(names, dtype=object), dtype=h5py.string_dtype())


def _rank_of(path: Path) -> int:
    return int(_RANK_RE.match(path.name).group(1))


def _duplicate(path: Path) -> None:
    shutil.copy(path, path.with_name(f"rank{_rank_of(path)}.w0.h5"))  # same rank and window under a second name


def _rank_beyond_world(f: h5py.File) -> None:
    set_attr(f, "rank", int(get_attr(f, "world_size")) + 4)


def _directory(path: Path) -> None:
    path.unlink()
    path.mkdir()


def _other_run(path: Path) -> None:
    _attr("run_id", "some-other-run")(path)


L = re.escape  # a literal phrase as a pattern
#: garbage over HDF5's metadata: caught by its checksums (superblock v3) or as damaged data, either said in words
_DAMAGED = "damaged HDF5|the shard is damaged"


def _full(value: int, dtype: str) -> Callable[[h5py.Dataset], np.ndarray]:
    return lambda d: np.full(d.shape[0], value, dtype)


#: kind -> how to make it and what its one-line reason says.
BAD_SHARDS: dict[str, BadKind] = {
    # measured in issue 10 (each raised a traceback or a misleading message before)
    "garbage_after_header_8k": BadKind(_garbage_from(8192), _DAMAGED),
    "garbage_after_header_4k": BadKind(_garbage_from(4096), _DAMAGED),
    "garbage_last_fifth": BadKind(_garbage_from(0.8), _DAMAGED),
    "no_strings": BadKind(_del("strings"), L("no string table /strings/names")),
    "window_is_a_string": BadKind(_attr("window", "abc"), L("attribute 'window' is str 'abc', not an integer")),
    "float_ids": BadKind(_replace("events/name_id", lambda d: d.astype("f8") + 0.5),
                         L("/events/name_id holds float64, not uint32")),
    "v1_unequal_columns": BadKind(_v1(_v1_unequal), L("table /events: columns differ in length")),
    "huge_world_size": BadKind(_attr("world_size", 10**15), L("'world_size' = 1000000000000000 is outside 1..1048576"),
                               whole_run=True),
    "no_events": BadKind(_del("events"), L("no table /events")),
    "config_not_json": BadKind(_attr("config", "{not json"), L("attribute 'config' is not valid JSON")),
    # the file
    "garbage_header": BadKind(_garbage_from(0), L("not a readable HDF5 file")),
    "empty_file": BadKind(_truncate(0.0), L("not a readable HDF5 file")),
    "truncated": BadKind(_truncate(0.5), L("not a readable HDF5 file")),
    "directory_named_like_a_shard": BadKind(_directory, L("not a regular file")),
    # attributes
    "rank_is_a_string": BadKind(_attr("rank", "one"), L("attribute 'rank' is str 'one', not an integer")),
    "rank_is_a_bool": BadKind(_attr("rank", True), L("attribute 'rank' is bool True, not an integer")),
    "rank_is_an_array": BadKind(_attr("rank", np.array([1, 2])), r"attribute 'rank' is a (ndarray|list)"),
    "rank_not_below_world_size": BadKind(_edit(_rank_beyond_world), r"attribute 'rank' = \d+ is outside 0\.\.\d+"),
    "negative_rank": BadKind(_attr("rank", -3), r"attribute 'rank' = -3 is outside 0\.\.\d+"),
    "zero_world_size": BadKind(_attr("world_size", 0), L("attribute 'world_size' = 0 is outside")),
    "huge_window": BadKind(_attr("window", 2**40), L("attribute 'window' = 1099511627776 is outside")),
    "steps_reversed": BadKind(_attr("first_step", 9), L("first_step 9 > last_step")),
    "missing_run_id": BadKind(_del_attr("run_id"), L("missing attribute(s) run_id")),
    "host_is_a_number": BadKind(_attr("host", 5), L("attribute 'host' is int 5, not a string")),
    "not_utf8_attr": BadKind(_attr("host", np.bytes_(b"\xff\xfe")), r"attribute '(host|attributes)' is not UTF-8"),
    "v1_not_utf8_attr": BadKind(_v1(lambda f: f.attrs.__setitem__("host", np.bytes_(b"\xff\xfe"))),
                                L("attribute 'host' is not UTF-8")),
    "attributes_not_an_object": BadKind(_edit(lambda f: f.attrs.__setitem__("attributes", "[1]")),
                                        L("attribute 'attributes' is a list, not a JSON object")),
    "attribute_twice": BadKind(_edit(_format_twice), L("attribute 'format' is both in 'attributes' and beside it")),
    "wrong_format": BadKind(_attr("format", "something-else"), L("not a distprof shard")),
    "newer_major": BadKind(_attr("schema_version", "3.0"), L("schema_version 3.0 is newer than this distprof")),
    "version_not_a_string": BadKind(_attr("schema_version", 1.0), L("attribute 'schema_version' is float 1.0")),
    "config_not_an_object": BadKind(_attr("config", "[1, 2]"), L("attribute 'config' is a list, not a JSON object")),
    "schedule_not_an_object": BadKind(_attr("config", '{"schedule": 5}'), L("'schedule' is int 5")),
    "errors_not_a_list": BadKind(_attr("errors", "5"), L("attribute 'errors' is int 5, not a JSON list")),
    "pg_index_not_an_int": BadKind(_attr("process_groups", '[{"index": "x", "ranks": [0, 1, 2]}]'),
                                   L("entry 0 has index str 'x'")),
    "pg_ranks_a_string": BadKind(_attr("process_groups", '[{"index": 0, "ranks": "0,1,2"}]'),
                                 r"'ranks' is not a list of ranks 0\.\.\d+"),
    "pg_index_huge": BadKind(_attr("process_groups", '[{"index": 1000000000000, "ranks": [0]}]'),
                             L("entry 0 has index int 1000000000000")),
    "pg_range_past_the_world": BadKind(_attr("process_groups", '[{"index": 0, "ranks_range": [0, 100000000, 1]}]'),
                                       r"entry 0 'ranks_range' is a list, not \[start, stop, step\]"),
    "pg_range_step_zero": BadKind(_attr("process_groups", '[{"index": 0, "ranks_range": [0, 2, 0]}]'),
                                  r"entry 0 'ranks_range' is a list, not \[start, stop, step\]"),
    "pg_range_and_list": BadKind(_attr("process_groups", '[{"index": 0, "ranks": [0], "ranks_range": [0, 1, 1]}]'),
                                 L("entry 0 has both 'ranks' and 'ranks_range'")),
    "clock_leader_a_string": BadKind(_attr("clock_leader", "x"), L("attribute 'clock_leader' is str 'x'")),
    "clock_role_unknown": BadKind(_attr("clock_role", "boss"), L("attribute 'clock_role' is str 'boss'")),
    "snapshot_path_escapes": BadKind(_attr("memory_history", '{"snapshot": "../../etc/passwd"}'),
                                     L("'snapshot' is str '../../etc/passwd', not a file name")),
    "job_without_id": BadKind(_attr("job", '{"launch": 1}'),
                              L("attribute 'job' is a dict, not an object with an 'id'")),
    # layout
    "strings_not_strings": BadKind(_replace("strings/names", lambda d: np.arange(d.shape[0])),
                                   L("/strings/names holds int64, not strings")),
    "column_missing": BadKind(_del_column("events/kind"), L("table /events has no column 'kind'")),
    "column_2d": BadKind(_replace("events/ts_ns", lambda d: np.zeros((d.shape[0], 2), "i8")),
                         L("/events/ts_ns has shape (2,) in each row")),
    "column_of_bytes": BadKind(_replace("events/ts_ns", lambda d: np.array([b"x"] * d.shape[0])),
                               L("/events/ts_ns holds |S1, not int64")),
    "table_of_ints": BadKind(_edit(_table_of_ints), L("/events holds int64, not a table")),
    "table_rows_too_wide": BadKind(_edit(_wide_rows), L("/events has rows of 4,852 bytes (more than 4,096)")),
    "table_is_a_link": BadKind(_edit(lambda f: (f.__delitem__("events"), f.__setitem__("events", h5py.SoftLink(
        "/steps")))), L("/events is a link (SoftLink), not data in the file")),
    "forged_row_count": BadKind(_edit(_forged_rows), L("/events claims 1,000,000,000,000 rows but only 0 of its")),
    "external_storage": BadKind(_edit(_external), L("/events keeps its data outside the file")),
    "external_link": BadKind(_external_link, L("/strings is a link (ExternalLink), not data in the file")),
    # the 1.x layout (a group of column datasets per table), which older captures wrote and readers still read
    "v1_column_missing": BadKind(_v1(lambda f: f.__delitem__("events/kind")),
                                 L("table /events has no column 'kind'")),
    "v1_column_2d": BadKind(_v1(lambda f: (f.__delitem__("events/ts_ns"), f.__setitem__(
        "events/ts_ns", np.zeros((f["events/dur_ns"].shape[0], 2), "i8")))), L("/events/ts_ns has shape")),
    "v1_column_is_a_group": BadKind(_v1(lambda f: (f.__delitem__("events/kind"), f.create_group("events/kind"))),
                                    L("/events/kind is a group, not a column")),
    "v1_forged_row_count": BadKind(_v1(_v1_forged_rows), L("claims 1,000,000,000,000 rows but only 0 of its")),
    "v1_forged_table": BadKind(_v1(_v1_forged_all), L("claims 1,000,000,000,000 rows")),
    "v1_external_storage": BadKind(_v1(_v1_external), L("keeps its data outside the file")),
    "v1_float_ids": BadKind(_v1(_v1_float_ids), L("/events/name_id holds float64, not uint32")),
    # ids (checked on the columns as read)
    "name_id_out_of_range": BadKind(_replace("events/name_id", _full(10**6, "u4")),
                                    L("/events/name_id 1000000 is outside the string table")),
    "comm_row_out_of_range": BadKind(_replace("comms/row", _full(10**9, "i8")),
                                     L("/comms/row 1000000000 points outside /events")),
    "comm_row_negative": BadKind(_replace("comms/row", _full(-1, "i8")), L("/comms/row -1 points outside /events")),
    "op_id_out_of_range": BadKind(_replace("comms/op_id", _full(999, "u4")),
                                  L("/comms/op_id 999 is outside the string table")),
    "pg_out_of_range": BadKind(_replace("comms/pg", _full(7, "i4")),
                               L("/comms/pg 7 is neither -1 nor a process group")),
    "step_below_minus_one": BadKind(_replace("events/step", _full(-5, "i4")), L("/events/step -5 is below -1")),
    "clock_peer_not_a_rank": BadKind(_replace("clock/samples/peer", _full(99, "i4")),
                                     L("/clock/samples/peer holds rank 99")),
    "corrupt_data_chunk": BadKind(_corrupt_chunk("events"), L("cannot read /events"), at_read=True),
    "v1_corrupt_data_chunk": BadKind(lambda p: (to_column_layout(p), _corrupt_chunk("events/ts_ns")(p)),
                                     L("cannot read /events"), at_read=True),
    # times (OverflowError / LinAlgError in the clock fit before)
    "ts_beyond_2_62": BadKind(_replace("events/ts_ns", _full(2**62 + 5, "i8")),
                              L("/events/ts_ns 4611686018427387909 is outside 0..2^62")),
    "negative_dur": BadKind(_replace("events/dur_ns", _full(-7, "i8")), L("/events/dur_ns -7 is outside 0..2^62")),
    "step_ends_before_it_starts": BadKind(_replace("steps/end_ns", _full(1, "i8")), L("a step ends before it starts")),
    "clock_answer_before_question": BadKind(_replace("clock/samples/t_recv_ns", _full(5, "i8")),
                                            L("/clock/samples: a round trip of")),
    "clock_offset_absurd": BadKind(_replace("clock/samples/t_remote_ns", _full(2**61, "i8")),
                                   L("/clock/samples: a clock offset of")),
    # the directory
    "duplicate_copy": BadKind(_duplicate, r"rank \d+ window 0 is also in rank\d{5}\.w0000\.h5; remove the copy"),
    "other_run": BadKind(_other_run, r"run_id 'some-other-run' differs from 'good' in \d+ other shard\(s\)"),
}

#: Kinds that leave the file readable: invalid UTF-8 in the string table reads as U+FFFD, not as an error.
TOLERATED = {"bad_utf8_names": _edit(_bad_utf8_names)}


def skipped_path(shard: Path, kind: str) -> Path:
    """The file a kind's skipped entry names, for a kind applied to `shard`."""
    return shard.with_name(f"rank{_rank_of(shard)}.w0.h5") if kind == "duplicate_copy" else shard
