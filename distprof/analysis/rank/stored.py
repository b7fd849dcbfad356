"""A rank's summary stored in its shard, where the events are born, and read back instead of the events.

    with building(tables, strings, attrs) as b:             # capture's writer thread, or ``distprof import``
        image = b.with_summary(summarize_image(b.image(), path))
    ...
    s = load_stored(shard, pg_lut)                          # the report: RankSummary, or None (take the events)

:func:`summarize_image` runs the report's own map (``rankdata.read_shards`` and ``summary.summarize_rank``, no steps
selection, default rules) on the shard's bytes as they will be stored, so the stored summary is the one the report
would compute from that shard. The report uses it only where that holds: one shard for the rank, no ``--steps``,
the default rules (``summarize.engine.stored_summary``), this format and distprof version (``usable``).
Process-group indices are stored as the shard has them and mapped to the run's when read, as the events' are.

The encoding is exact: every array keeps its dtype, every number its type (numpy scalars included), NaN stays NaN,
tuples stay tuples; objects are the summary's own dataclasses only (a whitelist). Strings travel in the JSON
document, numeric arrays in the group's byte column (``storage.summary_group``). Decoding checks every field against
its type hints, the tables' columns and lengths and the indices between them; a fault is a SummaryUnreadable.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import sys
import threading
import time
import types
import typing
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..._version import __version__
from ...storage.summary_group import SUMMARY_KINDS, StoredSummary, SummaryUnreadable
from ...storage.validate import check_image
from ..load.rankdata import read_shards
from ..types import RankSummary
from .breakdown import BREAKDOWN_COLUMNS
from .device import DeviceIdle
from .gpu_time import GpuTime
from .measures import Churn, HistoryChurn, InputWait, OpSizes, RankMeasures
from .summary import summarize_rank

__all__ = ["SUMMARY_VERSION", "encode", "decode", "summarize_image", "usable", "load_stored"]

#: Bump whenever summarize_rank's output changes shape or meaning: a stored summary of another version is not used.
SUMMARY_VERSION = 1

_CLASSES: dict[str, type] = {c.__name__: c for c in (RankSummary, RankMeasures, OpSizes, InputWait, Churn,
                                                      HistoryChurn, DeviceIdle, GpuTime)}
_HINT_NS = {**_CLASSES, "Table": dict[str, np.ndarray], "np": np}
#: Columns each table of a summary must have (more may follow).
_CPU_WAIT = ("cpu_wait_at_start_ns", "cpu_wait_at_end_ns")
_COLUMNS = {
    "steps": tuple(BREAKDOWN_COLUMNS) + _CPU_WAIT,
    "collectives": ("window", "pg", "seq", "op", "bytes", "start_ns", "end_ns", "step", "ev_row", "exposed_ns")
    + _CPU_WAIT,
    "op_totals": ("name", "step", "dur_ms", "self_ms", "calls"),
}
_P2P_COLUMNS = ("window", "pg", "peer", "is_recv", "bytes", "start_ns", "end_ns", "step", "ev_row")


# ----------------------------------------------------------------------------------------------------------- encode
class _Encoder:
    def __init__(self) -> None:
        self.arrays: dict[str, np.ndarray] = {}

    def __call__(self, v: Any) -> Any:
        if v is None or isinstance(v, (bool, str, int, float)):
            return v
        if isinstance(v, np.ndarray):
            return self._array(v)
        if isinstance(v, np.generic):
            return {"$s": v.dtype.str, "v": v.item()}
        if isinstance(v, tuple):
            return {"$t": [self(x) for x in v]}
        if isinstance(v, list):
            return [self(x) for x in v]
        if isinstance(v, dict):
            return {"$d": [[self(k), self(x)] for k, x in v.items()]}
        if dataclasses.is_dataclass(v) and type(v).__name__ in _CLASSES and _CLASSES[type(v).__name__] is type(v):
            return {"$c": type(v).__name__, "f": {f.name: self(getattr(v, f.name)) for f in dataclasses.fields(v)}}
        raise TypeError(f"a rank summary holds a {type(v).__name__}, which a stored summary cannot hold")

    def _array(self, a: np.ndarray) -> Any:
        if a.dtype.kind in SUMMARY_KINDS and a.ndim == 1:
            key = f"a{len(self.arrays)}"
            self.arrays[key] = a
            return {"$a": key, "dtype": a.dtype.str}
        if a.dtype.kind == "O" and a.ndim == 1:
            return {"$o": [self(x) for x in a.tolist()]}
        raise TypeError(f"a rank summary holds a {a.dtype} array of shape {a.shape}, which a stored summary cannot "
                        "hold")


def encode(summary: RankSummary, *, cpu_s: float = 0.0) -> StoredSummary:
    """The summary as storage holds it (exact: ``decode(encode(s))`` equals `s` in every value and type)."""
    enc = _Encoder()
    doc = enc(summary)
    return StoredSummary(version=SUMMARY_VERSION, producer=__version__,
                         meta=json.dumps(doc, separators=(",", ":"), allow_nan=True), arrays=enc.arrays, cpu_s=cpu_s)


# ----------------------------------------------------------------------------------------------------------- decode
class _Decoder:
    def __init__(self, arrays: dict[str, np.ndarray]) -> None:
        self.arrays = arrays

    def __call__(self, v: Any, depth: int = 0) -> Any:
        if depth > 32:
            raise SummaryUnreadable("nested too deep")
        if type(v) is str:  # op names: one string for every rank's copy, as rankdata interns the events' names
            return sys.intern(v)
        if v is None or isinstance(v, (bool, int, float)):
            return v
        if isinstance(v, list):
            return self._items(v, depth)
        if not isinstance(v, dict) or len(v) not in (1, 2):
            raise SummaryUnreadable(f"an unknown value {_show(v)}")
        if "$a" in v:
            a = self.arrays.get(v["$a"]) if isinstance(v["$a"], str) else None
            if a is None or a.dtype.str != v.get("dtype"):
                raise SummaryUnreadable(f"array {_show(v['$a'])} missing or not of dtype {_show(v.get('dtype'))}")
            return a
        if "$o" in v and isinstance(v["$o"], list):
            items = self._items(v["$o"], depth)
            out = np.empty(len(items), dtype=object)
            out[:] = items
            return out
        if "$s" in v:
            return _scalar(v.get("$s"), v.get("v"))
        if "$t" in v and isinstance(v["$t"], list):
            return tuple(self(x, depth + 1) for x in v["$t"])
        if "$d" in v and isinstance(v["$d"], list):
            out_d = {}
            for kv in v["$d"]:
                if not (isinstance(kv, list) and len(kv) == 2):
                    raise SummaryUnreadable(f"a dict entry {_show(kv)}")
                k = self(kv[0], depth + 1)
                if isinstance(k, (list, dict, np.ndarray)):
                    raise SummaryUnreadable(f"a dict key {_show(kv[0])}")
                out_d[k] = self(kv[1], depth + 1)
            return out_d
        if "$c" in v and isinstance(v.get("f"), dict):
            cls = _CLASSES.get(v["$c"]) if isinstance(v["$c"], str) else None
            if cls is None:
                raise SummaryUnreadable(f"an unknown class {_show(v['$c'])}")
            return _build(cls, {k: self(x, depth + 1) for k, x in v["f"].items()})
        raise SummaryUnreadable(f"an unknown value {_show(v)}")

    def _items(self, v: list, depth: int) -> list:
        """A list's items decoded; a list of strings alone (a rank's op names) interned without a call per name
        (the decoder's calls were half of reading a stored summary)."""
        if all(type(x) is str for x in v):
            return list(map(sys.intern, v))
        return [self(x, depth + 1) for x in v]


def _scalar(dtype: Any, value: Any) -> np.generic:
    try:
        dt = np.dtype(dtype) if isinstance(dtype, str) else None
    except TypeError:
        dt = None
    if dt is None or dt.kind not in SUMMARY_KINDS or not isinstance(value, (bool, int, float)):
        raise SummaryUnreadable(f"a scalar {_show(dtype)} {_show(value)}")
    try:
        return dt.type(value)
    except (OverflowError, ValueError):
        raise SummaryUnreadable(f"a scalar {_show(dtype)} {_show(value)}") from None


@lru_cache(maxsize=None)
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls, globalns={**vars(sys.modules[cls.__module__]), **_HINT_NS})


