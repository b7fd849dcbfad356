"""Write one shard file so that a failure can neither crash the process nor leave a partial file under a final name.

The shard is built in memory by HDF5 (the core driver without a backing store: no HDF5 call ever touches the disk,
so a full disk cannot reach HDF5's error paths, which are not safe on ENOSPC -- a segfault in ``File.close()`` was
measured), then its bytes are written by :func:`write_durably`: free space checked first (``os.statvfs``), a
temporary file of a unique name (``O_CREAT|O_EXCL|O_NOFOLLOW``, mode 0600) written with plain ``os.write`` calls,
fsynced, its size verified, renamed over the final name relative to the directory's descriptor (``storage.safefs``:
a link planted at either name is never followed). A crash while writing leaves at most an orphan ``*.tmp`` (removed
by the next writer in that directory), never a partial file under a final name. Every failure to store is a
:class:`ShardWriteError` saying why in words (no space, no free inode, the file-size limit, a read-only file system),
with nothing left behind.
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import logging
import os
import time
from pathlib import Path
from typing import Any, Iterator, Mapping

import h5py
import numpy as np

from . import safefs, schema
from .group_ranks import compact_groups
from .summary_group import BLOB, COMPRESS_MIN, SUMMARY_GROUP, StoredSummary, Summarizer, pack

log = logging.getLogger(__name__)

CODECS = ("zstd", "gzip")
#: HDF5 1.14 readers (PyTables, h5dump 1.14) must open what we write: never libver 'latest' (= v200 on HDF5 2.0).
#: v110 as the lowest: a dataset of one chunk needs no chunk B-tree (HDF5 1.10's chunk indexes) and object headers
#: are smaller — a 3k-event window's shard 140 -> 51 kB, of which 20 kB are data (PyTables 3.11 /
#: HDF5 1.14.6 read it; schema 2.0, a dataset per table and one JSON attribute, is read by PyTables 3.10 / HDF5 1.14.3).
LIBVER = ("v110", "v114")
#: The core driver grows its in-memory image by this much at a time.
_CORE_BLOCK = 1 << 20
#: A file is written only when the file system keeps this much free after it: 1 % of its size, at most 256 MiB
#: (the job's own checkpoints and logs need the space more than a profile does), at least 64 KiB (each rank's status
#: file, which names the windows lost, must still fit once shards have filled a small file system).
RESERVE_FRACTION, RESERVE_MAX, RESERVE_MIN = 0.01, 256 << 20, 64 << 10


class ShardWriteError(OSError):
    """A file could not be stored; ``reason`` says why in words (``no space left on /out: 1.2 MB needed, ...``)."""

    def __init__(self, path: os.PathLike | str, reason: str, err: int | None = None):
        super().__init__(err or 0, f"{path}: {reason}")
        self.path = Path(path)
        self.reason = reason


def _filter_kwargs(codec: str) -> dict[str, Any]:
    if codec == "zstd":
        import hdf5plugin  # registers the Zstd filter (id 32015)

        return {"shuffle": True, **hdf5plugin.Zstd(clevel=3)}
    if codec == "gzip":
        return {"shuffle": True, "compression": "gzip", "compression_opts": 1}
    raise ValueError(f"unknown codec {codec!r}; choose one of {', '.join(CODECS)}")


def table_records(name: str, columns: Mapping[str, np.ndarray]) -> np.ndarray:
    """A table's columns as one record array (a field per column, in the given order and dtypes): what a 2.x shard
    stores as the compound dataset ``/<name>``."""
    lengths = {len(v) for v in columns.values()}
    if len(lengths) > 1:
        raise ValueError(f"table /{name}: columns have different lengths {sorted(lengths)}")
    arrays = {col: np.asarray(values) for col, values in columns.items()}
    rec = np.empty(next(iter(lengths), 0), dtype=[(col, a.dtype) for col, a in arrays.items()])
    for col, a in arrays.items():
        rec[col] = a
    return rec


def _write_table(f: h5py.File, name: str, columns: Mapping[str, np.ndarray], filt: dict[str, Any]) -> None:
    """Table `name` as one compound dataset, chunked by schema.CHUNK_ROWS rows and compressed (empty: no chunks)."""
    rec = table_records(name, columns)
    n = len(rec)
    if n == 0:
        f.create_dataset(name, shape=(0,), dtype=rec.dtype)
        return
    f.create_dataset(name, data=rec, chunks=(min(n, schema.CHUNK_ROWS),), **filt)


def _storable(name: str) -> str:
    """A name HDF5 can hold: variable-length strings end at a NUL, so an embedded one (an imported trace's
    garbage) is written as the text ``\\x00``."""
    return name.replace("\x00", "\\x00") if "\x00" in name else name


def _attr_value(key: str, value: Any) -> Any:
    """An attribute's value as a 1.x shard held it: JSON text for the JSON attributes, "" for None; the process
    groups' ranks as ranges where they are one (``group_ranks``, 2.1)."""
    if key == "process_groups":
        value = compact_groups(value)
    if key in schema.JSON_ATTRS or isinstance(value, (dict, list, tuple)):
        return json.dumps(value, default=str)
    if value is None:
        return ""
    if isinstance(value, str):
        return str(value)  # str subclasses (torch.__version__)
    if isinstance(value, np.generic):
        return value.item()
    return value


