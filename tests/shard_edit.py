"""Editing shard files in tests: a 2.x table's fields (one compound dataset per table), and the 1.x layout (a group
of column datasets per table) that older captures wrote.

    with h5py.File(path, "r+") as f:
        set_column(f, "events/ts_ns", np.zeros(n, "i8"))   # replace (or add) one field, any dtype or shape
        drop_column(f, "events/kind")
    to_column_layout(path, version="1.5")                  # the same shard as a 1.x capture wrote it
"""

from __future__ import annotations

from pathlib import Path

import h5py
import hdf5plugin
import numpy as np

from distprof.storage import schema

_FILTER = {"shuffle": True, **hdf5plugin.Zstd(clevel=3)}


def _rewrite(f: h5py.File, table: str, columns: dict[str, np.ndarray]) -> None:
    """Table `table` written again as one compound dataset of `columns` (a field may be a sub-array)."""
    n = len(next(iter(columns.values()))) if columns else 0
    dtype = np.dtype([(c, v.dtype, v.shape[1:]) for c, v in columns.items()])
    rec = np.empty(n, dtype)
    for c, v in columns.items():
        rec[c] = v
    del f[table]
    if n:
        f.create_dataset(table, data=rec, chunks=(min(n, schema.CHUNK_ROWS),), **_FILTER)
    else:
        f.create_dataset(table, shape=(0,), dtype=dtype)


def columns_of(f: h5py.File, table: str) -> dict[str, np.ndarray]:
    rec = f[table][()]
    return {c: rec[c] for c in rec.dtype.names}


def set_column(f: h5py.File, where: str, values: np.ndarray) -> None:
    """`where` = ``table/column``: that field replaced by `values` (same rows; any dtype or shape per row)."""
    table, col = where.rsplit("/", 1)
    cols = columns_of(f, table)
    cols[col] = np.asarray(values)
    _rewrite(f, table, cols)


def drop_column(f: h5py.File, where: str) -> None:
    table, col = where.rsplit("/", 1)
    cols = columns_of(f, table)
    del cols[col]
    _rewrite(f, table, cols)


def column(f: h5py.File, where: str) -> np.ndarray:
    table, col = where.rsplit("/", 1)
    return f[table][col]


def to_column_layout(path: Path, version: str = "1.5") -> None:
    """Rewrite every table of a 2.x shard as a 1.x capture stored it (a group, one chunked dataset per column) and
    mark the file `version`."""
    with h5py.File(path, "r+") as f:
        for table in schema.TABLES:
            obj = f.get(table)
            if not isinstance(obj, h5py.Dataset):
                continue
            cols = columns_of(f, table)
            del f[table]
            g = f.create_group(table)
            for c, v in cols.items():
                v = np.ascontiguousarray(v)
                if len(v):
                    g.create_dataset(c, data=v, chunks=(min(len(v), schema.CHUNK_ROWS),), **_FILTER)
                else:
                    g.create_dataset(c, shape=(0,), dtype=v.dtype, maxshape=(None,), chunks=(1024,))
        f.attrs["schema_version"] = version
