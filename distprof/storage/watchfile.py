"""The watch series on disk (``--watch``): a few numbers per step per rank, in RUN_DIR/watch/ (no torch here).

    watch/rank00003.s00012.npy   rank 3, steps 12*SEGMENT_STEPS .. 13*SEGMENT_STEPS-1 (a NumPy .npy record array)
    watch/drifts.json            rank 0: each drift that asked for a window, why, and what the trigger answered

A rank's side thread rewrites its current segment every few seconds (temporary file + rename, so a reader or a crash
sees the previous flush or this one, never half of one); once its steps are past a segment it is written one last
time and left alone. Each file holds at most SEGMENT_STEPS rows, so rewriting is bounded and a reader holds one
segment of one rank at a time.

Rows (:data:`SERIES_DTYPE`), times on the rank's own clock:
  step      global step (the profiler's numbering: the shards' steps)
  end_ns    time.time_ns() when the step ended
  step_ms   wall time of the step, boundary to boundary
  data_ms   time in DataLoader ``__next__`` during the step
  opt_ms    time in the (outermost) optimizer step
  comm_ms   time the training thread waited at synchronisation points: ``Work.wait`` of collectives and
            point-to-point calls, the functional collectives' ``wait_tensor``, the end of backward (DDP's reducer)
  mem_peak  device memory peak during the step in bytes (-1: no GPU)
  dev_comm_ms  device time of the NCCL collectives the step issued (their active duration: transfers and waiting
            for peers, on the device); NaN where not measured (gloo, no GPU). Version 2 of the rows: a version-1
            file (without it) still reads, as NaN.
"""

from __future__ import annotations

import io
import os
import re
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import DistprofError
from . import safefs

WATCH_DIR = "watch"
SEGMENT_STEPS = 4096
SEGMENT_TEMPLATE = "rank{rank:05d}.s{segment:05d}.npy"
DRIFTS_NAME = "drifts.json"
DRIFTS_FORMAT = "distprof-watch-drifts"
DRIFTS_VERSION = 1
SERIES_DTYPE_V1 = np.dtype([("step", "<i8"), ("end_ns", "<i8"), ("step_ms", "<f4"), ("data_ms", "<f4"),
                            ("opt_ms", "<f4"), ("comm_ms", "<f4"), ("mem_peak", "<i8")])
SERIES_DTYPE = np.dtype(SERIES_DTYPE_V1.descr + [("dev_comm_ms", "<f4")])
#: The rows every version wrote, by version (a file's dtype says which it is).
SERIES_VERSIONS = {1: SERIES_DTYPE_V1, 2: SERIES_DTYPE}
#: A segment file is never larger than this (header + SEGMENT_STEPS rows); a bigger one is refused unread.
MAX_SEGMENT_BYTES = 4096 + SEGMENT_STEPS * SERIES_DTYPE.itemsize
#: drifts.json is never read past this size.
MAX_DRIFTS_BYTES = 4 * 1024 * 1024
_SEGMENT_RE = re.compile(r"^rank(\d{5,})\.s(\d{5,})\.npy$")


class WatchFileError(DistprofError):
    """A watch file that cannot be used (one line: the file, what is wrong, what to do)."""


def segment_of(step: int) -> int:
    return step // SEGMENT_STEPS


def segment_path(run_dir: Path, rank: int, segment: int) -> Path:
    return Path(run_dir) / WATCH_DIR / SEGMENT_TEMPLATE.format(rank=rank, segment=segment)


def write_segment(path: Path, rows: np.ndarray) -> None:
    """`rows` (SERIES_DTYPE, at most SEGMENT_STEPS) to `path`, atomically, never through a link (storage.safefs).
    Raises OSError."""
    assert rows.dtype == SERIES_DTYPE and rows.size <= SEGMENT_STEPS
    buf = io.BytesIO()
    np.lib.format.write_array(buf, np.ascontiguousarray(rows), allow_pickle=False)
    path = Path(path)
    safefs.write_file(path.parent, path.name, buf.getbuffer())


def ensure_watch_dir(run_dir: Path) -> Path:
    """RUN_DIR/watch, created when missing; OSError (safefs.FileRefused) when it is a link or not a directory."""
    d = Path(run_dir) / WATCH_DIR
    try:
        os.mkdir(d, 0o755)
    except FileExistsError:
        pass
    os.close(safefs.open_dir(d))  # a link planted at RUN_DIR/watch is refused here, and by every write after
    return d


def list_segments(run_dir: Path) -> dict[int, list[tuple[int, Path]]]:
    """rank -> [(segment, path)] in segment order, from the file names of RUN_DIR/watch/ (nothing read)."""
    d = Path(run_dir) / WATCH_DIR
    out: dict[int, list[tuple[int, Path]]] = {}
    if not d.is_dir():
        return out
    for p in d.iterdir():
        m = _SEGMENT_RE.match(p.name)
        if m:  # whatever it is: a reader names what is not a regular file and skips it
            out.setdefault(int(m.group(1)), []).append((int(m.group(2)), p))
    for v in out.values():
        v.sort()
    return dict(sorted(out.items()))