#: The root attributes a 2.x shard keeps as HDF5 attributes (what a tool needs to tell a shard and its version).
_FILE_ATTRS = {"format": schema.FORMAT_NAME, "schema_version": schema.SCHEMA_VERSION}


def attributes_json(attrs: Mapping[str, Any]) -> str:
    """The 2.x root attribute ``attributes``: one JSON object of every attribute, each as :func:`_attr_value`."""
    try:
        return json.dumps({key: _attr_value(key, value) for key, value in attrs.items()})
    except TypeError as e:
        raise TypeError(f"shard attributes: {e}") from None


def populate(f: h5py.File, tables: Mapping[str, Mapping[str, np.ndarray]], strings: list[str],
             attrs: Mapping[str, Any], codec: str) -> None:
    """Fill an open, empty HDF5 file with a shard's attributes, strings and tables (``timings.write_s`` added):
    `format` and `schema_version` as HDF5 attributes, the others in one JSON attribute (schema.ATTRS_JSON)."""
    filt = _filter_kwargs(codec)
    for key, default in _FILE_ATTRS.items():
        f.attrs[key] = _attr_value(key, attrs.get(key, default))
    f.create_dataset(
        "strings/names",
        data=np.array([_storable(s) for s in strings], dtype=h5py.string_dtype("utf-8")),
        dtype=h5py.string_dtype("utf-8"),
    )
    t0 = time.perf_counter()
    for name, columns in tables.items():
        _write_table(f, name, columns, filt)
    timings = dict(attrs.get("timings") or {})
    timings["write_s"] = round(time.perf_counter() - t0, 6)  # compression + HDF5 (in memory)
    others = {k: v for k, v in attrs.items() if k not in _FILE_ATTRS}
    f.attrs[schema.ATTRS_JSON] = attributes_json({"codec": codec, **others, "timings": timings})


class ImageBuilder:
    """A shard being built in memory (HDF5's core driver, no backing store: nothing on disk), still open:

        with building(tables, strings, attrs, codec) as b:
            image = b.image()                       # a complete file's bytes
            image = b.with_summary(summary)         # the same file with /summary added, in place

    Adding the summary to the open file, not to a file reopened from its bytes, keeps HDF5's free space in use: a
    reopened image grew by ~4 kB of unused space on top of the summary itself (24 -> 40 kB, 36 kB in place)."""

    def __init__(self, f: h5py.File, codec: str) -> None:
        self._f = f
        self._codec = codec

    def image(self) -> bytes:
        self._f.flush()
        return self._f.id.get_file_image()

    def with_summary(self, summary: StoredSummary) -> bytes:
        """The file's bytes with `summary` added as /summary. After a failure here, use the bytes of image()."""
        _write_summary(self._f, summary, self._codec)
        return self.image()


