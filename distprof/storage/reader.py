"""Read distprof shards without torch: lazily, only the columns asked for.

    shard = read_shard("run/rank00000.w0000.h5")       # attributes checked (types, ranges, JSON shapes)
    shard = check_shard("run/rank00000.w0000.h5")      # (storage.validate) and its layout and ids too
    shard.attrs["rank"], shard.names[shard.table("events", ["name_id"])["name_id"]]

Every problem with a file is a BadShardError (a ShardFormatError) naming the file: never a traceback.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Iterable, Mapping

import h5py
import hdf5plugin  # noqa: F401  -- registers the Zstd filter; every reader must import it
import numpy as np

from ..errors import BadShardError
from . import schema
from .validate import H5_ERRORS, MAX_WORLD_SIZE, check_attrs, h5_message, open_h5, read_attrs

_NAME_RE = re.compile(r"rank(\d+)\.w(\d+)\.h5$")


@dataclass
class Shard:
    """One rank's window: attributes eagerly, tables on demand."""

    path: Path
    attrs: dict[str, Any]
    _names: np.ndarray | None = field(default=None, repr=False)

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
        with self._open() as f:
            try:
                return _names(f)
            except H5_ERRORS as e:
                raise BadShardError(self.path, f"cannot read /strings/names ({h5_message(e)})") from None

    def _open(self) -> h5py.File:
        return open_h5(self.path)

    def memory_snapshot_path(self) -> Path | None:
        """The raw CUDA allocator snapshot beside this shard (``--memory-history``), or None when there is none."""
        mh = self.attrs.get("memory_history")
        name = mh.get("snapshot") if isinstance(mh, dict) else None
        return self.path.with_name(str(name)) if name else None

    def has(self, table: str) -> bool:
        with self._open() as f:
            try:
                return table in f
            except H5_ERRORS as e:
                raise BadShardError(self.path, f"cannot read /{table} ({h5_message(e)})") from None

    def table(self, name: str, columns: Iterable[str] | None = None) -> dict[str, np.ndarray]:
        """Columns of table `name` (all known columns when `columns` is None), in the schema's dtypes."""
        with self._open() as f:
            return self._table(f, name, columns)

    def tables(self, wanted: Mapping[str, Iterable[str] | None], *,
               names: bool = False) -> tuple[dict[str, dict[str, np.ndarray]], np.ndarray | None]:
        """Several tables (table -> columns, None = all) and, with `names`, the string table — the file opened once."""
        with self._open() as f:
            out = {t: self._table(f, t, cols) for t, cols in wanted.items()}
            if not names:
                return out, None
            try:
                return out, _names(f)
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
            grp = f.get(name)
            for col in cols:
                if grp is None or col not in grp:
                    n = _table_len(grp)
                    out[col] = np.full(n, schema.MISSING_DEFAULTS.get((name, col), 0), dtype=known[col])
                    continue
                out[col] = np.asarray(grp[col][()]).astype(known[col], copy=False)
        except H5_ERRORS as e:
            raise BadShardError(self.path, f"cannot read /{name} ({h5_message(e)}); the shard is damaged") \
                from None
        return out


def _names(f: h5py.File) -> np.ndarray:
    raw = f["strings/names"]
    if h5py.check_string_dtype(raw.dtype) is not None:
        return np.asarray(raw.asstr(errors="replace")[()], dtype=object)
    return np.array([s.decode("utf-8", "replace") if isinstance(s, bytes) else str(s) for s in raw[()]], dtype=object)


def _table_len(grp: h5py.Group | None) -> int:
    if grp is None:
        return 0
    for key in grp:
        return int(grp[key].shape[0])
    return 0


def read_shard(path: os.PathLike | str) -> Shard:
    """Open a shard and read its attributes, checked (format, version, types, ranges; storage.validate.check_attrs).

    Tables are not looked at: ``storage.validate.check_shard`` checks them too (what ``load_run`` uses).
    """
    path = Path(path)
    with open_h5(path) as f:
        attrs = read_attrs(path, f)
    check_attrs(path, attrs)
    return Shard(path=path, attrs=attrs)


def find_shards(run_dir: os.PathLike | str) -> list[Path]:
    """Shard files of a run, sorted by (rank, window). Temporary files are ignored."""
    run_dir = Path(run_dir)
    found = []
    for p in run_dir.glob(schema.SHARD_GLOB):
        m = _NAME_RE.search(p.name)
        if m:
            found.append((int(m.group(1)), int(m.group(2)), p))
    return [p for _, _, p in sorted(found)]


#: Status files larger than this are not read (a capture writes a few kB).
MAX_STATUS_BYTES = 16 << 20


def read_status(run_dir: os.PathLike | str) -> dict[int, dict]:
    """Per-rank status files (written at close): rank -> status dict. A file that is not a JSON object with an
    integer ``rank`` is ignored; ``errors`` is always a list."""
    out = {}
    for p in Path(run_dir).glob("rank*.status.json"):
        try:
            if p.stat().st_size > MAX_STATUS_BYTES:
                continue
            doc = json.loads(p.read_bytes())
        except (OSError, ValueError, RecursionError):
            continue
        rank = doc.get("rank") if isinstance(doc, dict) else None
        if rank.__class__ is not int or not 0 <= rank < MAX_WORLD_SIZE:
            continue
        if not isinstance(doc.get("errors"), list):
            doc["errors"] = []
        out[rank] = doc
    return out
