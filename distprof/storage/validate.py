"""Check a shard against the schema before anything uses it (storage.selection picks the shards of one run).

    shard = check_shard(path)            # a Shard, or BadShardError(path, reason): one line, never a traceback
    check_values(path, shard.attrs, {"events": shard.table("events")}, len(shard.names))

What :func:`check_shard` guarantees of a shard it returns (so that no later stage can raise on it, or allocate by a
value it holds):

* **attributes** (:func:`check_attrs`): every required one present; ints are ints (not bools, strings or arrays) in
  sane ranges (``0 <= rank < world_size <= MAX_WORLD_SIZE``, ``0 <= window < MAX_WINDOW``, steps in int32 with
  ``-1 <= first_step <= last_step``); strings are strings; JSON attributes decode and have the shape readers use
  (``process_groups`` a list of ``{"index", "ranks", ...}`` with indices and ranks in range, ``errors`` a list, ...).
* **layout**: ``/strings/names`` is a 1-D string dataset; the groups every shard has (events, comms, threads, steps)
  exist; every known column of a present group is a plain 1-D dataset (no external or virtual storage, no links out
  of the file) whose dtype casts safely to the schema's, all columns of a table have one length, and every chunk of
  its data is physically in the file (so its size is bounded by the file's: no dataset of 10^12 unwritten rows).
  A column missing from a present group is an error, except those a newer minor version added
  (``schema.MISSING_DEFAULTS``: the reader fills them).
* **values** (:func:`check_values`, on the columns as a reader loads them): every column that indexes something is
  in range: ``name_id``/``op_id``/frame ids below the string table's length, ``comms.row`` inside ``/events``, ``pg``
  either −1 or an index of ``process_groups``, clock ``peer`` a rank, ``step`` −1 or more; times and durations are
  in 0..2^62 ns, steps end after they start, clock samples are round trips (within ±2^40 ns: a clock that stepped
  back mid-exchange gives a negative one, which the clock alignment leaves out) with an offset under 2^52 ns.

Activity, category and role codes are not checked: readers tolerate codes they do not know (a newer writer's).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Mapping

import h5py
import hdf5plugin  # noqa: F401  -- registers the Zstd filter; every reader must import it
import numpy as np

from ..errors import BadShardError
from . import safefs, schema
from .group_ranks import RANGE_KEY
from .h5file import H5_ERRORS, h5_message, open_h5
from .layout import FIX, MAX_CHUNK_ROWS, REQUIRED_GROUPS, check_layout  # noqa: F401 -- re-exported
from .shard import ImageShard, Shard
from .summary_group import SUMMARY_GROUP

log = logging.getLogger(__name__)

__all__ = ["check_shard", "check_image", "check_attrs", "check_values", "MAX_WORLD_SIZE", "MAX_WINDOW", "MAX_NS",
           "job_id"]

#: Largest world size a shard may claim (readers size per-rank tables by it).
MAX_WORLD_SIZE = 1 << 20
#: Largest window index a shard may claim.
MAX_WINDOW = 1 << 20
#: Largest CPU count or thread count a shard may claim (cpu_affinity, host_cpus, intra_op_threads).
MAX_CPUS = 1 << 16
#: Largest process-group index (the merger builds a lookup table that long).
MAX_PG_INDEX = 1 << 16
_I32 = (-(1 << 31), (1 << 31) - 1)
_I64 = (-(1 << 63), (1 << 63) - 1)

_FIX = FIX


# ---- attributes ------------------------------------------------------------------------------------------------------


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


#: Longest text of a plain string attribute, by key (characters); hosts are names of at most 255 (an FQDN).
TEXT_ATTR_CHARS = {"host": 255, "real_host": 255}
#: ... of the identity attributes every shard has, and of any other plain string attribute.
NAME_ATTR_CHARS, OTHER_ATTR_CHARS = 1024, 65536
NAME_ATTRS = ("format", "schema_version", "run_id", "device", "device_type", "backend", "torch_version",
              "distprof_version", "python_version", "codec", "clock_source", "clock_role")
#: Largest JSON attribute (characters), by key; MAX_JSON_ATTR_CHARS for the others. 2.x's one attribute that holds
#: the others (schema.ATTRS_JSON) may hold them all.
JSON_ATTR_CHARS = {"process_groups": 64 << 20, "steps_covered": 16 << 20, "errors": 4 << 20,
                   schema.ATTRS_JSON: 128 << 20}
MAX_JSON_ATTR_CHARS = 1 << 20
#: Largest attribute stored as an array or a fixed-size string (bytes), and most attributes on a shard's root.
MAX_ARRAY_ATTR_BYTES, MAX_ATTRS = 1 << 20, 256


#: Attributes whose text is JSON.
_JSON_KEYS = frozenset((*schema.JSON_ATTRS, "job", schema.ATTRS_JSON))


def attr_limit(key: str) -> int:
    """The most characters (bytes for arrays) attribute `key` may hold."""
    if key in _JSON_KEYS:
        return JSON_ATTR_CHARS.get(key, MAX_JSON_ATTR_CHARS)
    return TEXT_ATTR_CHARS.get(key, NAME_ATTR_CHARS if key in NAME_ATTRS else OTHER_ATTR_CHARS)


def decode_attr(path: os.PathLike | str, key: str, value: Any) -> Any:
    """An HDF5 attribute as a Python value: bytes -> str, numpy scalars -> Python, JSON attributes decoded. Text longer
    than :func:`attr_limit`, JSON nested deeper than safefs.MAX_JSON_DEPTH or that the decoder refuses in any way is
    a BadShardError."""
    if isinstance(value, bytes):
        if len(value) > attr_limit(key) * 4:
            raise _too_long(path, key, len(value))
        try:
            value = value.decode("utf-8")
        except UnicodeDecodeError:
            raise BadShardError(path, f"attribute {key!r} is not UTF-8 text; {_FIX}") from None
    if isinstance(value, np.generic):
        value = value.item()
        if isinstance(value, bytes):
            return decode_attr(path, key, value)
    if isinstance(value, str) and len(value) > attr_limit(key):
        raise _too_long(path, key, len(value))
    if key in _JSON_KEYS and isinstance(value, str):
        try:
            return safefs.load_json(value, path) if value else None
        except safefs.BadJSON as e:  # every decoder exception, recursion and depth included
            raise BadShardError(path, f"attribute {key!r} is not valid JSON ({e.detail}); {_FIX}") from None
    return value


def _too_long(path, key: str, n: int) -> BadShardError:
    return BadShardError(path, f"attribute {key!r} holds {n:,} characters, more than the {attr_limit(key):,} "
                               f"distprof writes (forged?); {_FIX}")


def _want_int(path, attrs: Mapping[str, Any], key: str, lo: int, hi: int, *, optional: bool = False,
              blank_ok: bool = False) -> None:
    if key not in attrs:
        if optional:
            return
        raise BadShardError(path, f"missing attribute {key!r}; {_FIX}")
    v = attrs[key]
    if blank_ok and (v is None or v == ""):
        return
    if not _is_int(v):
        raise BadShardError(path, f"attribute {key!r} is {_show(v)}, not an integer; {_FIX}")
    if not lo <= v <= hi:
        raise BadShardError(path, f"attribute {key!r} = {v} is outside {lo}..{hi}; {_FIX}")


def _want_type(path, attrs: Mapping[str, Any], key: str, types: tuple[type, ...], what: str, *,
               optional: bool = True) -> None:
    if key not in attrs:
        if optional:
            return
        raise BadShardError(path, f"missing attribute {key!r}; {_FIX}")
    v = attrs[key]
    if not isinstance(v, types) or (bool not in types and isinstance(v, bool) and int in types):
        raise BadShardError(path, f"attribute {key!r} is {_show(v)}, not {what}; {_FIX}")


def _show(v: Any) -> str:
    """A short description of a bad value for a one-line message."""
    if isinstance(v, (dict, list, tuple, np.ndarray)):
        return f"a {type(v).__name__}"
    r = repr(v)
    return f"{type(v).__name__} {r[:40] + '…' if len(r) > 40 else r}"


def check_version(path: os.PathLike | str, version: Any, fmt: Any) -> None:
    """Refuse files we cannot read, with one line naming the file, the field and the fix."""
    if fmt != schema.FORMAT_NAME:
        raise BadShardError(path, f"attribute 'format' is {_show(fmt) if fmt is not None else 'missing'}, not "
                                  f"{schema.FORMAT_NAME!r}: not a distprof shard (import Kineto JSON traces first)")
    parts = str(version).split(".") if isinstance(version, str) else []
    if len(parts) != 2 or not all(p.isdigit() and len(p) <= 6 for p in parts):
        raise BadShardError(path, f"attribute 'schema_version' is {_show(version)}, expected 'MAJOR.MINOR'; {_FIX}")
    if int(parts[0]) > schema.SCHEMA_MAJOR:
        raise BadShardError(path, f"schema_version {version} is newer than this distprof reads "
                                  f"({schema.SCHEMA_VERSION}); upgrade distprof (pip install -U distprof)")


def check_attrs(path: os.PathLike | str, attrs: Mapping[str, Any]) -> None:
    """Types and ranges of the root attributes (already decoded by :func:`decode_attr`). Raises BadShardError."""
    check_version(path, attrs.get("schema_version"), attrs.get("format"))
    missing = [k for k in schema.REQUIRED_ATTRS if k not in attrs]
    if missing:
        raise BadShardError(path, f"missing attribute(s) {', '.join(missing)}; {_FIX}")
    for key in ("run_id", "host", "device", "backend", "torch_version", "distprof_version"):
        _want_type(path, attrs, key, (str,), "a string", optional=False)
    for key in ("real_host", "device_type", "python_version", "codec", "clock_source"):
        _want_type(path, attrs, key, (str,), "a string")
    _want_int(path, attrs, "world_size", 1, MAX_WORLD_SIZE)
    ws = attrs["world_size"]
    _want_int(path, attrs, "rank", 0, ws - 1)
    _want_int(path, attrs, "local_rank", 0, MAX_WORLD_SIZE - 1)
    _want_int(path, attrs, "local_world_size", 0, MAX_WORLD_SIZE, optional=True, blank_ok=True)
    for key in ("cpu_affinity", "host_cpus", "intra_op_threads"):
        _want_int(path, attrs, key, 1, MAX_CPUS, optional=True)
    _want_int(path, attrs, "window", 0, MAX_WINDOW - 1)
    _want_int(path, attrs, "first_step", -1, _I32[1])
    _want_int(path, attrs, "last_step", -1, _I32[1])
    if attrs["first_step"] > attrs["last_step"]:
        raise BadShardError(path, f"attributes first_step {attrs['first_step']} > last_step {attrs['last_step']}; "
                                  f"{_FIX}")
    for key in ("pid", "window_start_ns", "window_end_ns", "created_ns"):
        _want_int(path, attrs, key, *_I64, optional=True, blank_ok=True)
    for key in ("complete", "memory_total_relative"):
        _want_type(path, attrs, key, (bool,), "true or false")
    role = attrs.get("clock_role")
    if role not in (None, "", "reference", "leader", "member"):
        raise BadShardError(path, f"attribute 'clock_role' is {_show(role)}, not reference, leader or member; {_FIX}")
    for key in ("clock_leader", "clock_reference"):
        _want_int(path, attrs, key, 0, ws - 1, optional=True, blank_ok=True)
    _check_json_attrs(path, attrs, ws)


def _check_json_attrs(path, attrs: Mapping[str, Any], ws: int) -> None:
    def shape(key: str, types: tuple[type, ...], what: str) -> Any:
        v = attrs.get(key)
        if v is not None and not isinstance(v, types):
            raise BadShardError(path, f"attribute {key!r} is {_show(v)}, not {what}; {_FIX}")
        return v

    cfg = shape("config", (dict,), "a JSON object")
    if cfg is not None and cfg.get("schedule") is not None and not isinstance(cfg["schedule"], dict):
        raise BadShardError(path, f"attribute 'config': 'schedule' is {_show(cfg['schedule'])}, not an object; {_FIX}")
    for key in ("sim_clock", "timings", "memory_history"):
        shape(key, (dict,), "a JSON object")
    errs = shape("errors", (list,), "a JSON list")
    if errs is not None and not all(isinstance(e, (dict, str)) for e in errs):
        raise BadShardError(path, f"attribute 'errors' holds an entry that is neither an object nor a string; {_FIX}")
    props = shape("device_properties", (list,), "a JSON list")
    if props is not None and not all(isinstance(p, dict) and (p.get("id") is None or _is_int(p["id"]))
                                     for p in props):
        raise BadShardError(path, f"attribute 'device_properties' holds an entry that is not an object with an "
                                  f"integer 'id'; {_FIX}")
    covered = shape("steps_covered", (list,), "a JSON list")
    if covered is not None and not all(_is_int(s) and _I32[0] <= s <= _I32[1] for s in covered):
        raise BadShardError(path, f"attribute 'steps_covered' holds a value that is not a step number; {_FIX}")
    mh = attrs.get("memory_history")
    if isinstance(mh, dict) and mh.get("snapshot") is not None:
        snap = mh["snapshot"]
        if not isinstance(snap, str) or not snap or snap in (".", "..") or "/" in snap or "\\" in snap or "\0" in snap:
            raise BadShardError(path, f"attribute 'memory_history': 'snapshot' is {_show(snap)}, not a file name "
                                      f"beside the shard; {_FIX}")
    job = attrs.get("job")
    if job is not None and not (isinstance(job, dict) and isinstance(job.get("id"), (str, int))
                                and not isinstance(job.get("id"), bool)):
        raise BadShardError(path, f"attribute 'job' is {_show(job)}, not an object with an 'id'; {_FIX}")
    _check_process_groups(path, shape("process_groups", (list,), "a JSON list"), ws)


def _check_process_groups(path, pgs: list | None, ws: int) -> None:
    if not pgs:
        return
    seen: set[int] = set()
    for i, g in enumerate(pgs):
        if not isinstance(g, dict):
            raise BadShardError(path, f"attribute 'process_groups': entry {i} is not an object; {_FIX}")
        idx = g.get("index", i)
        if not _is_int(idx) or not 0 <= idx < MAX_PG_INDEX or idx in seen:
            raise BadShardError(path, f"attribute 'process_groups': entry {i} has index {_show(idx)} (need a "
                                      f"distinct integer 0..{MAX_PG_INDEX - 1}); {_FIX}")
        seen.add(idx)
        if RANGE_KEY in g:  # 2.1: the ranks as a range; read back as the list they stand for
            if "ranks" in g:
                raise BadShardError(path, f"attribute 'process_groups': entry {i} has both 'ranks' and "
                                          f"{RANGE_KEY!r}; {_FIX}")
            g["ranks"] = _ranks_of_range(path, i, g.pop(RANGE_KEY), ws)
        elif g.get("ranks") is not None:
            g["ranks"] = _checked_ranks(path, i, g["ranks"], ws)
        for key in ("name", "desc", "backend"):
            if isinstance(g.get(key), (dict, list)):
                raise BadShardError(path, f"attribute 'process_groups': entry {i} {key!r} is {_show(g[key])}; {_FIX}")


#: Rank lists already checked, by (ranks, world size): every shard of a run lists the same groups (the world group's
#: list is world_size long), so each distinct list is checked once and one copy is kept for all shards (16,384
#: shards each holding their own 16,384-rank list were 9 GB; checking each one, 27 s).
_RANKS: dict[tuple[tuple, int], list[int]] = {}
_RANKS_KEPT = 256


def _checked_ranks(path, i: int, ranks: Any, ws: int) -> list[int]:
    """`ranks` checked (a list of ranks 0..ws-1), as the one shared copy of an equal list checked before."""
    key = None
    if isinstance(ranks, list) and len(ranks) <= ws:
        try:
            key = (tuple(ranks), ws)
            shared = _RANKS.get(key)
        except TypeError:  # an unhashable element: not a rank, refused below
            key = shared = None
        if shared is not None:
            return shared
    if not isinstance(ranks, list) or len(ranks) > ws or not all(_is_int(r) and 0 <= r < ws for r in ranks):
        raise BadShardError(path, f"attribute 'process_groups': entry {i} 'ranks' is not a list of ranks "
                                  f"0..{ws - 1}; {_FIX}")
    if key is not None:
        if len(_RANKS) >= _RANKS_KEPT:
            _RANKS.clear()
        _RANKS[key] = ranks
    return ranks


def _ranks_of_range(path, i: int, rng: Any, ws: int) -> list[int]:
    """The ranks a group's ``ranks_range`` [start, stop, step] stands for, checked (0 <= start, stop <= the world
    size, step >= 1), as one list shared by every shard with the same range."""
    if not (isinstance(rng, list) and len(rng) == 3 and all(_is_int(x) for x in rng) and 0 <= rng[0] <= rng[1] <= ws
            and rng[2] >= 1):
        raise BadShardError(path, f"attribute 'process_groups': entry {i} {RANGE_KEY!r} is {_show(rng)}, not "
                                  f"[start, stop, step] with 0 <= start <= stop <= {ws} and step >= 1; {_FIX}")
    key = (("range", *rng), ws)
    shared = _RANKS.get(key)
    if shared is None:
        if len(_RANKS) >= _RANKS_KEPT:
            _RANKS.clear()
        shared = _RANKS[key] = list(range(*rng))
    return shared


def pg_indices(attrs: Mapping[str, Any]) -> set[int]:
    """The process-group indices ``comms.pg`` / ``threads.pg`` may hold (besides −1)."""
    pgs = attrs.get("process_groups") or []
    return {int(g.get("index", i)) for i, g in enumerate(pgs)}


def job_id(attrs: Mapping[str, Any]) -> str | None:
    """The job identity a shard carries (attribute ``job``, ``{"id": ...}``), or None for shards without one."""
    job = attrs.get("job")
    return str(job["id"]) if isinstance(job, dict) and "id" in job else None


# ---- ids ---------------------------------------------------------------------------------------------------------


#: (table, column, what its values index: "names", "events", "pg" or "rank").
ID_COLUMNS = (
    ("events", "name_id", "names"),
    ("threads", "name_id", "names"),
    ("comms", "op_id", "names"),
    ("cuda_memory_blocks", "frame_id", "names"),
    ("cuda_memory_blocks", "user_frame_id", "names"),
    ("comms", "row", "events"),
    ("comms", "pg", "pg"),
    ("threads", "pg", "pg"),
    ("clock/samples", "peer", "rank"),
)


def check_values(path: os.PathLike | str, attrs: Mapping[str, Any], tables: Mapping[str, Mapping[str, np.ndarray]],
                 n_names: int) -> None:
    """Every id column in `tables` (a shard's columns as read) indexes what it should; times and durations are in
    0..2^62 (steps end after they start, clock samples are round trips of a sane length and offset). Raises
    BadShardError.

    Checked on the arrays a reader loaded, so what is used is what was checked, and nothing is read twice.
    """
    pgs = pg_indices(attrs)
    n_events = None
    if "events" in tables:
        ev = tables["events"]
        n_events = len(next(iter(ev.values()))) if ev else 0
    for table, col, target in ID_COLUMNS:
        v = tables.get(table, {}).get(col)
        if v is None or not len(v):
            continue
        where = f"/{table}/{col}"
        if target == "names":
            if int(v.max()) >= n_names:
                raise BadShardError(path, f"{where} {int(v.max())} is outside the string table ({n_names} names); "
                                          f"{_FIX}")
        elif target == "events":
            if n_events is None:
                continue
            if int(v.min()) < 0 or int(v.max()) >= n_events:
                bad = int(v.min()) if int(v.min()) < 0 else int(v.max())
                raise BadShardError(path, f"{where} {bad} points outside /events ({n_events:,} rows); {_FIX}")
        elif target == "pg":
            bad = np.setdiff1d(np.unique(v), np.array(sorted(pgs | {-1}), dtype=np.int64))
            if bad.size:
                raise BadShardError(path, f"{where} {int(bad[0])} is neither -1 nor a process group of attribute "
                                          f"'process_groups' (indices {_span(pgs)}); {_FIX}")
        elif target == "rank":
            ws = attrs["world_size"]
            if int(v.min()) < 0 or int(v.max()) >= ws:
                bad = int(v.min()) if int(v.min()) < 0 else int(v.max())
                raise BadShardError(path, f"{where} holds rank {bad}, outside 0..{ws - 1}; {_FIX}")
    for table in ("events", "memory"):
        step = tables.get(table, {}).get("step")
        if step is not None and len(step) and int(step.min()) < -1:
            raise BadShardError(path, f"/{table}/step {int(step.min())} is below -1 (outside every step); {_FIX}")
    _check_times(path, tables)


#: (table, column, lowest value): times (ns since the epoch, or of a monotonic clock) and durations, all below
#: MAX_NS so that every sum the readers form (ts + dur, + a clock offset) stays inside int64.
TIME_COLUMNS = (
    ("events", "ts_ns", 0), ("events", "dur_ns", 0), ("steps", "start_ns", 0), ("steps", "end_ns", 0),
    ("memory", "ts_ns", 0), ("cuda_memory", "peak_ns", 0), ("cuda_memory_blocks", "ts_ns", 0),
    ("cuda_memory_blocks", "lifetime_ns", -1), ("clock/samples", "t_send_ns", 0),
    ("clock/samples", "t_remote_ns", 0), ("clock/samples", "t_recv_ns", 0), ("clock/local", "time_ns", 0),
    ("clock/local", "monotonic_ns", 0), ("clock/local", "perf_counter_ns", 0),
)
MAX_NS = 1 << 62
#: Clock samples: a round trip longer than this (about 18 minutes), or a clock further off the reference than
#: MAX_OFFSET_NS (about 52 days), is not a measurement.
MAX_RTT_NS = 1 << 40
MAX_OFFSET_NS = 1 << 52


def _check_times(path, tables: Mapping[str, Mapping[str, np.ndarray]]) -> None:
    for table, col, lo in TIME_COLUMNS:
        v = tables.get(table, {}).get(col)
        if v is None or not len(v):
            continue
        vmin, vmax = int(v.min()), int(v.max())
        if vmin < lo or vmax >= MAX_NS:
            bad = vmin if vmin < lo else vmax
            raise BadShardError(path, f"/{table}/{col} {bad} is outside {lo}..2^62 (not a time or duration in ns); "
                                      f"{_FIX}")
    st = tables.get("steps", {})
    if "start_ns" in st and "end_ns" in st and len(st["start_ns"]) and bool((st["end_ns"] < st["start_ns"]).any()):
        raise BadShardError(path, f"/steps: a step ends before it starts; {_FIX}")
    cs = tables.get("clock/samples", {})
    if all(c in cs for c in ("t_send_ns", "t_remote_ns", "t_recv_ns")) and len(cs["t_send_ns"]):
        send, remote, recv = (np.asarray(cs[c], np.int64) for c in ("t_send_ns", "t_remote_ns", "t_recv_ns"))
        rtt = recv - send  # negative within bounds: the rank's clock stepped back mid-exchange (analysis drops it)
        worst = int(rtt.min()) if -int(rtt.min()) > int(rtt.max()) else int(rtt.max())
        if abs(worst) > MAX_RTT_NS:
            raise BadShardError(path, f"/clock/samples: a round trip of {worst} ns (beyond ±2^40 ns, about 18 "
                                      f"minutes: not a measurement); {_FIX}")
        off = remote - (send + rtt // 2)
        if int(np.abs(off).max()) > MAX_OFFSET_NS:
            raise BadShardError(path, f"/clock/samples: a clock offset of {int(np.abs(off).max())} ns (beyond 2^52 ns, "
                                      f"about 52 days); {_FIX}")


def _span(values: set[int]) -> str:
    if not values:
        return "none"
    return f"{min(values)}..{max(values)}" if len(values) == max(values) - min(values) + 1 else \
        ", ".join(map(str, sorted(values)[:8]))


# ---- one shard ---------------------------------------------------------------------------------------------------


def read_attrs(path: Path, f: h5py.File) -> dict[str, Any]:
    """The decoded root attributes of an open shard (BadShardError on undecodable or oversized ones: an array or a
    fixed-size string is measured before it is read)."""
    try:
        keys = list(f.attrs.keys())
        if len(keys) > MAX_ATTRS:
            raise BadShardError(path, f"{len(keys):,} root attributes, more than the {MAX_ATTRS} distprof reads "
                                      f"(forged?); {_FIX}")
        out = {}
        for k in keys:
            aid = h5py.h5a.open(f.id, k.encode())
            if aid.dtype.kind != "O":  # fixed size: its size is known before reading
                nbytes = int(np.prod(aid.shape or (1,), dtype=np.int64)) * aid.dtype.itemsize
                if nbytes > max(MAX_ARRAY_ATTR_BYTES, attr_limit(k)):
                    raise _too_long(path, k, nbytes)
            out[k] = decode_attr(path, k, _attr_value(aid))
        if schema.ATTRS_JSON in out:
            _unfold(path, out)
        return out
    except BadShardError:
        raise
    except H5_ERRORS as e:
        raise BadShardError(path, f"cannot read its attributes ({h5_message(e)}); {_FIX}") from None


def _unfold(path: Path, out: dict[str, Any]) -> None:
    """2.x: the attributes held in the JSON object schema.ATTRS_JSON, each decoded as its own HDF5 attribute would
    be (its text bounded, JSON text decoded), put in `out` beside the file's own (format, schema_version)."""
    key = schema.ATTRS_JSON
    doc = out.pop(key)
    if not isinstance(doc, dict):
        raise BadShardError(path, f"attribute {key!r} is {_show(doc)}, not a JSON object; {_FIX}")
    if len(doc) > MAX_ATTRS:
        raise BadShardError(path, f"{len(doc):,} attributes in {key!r}, more than the {MAX_ATTRS} distprof reads "
                                  f"(forged?); {_FIX}")
    for k, v in doc.items():
        if k in out or k == key:
            raise BadShardError(path, f"attribute {k!r} is both in {key!r} and beside it; {_FIX}")
        if isinstance(v, str) and _not_utf8(v):
            raise BadShardError(path, f"attribute {k!r} is not UTF-8 text; {_FIX}")
        out[k] = decode_attr(path, k, v)


def _not_utf8(s: str) -> bool:
    """Text read with surrogateescape from bytes that were not UTF-8."""
    try:
        s.encode("utf-8")
        return False
    except UnicodeEncodeError:
        return True


def _attr_value(aid: h5py.h5a.AttrID) -> Any:
    """An attribute's value from its open id, as ``h5py.File.attrs[name]`` gives it (which would open it again and
    build an AttributeManager per read: a third of a 16,384-shard scan)."""
    shape, dtype = aid.shape, aid.dtype
    if shape is None:
        return h5py.Empty(dtype)
    htype = h5py.h5t.py_create(dtype)
    if dtype.subdtype is not None:  # a top-level array type: numpy's shape and dtype for it
        dtype, sub = dtype.subdtype
        shape = shape + sub
    arr = np.zeros(shape, dtype=dtype, order="C")
    aid.read(arr, mtype=htype)
    info = h5py.check_string_dtype(dtype)
    if info and info.length is None:  # variable-length strings: bytes to str
        arr = np.array([b.decode("utf-8", "surrogateescape") for b in arr.flat], dtype=dtype).reshape(arr.shape)
    return arr[()] if arr.ndim == 0 else arr


def check_shard(path: os.PathLike | str, *, defer_layout: bool = False):
    """Open `path` and check its attributes and layout (metadata only: no column is read); return its Shard.

    The ids are checked on the columns as they are read (:func:`check_values`). Raises BadShardError.
    `defer_layout`: a shard that stores its summary (``/summary``, which the report may read instead of its events)
    has its layout checked only before its first table is read (``Shard.layout_checked``), not now.
    """
    path = Path(path)
    with open_h5(path) as f:
        attrs = read_attrs(path, f)
        check_attrs(path, attrs)
        try:
            if defer_layout and f.id.links.exists(SUMMARY_GROUP.encode()):
                return Shard(path=path, attrs=attrs, layout_checked=False)
            check_layout(path, f)
        except BadShardError:
            raise
        except H5_ERRORS as e:  # damaged metadata or chunks: h5py raises whatever HDF5's error stack maps to
            raise BadShardError(path, f"damaged HDF5 data ({h5_message(e)}); {_FIX}") from None
    return Shard(path=path, attrs=attrs)


def check_image(image: bytes, path: os.PathLike | str) -> ImageShard:
    """:func:`check_shard` of a shard still in memory (its bytes, to be stored at `path`)."""
    path = Path(path)
    shard = ImageShard(path=path, attrs={}, image=image)
    with shard._open() as f:
        attrs = read_attrs(path, f)
        check_attrs(path, attrs)
        check_layout(path, f)
    shard.attrs = attrs
    return shard
