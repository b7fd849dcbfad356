"""A shard's stored per-rank summary: the group ``/summary``, written beside the events where they are born.

    with writer.building(tables, strings, attrs) as b:
        image = b.with_summary(StoredSummary(version=1, producer="0.9", meta="{...}", arrays={"a0": ...}))
    shard.stored_summary()          # StoredSummary | None (None: an older shard, or one written without it)

Storage knows only the container: a format version, the distprof version that computed it, a JSON document
(``meta``) and flat, numeric, one-dimensional arrays it refers to by name. What they mean is
``analysis.rank.stored``'s business (it encodes and decodes ``RankSummary``). On disk the arrays are one byte
column, ``/summary/blob`` (compressed with the shard's codec), and an ``index`` attribute (JSON: ``[name, dtype,
offset, count]`` per array, each array 8-byte aligned): one read per summary, where a dataset per array cost
≈ 0.2 ms each (about 50 per rank).

Read back, nothing is trusted: the group's size is bounded before anything is read (the JSON's length, the index's
entries, the blob's size against what the file stores for it), every index entry must be a plain numeric dtype
lying inside the blob, and any fault is a :class:`SummaryUnreadable` saying why; the caller then takes the events
instead.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import h5py
import numpy as np

from ..errors import BadShardError
from .h5file import H5_ERRORS, check_expansion, h5_message, read_column

__all__ = ["SUMMARY_GROUP", "BLOB", "StoredSummary", "Summarizer", "SummaryUnreadable", "read_summary", "pack",
           "SUMMARY_KINDS", "COMPRESS_MIN"]

SUMMARY_GROUP = "summary"
BLOB = "blob"
#: Bounds on what a reader takes from a /summary group (a real one holds tens of arrays and tens of kB of JSON).
MAX_ARRAYS = 4096
MAX_META_BYTES = 32 << 20
MAX_BLOB_BYTES = 2 << 30
#: Array dtypes as the index writes them: byte order, kind, item size.
_DTYPE = re.compile(r"[<>|=][biuf](1|2|4|8|16)")
#: Array dtypes a summary may hold: numbers and booleans (strings travel in the JSON).
SUMMARY_KINDS = "biuf"
#: Blobs of at least this many bytes are compressed.
COMPRESS_MIN = 1024
#: Each array starts at a multiple of this in the blob.
ALIGN = 8


class SummaryUnreadable(ValueError):
    """A shard's /summary group cannot be used (the message says why); its events still can."""


@dataclass
class StoredSummary:
    """A summary as stored: `meta` refers to `arrays` by name. `cpu_s`: the CPU time it took to compute."""

    version: int
    producer: str
    meta: str
    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    cpu_s: float = 0.0


#: What computes a shard's summary from its bytes and the path they go to (the entry point hands capture's writer
#: analysis's map: ``distprof.source_summary``); None: none is stored with this shard.
Summarizer = Callable[[bytes, Path], "StoredSummary | None"]


def pack(arrays: dict[str, np.ndarray]) -> tuple[np.ndarray, str]:
    """The arrays as one byte column and its index (JSON), each array aligned to ALIGN bytes."""
    index, parts, offset = [], [], 0
    for key, arr in arrays.items():
        a = np.ascontiguousarray(arr)
        if a.ndim != 1 or a.dtype.kind not in SUMMARY_KINDS or not _DTYPE.fullmatch(a.dtype.str):
            raise ValueError(f"summary array {key!r}: {a.dtype} of shape {a.shape} cannot be stored")
        index.append([key, a.dtype.str, offset, int(a.size)])
        raw = a.view(np.uint8)
        pad = -raw.size % ALIGN
        parts += [raw, np.zeros(pad, np.uint8)]
        offset += raw.size + pad
    blob = np.concatenate(parts) if parts else np.zeros(0, np.uint8)
    return blob, json.dumps(index, separators=(",", ":"))


def read_summary(f: h5py.File, path: Path) -> StoredSummary | None:
    """The /summary group of an open shard; None when it has none. SummaryUnreadable when it cannot be used."""
    try:
        if not f.id.links.exists(SUMMARY_GROUP.encode()):
            return None
        _hard(f, SUMMARY_GROUP, path)
        g = f[SUMMARY_GROUP]
        if not isinstance(g, h5py.Group):
            raise SummaryUnreadable(f"{path}: /{SUMMARY_GROUP} is not a group")
        version, producer, meta, index = _attrs(g, path)
        arrays = _unpack(_blob(g, path), index, path)
        cpu = g.attrs.get("cpu_s", 0.0)
        return StoredSummary(version=version, producer=producer, meta=meta, arrays=arrays,
                             cpu_s=float(cpu) if isinstance(cpu, (float, np.floating)) else 0.0)
    except SummaryUnreadable:
        raise
    except H5_ERRORS as e:
        raise SummaryUnreadable(f"{path}: cannot read /{SUMMARY_GROUP} ({h5_message(e)})") from None


