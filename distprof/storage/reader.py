"""Read distprof shards without torch: lazily, only the columns asked for.

    shard = read_shard("run/rank00000.w0000.h5")
    shard.attrs["rank"], shard.names[shard.table("events", ["name_id"])["name_id"]]
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

from ..errors import ShardFormatError
from . import schema

_NAME_RE = re.compile(r"rank(\d+)\.w(\d+)\.h5$")


def _decode_attr(key: str, value: Any) -> Any:
    if isinstance(value, bytes):
        value = value.decode("utf-8")
    if isinstance(value, np.generic):
        value = value.item()
    if key in schema.JSON_ATTRS and isinstance(value, str):
        try:
            return json.loads(value) if value else None
        except json.JSONDecodeError as e:
            raise ShardFormatError(f"attribute {key!r} is not valid JSON ({e})") from None
    return value


def check_version(path: os.PathLike | str, version: str, fmt: str | None) -> None:
    """Refuse shards we cannot read, with one line naming the file, the field and the fix."""
    if fmt != schema.FORMAT_NAME:
        raise ShardFormatError(
            f"{path}: attribute 'format' is {fmt!r}, not {schema.FORMAT_NAME!r}: not a distprof shard "
            "(import Kineto JSON traces first)"
        )
    try:
        major = int(str(version).split(".")[0])
    except ValueError:
        raise ShardFormatError(f"{path}: attribute 'schema_version' is {version!r}, expected 'MAJOR.MINOR'") from None
    if major > schema.SCHEMA_MAJOR:
        raise ShardFormatError(
            f"{path}: schema_version {version} is newer than this distprof reads "
            f"({schema.SCHEMA_VERSION}); upgrade distprof (pip install -U distprof)"
        )


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
        """The string table, read now and not kept (a run's catalog holds every Shard: it must stay small)."""
        with self._open() as f:
            return _names(f)

    def _open(self) -> h5py.File:
        try:
            return h5py.File(self.path, "r")
        except OSError as e:
            raise ShardFormatError(f"{self.path}: cannot open ({e})") from None

    def memory_snapshot_path(self) -> Path | None:
        """The raw CUDA allocator snapshot beside this shard (``--memory-history``), or None when there is none."""
        mh = self.attrs.get("memory_history")
        name = mh.get("snapshot") if isinstance(mh, dict) else None
        return self.path.with_name(str(name)) if name else None

    def has(self, table: str) -> bool:
        with self._open() as f:
            return table in f

    def table(self, name: str, columns: Iterable[str] | None = None) -> dict[str, np.ndarray]:
        """Columns of table `name` (all known columns when `columns` is None)."""
        with self._open() as f:
            return self._table(f, name, columns)

    def tables(self, wanted: Mapping[str, Iterable[str] | None], *,
               names: bool = False) -> tuple[dict[str, dict[str, np.ndarray]], np.ndarray | None]:
        """Several tables (table -> columns, None = all) and, with `names`, the string table — the file opened once."""
        with self._open() as f:
            out = {t: self._table(f, t, cols) for t, cols in wanted.items()}
            return out, (_names(f) if names else None)

    def _table(self, f: h5py.File, name: str, columns: Iterable[str] | None) -> dict[str, np.ndarray]:
        known = schema.TABLES.get(name)
        if known is None:
            raise KeyError(f"unknown table {name!r}; known: {', '.join(schema.TABLES)}")
        cols = list(known) if columns is None else list(columns)
        out: dict[str, np.ndarray] = {}
        grp = f.get(name)
        for col in cols:
            if grp is None or col not in grp:
                if col not in known:
                    raise KeyError(f"{self.path}: table {name!r} has no column {col!r}")
                n = _table_len(grp)
                out[col] = np.full(n, schema.MISSING_DEFAULTS.get((name, col), 0), dtype=known[col])
                continue
            try:
                out[col] = grp[col][()]
            except OSError as e:
                raise ShardFormatError(f"{self.path}: cannot read {name}/{col} ({e})") from None
        return out


def _names(f: h5py.File) -> np.ndarray:
    raw = f["strings/names"]
    if h5py.check_string_dtype(raw.dtype) is not None:
        return np.asarray(raw.asstr()[()], dtype=object)
    return np.array([s.decode("utf-8") if isinstance(s, bytes) else s for s in raw[()]], dtype=object)


def _table_len(grp: h5py.Group | None) -> int:
    if grp is None:
        return 0
    for key in grp:
        return int(grp[key].shape[0])
    return 0


def read_shard(path: os.PathLike | str) -> Shard:
    """Open a shard, check its format and version, and read its attributes."""
    path = Path(path)
    if not path.exists():
        raise ShardFormatError(f"{path}: no such shard file")
    try:
        with h5py.File(path, "r") as f:
            raw = dict(f.attrs)
    except OSError as e:
        raise ShardFormatError(f"{path}: not a readable HDF5 file ({e}); delete it or re-run the capture") from None
    attrs = {k: _decode_attr(k, v) for k, v in raw.items()}
    check_version(path, attrs.get("schema_version", "?"), attrs.get("format"))
    missing = [k for k in schema.REQUIRED_ATTRS if k not in attrs]
    if missing:
        raise ShardFormatError(f"{path}: missing attribute(s) {', '.join(missing)}; the shard is damaged")
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


def read_status(run_dir: os.PathLike | str) -> dict[int, dict]:
    """Per-rank status files (written at close): rank -> status dict."""
    out = {}
    for p in Path(run_dir).glob("rank*.status.json"):
        try:
            doc = json.loads(p.read_text())
            out[int(doc["rank"])] = doc
        except (OSError, ValueError, KeyError):
            continue
    return out