@contextlib.contextmanager
def building(tables: Mapping[str, Mapping[str, np.ndarray]], strings: list[str], attrs: Mapping[str, Any],
             codec: str = "zstd") -> Iterator[ImageBuilder]:
    """A shard built in memory and kept open for a summary to be added (:class:`ImageBuilder`)."""
    with h5py.File(f"distprof-shard-{os.getpid()}-{time.perf_counter_ns()}.h5", "w", driver="core",
                   backing_store=False, block_size=_CORE_BLOCK, libver=LIBVER, track_order=False) as f:
        populate(f, tables, strings, attrs, codec)
        del tables, strings, attrs  # the caller may let go of them while the file stays open
        yield ImageBuilder(f, codec)


def shard_image(tables: Mapping[str, Mapping[str, np.ndarray]], strings: list[str], attrs: Mapping[str, Any],
                codec: str = "zstd") -> bytes:
    """A complete shard file's bytes, built in memory (HDF5's core driver, no backing store: nothing on disk)."""
    with building(tables, strings, attrs, codec) as b:
        return b.image()


def _write_summary(f: h5py.File, summary: StoredSummary, codec: str) -> None:
    """`summary` as the group /summary of open file `f` (the arrays packed into one byte column,
    ``summary_group.pack``)."""
    blob, index = pack(summary.arrays)
    g = f.create_group(SUMMARY_GROUP)
    g.attrs["version"] = int(summary.version)
    g.attrs["producer"] = str(summary.producer)
    g.attrs["cpu_s"] = float(summary.cpu_s)
    g.attrs["meta"] = summary.meta
    g.attrs["index"] = index
    if blob.size >= COMPRESS_MIN:
        g.create_dataset(BLOB, data=blob, chunks=(min(blob.size, 1 << 20),), **_filter_kwargs(codec))
    else:
        g.create_dataset(BLOB, data=blob)


def add_summary(image: bytes, summary: StoredSummary, codec: str = "zstd") -> bytes:
    """A shard's bytes (``writer.shard_image``) with `summary` added as /summary, the file reopened from them in
    memory (where the shard is still being built, :meth:`ImageBuilder.with_summary` makes it smaller)."""
    bio = io.BytesIO(image)
    with h5py.File(bio, "r+", libver=LIBVER) as f:
        _write_summary(f, summary, codec)
    return bio.getvalue()


def write_shard(
    path: str | os.PathLike,
    tables: Mapping[str, Mapping[str, np.ndarray]],
    strings: list[str],
    attrs: Mapping[str, Any],
    codec: str = "zstd",
    summarize: Summarizer | None = None,
) -> int:
    """Write a complete shard to `path` (in memory, then :func:`write_durably`). Returns its size in bytes.
    `summarize`: computes the summary stored with it (``summary_group``) from the shard's bytes; None: none.

    Raises ShardWriteError when the file system cannot take it (nothing written), ValueError/TypeError for tables
    or attributes that do not fit the schema."""
    with building(tables, strings, attrs, codec) as b:
        image = b.image()
        summary = summarize(image, Path(path)) if summarize is not None else None
        if summary is not None:
            image = b.with_summary(summary)
    return write_durably(path, image)


def free_bytes(directory: str | os.PathLike) -> tuple[int, int]:
    """(bytes an unprivileged writer may still use, the file system's size) for the file system of `directory`."""
    st = os.statvfs(directory)
    return st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize


def free_inodes(directory: str | os.PathLike) -> tuple[int, int]:
    """(inodes an unprivileged writer may still use, the file system's inodes); (-1, 0) when it does not count them
    (some file systems report 0 inodes in all)."""
    st = os.statvfs(directory)
    return (st.f_favail, st.f_files) if st.f_files > 0 else (-1, 0)


def reserve_bytes(fs_size: int, *, floor: bool = True) -> int:
    """Bytes a write leaves free on a file system of `fs_size` bytes; without the `floor` (RESERVE_MIN), what a
    status file's write leaves: the floor is kept for it."""
    share = min(RESERVE_MAX, int(fs_size * RESERVE_FRACTION))
    return max(RESERVE_MIN, share) if floor else share