def _text_attr(g: h5py.Group, key: str, path: Path) -> str:
    if key not in g.attrs:
        raise SummaryUnreadable(f"{path}: /{SUMMARY_GROUP} has no attribute {key!r}")
    aid = h5py.h5a.open(g.id, key.encode())
    if aid.dtype.kind != "O" and aid.dtype.itemsize > MAX_META_BYTES:
        raise SummaryUnreadable(f"{path}: /{SUMMARY_GROUP} {key} is over {MAX_META_BYTES >> 20} MiB")
    v = g.attrs[key]
    if isinstance(v, bytes):
        v = v.decode("utf-8", "replace")
    if not isinstance(v, str):
        raise SummaryUnreadable(f"{path}: /{SUMMARY_GROUP} {key} must be a string")
    if len(v) > MAX_META_BYTES:
        raise SummaryUnreadable(f"{path}: /{SUMMARY_GROUP} {key} is over {MAX_META_BYTES >> 20} MiB")
    return v


def _attrs(g: h5py.Group, path: Path) -> tuple[int, str, str, str]:
    if "version" not in g.attrs:
        raise SummaryUnreadable(f"{path}: /{SUMMARY_GROUP} has no attribute 'version'")
    version = g.attrs["version"]
    if not isinstance(version, (int, np.integer)) or isinstance(version, (bool, np.bool_)):
        raise SummaryUnreadable(f"{path}: /{SUMMARY_GROUP} version is {version!r}, not an integer")
    return (int(version), _text_attr(g, "producer", path), _text_attr(g, "meta", path),
            _text_attr(g, "index", path))


def _hard(g: h5py.Group, key: str, path: Path) -> None:
    """A link planted in the group (to another file, or elsewhere in this one) is refused, never followed."""
    if g.id.links.get_info(key.encode()).type != h5py.h5l.TYPE_HARD:
        raise SummaryUnreadable(f"{path}: {g.name.rstrip('/')}/{key} is a link, not data in the file")


def _blob(g: h5py.Group, path: Path) -> np.ndarray:
    if not g.id.links.exists(BLOB.encode()):
        raise SummaryUnreadable(f"{path}: /{SUMMARY_GROUP} has no {BLOB}")
    _hard(g, BLOB, path)
    ds = g[BLOB]
    if not isinstance(ds, h5py.Dataset) or len(ds.shape) != 1 or ds.dtype != np.uint8:
        raise SummaryUnreadable(f"{path}: /{SUMMARY_GROUP}/{BLOB} is not one column of bytes")
    n = int(ds.shape[0])
    if n > MAX_BLOB_BYTES:
        raise SummaryUnreadable(f"{path}: /{SUMMARY_GROUP}/{BLOB} claims {n:,} bytes, more than "
                                f"{MAX_BLOB_BYTES >> 30} GiB")
    try:
        check_expansion(path, f"/{SUMMARY_GROUP}/{BLOB}", n, [ds.id], row_bytes=1)
    except BadShardError as e:  # it claims far more than the file stores
        raise SummaryUnreadable(f"{e.path}: {e.reason}") from None
    return read_column(ds, np.dtype(np.uint8))


def _unpack(blob: np.ndarray, index_json: str, path: Path) -> dict[str, np.ndarray]:
    """The arrays the index names, each copied out of the blob after its entry is checked."""
    where = f"{path}: /{SUMMARY_GROUP} index"
    try:
        index = json.loads(index_json)
    except (ValueError, RecursionError) as e:
        raise SummaryUnreadable(f"{where} is not JSON ({e})") from None
    if not isinstance(index, list) or len(index) > MAX_ARRAYS:
        raise SummaryUnreadable(f"{where} is not a list of at most {MAX_ARRAYS} entries")
    arrays: dict[str, np.ndarray] = {}
    for entry in index:
        if not (isinstance(entry, list) and len(entry) == 4 and isinstance(entry[0], str) and len(entry[0]) <= 64
                and isinstance(entry[1], str) and _DTYPE.fullmatch(entry[1])
                and all(type(x) is int and x >= 0 for x in entry[2:])):
            raise SummaryUnreadable(f"{where}: an entry {str(entry)[:80]!r} is not [name, dtype, offset, count]")
        key, dt, offset, count = entry
        dtype = np.dtype(dt)
        if key in arrays or offset + count * dtype.itemsize > blob.size:
            raise SummaryUnreadable(f"{where}: array {key!r} repeated or outside the blob")
        arrays[key] = np.frombuffer(blob, dtype, count, offset).copy()
    return arrays
