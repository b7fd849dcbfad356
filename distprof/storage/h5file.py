"""Opening a shard's HDF5 file read-only, and the errors h5py raises on damaged files. Every reader goes through
``open_h5`` (a regular file only: never a FIFO or a device, checked without blocking) and turns ``H5_ERRORS`` into a
BadShardError. A table is read only once its size as read is checked against what the file stores
(:func:`check_expansion`), and in bounded slices (:func:`read_column`)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

import h5py
import hdf5plugin  # noqa: F401  -- registers the Zstd filter; every reader must import it
import numpy as np

from ..errors import BadShardError
from . import safefs

__all__ = ["H5_ERRORS", "open_h5", "h5_message", "check_expansion", "read_column", "read_records", "FIX"]


#: What every message about a damaged shard ends with.
FIX = "the shard is damaged; move it out of the run directory or re-run the capture"
#: Rows read from a column at a time (a read never asks HDF5 for more in one go).
READ_ROWS = 1 << 20

#: Errors h5py raises on damaged files (it maps HDF5's error stack onto these).
H5_ERRORS = (OSError, RuntimeError, KeyError, ValueError, TypeError, IndexError, SystemError)


def open_h5(path: Path) -> h5py.File:
    """Open a shard read-only; BadShardError when it is not a regular file (a FIFO, a device: checked on a
    descriptor opened non-blocking, so nothing ever waits on it) or not HDF5. The file HDF5 opens is the one
    checked (``/proc/self/fd``, storage.safefs)."""
    try:
        fd = safefs.open_regular(path)
    except FileNotFoundError:
        raise BadShardError(path, "no such shard file") from None
    except safefs.FileRefused as e:
        raise BadShardError(path, e.reason) from None
    except OSError as e:
        raise BadShardError(path, f"cannot read ({e.strerror})") from None
    name = safefs.fd_path(fd, path)
    try:
        return h5py.File(name, "r")
    except H5_ERRORS as e:
        raise BadShardError(path, f"not a readable HDF5 file ({h5_message(e).replace(name, str(path))}); delete it "
                                  "or re-run the capture") from None
    finally:
        os.close(fd)


def h5_message(e: BaseException) -> str:
    msg = str(e) or type(e).__name__
    return msg.strip("'\"").replace("Unable to synchronously ", "cannot ")


#: A table may hold this much more data than the file stores for it (compression), beyond RAW_FLOOR_BYTES: real
#: shards reach about 115 (a synthetic trace of identical steps), a forged one of zeros 10^5.
MAX_EXPANSION = 512
#: Tables up to this size (as read) are never refused for their compression.
RAW_FLOOR_BYTES = 64 << 20


def check_expansion(path, where: str, n: int, dsets: list | Callable[[], list], row_bytes: int | None = None) -> None:
    """Refuse a table whose `n` rows, as read, would take more than MAX_EXPANSION times the bytes the file stores
    for its columns `dsets` (low-level dataset ids, or a function giving them: opened only when needed) and more than
    RAW_FLOOR_BYTES: a decompression bomb, whose every chunk may be present. `row_bytes`: the bytes of one row as
    read, when known without opening the columns. Checked before anything is read; BadShardError."""
    if n == 0:
        return
    if row_bytes is not None and n * row_bytes <= RAW_FLOOR_BYTES:
        return
    dsets = dsets() if callable(dsets) else dsets
    if not dsets:
        return
    raw = n * sum(max(ds.dtype.itemsize, 1) for ds in dsets)
    if raw <= RAW_FLOOR_BYTES:
        return
    stored = sum(int(ds.get_storage_size()) for ds in dsets)
    if raw > MAX_EXPANSION * stored:
        raise BadShardError(path, f"{where} claims {n:,} rows ({raw / 1e9:.1f} GB as read) from {stored:,} bytes in "
                                  f"the file, more than {MAX_EXPANSION}x what compression gives (forged: a "
                                  f"decompression bomb); {FIX}")


def read_column(ds: h5py.Dataset, dtype: np.dtype) -> np.ndarray:
    """A 1-D column in `dtype`, read READ_ROWS at a time straight into its array (HDF5 converts the type): no
    temporary copy of the whole column. Its size was checked first (:func:`check_expansion`)."""
    return _read_1d(ds, np.empty(int(ds.shape[0]), dtype=dtype))


def read_records(ds: h5py.Dataset, dtype: np.dtype) -> np.ndarray:
    """The fields of compound dataset `ds` that record dtype `dtype` names, each converted by HDF5 to its dtype there
    (fields are matched by name; the others are not kept), READ_ROWS at a time. Its size was checked first."""
    return _read_1d(ds, np.empty(int(ds.shape[0]), dtype=dtype))


def _read_1d(ds: h5py.Dataset, out: np.ndarray) -> np.ndarray:
    n = len(out)
    if n <= READ_ROWS:
        if n:
            ds.id.read(h5py.h5s.ALL, h5py.h5s.ALL, out)
        return out
    fspace = ds.id.get_space()
    for a in range(0, n, READ_ROWS):
        b = min(n, a + READ_ROWS)
        fspace.select_hyperslab((a,), (b - a,))
        ds.id.read(h5py.h5s.create_simple((b - a,)), fspace, out[a:b])
    return out
