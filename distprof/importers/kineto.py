"""Read one Kineto chrome-trace JSON file (plain or .gz) into shard columns — streaming, exact to the nanosecond.

**Streaming.** The file is decompressed and parsed in slices of about :data:`READ_BYTES`: the top-level object up to
``"traceEvents": [`` (checked by parsing it with an empty list), then batches of whole events (a batch ends at a ``}``
followed by ``,`` or ``]``; a cut inside a string or a nested object makes the batch invalid JSON, so a batch that
parses is a correct cut), then the rest of the top-level object. Peak memory is one slice (its Python objects take ~20x its bytes) plus the numeric columns
(≈ 60 bytes per event), well below the size of the JSON.

**Exact timestamps.** ``ts``/``dur`` are µs: integers (older traces: absolute epoch µs) or decimals with three
fraction digits (ns resolution; relative to ``baseTimeNanoseconds`` when the trace has it, else absolute epoch µs).
A float64 cannot hold 1.7e15 µs to the ns (its spacing there is 0.25 µs), so before parsing, every
``"ts"``/``"dur"`` decimal literal is rewritten textually: three fraction digits (Kineto's form) by shifting the decimal
point, ``"ts": 12.345`` → ``"ts_ns":12345``, an integer orjson returns as int (one ``re.split`` and a join per batch,
no Python code per value); other fraction lengths into a string, ``"ts_d": "1.5"``, converted with integer arithmetic.
No float is ever involved. The columns come out sorted by ts (in place), which build_tables takes without a copy.
Numbers in exponent form (never written by Kineto) are read as floats and counted as possibly inexact.
"""

from __future__ import annotations

import dataclasses
import gc
import gzip
import json
import math
import os
import re
import zlib
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
from ..storage.validate import MAX_NS, MAX_WORLD_SIZE

__all__ = ["KinetoTrace", "read_kineto", "read_header", "TraceFormatError", "READ_BYTES"]

READ_BYTES = 1 << 17  # 128 KiB: parsed, a slice takes ~20x its size in Python objects
#: Most JSON held unparsed at once: the part before "traceEvents", one event, the part after the list (a Kineto trace
#: needs a few kB; a file that needs more is refused instead of read into memory whole).
MAX_PENDING_BYTES = 64 << 20
_MAX_TRIES = 4  # candidate cuts tried per slice before reading more

_TE_RE = re.compile(rb'"traceEvents"\s*:\s*\[')
_CUT_RE = re.compile(rb"\}[ \t\r\n]*[,\]]")
# Pass 1 (Kineto's own form, 3 fraction digits): the decimal point is shifted textually, "ts": 12.345 -> "ts_ns":12345,
# an integer ns literal orjson returns as int. A zero integer part drops the fraction's leading zeros (JSON forbids
# them): 0.045 -> 45, -0.000 -> -0. The opening quote is matched without a look-behind for a backslash: in valid JSON
# a `"ts"` whose closing quote is unescaped is a key (inside a string both quotes would be escaped), so no string value
# can be touched; a "ts" inside args is rewritten like any other (the importer reads none).
_TS3_RE = re.compile(rb'("ts|"dur)"[ \t\r\n]*:[ \t\r\n]*'
                     rb'(?:(-?[1-9][0-9]*)\.([0-9]{3})|(-?)0\.(?:00([0-9])|0([1-9][0-9])|([0-9]{3})))(?![0-9.eE])')
_TS3_GROUPS = 7
_NS_KEY = b'_ns":'
# Pass 2 (only where pass 1 left a "ts"/"dur" key): any other decimal -> a string of it, converted exactly (Decimal)
_TSD_RE = re.compile(rb'("ts|"dur)"([ \t\r\n]*):([ \t\r\n]*)(-?[0-9]+\.[0-9]+)(?![0-9eE])')
_WS = b" \t\r\n,"
_DEVICE_KINDS = classify.DEVICE_KINDS
_K_KERNEL = schema.KIND_CODE["kernel"]
_K_INSTANT = schema.KIND_CODE["cpu_instant_event"]
_K_TRACE = -1  # cat "Trace": the profiler's own span, skipped
_FLOAT_EXACT_LIMIT = 2.0 ** 43  # below it a 3-decimal µs value survives float64 (half spacing < 0.5 ns)
# Times and durations (ns) must lie in 0 <= t < MAX_NS = 2^62 (year 2116), as storage.validate requires of a shard.
_I64 = (-(1 << 63), (1 << 63) - 1)
_MAX_DEVICE = (1 << 15) - 1  # the shard's device column is int16
_MAX_STEP = (1 << 31) - 1  # the shard's step column is int32
#: Errors reading a file can raise: the OS, a corrupt or truncated gzip stream.
_READ_ERRORS = (OSError, EOFError, zlib.error)