def _build(cls: type, values: dict[str, Any]) -> Any:
    hints = _hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = set(values) - set(fields)
    if unknown:
        raise SummaryUnreadable(f"{cls.__name__} has no field {sorted(unknown)[0]!r}")
    for name, f in fields.items():
        if name not in values:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise SummaryUnreadable(f"{cls.__name__}.{name} is missing")
            continue
        if not _fits(values[name], hints.get(name, Any)):
            raise SummaryUnreadable(f"{cls.__name__}.{name} = {_show(values[name])} is not a {hints.get(name)}")
    return cls(**values)


def _fits(v: Any, hint: Any) -> bool:
    """Whether `v` has the shape of type hint `hint` (numbers: numpy's count; unknown hints: anything)."""
    return _checker(hint)(v)


def _never_bool(v: Any) -> bool:
    return not isinstance(v, (bool, np.bool_))


@lru_cache(maxsize=None)
def _checker(hint: Any) -> Callable[[Any], bool]:
    """`hint` made once into a function that checks a value against it (a stored summary checks ≈ 200 values per
    rank: taking each hint apart again per value was half of decoding one)."""
    if hint is Any:
        return lambda v: True
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        alts = tuple(_checker(a) for a in args)
        return lambda v: any(c(v) for c in alts)
    if hint is type(None):
        return lambda v: v is None
    if hint is bool:
        return lambda v: isinstance(v, (bool, np.bool_))
    if hint is int:
        return lambda v: isinstance(v, (int, np.integer)) and _never_bool(v)
    if hint is float:
        return lambda v: isinstance(v, (int, float, np.integer, np.floating)) and _never_bool(v)
    if hint in (str, np.ndarray):
        return lambda v: isinstance(v, hint)
    if origin is list:
        if args and args[0] is str:  # op_kinds: hundreds of names per rank
            return lambda v: isinstance(v, list) and all(type(x) is str for x in v)
        item = _checker(args[0]) if args else None
        return lambda v: isinstance(v, list) and (item is None or all(map(item, v)))
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            each = _checker(args[0])
            return lambda v: isinstance(v, tuple) and all(map(each, v))
        parts = tuple(_checker(a) for a in args)
        return lambda v: isinstance(v, tuple) and (not parts or (len(parts) == len(v) and
                                                                 all(c(x) for c, x in zip(parts, v))))
    if origin is dict:
        if not args:
            return lambda v: isinstance(v, dict)
        key, val = _checker(args[0]), _checker(args[1])
        return lambda v: isinstance(v, dict) and all(key(k) and val(x) for k, x in v.items())
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return lambda v: isinstance(v, hint)
    return lambda v: True


