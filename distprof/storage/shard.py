"""One shard read lazily: its attributes (given when it is opened), its tables and string table on demand.

    shard.attrs["rank"], shard.names[shard.table("events", ["name_id"])["name_id"]]

``reader.read_shard`` and ``validate.check_shard`` open shards and check them; this module reads (and checks the
layout of a shard whose scan left it, before its first table: ``layout_checked``).
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Iterable, Mapping

import h5py
import numpy as np

from ..errors import BadShardError
from . import schema
from .h5file import H5_ERRORS, check_expansion, h5_message, open_h5, read_column, read_records
from .layout import FIX, check_layout
from .summary_group import StoredSummary, read_summary

__all__ = ["Shard", "ImageShard"]


@dataclass
class Shard:
    """One rank's window: attributes eagerly, tables on demand."""

    path: Path
    attrs: dict[str, Any]
    _names: np.ndarray | None = field(default=None, repr=False)
    #: False while the layout is unchecked (``validate.check_shard(defer_layout=True)`` on a shard that stores its
    #: summary): it is checked before the first table is read.
    layout_checked: bool = True

    @property
    def rank(self) -> int:
        return int(self.attrs["rank"])

    @property
    def window(self) -> int:
        return int(self.attrs["window"])

    @cached_property
    def names(self) -> np.ndarray:
        """The string table (object array): names[name_id]; kept on the object once read (see read_names)."""
        return self.read_names()

    def read_names(self) -> np.ndarray:
        """The string table, read now and not kept (a run's catalog holds every Shard: it must stay small).
        Invalid UTF-8 reads as U+FFFD."""
        with self._open_tables() as f:
            try:
                return _names(f, self.path)
            except H5_ERRORS as e:
                raise BadShardError(self.path, f"cannot read /strings/names ({h5_message(e)})") from None

    def _open(self) -> h5py.File:
        return open_h5(self.path)

    def _open_tables(self) -> h5py.File:
        """The file opened to read tables: its layout checked first when the scan left it (BadShardError)."""
        f = self._open()
        if self.layout_checked:
            return f
        try:
            check_layout(self.path, f)
        except BadShardError:
            f.close()
            raise
        except H5_ERRORS as e:
            f.close()
            raise BadShardError(self.path, f"damaged HDF5 data ({h5_message(e)}); {FIX}") from None
        self.layout_checked = True
        return f

    def memory_snapshot_path(self) -> Path | None:
        """The raw CUDA allocator snapshot beside this shard (``--memory-history``), or None when there is none."""
        mh = self.attrs.get("memory_history")
        name = mh.get("snapshot") if isinstance(mh, dict) else None
        return self.path.with_name(str(name)) if name else None

    def stored_summary(self) -> StoredSummary | None:
        """The per-rank summary written with the shard (``summary_group``); None when it has none.
        SummaryUnreadable when it cannot be used."""
        with self._open() as f:
            return read_summary(f, self.path)

    def has(self, table: str) -> bool:
        with self._open_tables() as f:
            try:
                return table in f
            except H5_ERRORS as e:
                raise BadShardError(self.path, f"cannot read /{table} ({h5_message(e)})") from None

    def table(self, name: str, columns: Iterable[str] | None = None) -> dict[str, np.ndarray]:
        """Columns of table `name` (all known columns when `columns` is None), in the schema's dtypes."""
        with self._open_tables() as f:
            return self._table(f, name, columns)

    def tables(self, wanted: Mapping[str, Iterable[str] | None], *,
               names: bool = False) -> tuple[dict[str, dict[str, np.ndarray]], np.ndarray | None]:
        """Several tables (table -> columns, None = all) and, with `names`, the string table — the file opened once."""
        with self._open_tables() as f:
            out = {t: self._table(f, t, cols) for t, cols in wanted.items()}
            if not names:
                return out, None
            try:
                return out, _names(f, self.path)
            except H5_ERRORS as e:
                raise BadShardError(self.path, f"cannot read /strings/names ({h5_message(e)})") from None

    def _table(self, f: h5py.File, name: str, columns: Iterable[str] | None) -> dict[str, np.ndarray]:
        known = schema.TABLES.get(name)
        if known is None:
            raise KeyError(f"unknown table {name!r}; known: {', '.join(schema.TABLES)}")
        cols = list(known) if columns is None else list(columns)
        out: dict[str, np.ndarray] = {}
        unknown = [c for c in cols if c not in known]
        if unknown:
            raise KeyError(f"{self.path}: table {name!r} has no column {unknown[0]!r}")
        try:
            obj = f.get(name)
            if isinstance(obj, h5py.Dataset):
                return _record_columns(self.path, name, obj, cols)
            n = _table_len(obj)
            if obj is not None:  # the table's size as read, against what the file stores, before any read
                check_expansion(self.path, f"/{name}", n, lambda: [obj[c].id for c in known if c in obj],
                                row_bytes=sum(dt.itemsize for dt in known.values()))
            for col in cols:
                if obj is None or col not in obj:
                    out[col] = _missing(name, col, n)
                    continue
                out[col] = read_column(obj[col], known[col])
        except BadShardError:
            raise
        except H5_ERRORS as e:
            raise BadShardError(self.path, f"cannot read /{name} ({h5_message(e)}); the shard is damaged") \
                from None
        return out


@dataclass
class ImageShard(Shard):
    """A shard still in memory (``writer.shard_image``'s bytes, not yet stored at `path`): read as a file is."""

    image: bytes = field(default=b"", repr=False)

    def _open(self) -> h5py.File:
        return h5py.File(io.BytesIO(self.image), "r")


def _names(f: h5py.File, path: Path) -> np.ndarray:
    raw = f["strings/names"]
    check_expansion(path, "/strings/names", int(raw.shape[0]), [raw.id], row_bytes=16)
    if h5py.check_string_dtype(raw.dtype) is not None:
        return np.asarray(raw.asstr(errors="replace")[()], dtype=object)
    return np.array([s.decode("utf-8", "replace") if isinstance(s, bytes) else str(s) for s in raw[()]], dtype=object)


def _missing(table: str, col: str, n: int) -> np.ndarray:
    """Column `col` that a shard's `table` lacks (an older minor version): its default, `n` rows."""
    return np.full(n, schema.MISSING_DEFAULTS.get((table, col), 0), dtype=schema.TABLES[table][col])


def _record_columns(path: Path, name: str, ds: h5py.Dataset, cols: list[str]) -> dict[str, np.ndarray]:
    """Columns `cols` of a 2.x table (one compound dataset): HDF5 reads the wanted fields, converted to the schema's
    dtypes, in one pass (``read_records``); each becomes a contiguous array."""
    known = schema.TABLES[name]
    n = int(ds.shape[0])
    check_expansion(path, f"/{name}", n, [ds.id], row_bytes=ds.dtype.itemsize)
    present = [c for c in dict.fromkeys(cols) if c in (ds.dtype.names or ())]
    rec = read_records(ds, np.dtype([(c, known[c]) for c in present])) if present else None
    return {c: np.ascontiguousarray(rec[c]) if c in present else _missing(name, c, n) for c in cols}


def _table_len(grp: h5py.Group | None) -> int:
    if grp is None:
        return 0
    for key in grp:
        return int(grp[key].shape[0])
    return 0
