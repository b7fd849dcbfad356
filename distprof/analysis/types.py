"""The data the analysis stages hand each other: plain data objects, no torch, no I/O, nothing from the rest of
``distprof.analysis`` (the import-layer test keeps it so).

* :class:`RankSummary` — one rank, summarised (``rank.summary.summarize_rank``): the map's output.
* :class:`RunSummary` — every rank's summary joined on one clock (``align.reduce.reduce_run``): what every
  cross-rank analysis takes.
* :class:`HostClock` — how one host's clock maps onto the reference clock.
* :class:`P2PPairs` — matched point-to-point transfers (``align.p2p.match_p2p``).
* :class:`MergedRun` — every event of every rank merged into one table (``summarize.merged.load_run``: small runs,
  notebooks, the timeline and the export). Tables are dicts of equal-length numpy columns ("column tables"); all
  times are **aligned** to the reference rank's clock (int64 epoch ns).
* :class:`FindingRules` — the thresholds of the findings rules (read by the per-rank measures and the rules).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

import numpy as np

from ..storage.schema import TABLES

if TYPE_CHECKING:
    from .align.clock import ClockModel
    from .rank.gpu_time import GpuTime
    from .rank.measures import RankMeasures
    from .align.matching import Collectives
    from .load.catalog import RunCatalog

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


@dataclass
class P2PPairs:
    """Matched transfers (columns of equal length, aligned times) and what could not be matched."""

    window: np.ndarray
    pg: np.ndarray
    src: np.ndarray  # sender's global rank
    dst: np.ndarray  # receiver's global rank
    send_start_ns: np.ndarray
    send_end_ns: np.ndarray
    recv_start_ns: np.ndarray
    recv_end_ns: np.ndarray
    send_step: np.ndarray
    recv_step: np.ndarray
    bytes: np.ndarray
    n_sends: int = 0
    n_recvs: int = 0
    n_unmatched: int = 0  # sends or receives without a partner row inside their window (a rank missing, a lost row)
    n_edge: int = 0  # unmatched rows that are the first or last of their (sender, receiver) in a window: the peer
    # recorded that transfer just before its window began or after it ended
    n_unknown_peer: int = 0  # rows whose peer is not known and cannot be inferred
    examples: list[str] = field(default_factory=list)
    send_row: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # the send's row in its rank's
    recv_row: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # events (ev_row); −1 where unknown

    def __len__(self) -> int:
        return int(self.src.size)

    @property
    def recv_wait_ns(self) -> np.ndarray:
        return np.maximum(self.send_start_ns - self.recv_start_ns, 0)

    @property
    def send_wait_ns(self) -> np.ndarray:
        return np.maximum(self.recv_start_ns - self.send_start_ns, 0)

    @classmethod
    def empty(cls) -> "P2PPairs":
        """No transfer (a run without point-to-point communication)."""
        z = np.zeros(0, np.int64)
        return cls(*(z.copy() for _ in range(11)))


@dataclass
class RankSummary:
    """One rank's compact results (see the module docstring). Picklable: MPI processes send these to rank 0."""

    rank: int
    host: str
    windows: list[int]
    device_rank: bool
    steps: Table  # breakdown columns (breakdown.BREAKDOWN_COLUMNS), recorded clock
    collectives: Table  # window, pg, seq, op, bytes, start_ns, end_ns, step, ev_row; in a RunSummary: views of the
    #                     rank's rows of RunSummary.collective_rows (raw times, windows the clock left out dropped)
    ops_names: np.ndarray  # names indexed by collectives["op"] (object array); in a RunSummary: RunSummary.names
    op_totals: Table  # name (index into op_names), step, dur_ms (own work), self_ms (outside nested events), calls
    op_names: np.ndarray  # names indexed by op_totals["name"]
    op_kinds: list[str]  # kind of each op name
    annotations: dict[str, tuple[float, float]]  # name -> (total ms, calls) in the rank's steps
    measures: RankMeasures | None
    gpu_time: GpuTime | None
    used_devices: list[int]
    reserved_peak_bytes: float | None
    memory_series: dict[int, tuple[np.ndarray, np.ndarray]]  # window -> (ts_ns, total bytes), one device
    memory_device: int
    samples: dict[tuple[int, int], Table] = field(default_factory=dict)
    n_events: int = 0
    t_min: dict[int, int] = field(default_factory=dict)  # window -> earliest event or memory time (recorded clock)
    p2p: Table = field(default_factory=dict)  # point-to-point transfers (p2p_rows), before the steps selection
    unlaunched: tuple[int, float] = (0, 0.0)  # device events whose launch is not in the trace: count, ms
    after_last_step: dict[int, float] = field(default_factory=dict)  # window -> ms of work after its last step


class Released:
    """Stands in for a table of a :class:`RunSummary` that its last reader is done with (``RunSummary.release_rows``,
    ``release_memory_curves``): any later read is a programming error, and says so instead of reading an empty
    table."""

    __slots__ = ("what",)

    def __init__(self, what: str) -> None:
        self.what = what

    def _fail(self, *_args: Any) -> Any:
        raise RuntimeError(f"{self.what} was released once its last reader was done (RunSummary.release_rows / "
                           f"release_memory_curves): read it before build_report lets it go")

    __getitem__ = __iter__ = __len__ = __contains__ = _fail

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):  # probes (copy, pickle, numpy, IPython's display hooks) ask with a default
            raise AttributeError(name)
        return self._fail()

    def __repr__(self) -> str:
        return f"Released({self.what!r})"


