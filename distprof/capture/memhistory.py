"""CUDA allocator history (``--memory-history``): record it per window, summarise it per step, keep the raw snapshot.

Capture side (needs torch with CUDA): `MemoryHistory` turns torch's allocator history on at each window start
(``torch.cuda.memory._record_memory_history(enabled="all", ...)``) and, at window end, takes
``torch.cuda.memory._snapshot()`` and turns recording off. Those two calls are all the training thread pays; the
summary and the pickle run on the background writer.

Pure side (no torch): `summarize_snapshot` maps the snapshot's ``device_traces`` onto the window's steps and returns
the ``cuda_memory`` / ``cuda_memory_blocks`` shard tables (docs/shard-format.md). Facts it relies on (PyTorch's
CUDACachingAllocator): ``time_us`` is CLOCK_REALTIME epoch µs; ``alloc`` and ``free_requested`` carry the requested
size, and ``memory_allocated()`` drops at ``free_requested``; ``segment_alloc``/``segment_map`` add reserved bytes,
``segment_free``/``segment_unmap`` remove them; the snapshot's ``segments`` give the state at the snapshot, from which
the levels before each entry are rebuilt backwards (exact even when the ring buffer dropped older entries).
"""

from __future__ import annotations

import inspect
import logging
import os
import pickle
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from ..events.tables import Strings
from ..storage import safefs, schema

log = logging.getLogger(__name__)

#: Largest allocations kept per step and device in ``cuda_memory_blocks``.
TOP_BLOCKS = 8
#: Raw snapshot file beside the shard (the pickle https://pytorch.org/memory_viz opens).
SNAPSHOT_TEMPLATE = "rank{rank:05d}.w{window:04d}.memsnap.pickle"

_ALLOC, _FREE, _SEG_ALLOC, _SEG_FREE, _OOM = "alloc", "free_requested", "segment_alloc", "segment_free", "oom"
_SEG_GROW = (_SEG_ALLOC, "segment_map")
_SEG_SHRINK = (_SEG_FREE, "segment_unmap")
#: Path fragments of frames that belong to libraries rather than the user's code.
_LIBRARY_MARKERS = ("/torch/", "/site-packages/", "/dist-packages/", "/distprof/", "/lib/python3", "<frozen ")


@dataclass
class MemSummary:
    """What `summarize_snapshot` returns: shard tables whose ``*frame_id`` columns index ``strings``."""

    tables: dict[str, dict[str, np.ndarray]]
    strings: list[str]
    stats: dict[str, Any] = field(default_factory=dict)

    def with_strings(self, shard_strings: list[str]) -> dict[str, dict[str, np.ndarray]]:
        """Tables with frame ids re-pointed into `shard_strings`, which is extended in place (deduplicated)."""
        index = {s: i for i, s in enumerate(shard_strings)}
        lut = np.empty(len(self.strings), np.uint32)
        for i, s in enumerate(self.strings):
            j = index.get(s)
            if j is None:
                j = index[s] = len(shard_strings)
                shard_strings.append(s)
            lut[i] = j
        out = {name: dict(cols) for name, cols in self.tables.items()}
        blocks = out["cuda_memory_blocks"]
        for col in ("frame_id", "user_frame_id"):
            if len(blocks[col]):
                blocks[col] = lut[blocks[col]]
        return out


# ---- pure summary ----------------------------------------------------------------------------------------------------


