"""The merged run: a plain data object every analysis takes. No torch, no I/O.

Built by `distprof.analysis.run.load_run` (from shards), one rank at a time by `run.rank_merged` (timeline, export), or
directly by tests (`engine.summarize_merged` analyses it). Tables are dicts of equal-length numpy
columns ("column tables"); all times are **aligned** to the reference rank's clock (int64 epoch ns).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np

Table = dict[str, np.ndarray]


@dataclass
class HostClock:
    """How one host's clock maps onto the reference clock: aligned = t + offset_ns + drift_ppm·1e-6·(t − t_ref_ns)."""

    host: str
    offset_ns: float
    drift_ppm: float = 0.0
    t_ref_ns: int = 0
    residual_us: float | None = None  # median violation of collective causality after alignment
    residual_max_us: float | None = None
    method: str = "ping-pong"  # "ping-pong", "collectives", "none"
    n_samples: int = 0
    ranks: list[int] = field(default_factory=list)

    def apply(self, t: np.ndarray) -> np.ndarray:
        t = np.asarray(t, dtype=np.int64)
        corr = self.offset_ns + self.drift_ppm * 1e-6 * (t - self.t_ref_ns).astype(np.float64)
        return t + np.rint(corr).astype(np.int64)


@dataclass
class MergedRun:
    """All ranks of one run, merged.

    Column tables (each with an added ``rank`` i4 and ``window`` i4 column):

    * ``events``: name_id (global string table), kind, category, tid, device, ts_ns (aligned), dur_ns, step, flops,
      corr_id — sorted by (rank, ts_ns).
    * ``comms``: row (index into ``events``), op_id (global), role, pg, seq, bytes, group_size, nccl_seq.
    * ``steps``: step, start_ns, end_ns (aligned), flops, peak_mem_bytes, n_events.
    * ``memory``: ts_ns (aligned), bytes, total_bytes, device, step.
    * ``threads``: tid, name_id (global), role, pg.
    * ``cuda_memory`` (``--memory-history`` on CUDA; empty columns otherwise): per step and device, allocator peaks
      and end levels (``alloc_*`` = requested bytes, ``reserved_*`` = cached segments), alloc/free/segment/OOM
      counts, ``peak_ns`` (aligned), ``complete``.
    * ``cuda_memory_blocks``: the largest allocations per step and device: ts_ns (aligned), bytes, stream,
      lifetime_ns, live_at_peak, frame_id / user_frame_id (global string table).
    """

    run_id: str
    world_size: int
    ranks_present: list[int]
    ranks_missing: list[int]
    hosts: dict[int, str]  # rank -> host
    names: np.ndarray  # global string table (object array)
    events: Table
    comms: Table
    steps: Table
    memory: Table
    threads: Table
    clock: dict[str, HostClock] = field(default_factory=dict)
    attrs: dict[int, dict[str, Any]] = field(default_factory=dict)  # rank -> root attributes of its first shard
    process_groups: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    device_peak_tflops: dict[int, float] = field(default_factory=dict)  # rank -> peak, where known
    cuda_memory: Table = field(default_factory=lambda: _empty("cuda_memory"))
    cuda_memory_blocks: Table = field(default_factory=lambda: _empty("cuda_memory_blocks"))
    skipped_shards: list = field(default_factory=list)  # storage.validate.SkippedShard: left out, and why

    @property
    def has_memory_history(self) -> bool:
        return len(self.cuda_memory.get("step", ())) > 0

    def name_id(self, name: str) -> int | None:
        hits = np.flatnonzero(self.names == name)
        return int(hits[0]) if len(hits) else None


def _empty(table: str) -> Table:
    """Zero-row columns of an optional shard table, plus the merged ``rank``/``window`` columns."""
    from ..storage.schema import TABLES

    cols = {c: np.zeros(0, dt) for c, dt in TABLES[table].items()}
    cols["rank"] = np.zeros(0, np.int32)
    cols["window"] = np.zeros(0, np.int32)
    return cols


def device_properties(attrs: dict[str, Any]) -> list[dict[str, Any]]:
    """The ``device_properties`` entries of a rank's shard attributes (Kineto's ``deviceProperties`` shape); a JSON
    string is decoded, anything that is not a list of objects gives []."""
    props = attrs.get("device_properties")
    if isinstance(props, str):
        try:
            props = json.loads(props)
        except ValueError:
            return []
    return [p for p in props if isinstance(p, dict)] if isinstance(props, list) else []
