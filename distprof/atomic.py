"""Write a file so that nobody ever sees half of it: into ``<name>.tmp`` beside it, then one rename.

    with atomic_write(path) as fh:          # binary file object of the temporary file
        fh.write(data)
    # here `path` holds all of it; on an exception the temporary file is gone and `path` is untouched

``gzip=True`` wraps the file in a gzip stream (closed before the rename); ``fsync=True`` makes the data durable
before the rename (shards and files written while a job runs).
"""

from __future__ import annotations

import gzip as gzip_mod
import os
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, Iterator

from .storage.schema import TMP_SUFFIX

__all__ = ["atomic_write", "TMP_SUFFIX"]


@contextmanager
def atomic_write(path: str | os.PathLike, *, gzip: bool = False, compresslevel: int = 6, fsync: bool = False,
                 gzip_name: str = "") -> Iterator[BinaryIO]:
    path = Path(path)
    tmp = path.with_name(path.name + TMP_SUFFIX)
    try:
        with open(tmp, "wb") as raw:
            if gzip:
                with gzip_mod.GzipFile(filename=gzip_name, mode="wb", fileobj=raw, compresslevel=compresslevel,
                                       mtime=0) as fh:
                    yield fh
            else:
                yield raw
            if fsync:
                raw.flush()
                os.fsync(raw.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
