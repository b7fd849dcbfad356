"""Write one shard file atomically: temporary name, fsync, rename.

A crash while writing leaves at most an orphan ``*.tmp`` (removed by the next writer in that
directory), never a partial file under a final name.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any, Mapping

import h5py
import numpy as np

from . import schema

log = logging.getLogger(__name__)

CODECS = ("zstd", "gzip")
#: HDF5 1.14 readers (PyTables, h5dump 1.14) must open what we write: never libver 'latest' (= v200 on HDF5 2.0).
LIBVER = ("earliest", "v114")


def _filter_kwargs(codec: str) -> dict[str, Any]:
    if codec == "zstd":
        import hdf5plugin  # registers the Zstd filter (id 32015)

        return {"shuffle": True, **hdf5plugin.Zstd(clevel=3)}
    if codec == "gzip":
        return {"shuffle": True, "compression": "gzip", "compression_opts": 1}
    raise ValueError(f"unknown codec {codec!r}; choose one of {', '.join(CODECS)}")


def _write_table(group: h5py.Group, columns: Mapping[str, np.ndarray], filt: dict[str, Any]) -> None:
    lengths = {len(v) for v in columns.values()}
    if len(lengths) > 1:
        raise ValueError(f"table {group.name}: columns have different lengths {sorted(lengths)}")
    for col, values in columns.items():
        arr = np.ascontiguousarray(values)
        n = len(arr)
        if n == 0:
            group.create_dataset(col, shape=(0,), dtype=arr.dtype, maxshape=(None,), chunks=(1024,))
            continue
        chunk = (min(n, schema.CHUNK_ROWS),)
        group.create_dataset(col, data=arr, chunks=chunk, **filt)


def _attr_value(key: str, value: Any) -> Any:
    if key in schema.JSON_ATTRS or isinstance(value, (dict, list, tuple)):
        return json.dumps(value, default=str)
    if value is None:
        return ""
    if isinstance(value, str):
        return str(value)  # str subclasses (torch.__version__) have no HDF5 conversion
    return value


def write_shard(
    path: str | os.PathLike,
    tables: Mapping[str, Mapping[str, np.ndarray]],
    strings: list[str],
    attrs: Mapping[str, Any],
    codec: str = "zstd",
) -> int:
    """Write a complete shard to `path` (tmp → fsync → rename). Returns its size in bytes."""
    path = Path(path)
    tmp = path.with_name(path.name + schema.TMP_SUFFIX)
    filt = _filter_kwargs(codec)
    try:
        with h5py.File(tmp, "w", libver=LIBVER, track_order=False) as f:
            f.attrs["format"] = schema.FORMAT_NAME
            f.attrs["schema_version"] = schema.SCHEMA_VERSION
            f.attrs["codec"] = codec
            for key, value in attrs.items():
                try:
                    f.attrs[key] = _attr_value(key, value)
                except TypeError as e:
                    raise TypeError(f"shard attribute {key!r} = {value!r}: {e}") from None
            f.create_dataset(
                "strings/names",
                data=np.array(strings, dtype=h5py.string_dtype("utf-8")),
                dtype=h5py.string_dtype("utf-8"),
            )
            t0 = time.perf_counter()
            for name, columns in tables.items():
                _write_table(f.require_group(name), columns, filt)
            timings = dict(attrs.get("timings") or {})
            timings["write_s"] = round(time.perf_counter() - t0, 6)  # compression + HDF5 writes
            f.attrs["timings"] = json.dumps(timings)
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        _fsync_dir(path.parent)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path.stat().st_size


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def remove_orphans(directory: str | os.PathLike, rank: int) -> int:
    """Delete this rank's leftover temporary files from an earlier crash. Returns how many."""
    n = 0
    for p in Path(directory).glob(f"rank{rank:05d}.*{schema.TMP_SUFFIX}"):
        try:
            p.unlink()
            n += 1
        except OSError:
            pass
    return n
