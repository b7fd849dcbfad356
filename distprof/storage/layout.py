"""A shard's layout, checked before any of its tables is read: groups, columns, dtypes, lengths and storage.

    check_layout(path, h5file)      # each present table's row count; BadShardError naming the first fault

Every known column of a present group must be a plain 1-D dataset stored in the file (a link out of it, external or
virtual storage are refused, never followed), of a dtype that converts exactly to the schema's, all columns of a
table of one length, and every chunk of its data present (a table's size is bounded by the file's). Run by
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
#: Groups every shard has (capture and import write them, possibly empty).
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


def _group(path, f: h5py.File, name: str) -> h5py.h5g.GroupID | None:
    """Group `name` (``a/b`` walks the path) stored in this file; None when absent."""
    gid = f.id
    done = ""
    for part in name.split("/"):
        done = f"{done}/{part}"
        gid = _link(path, gid, part, done)
        if gid is None:
            return None
        if not isinstance(gid, h5py.h5g.GroupID):
            raise BadShardError(path, f"{done} is not a table (a group of columns); {FIX}")
    return gid


def _dataset(path, gid: h5py.h5g.GroupID, name: str, where: str) -> h5py.h5d.DatasetID | None:
    """Column `name` of group `gid` when it is a plain 1-D dataset whose rows are all in this file; None when absent."""
    ds = _link(path, gid, name, where)
    if ds is None:
        return None
    if not isinstance(ds, h5py.h5d.DatasetID):
        raise BadShardError(path, f"{where} is a group, not a column; {FIX}")
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
    """Groups, columns, dtypes, lengths and storage; returns each present table's row count (and 'strings')."""
    rows: dict[str, int] = {}
    names = _dataset(path, strings, "names", "/strings/names") if (strings := _group(path, f, "strings")) else None
    if names is None:
        raise BadShardError(path, f"no string table /strings/names; {FIX}")
    if h5py.check_string_dtype(names.dtype) is None:
        raise BadShardError(path, f"/strings/names holds {names.dtype}, not strings; {FIX}")
    rows["strings"] = int(names.shape[0])
    for table, cols in schema.TABLES.items():
        g = _group(path, f, table)
        if g is None:
            if table in REQUIRED_GROUPS:
                raise BadShardError(path, f"no table /{table}; {FIX}")
            continue
        lengths: dict[str, int] = {}
        dsets = []
        required = _columns_required(table)
        for col, want in cols.items():
            ds = _dataset(path, g, col, f"/{table}/{col}")
            if ds is None:
                if required[col]:
                    raise BadShardError(path, f"table /{table} has no column {col!r}; {FIX}")
                continue
            if not _castable(ds.dtype, want):
                raise BadShardError(path, f"/{table}/{col} holds {ds.dtype}, not {want} (or a type that converts "
                                          f"to it exactly); {FIX}")
            lengths[col] = int(ds.shape[0])
            dsets.append(ds)
        if len(set(lengths.values())) > 1:
            lo, hi = min(lengths, key=lengths.get), max(lengths, key=lengths.get)
            raise BadShardError(path, f"table /{table}: columns differ in length ({lo} {lengths[lo]:,} rows, "
                                      f"{hi} {lengths[hi]:,}); {FIX}")
        rows[table] = next(iter(lengths.values()), 0)
        check_expansion(path, f"/{table}", rows[table], dsets)
    check_expansion(path, "/strings/names", rows["strings"], [names])
    return rows