class TraceFormatError(DistprofError):
    """A trace file is not Kineto chrome-trace JSON distprof can read."""


def _open(path: Path) -> BinaryIO:
    with open(path, "rb") as fh:
        magic = fh.read(2)
    if magic == b"\x1f\x8b":
        return gzip.open(path, "rb")  # type: ignore[return-value]
    return open(path, "rb")


def _rewrite(b: bytes) -> bytes:
    """Rewrite the ``ts``/``dur`` decimals of a batch's text so orjson reads them without float (module docstring).

    Pass 1 runs as one ``re.split`` plus list slicing and a join — no Python code per match: the split gives the text
    between matches and the 7 groups of each match; a constant (``_ns":``) goes after each key group, the groups that
    did not take part (None) are filtered out.
    """
    parts = _TS3_RE.split(b)
    g = _TS3_GROUPS
    n = (len(parts) - 1) // (g + 1)
    if n:
        out = [_NS_KEY] * (1 + (g + 2) * n)
        out[0::g + 2] = parts[0::g + 1]  # the text before each match, and after the last
        out[1::g + 2] = parts[1::g + 1]  # '"ts' / '"dur'; out[2::g + 2] stays '_ns":'
        for j in range(2, g + 1):
            out[j + 1::g + 2] = parts[j::g + 1]  # the number's pieces (None where their alternative did not match)
        b = b"".join(filter(None, out))
    if b'"ts"' in b or b'"dur"' in b:  # integers (µs, read as they are), other decimals, exponents
        b = _TSD_RE.sub(rb'\1_d"\2:\3"\4"', b)
    return b


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
        if len(self.buf) > MAX_PENDING_BYTES:
            raise TraceFormatError(f"{self.path}: over {MAX_PENDING_BYTES >> 20} MB of JSON without the end of an "
                                   "event (or of the part before \"traceEvents\"); not a Kineto trace distprof reads")
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
            done = False
            for c in _last_cuts(self.buf, _MAX_TRIES):
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


def _last_cuts(buf: bytes, n: int) -> list[int]:
    """Offsets of the last `n` candidate cuts (a ``}`` followed by ``,`` or ``]``), last first; found from the end."""
    out: list[int] = []
    end = len(buf)
    match = _CUT_RE.match
    while len(out) < n:
        j = buf.rfind(b"}", 0, end)
        if j < 0:
            break
        if match(buf, j) is not None:
            out.append(j)
        end = j
    return out


def read_header(path: str | os.PathLike) -> dict[str, Any]:
    """Top-level keys before ``traceEvents`` (``distributedInfo``, ``deviceProperties``, …) without reading events."""
    path = Path(path)
    try:
        with _open(path) as fh:
            return _Reader(path, fh).header()
    except _READ_ERRORS as e:
        raise TraceFormatError(f"{path}: cannot read ({_read_error(e)}); is it a complete .json or .json.gz file?") \
            from None


def _read_error(e: BaseException) -> str:
    if isinstance(e, zlib.error) or isinstance(e, gzip.BadGzipFile):
        return f"corrupt gzip data: {e}"
    if isinstance(e, EOFError):
        return "the gzip stream ends early: truncated"
    return e.strerror or str(e) if isinstance(e, OSError) else str(e)


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
    skipped: dict[str, int] = field(default_factory=dict)  # why -> events left out (malformed)
    ignored: dict[str, int] = field(default_factory=dict)  # why -> values ignored (out of range), their events kept
    stream_names: dict[tuple[int, int], str] = field(default_factory=dict)  # (device, stream) -> name
    has_profiler_steps: bool = False  # some CPU thread holds ProfilerStep#N spans

    @property
    def distributed_info(self) -> dict[str, Any]:
        d = self.meta.get("distributedInfo")
        return d if isinstance(d, dict) else {}


