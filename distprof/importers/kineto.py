"""Read one Kineto chrome-trace JSON file (plain or .gz) into shard columns — streaming, exact to the nanosecond.

**Streaming.** The file is decompressed and parsed in slices of about :data:`READ_BYTES`: the top-level object up to
``"traceEvents": [`` (checked by parsing it with an empty list), then batches of whole events (a batch ends at a ``}``
followed by ``,`` or ``]``; a cut inside a string or a nested object makes the batch invalid JSON, so a batch that
parses is a correct cut), then the rest of the top-level object. Peak memory is one slice (its Python objects take ~20x its bytes) plus the numeric columns
(≈ 60 bytes per event), well below the size of the JSON.

**Exact timestamps.** ``ts``/``dur`` are µs: integers (older traces: absolute epoch µs) or decimals with three
fraction digits (ns resolution; relative to ``baseTimeNanoseconds`` when the trace has it, else absolute epoch µs).
A float64 cannot hold 1.7e15 µs to the ns (its spacing there is 0.25 µs), so before parsing, every
``"ts"``/``"dur"`` decimal literal is rewritten into a string of its digits (``"ts": 12.345`` → ``"ts_ns": "12345"``,
other fraction lengths → ``"ts_d": "1.5"``) and converted with integer arithmetic: no float is ever involved.
Numbers in exponent form (never written by Kineto) are read as floats and counted as possibly inexact.
"""

from __future__ import annotations

import gc
import gzip
import logging
import os
import re
from array import array
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any, BinaryIO, Iterator

import numpy as np
import orjson

from ..errors import DistprofError
from ..events import classify
from ..events.classify import CommArgs
from ..events.tables import Columns, Strings
from ..storage import schema

log = logging.getLogger(__name__)

__all__ = ["KinetoTrace", "read_kineto", "read_header", "TraceFormatError", "READ_BYTES"]

READ_BYTES = 1 << 17  # 128 KiB: parsed, a slice takes ~20x its size in Python objects
_MAX_TRIES = 4  # candidate cuts tried per slice before reading more

_TE_RE = re.compile(rb'"traceEvents"\s*:\s*\[')
_CUT_RE = re.compile(rb"\}[ \t\r\n]*[,\]]")
_TS3_RE = re.compile(rb'(?<!\\)"(ts|dur)"(\s*):(\s*)(-?\d+)\.(\d{3})(?![\d.eE])')
_TSD_RE = re.compile(rb'(?<!\\)"(ts|dur)"(\s*):(\s*)(-?\d+\.\d+)(?![\deE])')
_WS = b" \t\r\n,"
_DEVICE_KINDS = classify.DEVICE_KINDS
_K_KERNEL = schema.KIND_CODE["kernel"]
_K_INSTANT = schema.KIND_CODE["cpu_instant_event"]
_FLOAT_EXACT_LIMIT = 2.0 ** 43  # below it a 3-decimal µs value survives float64 (half spacing < 0.5 ns)


class TraceFormatError(DistprofError):
    """A trace file is not Kineto chrome-trace JSON distprof can read."""


def _open(path: Path) -> BinaryIO:
    with open(path, "rb") as fh:
        magic = fh.read(2)
    if magic == b"\x1f\x8b":
        return gzip.open(path, "rb")  # type: ignore[return-value]
    return open(path, "rb")


def _rewrite(b: bytes) -> bytes:
    b = _TS3_RE.sub(rb'"\1_ns"\2:\3"\4\5"', b)
    return _TSD_RE.sub(rb'"\1_d"\2:\3"\4"', b)


def _dec_ns(s: str) -> int:
    """'12.3456' µs -> ns, rounded half-even on the 4th decimal (exact integer arithmetic)."""
    return int((Decimal(s) * 1000).to_integral_value())


