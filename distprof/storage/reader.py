"""Read distprof shards without torch: lazily, only the columns asked for.

    shard = read_shard("run/rank00000.w0000.h5")       # attributes checked (types, ranges, JSON shapes)
    shard = check_shard("run/rank00000.w0000.h5")      # (storage.validate) and its layout and ids too
    shard.attrs["rank"], shard.names[shard.table("events", ["name_id"])["name_id"]]

Every problem with a file is a BadShardError (a ShardFormatError) naming the file: never a traceback.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import hdf5plugin  # noqa: F401  -- registers the Zstd filter; every reader must import it

from . import safefs, schema
from .h5file import open_h5
from .shard import Shard
from .validate import MAX_WORLD_SIZE, check_attrs, read_attrs

_NAME_RE = re.compile(r"rank(\d+)\.w(\d+)\.h5$")


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


def read_status(run_dir: os.PathLike | str, problems: list[str] | None = None) -> dict[int, dict]:
    """Per-rank status files (written at close): rank -> status dict. A file that is not a regular file (a FIFO, a
    link: never followed, never waited on), larger than MAX_STATUS_BYTES, not JSON, or not a JSON object with an
    integer ``rank`` is skipped (named in `problems` when given); ``errors`` and ``lost`` are always lists."""
    out = {}
    for p in sorted(Path(run_dir).glob("rank*.status.json")):
        try:
            doc = safefs.read_json(p, MAX_STATUS_BYTES, what="status file")
        except FileNotFoundError:
            continue
        except OSError as e:  # FileRefused: not a regular file, too large, not JSON
            if problems is not None:
                problems.append(f"skipped {e}" if isinstance(e, safefs.FileRefused) else
                                f"skipped {p}: cannot read ({e.strerror or e})")
            continue
        rank = doc.get("rank") if isinstance(doc, dict) else None
        if rank.__class__ is not int or not 0 <= rank < MAX_WORLD_SIZE:
            if problems is not None:
                problems.append(f"skipped {p}: not a distprof status file (no integer 'rank')")
            continue
        for key in ("errors", "lost"):
            if not isinstance(doc.get(key), list):
                doc[key] = []
        out[rank] = doc
    return out