def _int(v: Any) -> int | None:
    """An integer id (int or numeric string) inside int64, else None."""
    if v.__class__ is not int:
        if not isinstance(v, str):
            return None
        try:
            v = int(v, 0)
        except ValueError:
            return None
    return v if _I64[0] <= v <= _I64[1] else None


def shown(v: Any) -> str:
    """A value as the trace wrote it (JSON), shortened for a one-line message."""
    t = json.dumps(v, default=str)
    return t if len(t) <= 40 else t[:39] + "…"


def step_number(name: str) -> int | None:
    """N of a ``ProfilerStep#N`` name when N is a step number (0 <= N < 2^31), else None."""
    try:
        n = int(name[len("ProfilerStep#"):])
    except ValueError:
        return None
    return n if 0 <= n <= _MAX_STEP else None


def read_kineto(path: str | os.PathLike) -> KinetoTrace:
    """Parse one Kineto trace into columns (see the module docstring). Raises TraceFormatError on bad input."""
    path = Path(path)
    gc_was = gc.isenabled()
    gc.disable()  # millions of small dicts, no cycles: the collector would only rescan them
    try:
        with _open(path) as fh:
            return _read(path, _Reader(path, fh))
    except _READ_ERRORS as e:
        raise TraceFormatError(f"{path}: cannot read ({_read_error(e)}); is it a complete .json or .json.gz file?") \
            from None
    finally:
        if gc_was:
            gc.enable()


def _cat_kind(cat: Any) -> int:
    """Kind code of a ``ph: X`` event's category (0 when unknown), or _K_TRACE for the profiler's own span."""
    if cat == "Trace":
        return _K_TRACE
    return schema.KIND_CODE.get(str("" if cat is None else cat).lower(), 0)