@dataclass
class _Reader:
    """Incremental splitter of the top-level object into header, event batches and trailer."""

    path: Path
    fh: BinaryIO
    buf: bytes = b""
    eof: bool = False
    raw_bytes: int = 0

    def more(self) -> bool:
        if self.eof:
            return False
        chunk = self.fh.read(READ_BYTES)
        if not chunk:
            self.eof = True
            return False
        self.raw_bytes += len(chunk)
        self.buf += chunk
        return True

    def header(self) -> dict[str, Any]:
        start = 0
        while True:
            m = _TE_RE.search(self.buf, start)
            if m is None:
                if not self.more():
                    raise TraceFormatError(f"{self.path}: no \"traceEvents\" list; not a Kineto/chrome trace "
                                           "(pass the .json or .json.gz files torch.profiler wrote)")
                start = max(0, len(self.buf) - READ_BYTES - 64)
                continue
            head = self.buf[: m.end() - 1]
            try:
                doc = orjson.loads(head + b"[]}")
            except orjson.JSONDecodeError:
                start = m.end()
                continue
            if not isinstance(doc, dict):
                start = m.end()
                continue
            self.buf = self.buf[m.end():]
            doc.pop("traceEvents", None)
            return doc

    def batches(self) -> Iterator[list]:
        while True:
            self.buf = self.buf.lstrip(_WS)
            while not self.buf and self.more():
                self.buf = self.buf.lstrip(_WS)
            if not self.buf:
                raise TraceFormatError(f"{self.path}: the file ends inside \"traceEvents\"; it is truncated "
                                       "(re-export the trace or re-copy the file)")
            if self.buf[:1] == b"]":
                self.buf = self.buf[1:]
                return
            cuts = [m.start() for m in _CUT_RE.finditer(self.buf)]
            done = False
            for c in reversed(cuts[-_MAX_TRIES:]):
                try:
                    evs = orjson.loads(b"[" + _rewrite(self.buf[: c + 1]) + b"]")
                except orjson.JSONDecodeError:
                    continue
                self.buf = self.buf[c + 1:]
                done = True
                yield evs
                break
            if not done and not self.more():
                raise TraceFormatError(f"{self.path}: invalid JSON in \"traceEvents\" near byte "
                                       f"{self.raw_bytes - len(self.buf)}; the file is damaged or truncated")

    def trailer(self) -> dict[str, Any]:
        while self.more():
            pass
        rest = self.buf.lstrip(_WS)
        try:
            doc = orjson.loads(b"{" + rest) if rest[:1] != b"}" else {}
        except orjson.JSONDecodeError as e:
            raise TraceFormatError(f"{self.path}: invalid JSON after \"traceEvents\" ({e})") from None
        self.buf = b""
        return doc if isinstance(doc, dict) else {}


def read_header(path: str | os.PathLike) -> dict[str, Any]:
    """Top-level keys before ``traceEvents`` (``distributedInfo``, ``deviceProperties``, …) without reading events."""
    path = Path(path)
    with _open(path) as fh:
        try:
            return _Reader(path, fh).header()
        except (OSError, EOFError) as e:
            raise TraceFormatError(f"{path}: cannot read ({e})") from None


@dataclass
class KinetoTrace:
    """One trace file as shard columns (times: int64 epoch ns on the trace's clock) plus its metadata."""

    path: Path
    meta: dict[str, Any]  # top-level keys except traceEvents
    strings: Strings
    columns: Columns
    thread_names: dict[int, str]  # OS tid -> name (thread_name metadata of the CPU process)
    main_tid: int | None
    n_events_raw: int
    raw_bytes: int
    n_inexact: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    stream_names: dict[tuple[int, int], str] = field(default_factory=dict)  # (device, stream) -> name

    @property
    def distributed_info(self) -> dict[str, Any]:
        d = self.meta.get("distributedInfo")
        return d if isinstance(d, dict) else {}


def _int(v: Any) -> int | None:
    if isinstance(v, int):
        return v
    if isinstance(v, str):
        try:
            return int(v, 0)
        except ValueError:
            return None
    return None


def read_kineto(path: str | os.PathLike) -> KinetoTrace:
    """Parse one Kineto trace into columns (see the module docstring). Raises TraceFormatError on bad input."""
    path = Path(path)
    gc_was = gc.isenabled()
    gc.disable()  # millions of small dicts, no cycles: the collector would only rescan them
    try:
        with _open(path) as fh:
            try:
                return _read(path, _Reader(path, fh))
            except (OSError, EOFError) as e:
                raise TraceFormatError(f"{path}: cannot read ({e}); is it a complete .json or .json.gz file?") \
                    from None
    finally:
        if gc_was:
            gc.enable()


