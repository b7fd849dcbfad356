"""Opening a shard's HDF5 file read-only, and the errors h5py raises on damaged files. Every reader goes through
``open_h5`` (a regular file only: never a FIFO or a device) and turns ``H5_ERRORS`` into a BadShardError."""

from __future__ import annotations

import stat
from pathlib import Path

import h5py
import hdf5plugin  # noqa: F401  -- registers the Zstd filter; every reader must import it

from ..errors import BadShardError

__all__ = ["H5_ERRORS", "open_h5", "h5_message"]


#: Errors h5py raises on damaged files (it maps HDF5's error stack onto these).
H5_ERRORS = (OSError, RuntimeError, KeyError, ValueError, TypeError, IndexError, SystemError)


def open_h5(path: Path) -> h5py.File:
    """Open a shard read-only; BadShardError when it is not a file or not HDF5."""
    try:
        st = path.stat()
    except FileNotFoundError:
        raise BadShardError(path, "no such shard file") from None
    except OSError as e:
        raise BadShardError(path, f"cannot read ({e.strerror})") from None
    if not stat.S_ISREG(st.st_mode):
        raise BadShardError(path, "not a regular file; move it out of the run directory")
    try:
        return h5py.File(path, "r")
    except H5_ERRORS as e:
        raise BadShardError(path, f"not a readable HDF5 file ({h5_message(e)}); delete it or re-run the "
                                  "capture") from None


def h5_message(e: BaseException) -> str:
    msg = str(e) or type(e).__name__
    return msg.strip("'\"").replace("Unable to synchronously ", "cannot ")