@dataclass
class _Events:
    """The events kept so far, as typed arrays (one per column), and what reading them found."""

    strings: Strings = field(default_factory=Strings)
    name_id: array = field(default_factory=lambda: array("I"))
    kind: array = field(default_factory=lambda: array("B"))
    tid: array = field(default_factory=lambda: array("q"))
    device: array = field(default_factory=lambda: array("h"))
    ts: array = field(default_factory=lambda: array("q"))
    dur: array = field(default_factory=lambda: array("q"))
    flops: array = field(default_factory=lambda: array("q"))
    corr: array = field(default_factory=lambda: array("q"))
    comm_meta: dict[int, CommArgs] = field(default_factory=dict)
    track_names: dict[tuple[int | None, int], str] = field(default_factory=dict)  # (pid, tid) -> name, first wins
    dev_pids: set[int] = field(default_factory=set)  # pids of device rows (Kineto: pid = device index)
    # per distinct name: (string id, is a ProfilerStep, comm role off / on a kernel) — classified once
    name_info: dict[str, tuple[int, bool, int, int]] = field(default_factory=dict)
    cat_kinds: dict[str, int] = field(default_factory=dict)  # cat -> kind code (or _K_TRACE)
    step_tids: dict[int, int] = field(default_factory=dict)  # CPU tid -> its ProfilerStep# events
    skipped: dict[str, int] = field(default_factory=dict)
    ignored: dict[str, int] = field(default_factory=dict)
    n_raw: int = 0
    n_inexact: int = 0

    def skip(self, why: str) -> None:
        """Count one event left out, for `why`."""
        self.skipped[why] = self.skipped.get(why, 0) + 1

    def slow_ns(self, e: dict, key: str) -> int | None:
        """Any `ts`/`dur` form but the integer ns pass 1 writes: a decimal string, integer µs, a float."""
        v = e.get(key + "_ns")
        if v.__class__ is int:
            return v
        v = e.get(key + "_d")
        if v.__class__ is str:
            return _dec_ns(v)
        v = e.get(key)
        if v.__class__ is int:
            return v * 1000
        if v.__class__ is float:
            v *= 1000
            if not math.isfinite(v):  # inf, nan, or a finite µs value whose ns overflow (the range check skips it)
                return None
            if abs(v) >= _FLOAT_EXACT_LIMIT * 1000:
                self.n_inexact += 1
            return int(round(v))
        return None

    def new_cat(self, cat: Any) -> int:
        """Kind code of a ``ph: X`` category not seen yet (remembered when a string)."""
        k = _cat_kind(cat)
        if cat.__class__ is str:
            self.cat_kinds[cat] = k
        return k

    def new_name(self, name: Any) -> tuple[int, bool, int, int]:
        """name_info of an event name not seen yet (or not a string: its str), _BAD_STEP for a bad step name."""
        name = name if name.__class__ is str else str(name)
        info = self.name_info.get(name)
        if info is None:
            is_step = name.startswith("ProfilerStep#")
            if is_step and step_number(name) is None:
                info = self.name_info[name] = _BAD_STEP
            else:
                ids = self.strings.ids
                nid = ids.get(name)
                if nid is None:
                    nid = ids[name] = len(ids)
                info = self.name_info[name] = (nid, is_step, classify.comm_role(name),
                                               classify.comm_role(name, _K_KERNEL))
        return info

    def thread_name(self, e: dict) -> None:
        """A ``ph: M`` event: keep the name of a ``thread_name`` one."""
        if e.get("name") == "thread_name":
            t = _int(e.get("tid"))
            a = e.get("args")
            nm = a.get("name") if a.__class__ is dict else None
            if t is not None and isinstance(nm, str):
                self.track_names.setdefault((_int(e.get("pid")), t), nm)

    def add(self, batch: list) -> None:
        """Append the events of one parsed batch that a shard can hold; count the others."""
        self.n_raw += len(batch)
        cat_kinds, name_info, skip, empty = self.cat_kinds, self.name_info, self.skip, {}
        ts, tid, flops, corr = self.ts, self.tid, self.flops, self.corr
        step_tids, dev_pids = self.step_tids, self.dev_pids
        a_name, a_kind, a_tid, a_dev = self.name_id.append, self.kind.append, tid.append, self.device.append
        a_ts, a_dur, a_flops, a_corr = ts.append, self.dur.append, flops.append, corr.append
        for e in batch:
            if e.__class__ is not dict:
                continue
            ph = e.get("ph")
            if ph == "X":
                cat = e.get("cat")
                k = cat_kinds.get(cat) if cat.__class__ is str else None
                if k is None:
                    k = self.new_cat(cat)
                if k == _K_TRACE:
                    skip("Trace")
                    continue
            elif ph == "M":
                self.thread_name(e)
                continue
            elif ph == "i" or ph == "I":
                if e.get("s") == "g":  # Kineto's global markers ("Iteration Start", "Record Window End")
                    skip("Trace")
                    continue
                k = _K_INSTANT
            else:
                continue
            args = e.get("args")
            if args.__class__ is not dict:
                args = empty
            if k in _DEVICE_KINDS:
                p = e.get("pid")
                d = args.get("device", p)
                t = args.get("stream", e.get("tid"))
                d = d if d.__class__ is int else _int(d)
                t = t if t.__class__ is int else _int(t)
                p = p if p.__class__ is int else _int(p)
                if p is not None and 0 <= p <= _MAX_DEVICE:
                    dev_pids.add(p)
                if d is not None and not 0 <= d <= _MAX_DEVICE:
                    skip("device id out of range")
                    continue
            else:
                d = -1
                t = e.get("tid")
                t = t if t.__class__ is int else _int(t)
            if t is None or d is None:
                skip("no thread/stream id")
                continue
            t0 = e.get("ts_ns")
            if t0.__class__ is not int:
                t0 = self.slow_ns(e, "ts")
                if t0 is None:
                    skip("no ts")
                    continue
            if ph == "X":
                d0 = e.get("dur_ns")
                if d0.__class__ is not int:
                    d0 = self.slow_ns(e, "dur") or 0
            else:
                d0 = 0
            if not (-MAX_NS < t0 < MAX_NS and 0 <= d0 < MAX_NS):  # base time added later, checked again then
                skip("negative dur" if d0 < 0 else "ts or dur out of range")
                continue
            name = e.get("name", "")
            info = name_info.get(name) if name.__class__ is str else None
            if info is None:
                info = self.new_name(name)
            if info is _BAD_STEP:
                skip("ProfilerStep# name without a step number 0..2^31-1")
                continue
            f = args.get("flops")
            c = args.get("correlation")
            i = len(ts)
            try:  # the typed arrays refuse what their column cannot hold: the whole event is skipped, never wrapped
                a_tid(t)
                a_flops(f if f.__class__ is int else 0)
                a_corr(c if c.__class__ is int else 0)
            except OverflowError:
                del tid[i:], flops[i:], corr[i:]
                skip("tid, flops or correlation out of range")
                continue
            a_name(info[0])
            a_kind(k)
            a_dev(d)
            a_ts(t0)
            a_dur(d0)
            if info[1] and d < 0:
                step_tids[t] = step_tids.get(t, 0) + 1
            if info[3] if k == _K_KERNEL else info[2]:
                a = classify.comm_args(args)
                if a is not None:
                    self.comm_meta[i] = _in_range(a, self.ignored)

    def columns(self) -> Columns:
        """The columns as numpy views of the typed arrays' buffers (no second copy)."""

        def col(a: array, dtype: type) -> np.ndarray:
            """A view of the array's buffer (an empty column when it holds nothing)."""
            return np.frombuffer(a, dtype=dtype) if len(a) else np.zeros(0, dtype)

        return Columns(name_id=col(self.name_id, np.uint32), kind=col(self.kind, np.uint8), tid=col(self.tid, np.int64),
                       device=col(self.device, np.int16), ts=col(self.ts, np.int64), dur=col(self.dur, np.int64),
                       flops=col(self.flops, np.int64), corr=col(self.corr, np.int64), comm_meta=self.comm_meta)

    def track_name_maps(self) -> tuple[dict[int, str], dict[tuple[int, int], str]]:
        """Thread names (OS tid -> name) and stream names ((device, stream) -> name): a device pid's tracks are its
        streams (pid = device, tid = stream); every other pid's are OS threads."""
        thread_names: dict[int, str] = {}
        stream_names: dict[tuple[int, int], str] = {}
        for (p, t), nm in self.track_names.items():
            if p is not None and p in self.dev_pids:
                stream_names.setdefault((p, t), nm)
            else:
                thread_names.setdefault(t, nm)
        return thread_names, stream_names