def _show(v: Any) -> str:
    s = repr(v)
    return s if len(s) <= 60 else s[:57] + "..."


def _check_table(name: str, tab: dict[str, np.ndarray], required: tuple[str, ...]) -> int:
    missing = [c for c in required if c not in tab]
    if missing:
        raise SummaryUnreadable(f"{name} has no column {missing[0]!r}")
    lengths = {len(v) for v in tab.values()}
    if len(lengths) > 1:
        raise SummaryUnreadable(f"{name}'s columns differ in length ({sorted(lengths)})")
    return lengths.pop() if lengths else 0


def _in_range(name: str, idx: np.ndarray, n: int) -> None:
    if idx.size and (idx.dtype.kind not in "iu" or int(idx.min()) < 0 or int(idx.max()) >= n):
        raise SummaryUnreadable(f"{name} points outside 0..{n - 1}")


def _check(s: RankSummary) -> RankSummary:
    """The relations between a summary's parts that the analyses rely on."""
    for name, req in _COLUMNS.items():
        _check_table(name, getattr(s, name), req)
    if s.p2p:
        _check_table("p2p", s.p2p, _P2P_COLUMNS)
    _in_range("collectives.op", s.collectives["op"], len(s.ops_names))
    _in_range("op_totals.name", s.op_totals["name"], len(s.op_names))
    if len(s.op_kinds) != len(s.op_names):
        raise SummaryUnreadable("op_kinds and op_names differ in length")
    for name, tab in (("collectives", s.collectives), ("p2p", s.p2p)):
        if "ev_row" in tab:
            _in_range(f"{name}.ev_row", tab["ev_row"], max(s.n_events, 0))
    for w, (t, v) in s.memory_series.items():
        if len(t) != len(v):
            raise SummaryUnreadable(f"memory_series[{w}] has {len(t)} times and {len(v)} values")
    for key, tab in s.samples.items():
        if not (len(key) == 2 and all(isinstance(x, int) for x in key)):
            raise SummaryUnreadable(f"samples key {_show(key)}")
        _check_table(f"samples{list(key)}", tab, ())
    for x in (s.n_events, s.memory_device):
        if not isinstance(x, (int, np.integer)):
            raise SummaryUnreadable("n_events and memory_device must be integers")
    if s.reserved_peak_bytes is not None and not math.isfinite(float(s.reserved_peak_bytes)):
        raise SummaryUnreadable("reserved_peak_bytes is not finite")
    return s