def _spans(step_spans: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(step, start_ns, end_ns) arrays sorted by start, from a steps table or (step, start, end) tuples."""
    if isinstance(step_spans, Mapping):
        steps = np.asarray(step_spans["step"], np.int64)
        start = np.asarray(step_spans["start_ns"], np.int64)
        end = np.asarray(step_spans["end_ns"], np.int64)
    else:
        rows = list(step_spans)
        steps = np.array([int(r[0]) for r in rows], np.int64)
        start = np.array([int(r[1]) for r in rows], np.int64)
        end = np.array([int(r[2]) for r in rows], np.int64)
    o = np.argsort(start, kind="stable")
    return steps[o], start[o], end[o]


def _frame_text(fr: Mapping[str, Any]) -> str:
    return f"{fr.get('name', '?')} ({fr.get('filename', '?')}:{fr.get('line', 0)})"


def _user_frame(frames: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    for fr in frames:
        fn = str(fr.get("filename", ""))
        if fn.endswith(".py") and not any(m in fn for m in _LIBRARY_MARKERS):
            return fr
    return None


def _devices(snapshot: Mapping[str, Any]) -> list[int]:
    traces = snapshot.get("device_traces") or []
    devs = {d for d, tr in enumerate(traces) if tr}
    devs |= {int(s.get("device", 0)) for s in snapshot.get("segments") or []}
    return sorted(devs)


@dataclass
class _DeviceTrace:
    """One device's allocator trace in time order, with the allocated and reserved levels around each entry."""

    entries: list  # the trace's entries (dicts)
    t: np.ndarray  # entry times, ns on the recorded clock
    size: np.ndarray
    act: np.ndarray  # 1 alloc, 2 free, 3 segment grow, 4 segment shrink, 5 oom, 0 other
    end_alloc: int  # levels at the snapshot (from its segments)
    end_reserved: int
    base_alloc: int  # levels before the first entry
    base_res: int
    alloc_after: np.ndarray  # level after entry i
    res_after: np.ndarray
    truncated: bool  # as long as the ring buffer: older entries may be lost


def _device_trace(trace: list, segs: list, max_entries: int | None,
                  to_recorded: Callable[[np.ndarray], np.ndarray] | None) -> _DeviceTrace:
    """The entries of one device's trace sorted by time, and the levels rebuilt backwards from its segments."""
    end_alloc = 0
    for s in segs:
        blocks = s.get("blocks")
        if blocks is None:
            end_alloc += int(s.get("requested_size", s.get("allocated_size", 0)))
        else:
            end_alloc += sum(int(b.get("requested_size", b.get("size", 0))) for b in blocks
                             if b.get("state") == "active_allocated")
    end_reserved = sum(int(s.get("total_size", 0)) for s in segs)

    n = len(trace)
    t_us = np.empty(n, np.int64)
    size = np.empty(n, np.int64)
    act = np.zeros(n, np.int8)
    codes = {_ALLOC: 1, _FREE: 2, **{a: 3 for a in _SEG_GROW}, **{a: 4 for a in _SEG_SHRINK}, _OOM: 5}
    for i, e in enumerate(trace):
        t_us[i] = int(e.get("time_us", 0))
        size[i] = int(e.get("size", 0))
        act[i] = codes.get(e.get("action"), 0)
    order = np.argsort(t_us, kind="stable")  # torch hands them over in order; be safe
    if n and not (np.diff(t_us) >= 0).all():
        trace = [trace[i] for i in order]
        t_us, size, act = t_us[order], size[order], act[order]
    t = t_us * 1000
    if to_recorded is not None and n:
        t = np.asarray(to_recorded(t), np.int64)
    d_alloc = np.where(act == 1, size, 0) - np.where(act == 2, size, 0)
    d_res = np.where(act == 3, size, 0) - np.where(act == 4, size, 0)
    base_alloc = end_alloc - int(d_alloc.sum())
    base_res = end_reserved - int(d_res.sum())
    return _DeviceTrace(entries=trace, t=t, size=size, act=act, end_alloc=end_alloc, end_reserved=end_reserved,
                        base_alloc=base_alloc, base_res=base_res, alloc_after=base_alloc + np.cumsum(d_alloc),
                        res_after=base_res + np.cumsum(d_res),
                        truncated=bool(max_entries is not None and n >= max_entries))


def _entry_steps(t: np.ndarray, s_start: np.ndarray, s_end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each entry's step slot (−1: none) and whether it lies in a step's [start, end)."""
    k = np.searchsorted(s_start, t, side="right") - 1
    kc = np.clip(k, 0, None)
    in_step = (k >= 0) & (t < s_end[kc]) if len(s_start) else np.zeros(len(t), bool)
    return np.where(in_step, k, -1), in_step


def _frees(dt: _DeviceTrace) -> np.ndarray:
    """Index of the entry that frees each allocation (same address, later), −1 for the others, for lifetimes."""
    free_idx = np.full(len(dt.t), -1, np.int64)
    open_at: dict[int, int] = {}
    for i in np.flatnonzero((dt.act == 1) | (dt.act == 2)).tolist():
        addr = int(dt.entries[i].get("addr", -1))
        if dt.act[i] == 1:
            open_at[addr] = i
        else:
            j = open_at.pop(addr, None)
            if j is not None:
                free_idx[j] = i
    return free_idx


def _step_row(dt: _DeviceTrace, idx: np.ndarray, step: int, start: int, dev: int) -> tuple[dict[str, int], int]:
    """The cuda_memory row of the step starting at `start` whose entries are `idx`, and its peak entry (−1: none)."""
    first = int(np.searchsorted(dt.t, start, side="left"))  # entries before the step start
    level_a = int(dt.alloc_after[first - 1]) if first > 0 else dt.base_alloc
    level_r = int(dt.res_after[first - 1]) if first > 0 else dt.base_res
    peak_a, peak_r, peak_i, peak_ns = level_a, level_r, -1, start
    if len(idx):
        j = int(idx[np.argmax(dt.alloc_after[idx])])
        if dt.alloc_after[j] > peak_a:
            peak_a, peak_i, peak_ns = int(dt.alloc_after[j]), j, int(dt.t[j])
        peak_r = max(peak_r, int(dt.res_after[idx].max()))
        end_a, end_r = int(dt.alloc_after[idx[-1]]), int(dt.res_after[idx[-1]])
    else:
        end_a, end_r = level_a, level_r
    a = dt.act[idx]
    sz = dt.size[idx]
    complete = not dt.truncated or (len(dt.t) > 0 and int(dt.t[0]) <= start)
    return {
        "step": step, "device": dev, "complete": int(complete),
        "n_alloc": int((a == 1).sum()), "alloc_bytes": int(sz[a == 1].sum()),
        "n_free": int((a == 2).sum()), "free_bytes": int(sz[a == 2].sum()),
        "n_segment_alloc": int((a == 3).sum()), "segment_alloc_bytes": int(sz[a == 3].sum()),
        "n_segment_free": int((a == 4).sum()), "segment_free_bytes": int(sz[a == 4].sum()),
        "n_oom": int((a == 5).sum()),
        "alloc_peak_bytes": peak_a, "alloc_end_bytes": end_a,
        "reserved_peak_bytes": peak_r, "reserved_end_bytes": end_r, "peak_ns": peak_ns,
    }, peak_i


def _top_blocks(dt: _DeviceTrace, idx: np.ndarray, free_idx: np.ndarray, peak_i: int, step: int, dev: int,
                top_blocks: int, names: Strings) -> list[dict[str, int]]:
    """cuda_memory_blocks rows of a step's `top_blocks` largest allocations (frames interned in `names`)."""
    allocs = idx[dt.act[idx] == 1]
    out: list[dict[str, int]] = []
    if len(allocs) and top_blocks > 0:
        big = allocs[np.argsort(-dt.size[allocs], kind="stable")[:top_blocks]]
        for j in big.tolist():
            e = dt.entries[j]
            frames = e.get("frames") or []
            fi = free_idx[j]
            uf = _user_frame(frames)
            live = peak_i >= j and (fi < 0 or fi > peak_i)
            out.append({"step": step, "device": dev, "ts_ns": int(dt.t[j]), "bytes": int(dt.size[j]),
                        "stream": int(e.get("stream", 0)), "lifetime_ns": int(dt.t[fi] - dt.t[j]) if fi >= 0 else -1,
                        "live_at_peak": int(live),
                        "frame_id": names.id(_frame_text(frames[0])) if frames else 0,
                        "user_frame_id": names.id(_frame_text(uf)) if uf is not None else 0})
    return out


def _device_stats(dt: _DeviceTrace, in_step: np.ndarray) -> dict[str, Any]:
    """The summary's stats of one device: entries, levels at both ends, window peak."""
    n = len(dt.t)
    stats = {
        "entries": n, "outside_steps": int(n - in_step.sum()), "truncated": dt.truncated,
        "baseline_alloc_bytes": dt.base_alloc, "baseline_reserved_bytes": dt.base_res,
        "end_alloc_bytes": dt.end_alloc, "end_reserved_bytes": dt.end_reserved,
        "window_peak_alloc_bytes": int(max(dt.base_alloc, dt.alloc_after.max() if n else dt.base_alloc)),
        "n_oom": int((dt.act == 5).sum()),
    }
    if dt.base_alloc < 0 or dt.base_res < 0:
        stats["inconsistent"] = True  # state changed between segments and trace reads
    return stats


def _takes(fn: Callable[..., Any], name: str) -> bool:
    """Whether `fn` takes the keyword `name` (True where its signature cannot be read: the call says so itself)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return True
    return name in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def summarize_snapshot(
    snapshot: Mapping[str, Any],
    step_spans: Any,
    *,
    devices: Iterable[int] | None = None,
    max_entries: int | None = None,
    to_recorded: Callable[[np.ndarray], np.ndarray] | None = None,
    top_blocks: int = TOP_BLOCKS,
) -> MemSummary:
    """Per-step CUDA allocator summary of one window's snapshot (``torch.cuda.memory._snapshot()`` format).

    step_spans: the window's steps, as a ``steps`` table (step, start_ns, end_ns) or (step, start_ns, end_ns) tuples,
        in the recorded clock. An entry belongs to the step whose [start, end) holds its time.
    devices: device indices to summarise (default: every device with segments or trace entries).
    max_entries: the ring-buffer size recording used; a trace that long may have lost its oldest entries, so steps
        that start before its first entry are marked ``complete = 0``.
    to_recorded: maps true epoch ns to the recorded clock (the test-only simulated clock); identity by default.
    """
    steps, s_start, s_end = _spans(step_spans)
    mem_cols = schema.TABLES["cuda_memory"]
    blk_cols = schema.TABLES["cuda_memory_blocks"]
    rows: dict[str, list] = {c: [] for c in mem_cols}
    brows: dict[str, list] = {c: [] for c in blk_cols}
    names = Strings()
    names.id("")  # frame id 0: no frame
    segments = snapshot.get("segments") or []
    traces = snapshot.get("device_traces") or []
    stats: dict[str, Any] = {"devices": {}}
    for dev in (sorted(set(devices)) if devices is not None else _devices(snapshot)):
        trace = list(traces[dev]) if dev < len(traces) and traces[dev] else []
        tr = _device_trace(trace, [s for s in segments if int(s.get("device", dev)) == dev], max_entries, to_recorded)
        slot, in_step = _entry_steps(tr.t, s_start, s_end)
        free_idx = _frees(tr)
        for si in range(len(steps)):
            idx = np.flatnonzero(slot == si)
            vals, peak_i = _step_row(tr, idx, int(steps[si]), int(s_start[si]), dev)
            for c in mem_cols:
                rows[c].append(vals[c])
            for b in _top_blocks(tr, idx, free_idx, peak_i, int(steps[si]), dev, top_blocks, names):
                for c in blk_cols:
                    brows[c].append(b[c])
        stats["devices"][str(dev)] = _device_stats(tr, in_step)

    tables = {
        "cuda_memory": {c: np.asarray(rows[c], dtype=dt) for c, dt in mem_cols.items()},
        "cuda_memory_blocks": {c: np.asarray(brows[c], dtype=dt) for c, dt in blk_cols.items()},
    }
    for name, cols in tables.items():  # entries of one device come in step order; rows of all devices by step
        o = np.lexsort((cols["device"], cols["step"]))
        tables[name] = {c: v[o] for c, v in cols.items()}
    return MemSummary(tables=tables, strings=names.list(), stats=stats)


def dump_snapshot(snapshot: Any, path: str | os.PathLike) -> int:
    """Pickle the raw snapshot to `path` (tmp → rename), the file pytorch.org/memory_viz opens. Returns bytes."""
    path = Path(path)
    with safefs.atomic_file(path.parent, path.name, fsync=True) as f:  # never through a link planted at `path`
        pickle.dump(snapshot, f, protocol=pickle.HIGHEST_PROTOCOL)
        size = f.tell()
    return size


# ---- capture side ----------------------------------------------------------------------------------------------------


class MemoryHistory:
    """Turns torch's CUDA allocator history on for each window and takes its snapshot at the window end.

    `memory` is ``torch.cuda.memory`` (tests pass a fake). Every call here runs on the training thread and is
    cheap apart from ``_snapshot()`` (it symbolises the recorded stacks).
    """

    def __init__(self, max_entries: int, memory: Any = None, stacks: str = "python") -> None:
        self.max_entries = int(max_entries)
        self.stacks = stacks
        self._memory = memory
        self.recording = False

    def _mod(self):
        if self._memory is None:
            import torch.cuda.memory as memory

            self._memory = memory
        return self._memory

    def begin(self) -> None:
        """Window start: record every alloc/free from now on, forgetting earlier history (torch 2.3 cannot forget
        it: its `_record_memory_history` has no `clear_history`; the summary assigns entries to steps by time, so
        earlier ones are left out of the tables, and only the raw snapshot beside the shard holds them)."""
        record = self._mod()._record_memory_history
        clear = {"clear_history": True} if _takes(record, "clear_history") else {}
        record(enabled="all", context="all", stacks=self.stacks, max_entries=self.max_entries, **clear)
        self.recording = True

    def end(self) -> dict | None:
        """Window end: the snapshot (None when not recording), and recording off (also when the snapshot fails)."""
        if not self.recording:
            return None
        try:
            return self._mod()._snapshot()
        finally:
            self.stop()

    def stop(self) -> None:
        if self.recording:
            self.recording = False
            self._mod()._record_memory_history(enabled=None)
