"""A shard's layout, checked before any of its tables is read: tables, columns, dtypes, lengths and storage.

    check_layout(path, h5file)      # each present table's row count; BadShardError naming the first fault

A table is one plain 1-D compound dataset (schema 2.x: a field per column) or a group of plain 1-D datasets, one per
column (1.x). Either is stored in the file (a link out of it, external or virtual storage are refused, never
followed), every known column has a dtype that converts exactly to the schema's, all columns of a table are of one
length, and every chunk of its data is present (a table's size is bounded by the file's). Run by
``validate.check_shard`` when a shard is scanned, or — for a shard whose stored summary the report reads instead of
its events — by ``Shard`` before its first table is read.
"""

from __future__ import annotations

import functools
import math

import h5py
import numpy as np

from ..errors import BadShardError
from . import schema
from .h5file import check_expansion

__all__ = ["check_layout", "FIX", "MAX_CHUNK_ROWS", "REQUIRED_GROUPS"]

#: Largest chunk (rows) a column may use: with every chunk present, a column is at most this many rows per chunk
#: record in the file (the writer uses schema.CHUNK_ROWS).
MAX_CHUNK_ROWS = 1 << 20
#: A 2.x table's row (its compound type) is at most this many bytes: the schema's widest is under 200.
MAX_ROW_BYTES = 4096
#: Tables every shard has (capture and import write them, possibly empty).
REQUIRED_GROUPS = ("events", "comms", "threads", "steps")
FIX = "the shard is damaged; move it out of the run directory or re-run the capture"


def _columns_required(table: str) -> dict[str, bool]:
    """Per column of `table`: must a shard that has the table have it (not added by a later minor version)?"""
    return {c: (table, c) not in schema.MISSING_DEFAULTS for c in schema.TABLES[table]}


# The layout is checked with h5py's low-level ids (links, object ids, creation property lists): the high-level objects
# cost ~0.15 ms each, ~40 per shard.


def _link(path, gid: h5py.h5g.GroupID, name: str, where: str):
    """The object `name` of group `gid` when it is a hard link in this file; None when absent."""
    bname = name.encode()
    if not gid.links.exists(bname):
        return None
    kind = gid.links.get_info(bname).type
    if kind != h5py.h5l.TYPE_HARD:
        what = "ExternalLink" if kind == h5py.h5l.TYPE_EXTERNAL else "SoftLink" if kind == h5py.h5l.TYPE_SOFT \
            else "link"
        raise BadShardError(path, f"{where} is a link ({what}), not data in the file; {FIX}")
    return h5py.h5o.open(gid, bname)


def _object(path, f: h5py.File, name: str):
    """Object `name` (``a/b`` walks the path; every part before the last a group) stored in this file; None when
    absent."""
    gid = f.id
    done = ""
    parts = name.split("/")
    for i, part in enumerate(parts):
        done = f"{done}/{part}"
        gid = _link(path, gid, part, done)
        if gid is None:
            return None
        if i < len(parts) - 1 and not isinstance(gid, h5py.h5g.GroupID):
            raise BadShardError(path, f"{done} is not a group; {FIX}")
    return gid


def _group(path, f: h5py.File, name: str) -> h5py.h5g.GroupID | None:
    """Group `name` stored in this file; None when absent."""
    gid = _object(path, f, name)
    if gid is not None and not isinstance(gid, h5py.h5g.GroupID):
        raise BadShardError(path, f"/{name} is not a group; {FIX}")
    return gid


def _dataset(path, gid: h5py.h5g.GroupID, name: str, where: str) -> h5py.h5d.DatasetID | None:
    """Column `name` of group `gid` when it is a plain 1-D dataset whose rows are all in this file; None when absent."""
    ds = _link(path, gid, name, where)
    if ds is None:
        return None
    if not isinstance(ds, h5py.h5d.DatasetID):
        raise BadShardError(path, f"{where} is a group, not a column; {FIX}")
    return _stored(path, ds, where)