def decode(stored: StoredSummary) -> RankSummary:
    """The RankSummary `stored` holds (SummaryUnreadable when it is not one, whatever the file says)."""
    if stored.version != SUMMARY_VERSION:
        raise SummaryUnreadable(f"summary format {stored.version}, this distprof reads {SUMMARY_VERSION}")
    try:
        doc = json.loads(stored.meta)
    except (ValueError, RecursionError) as e:
        raise SummaryUnreadable(f"summary document is not JSON ({e})") from None
    try:
        s = _Decoder(stored.arrays)(doc)
    except (TypeError, ValueError, RecursionError) as e:
        if isinstance(e, SummaryUnreadable):
            raise
        raise SummaryUnreadable(f"summary document does not decode ({type(e).__name__}: {e})") from None
    if not isinstance(s, RankSummary):
        raise SummaryUnreadable("summary document is not a rank summary")
    return _check(s)


# --------------------------------------------------------------------------------------------------- produce / use
def summarize_image(image: bytes, path: str | Path) -> StoredSummary | None:
    """The summary of a shard still in memory (its bytes, to be stored at `path`): the report's map of that shard,
    with the CPU time it took. None when the map had something to say (a log record of INFO or above): those lines
    are the report's to print, where and when it prints them, so such a shard is summarised by the report itself."""
    t0 = time.thread_time()
    with _Quiet() as said:
        shard = check_image(image, path)
        rd = read_shards(shard.rank, [shard])
        summary = summarize_rank(rd)
    if said.records:
        return None
    return encode(summary, cpu_s=time.thread_time() - t0)


class _Quiet(logging.Handler):
    """While open, what this thread logs through ``distprof.analysis`` is kept here (INFO and above) instead of
    printed; other threads' records pass on to ``distprof``'s handlers as usual."""

    def __init__(self) -> None:
        super().__init__(logging.NOTSET)
        self.records: list[logging.LogRecord] = []
        self._tid = threading.get_ident()
        self._logger = logging.getLogger("distprof.analysis")

    def __enter__(self) -> "_Quiet":
        self._propagate = self._logger.propagate
        self._logger.addHandler(self)
        self._logger.propagate = False
        return self

    def __exit__(self, *exc: object) -> None:
        self._logger.removeHandler(self)
        self._logger.propagate = self._propagate

    def emit(self, record: logging.LogRecord) -> None:
        if record.thread != self._tid:
            logging.getLogger("distprof").handle(record)
        elif record.levelno >= logging.INFO:
            self.records.append(record)


def usable(stored: StoredSummary) -> str | None:
    """Why the report cannot take `stored` (None: it can); that the rank has this one shard, no ``--steps`` and the
    default rules is the caller's to know (``summarize.engine.stored_summary``) before the shard is opened."""
    if stored.version != SUMMARY_VERSION or stored.producer != __version__:
        return f"written by distprof {stored.producer} (format {stored.version})"
    return None


def load_stored(stored: StoredSummary, pg_lut: np.ndarray | None) -> RankSummary:
    """`stored` decoded, its process-group indices mapped to the run's (``catalog.remap_pg``)."""
    from ..load.catalog import remap_pg

    s = decode(stored)
    for tab in (s.collectives, s.p2p):
        if "pg" in tab:
            tab["pg"] = remap_pg(tab["pg"], pg_lut)
    return s