def _read(path: Path, rd: _Reader) -> KinetoTrace:
    header = rd.header()
    strings = Strings()
    sid = strings.id
    kind_code = schema.KIND_CODE
    name_id, kind, tid, device = array("I"), array("B"), array("q"), array("h")
    ts, dur, flops, corr = array("q"), array("q"), array("q"), array("q")
    comm_meta: dict[int, CommArgs] = {}
    track_names: dict[tuple[int | None, int], str] = {}  # (pid, tid) -> thread_name metadata, first wins
    dev_pids: set[int] = set()  # pids of device rows (Kineto: pid = device index)
    role_cache: dict[tuple[str, int], int] = {}
    step_tids: dict[int, int] = {}
    skipped: dict[str, int] = {}
    n_raw = 0
    n_inexact = 0

    def t_ns(e: dict, key: str) -> int | None:
        nonlocal n_inexact
        v = e.get(key + "_ns")
        if v is not None:
            return int(v)
        v = e.get(key + "_d")
        if v is not None:
            return _dec_ns(v)
        v = e.get(key)
        if v.__class__ is int:
            return v * 1000
        if v.__class__ is float:
            if abs(v) >= _FLOAT_EXACT_LIMIT:
                n_inexact += 1
            return int(round(v * 1000))
        return None

    for batch in rd.batches():
        n_raw += len(batch)
        for e in batch:
            if e.__class__ is not dict:
                continue
            ph = e.get("ph")
            if ph == "X":
                k = kind_code.get(str(e.get("cat", "")).lower(), 0)
                if e.get("cat") == "Trace":
                    skipped["Trace"] = skipped.get("Trace", 0) + 1
                    continue
            elif ph == "M":
                if e.get("name") == "thread_name":
                    t = _int(e.get("tid"))
                    nm = (e.get("args") or {}).get("name")
                    if t is not None and isinstance(nm, str):
                        track_names.setdefault((_int(e.get("pid")), t), nm)
                continue
            elif ph in ("i", "I"):
                k = _K_INSTANT
            else:
                continue
            args = e.get("args") or {}
            if k in _DEVICE_KINDS:
                d = _int(args.get("device", e.get("pid")))
                t = _int(args.get("stream", e.get("tid")))
                p = _int(e.get("pid"))
                if p is not None:
                    dev_pids.add(p)
            else:
                d = -1
                t = _int(e.get("tid"))
            if t is None or d is None:
                skipped["no thread/stream id"] = skipped.get("no thread/stream id", 0) + 1
                continue
            t0 = t_ns(e, "ts")
            if t0 is None:
                skipped["no ts"] = skipped.get("no ts", 0) + 1
                continue
            name = e.get("name", "")
            if name.__class__ is not str:
                name = str(name)
            i = len(ts)
            name_id.append(sid(name))
            kind.append(k)
            tid.append(t)
            device.append(d)
            ts.append(t0)
            dur.append((t_ns(e, "dur") or 0) if ph == "X" else 0)
            f = args.get("flops")
            flops.append(f if f.__class__ is int else 0)
            c = args.get("correlation")
            corr.append(c if c.__class__ is int else 0)
            if name.startswith("ProfilerStep#") and d < 0:
                step_tids[t] = step_tids.get(t, 0) + 1
            rk = (name, k)
            role = role_cache.get(rk)
            if role is None:
                role = role_cache[rk] = classify.comm_role(name, k)
            if role:
                a = classify.comm_args(args)
                if a is not None:
                    comm_meta[i] = a
    trailer = rd.trailer()
    meta = {**header, **trailer}

    base = _int(meta.get("baseTimeNanoseconds")) or 0
    ts_arr = np.frombuffer(ts, dtype=np.int64).copy() if len(ts) else np.zeros(0, np.int64)
    if base:
        ts_arr += base
    cols = Columns(
        name_id=np.frombuffer(name_id, dtype=np.uint32).copy() if len(name_id) else np.zeros(0, np.uint32),
        kind=np.frombuffer(kind, dtype=np.uint8).copy() if len(kind) else np.zeros(0, np.uint8),
        tid=np.frombuffer(tid, dtype=np.int64).copy() if len(tid) else np.zeros(0, np.int64),
        device=np.frombuffer(device, dtype=np.int16).copy() if len(device) else np.zeros(0, np.int16),
        ts=ts_arr,
        dur=np.frombuffer(dur, dtype=np.int64).copy() if len(dur) else np.zeros(0, np.int64),
        flops=np.frombuffer(flops, dtype=np.int64).copy() if len(flops) else np.zeros(0, np.int64),
        corr=np.frombuffer(corr, dtype=np.int64).copy() if len(corr) else np.zeros(0, np.int64),
        comm_meta=comm_meta,
    )
    main_tid = max(step_tids, key=step_tids.get) if step_tids else _busiest_cpu_thread(cols)
    # names: a device pid's tracks are its streams (pid = device, tid = stream); every other pid's are OS threads
    thread_names: dict[int, str] = {}
    stream_names: dict[tuple[int, int], str] = {}
    for (p, t), nm in track_names.items():
        if p is not None and p in dev_pids:
            stream_names.setdefault((p, t), nm)
        else:
            thread_names.setdefault(t, nm)
    if n_inexact:
        log.warning("%s: %d timestamp(s) in exponent notation beyond 2^43 µs could not be read exactly "
                    "(may be off by < 1 µs)", path, n_inexact)
    return KinetoTrace(path=path, meta=meta, strings=strings, columns=cols, thread_names=thread_names,
                       stream_names=stream_names, main_tid=main_tid, n_events_raw=n_raw, raw_bytes=rd.raw_bytes, n_inexact=n_inexact,
                       skipped=skipped)


def _busiest_cpu_thread(cols: Columns) -> int | None:
    cpu = (cols.device < 0) & (cols.kind == schema.KIND_CODE["cpu_op"])
    if not np.any(cpu):
        return None
    vals, counts = np.unique(cols.tid[cpu], return_counts=True)
    return int(vals[np.argmax(counts)])