def read_segment(path: Path) -> np.ndarray:
    """One segment, checked before anything is allocated: a regular file (never a FIFO: opened non-blocking), size,
    header, dtype, row count against the file size."""
    path = Path(path)
    try:
        raw = safefs.read_file(path, MAX_SEGMENT_BYTES, what="watch segment")
    except safefs.FileRefused as e:
        raise WatchFileError(f"{e}") from None
    except OSError as e:
        raise WatchFileError(f"{path}: cannot read ({e.strerror or e})") from None
    fh = io.BytesIO(raw)
    try:
        version = np.lib.format.read_magic(fh)
        if version != (1, 0):
            raise ValueError(f"npy version {version}")
        shape, fortran, dtype = np.lib.format.read_array_header_1_0(fh)
    except (ValueError, TypeError, SyntaxError, OverflowError, MemoryError) as e:
        raise WatchFileError(f"{path}: not a watch segment ({_short(e)}); remove it") from None
    if dtype not in SERIES_VERSIONS.values() or fortran or len(shape) != 1 or not 0 <= shape[0] <= SEGMENT_STEPS:
        raise WatchFileError(f"{path}: field 'dtype/shape' is {dtype}/{shape}, not distprof's watch rows "
                             f"(at most {SEGMENT_STEPS}); written by another version? remove it")
    data = raw[fh.tell():]
    if len(data) != shape[0] * dtype.itemsize:
        raise WatchFileError(f"{path}: {len(data)} bytes of rows, the header says {shape[0]} rows; a damaged "
                             "file (remove it)")
    rows = _current(np.frombuffer(data, dtype=dtype))
    if rows.size and (np.any(np.diff(rows["step"]) <= 0) or rows["step"][0] < 0):
        raise WatchFileError(f"{path}: field 'step' is not increasing; a damaged file (remove it)")
    return rows


def _current(rows: np.ndarray) -> np.ndarray:
    """Rows of an earlier version as the current rows (a column it lacks: NaN, not measured)."""
    if rows.dtype == SERIES_DTYPE:
        return rows
    out = np.zeros(rows.size, SERIES_DTYPE)
    out["dev_comm_ms"] = np.nan
    for name in rows.dtype.names:
        out[name] = rows[name]
    return out


def _short(e: BaseException) -> str:
    text = str(e)
    return text if len(text) <= 80 else text[:77] + "..."


def read_rank_series(run_dir: Path, rank: int, segments: list[tuple[int, Path]] | None = None) -> np.ndarray:
    """Every row of one rank (bounded: a few numbers per step), in step order."""
    segs = list_segments(run_dir).get(rank, []) if segments is None else segments
    parts = [read_segment(p) for _, p in segs]
    return np.concatenate(parts) if parts else np.zeros(0, SERIES_DTYPE)


def write_drifts(run_dir: Path, drifts: list[dict[str, Any]]) -> None:
    """Rank 0's drift records to RUN_DIR/watch/drifts.json, atomically, never through a link. Raises OSError."""
    import json

    doc = {"format": DRIFTS_FORMAT, "version": DRIFTS_VERSION, "drifts": drifts}
    safefs.write_file(Path(run_dir) / WATCH_DIR, DRIFTS_NAME, json.dumps(doc, indent=1).encode())


def read_drifts(run_dir: Path) -> list[dict[str, Any]]:
    """Rank 0's drift records ([] when there is no file); one-line error for a bad one (a FIFO, a link, too large,
    not JSON)."""
    path = Path(run_dir) / WATCH_DIR / DRIFTS_NAME
    try:
        doc = safefs.read_json(path, MAX_DRIFTS_BYTES, what="drifts file")
    except FileNotFoundError:
        return []
    except safefs.FileRefused as e:
        raise WatchFileError(f"{e}; remove it") from None
    except OSError as e:
        raise WatchFileError(f"{path}: cannot read ({e.strerror or e}); remove it") from None
    if not isinstance(doc, dict) or doc.get("format") != DRIFTS_FORMAT:
        raise WatchFileError(f"{path}: field 'format' is not {DRIFTS_FORMAT!r}; remove it")
    if not isinstance(doc.get("version"), int) or doc["version"] > DRIFTS_VERSION:
        raise WatchFileError(f"{path}: field 'version' is {doc.get('version')!r}, newer than this distprof's "
                             f"{DRIFTS_VERSION}; upgrade distprof")
    drifts = doc.get("drifts")
    if not isinstance(drifts, list) or not all(isinstance(d, dict) for d in drifts):
        raise WatchFileError(f"{path}: field 'drifts' is not a list of objects; remove it")
    return drifts