def human_bytes(n: int) -> str:
    """1234567 -> '1.23 MB', 4096 -> '4.1 kB', 12 -> '12 bytes'."""
    if n >= 1_000_000:
        return f"{n / 1e6:.2f} MB"
    return f"{n / 1e3:.1f} kB" if n >= 1000 else f"{n} bytes"


def no_space(directory: Path, size: int, avail: int, fs_size: int, *, estimated: bool = False,
             floor: bool = True) -> str:
    """The reason a file of `size` bytes is not written for lack of space, in words (one format for every case)."""
    return (f"not enough space on {directory}: {human_bytes(avail)} free, {'about ' if estimated else ''}"
            f"{human_bytes(size)} to write and {human_bytes(reserve_bytes(fs_size, floor=floor))} kept free for "
            "the job")


def no_inodes(directory: Path, total: int) -> str:
    """The reason a file is not written because its file system has no free inode (space may be left)."""
    return (f"no free inodes on {directory} (all {total:,} files the file system can hold are used; free space "
            "does not help: remove files or use another --out)")


#: errno -> what it means for a file being written, in words
_CAUSES = {
    errno.ENOSPC: "no space left on the device",
    errno.EDQUOT: "disk quota exceeded",
    errno.EFBIG: "file-size limit reached (ulimit -f / RLIMIT_FSIZE)",
    errno.EROFS: "read-only file system",
    errno.EACCES: "permission denied",
    errno.EPERM: "permission denied",
    errno.EIO: "I/O error",
    errno.ELOOP: "a symbolic link is in the way",
    errno.EEXIST: "a file of that name is already there, written by another process (it is kept)",
}


def cause(e: OSError) -> str:
    """An OSError while storing a file, in words."""
    if isinstance(e, safefs.FileRefused):
        return str(e)
    return _CAUSES.get(e.errno, e.strerror or str(e) or type(e).__name__)


def _cause_in(directory: Path, e: OSError) -> str:
    """`cause` of a failed write in `directory`; ENOSPC while bytes are free is the file system's inodes."""
    if e.errno == errno.ENOSPC:
        try:
            avail, total = free_inodes(directory)
        except OSError:
            avail, total = -1, 0
        if avail == 0:
            return no_inodes(directory, total)
    return cause(e)


def write_durably(path: str | os.PathLike, data: bytes | memoryview, *, floor: bool = True,
                  replace: bool = True) -> int:
    """Store `data` at `path`: free space (and inodes) checked, written to a new temporary file beside it (a unique
    name, created with O_EXCL|O_NOFOLLOW, mode 0600) with os.write, fsynced, size verified, renamed over `path`
    (never opened: a link there is replaced, not followed), directory fsynced (storage.safefs). Returns the size.
    On any failure the temporary is removed and ShardWriteError says why; a file already at `path` is untouched.
    `floor`: keep RESERVE_MIN free too (False only for the status file, for which that room is kept). `replace=False`:
    a file already at `path` stays, and ShardWriteError (EEXIST) says so (a shard is written once: one there already
    is another process's)."""
    path = Path(path)
    size = len(data)
    try:
        avail, fs_size = free_bytes(path.parent)
        inodes, n_inodes = free_inodes(path.parent)
    except OSError as e:
        raise ShardWriteError(path, f"cannot reach {path.parent} ({cause(e)})", e.errno) from None
    if inodes == 0:
        raise ShardWriteError(path, no_inodes(path.parent, n_inodes), errno.ENOSPC)
    if avail < size + reserve_bytes(fs_size, floor=floor):
        raise ShardWriteError(path, no_space(path.parent, size, avail, fs_size, floor=floor), errno.ENOSPC)
    try:
        safefs.write_file(path.parent, path.name, data, fsync=True, replace=replace)
    except OSError as e:
        raise ShardWriteError(path, f"{_cause_in(path.parent, e)} in {path.parent}: {human_bytes(size)} not written",
                              e.errno) from None
    return size


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
