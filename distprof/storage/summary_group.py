"""A shard's stored per-rank summary: the group ``/summary``, written beside the events where they are born.

    image = shard_image(tables, strings, attrs)
    image = writer.add_summary(image, StoredSummary(version=1, producer="0.9", meta="{...}", arrays={"a0": ...}))
    shard.stored_summary()          # StoredSummary | None (None: an older shard, or one written without it)

Storage knows only the container: a format version, the distprof version that computed it, a JSON document
(``meta``) and flat, numeric, one-dimensional arrays it refers to by name. What they mean is
``analysis.rank.stored``'s business (it encodes and decodes ``RankSummary``).

Read back, nothing is trusted: the group's size is bounded before anything is read (names, arrays, the JSON's
length, each array's size against what the file stores for it), and any fault is a :class:`SummaryUnreadable`
saying why; the caller then takes the events instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import h5py
import numpy as np

from ..errors import BadShardError
from .h5file import H5_ERRORS, check_expansion, h5_message

__all__ = ["SUMMARY_GROUP", "StoredSummary", "Summarizer", "SummaryUnreadable", "read_summary", "SUMMARY_KINDS",
           "COMPRESS_MIN"]

SUMMARY_GROUP = "summary"
#: Bounds on what a reader takes from a /summary group (a real one holds tens of arrays and tens of kB of JSON).
MAX_ARRAYS = 4096
MAX_META_BYTES = 32 << 20
#: Array dtypes a summary may hold: numbers and booleans (strings travel in the JSON).
SUMMARY_KINDS = "biuf"
#: Arrays at least this long are compressed.
COMPRESS_MIN = 1024


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
#: analysis's map: ``distprof.source_summary``).
Summarizer = Callable[[bytes, Path], StoredSummary]


def read_summary(f: h5py.File, path: Path) -> StoredSummary | None:
    """The /summary group of an open shard; None when it has none. SummaryUnreadable when it cannot be used."""
    try:
        if not f.id.links.exists(SUMMARY_GROUP.encode()):
            return None
        _hard(f, SUMMARY_GROUP, path)
        g = f[SUMMARY_GROUP]
        if not isinstance(g, h5py.Group):
            raise SummaryUnreadable(f"{path}: /{SUMMARY_GROUP} is not a group")
        version, producer, meta = _attrs(g, path)
        keys = list(g.keys())
        if len(keys) > MAX_ARRAYS:
            raise SummaryUnreadable(f"{path}: /{SUMMARY_GROUP} holds {len(keys):,} arrays, more than {MAX_ARRAYS}")
        arrays = {k: _array(g, k, path) for k in keys}
        cpu = g.attrs.get("cpu_s", 0.0)
        return StoredSummary(version=version, producer=producer, meta=meta, arrays=arrays,
                             cpu_s=float(cpu) if isinstance(cpu, (float, np.floating)) else 0.0)
    except SummaryUnreadable:
        raise
    except H5_ERRORS as e:
        raise SummaryUnreadable(f"{path}: cannot read /{SUMMARY_GROUP} ({h5_message(e)})") from None


def _attrs(g: h5py.Group, path: Path) -> tuple[int, str, str]:
    for k in ("version", "producer", "meta"):
        if k not in g.attrs:
            raise SummaryUnreadable(f"{path}: /{SUMMARY_GROUP} has no attribute {k!r}")
    aid = h5py.h5a.open(g.id, b"meta")
    if aid.dtype.kind != "O" and aid.dtype.itemsize > MAX_META_BYTES:
        raise SummaryUnreadable(f"{path}: /{SUMMARY_GROUP} meta is over {MAX_META_BYTES >> 20} MiB")
    version, producer, meta = g.attrs["version"], g.attrs["producer"], g.attrs["meta"]
    if isinstance(meta, bytes):
        meta = meta.decode("utf-8", "replace")
    if isinstance(producer, bytes):
        producer = producer.decode("utf-8", "replace")
    if not isinstance(version, (int, np.integer)) or isinstance(version, (bool, np.bool_)):
        raise SummaryUnreadable(f"{path}: /{SUMMARY_GROUP} version is {version!r}, not an integer")
    if not isinstance(meta, str) or not isinstance(producer, str):
        raise SummaryUnreadable(f"{path}: /{SUMMARY_GROUP} meta and producer must be strings")
    if len(meta) > MAX_META_BYTES:
        raise SummaryUnreadable(f"{path}: /{SUMMARY_GROUP} meta is over {MAX_META_BYTES >> 20} MiB")
    return int(version), producer, meta


def _hard(g: h5py.Group, key: str, path: Path) -> None:
    """A link planted in the group (to another file, or elsewhere in this one) is refused, never followed."""
    if g.id.links.get_info(key.encode()).type != h5py.h5l.TYPE_HARD:
        raise SummaryUnreadable(f"{path}: {g.name.rstrip('/')}/{key} is a link, not data in the file")


def _array(g: h5py.Group, key: str, path: Path) -> np.ndarray:
    _hard(g, key, path)
    ds = g[key]
    if not isinstance(ds, h5py.Dataset):
        raise SummaryUnreadable(f"{path}: /{SUMMARY_GROUP}/{key} is not a dataset")
    if len(ds.shape) != 1 or ds.dtype.kind not in SUMMARY_KINDS:
        raise SummaryUnreadable(f"{path}: /{SUMMARY_GROUP}/{key} holds {ds.dtype} of shape {ds.shape}, not one "
                                "column of numbers")
    n = int(ds.shape[0])
    try:
        check_expansion(path, f"/{SUMMARY_GROUP}/{key}", n, [ds.id], row_bytes=ds.dtype.itemsize)
    except BadShardError as e:  # the array claims far more than the file stores
        raise SummaryUnreadable(f"{e.path}: {e.reason}") from None
    return ds[()] if n else np.zeros(0, ds.dtype)