def _base_ns(path: Path, meta: dict[str, Any]) -> int:
    """The trace's ``baseTimeNanoseconds`` (0 when absent); TraceFormatError when it is not a time."""
    base = meta.get("baseTimeNanoseconds")
    if base is None or base == "":
        return 0
    if _int(base) is None or not 0 <= _int(base) < MAX_NS:
        raise TraceFormatError(f"{path}: \"baseTimeNanoseconds\" is {shown(base)}, not a time in ns since "
                               "the epoch (0 <= t < 2^62); fix or remove the key")
    return _int(base)


def _on_epoch(cols: Columns, base: int, skipped: dict[str, int]) -> Columns:
    """`cols` with `base` added to ts (in place), without the events outside 0 <= t < 2^62 then (counted)."""
    ts_arr = cols.ts
    if len(ts_arr):
        # events outside 0 <= ts + base and ts + base + dur < 2^62 are skipped (each |value| < 2^62: no overflow)
        lo, hi = int(ts_arr.min()) + base, int((ts_arr + cols.dur).max()) + base
        if lo < 0 or hi >= MAX_NS:
            keep = (ts_arr >= -base) & (ts_arr + cols.dur < MAX_NS - base)
            skipped["ts out of range"] = skipped.get("ts out of range", 0) + int((~keep).sum())
            cols = _keep_rows(cols, keep)
            ts_arr = cols.ts
        if base:
            ts_arr += base
    return cols


