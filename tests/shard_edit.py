"""Editing shard files in tests: a 2.x table's fields (one compound dataset per table), its root attributes (one
JSON object, but for format and schema_version), and the 1.x layout (a group of column datasets per table, an HDF5
attribute per attribute) that older captures wrote.

    with h5py.File(path, "r+") as f:
        set_column(f, "events/ts_ns", np.zeros(n, "i8"))   # replace (or add) one field, any dtype or shape
        drop_column(f, "events/kind")
        set_attr(f, "rank", "one"); del_attr(f, "run_id"); get_attr(f, "world_size")
    to_column_layout(path, version="1.5")                  # the same shard as a 1.x capture wrote it
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

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


def _doc(f: h5py.File) -> dict[str, Any]:
    return json.loads(f.attrs[schema.ATTRS_JSON])


def _jsonable(value: Any) -> Any:
    if isinstance(value, bytes):  # np.bytes_ too
        return bytes(value).decode("utf-8", "surrogateescape")
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return value


def _store_doc(f: h5py.File, doc: dict[str, Any]) -> None:
    """The attributes' JSON object stored; as bytes that are not UTF-8 when a value was such bytes."""
    text = json.dumps(doc, ensure_ascii=False)
    try:
        text.encode("utf-8")
        f.attrs[schema.ATTRS_JSON] = text
    except UnicodeEncodeError:
        f.attrs[schema.ATTRS_JSON] = np.bytes_(text.encode("utf-8", "surrogateescape"))


def set_attr(f: h5py.File, key: str, value: Any) -> None:
    """Root attribute `key` set: an HDF5 attribute for format and schema_version (and in a 1.x shard), else an entry
    of the attributes' JSON object, holding what the HDF5 attribute would (JSON attributes as JSON text)."""
    if key in ("format", "schema_version") or schema.ATTRS_JSON not in f.attrs:
        f.attrs[key] = value
        return
    doc = _doc(f)
    doc[key] = _jsonable(value)
    _store_doc(f, doc)


def get_attr(f: h5py.File, key: str) -> Any:
    if key in f.attrs:
        return f.attrs[key]
    return _doc(f)[key]


def del_attr(f: h5py.File, key: str) -> None:
    if key in f.attrs:
        del f.attrs[key]
        return
    doc = _doc(f)
    del doc[key]
    _store_doc(f, doc)


def to_column_layout(path: Path, version: str = "1.5") -> None:
    """Rewrite a 2.x shard as a 1.x capture stored it: every table a group, one chunked dataset per column; every
    attribute an HDF5 attribute; marked `version`."""
    with h5py.File(path, "r+") as f:
        if schema.ATTRS_JSON in f.attrs:
            doc = _doc(f)
            del f.attrs[schema.ATTRS_JSON]
            for k, v in doc.items():
                f.attrs[k] = v
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