@dataclass
class RunSummary:
    """All ranks of one run, summarised and aligned (see the module docstring)."""

    run_id: str
    world_size: int
    ranks_present: list[int]
    ranks_missing: list[int]
    hosts: dict[int, str]  # rank -> host (ranks in the selection)
    attrs: dict[int, dict[str, Any]]  # rank -> attributes of its first shard
    process_groups: list[dict[str, Any]]
    ranks: dict[int, RankSummary]
    steps: Table  # breakdown of every rank (BREAKDOWN_COLUMNS), aligned start/end, sorted by (rank, start)
    collective_rows: Table  # every rank's executed collectives: rank, window, pg, seq, op_id, bytes, start/end, step,
    # ev_row (row in the rank's events, before any steps selection)
    names: np.ndarray  # op names of collective_rows["op_id"]
    collectives: Collectives  # matched instances, aligned member times
    clock: dict[str, HostClock]
    model: ClockModel
    warnings: list[str] = field(default_factory=list)
    device_peak_tflops: dict[int, float] = field(default_factory=dict)  # rank -> peak, where known
    steps_selection: tuple[int, int] | None = None
    rules: Any = None  # the FindingRules the measures were taken with (None: defaults)
    catalog: RunCatalog | None = field(default=None, repr=False)
    p2p: P2PPairs = field(default_factory=P2PPairs.empty)  # matched sends/receives, aligned

    @property
    def device_rank_set(self) -> set[int]:
        return {r for r, s in self.ranks.items() if s.device_rank}

    @cached_property
    def ranks_with_collectives(self) -> frozenset[int]:
        """The ranks that executed a collective (kept when the rows are released)."""
        return frozenset(r for r, s in self.ranks.items() if len(s.collectives["seq"]))

    def release_rows(self) -> None:
        """Let the per-row collective and transfer tables go — the joined collective rows, the matched instances and
        members, each rank's views of its rows and its transfer rows — once the step graph and every analysis that
        reads them are done. The owner of the run calls it (``build_report(..., release=True)``): at 1,024
        LLM-shaped ranks they are 170 MB of the 370 held under the what-ifs. The matched transfer pairs
        (``p2p``) stay."""
        _ = self.ranks_with_collectives  # the one fact read after the rows, kept
        self.collective_rows = Released("RunSummary.collective_rows")  # type: ignore[assignment]
        self.collectives = Released("RunSummary.collectives")  # type: ignore[assignment]
        for s in self.ranks.values():
            s.collectives = Released(f"rank {s.rank}'s collectives")  # type: ignore[assignment]
            s.p2p = Released(f"rank {s.rank}'s p2p rows")  # type: ignore[assignment]

    def release_memory_curves(self) -> None:
        """Let each rank's memory curve go once the memory timeline is drawn from it (33 MB at 1,024 LLM-shaped
        ranks, otherwise held under every other analysis)."""
        for s in self.ranks.values():
            s.memory_series = Released(f"rank {s.rank}'s memory_series")  # type: ignore[assignment]

    @property
    def skipped_shards(self) -> list:
        """storage.selection.SkippedShard of every shard left out (bad, another run's, a copy), and why."""
        return list(self.catalog.skipped) if self.catalog is not None else []

    @property
    def has_memory_history(self) -> bool:
        return any(s.measures is not None and s.measures.history is not None for s in self.ranks.values())


@dataclass(frozen=True)
class FindingRules:
    """Thresholds of the rules (each documented in its rule's module, see ``distprof.analysis.findings``)."""

    high_pct: float = 25.0
    medium_pct: float = 10.0
    tiny_op_us: float = 100.0
    tiny_min_share_pct: float = 50.0
    tiny_min_per_step: float = 100.0
    tiny_min_step_pct: float = 10.0
    input_min_step_pct: float = 10.0
    input_min_ms: float = 0.5
    cpu_wait_min_step_pct: float = 10.0
    cpu_wait_min_ms: float = 1.0
    churn_min_allocs_per_ms: float = 20.0
    churn_min_allocs_per_step: float = 500.0
    churn_min_turnover: float = 8.0
    churn_min_alloc_mib: float = 64.0
    swing_min_pct: float = 50.0
    swing_min_mib: float = 64.0
    frag_min_ratio: float = 1.5  # memory_churn with --memory-history: reserved peak / allocated peak
    frag_min_mib: float = 1024.0  # ... and reserved - allocated
    exposed_min_pct: float = 10.0
    idle_min_step_pct: float = 10.0
    idle_min_ms: float = 0.5
    sync_min_per_step: float = 1.0
    sync_min_step_pct: float = 5.0
    host_min_fraction: float = 0.75
    pipeline_min_pct: float = 10.0
    pipeline_imbalance_pct: float = 15.0
    max_per_rule: int = 8

    def severity(self, impact_pct: float) -> str:
        return "high" if impact_pct >= self.high_pct else "medium" if impact_pct >= self.medium_pct else "low"


@dataclass
class RankClockInfo:
    """What the clock model needs to know about one rank (from its shards' attributes)."""

    rank: int
    host: str
    role: str | None = None  # reference / leader / member / None (unknown)
    leader: int | None = None
    reference: int | None = None