def _read(path: Path, rd: _Reader) -> KinetoTrace:
    """The trace `rd` reads as columns, sorted by ts, with its metadata; TraceFormatError on bad input."""
    header = rd.header()
    evs = _Events()
    for batch in rd.batches():
        evs.add(batch)
    trailer = rd.trailer()
    if "traceEvents" in trailer:
        raise TraceFormatError(f"{path}: a second \"traceEvents\" key after the first list; one trace per file "
                               "(split the file, or keep the list that holds the events)")
    meta = {**header, **trailer}
    base = _base_ns(path, meta)
    cols = _on_epoch(evs.columns(), base, evs.skipped)
    _sort_in_place(cols)
    step_tids = evs.step_tids
    main_tid = max(step_tids, key=step_tids.get) if step_tids else _busiest_cpu_thread(cols)
    thread_names, stream_names = evs.track_name_maps()
    return KinetoTrace(path=path, meta=meta, strings=evs.strings, columns=cols, thread_names=thread_names,
                       stream_names=stream_names, main_tid=main_tid, n_events_raw=evs.n_raw, raw_bytes=rd.raw_bytes,
                       n_inexact=evs.n_inexact, skipped=evs.skipped, ignored=evs.ignored,
                       has_profiler_steps=bool(step_tids))


_BAD_STEP = (-1, False, 0, 0)  # name_info of a "ProfilerStep#..." name whose events are skipped


def _in_range(a: CommArgs, ignored: dict[str, int]) -> CommArgs:
    """`a` with each value its column cannot hold set to unknown (None), counted in `ignored`."""
    bad = {}
    if a.bytes is not None and not 0 <= a.bytes <= _I64[1]:
        bad["bytes"] = None
    if a.group_size is not None and not 1 <= a.group_size <= MAX_WORLD_SIZE:
        bad["group_size"] = None
    if a.nccl_seq is not None and not _I64[0] <= a.nccl_seq <= _I64[1]:
        bad["nccl_seq"] = None
    if a.pg_ranks is not None and (len(a.pg_ranks) > MAX_WORLD_SIZE
                                   or not all(0 <= r < MAX_WORLD_SIZE for r in a.pg_ranks)):
        bad["pg_ranks"] = None
    if not bad:
        return a
    for k in bad:
        why = f"collective {k} out of range"
        ignored[why] = ignored.get(why, 0) + 1
    return dataclasses.replace(a, **bad)


def _keep_rows(cols: Columns, keep: np.ndarray) -> Columns:
    """Columns of the rows where `keep` is true (comm_meta re-keyed)."""
    new_pos = np.cumsum(keep) - 1
    meta = {int(new_pos[i]): a for i, a in cols.comm_meta.items() if keep[i]}
    return Columns(name_id=cols.name_id[keep], kind=cols.kind[keep], tid=cols.tid[keep], device=cols.device[keep],
                   ts=cols.ts[keep], dur=cols.dur[keep], flops=cols.flops[keep], corr=cols.corr[keep],
                   msg_bytes=None if cols.msg_bytes is None else cols.msg_bytes[keep], comm_meta=meta)


_SORT_CHUNK = 1 << 18


def _sort_in_place(cols: Columns) -> None:
    """Stable-sort the columns by ts in place (comm_meta re-keyed), so build_tables takes them as they are.

    Memory: the order (8 B/event) and one column's copy at a time, instead of a sorted copy of every column.
    """
    ts = cols.ts
    n = len(ts)
    if n < 2 or bool(np.all(ts[1:] >= ts[:-1])):
        return
    order = np.argsort(ts, kind="stable")
    if cols.comm_meta:
        new_pos = np.empty(n, np.int32 if n < 2 ** 31 else np.int64)  # new_pos[old index] = new index
        for s in range(0, n, _SORT_CHUNK):
            new_pos[order[s:s + _SORT_CHUNK]] = np.arange(s, min(n, s + _SORT_CHUNK), dtype=new_pos.dtype)
        cols.comm_meta = {int(new_pos[i]): a for i, a in cols.comm_meta.items()}
        del new_pos
    for name in ("name_id", "kind", "tid", "device", "ts", "dur", "flops", "corr"):
        a = getattr(cols, name)
        a[...] = a[order]
    if cols.msg_bytes is not None:
        cols.msg_bytes = cols.msg_bytes[order]


def _busiest_cpu_thread(cols: Columns) -> int | None:
    cpu = (cols.device < 0) & (cols.kind == schema.KIND_CODE["cpu_op"])
    if not np.any(cpu):
        return None
    vals, counts = np.unique(cols.tid[cpu], return_counts=True)
    return int(vals[np.argmax(counts)])