def _stored(path, ds: h5py.h5d.DatasetID, where: str) -> h5py.h5d.DatasetID:
    """`ds` when it is a plain 1-D dataset whose rows are all in this file (chunks present, none too large)."""
    dcpl = ds.get_create_plist()
    layout = dcpl.get_layout()
    if layout == h5py.h5d.VIRTUAL or dcpl.get_external_count():
        raise BadShardError(path, f"{where} keeps its data outside the file (virtual or external storage); {FIX}")
    shape = ds.shape
    if len(shape) != 1:
        raise BadShardError(path, f"{where} has shape {shape}, not one column; {FIX}")
    n = int(shape[0])
    if n == 0:
        return ds
    if layout == h5py.h5d.CHUNKED:
        rows = int(dcpl.get_chunk()[0])
        if rows > MAX_CHUNK_ROWS:
            raise BadShardError(path, f"{where} uses chunks of {rows:,} rows (more than {MAX_CHUNK_ROWS:,}); {FIX}")
        need = math.ceil(n / rows)
        have = ds.get_num_chunks()
        if have < need:
            raise BadShardError(path, f"{where} claims {n:,} rows but only {have} of its {need} chunks are in the "
                                      f"file (truncated or forged); {FIX}")
    elif ds.get_storage_size() < n * ds.dtype.itemsize:
        raise BadShardError(path, f"{where} claims {n:,} rows but the file holds less data; {FIX}")
    return ds


@functools.lru_cache(maxsize=256)
def _castable(src: np.dtype, dst: np.dtype) -> bool:
    return bool(np.can_cast(src, dst, casting="safe"))


def check_layout(path, f: h5py.File) -> dict[str, int]:
    """Tables, columns, dtypes, lengths and storage; returns each present table's row count (and 'strings')."""
    rows: dict[str, int] = {}
    names = _dataset(path, strings, "names", "/strings/names") if (strings := _group(path, f, "strings")) else None
    if names is None:
        raise BadShardError(path, f"no string table /strings/names; {FIX}")
    if h5py.check_string_dtype(names.dtype) is None:
        raise BadShardError(path, f"/strings/names holds {names.dtype}, not strings; {FIX}")
    rows["strings"] = int(names.shape[0])
    for table in schema.TABLES:
        obj = _object(path, f, table)
        if obj is None:
            if table in REQUIRED_GROUPS:
                raise BadShardError(path, f"no table /{table}; {FIX}")
            continue
        if isinstance(obj, h5py.h5g.GroupID):
            rows[table] = _column_table(path, table, obj)
        elif isinstance(obj, h5py.h5d.DatasetID):
            rows[table] = _record_table(path, table, obj)
        else:
            raise BadShardError(path, f"/{table} is neither a table nor a group of columns; {FIX}")
    check_expansion(path, "/strings/names", rows["strings"], [names])
    return rows


def _want_column(path, table: str, col: str, dtype: np.dtype, want: np.dtype) -> None:
    if not _castable(dtype, want):
        raise BadShardError(path, f"/{table}/{col} holds {dtype}, not {want} (or a type that converts to it "
                                  f"exactly); {FIX}")


def _record_table(path, table: str, ds: h5py.h5d.DatasetID) -> int:
    """A 2.x table: one compound dataset with a field per column. Returns its row count."""
    where = f"/{table}"
    _stored(path, ds, where)
    dtype = ds.dtype
    if dtype.names is None:
        raise BadShardError(path, f"{where} holds {dtype}, not a table (a compound type, a field per column); {FIX}")
    if dtype.itemsize > MAX_ROW_BYTES:
        raise BadShardError(path, f"{where} has rows of {dtype.itemsize:,} bytes (more than {MAX_ROW_BYTES:,}); "
                                  f"{FIX}")
    required = _columns_required(table)
    for col, want in schema.TABLES[table].items():
        if col not in dtype.names:
            if required[col]:
                raise BadShardError(path, f"table {where} has no column {col!r}; {FIX}")
            continue
        field = dtype.fields[col][0]
        if field.shape:
            raise BadShardError(path, f"{where}/{col} has shape {field.shape} in each row, not one value; {FIX}")
        _want_column(path, table, col, field, want)
    n = int(ds.shape[0])
    check_expansion(path, where, n, [ds])
    return n


def _column_table(path, table: str, g: h5py.h5g.GroupID) -> int:
    """A 1.x table: a group with a dataset per column, all of one length. Returns its row count."""
    lengths: dict[str, int] = {}
    dsets = []
    required = _columns_required(table)
    for col, want in schema.TABLES[table].items():
        ds = _dataset(path, g, col, f"/{table}/{col}")
        if ds is None:
            if required[col]:
                raise BadShardError(path, f"table /{table} has no column {col!r}; {FIX}")
            continue
        _want_column(path, table, col, ds.dtype, want)
        lengths[col] = int(ds.shape[0])
        dsets.append(ds)
    if len(set(lengths.values())) > 1:
        lo, hi = min(lengths, key=lengths.get), max(lengths, key=lengths.get)
        raise BadShardError(path, f"table /{table}: columns differ in length ({lo} {lengths[lo]:,} rows, "
                                  f"{hi} {lengths[hi]:,}); {FIX}")
    n = next(iter(lengths.values()), 0)
    check_expansion(path, f"/{table}", n, dsets)
    return n
