"""One rank's events: its shards (every window in the selection) read alone and concatenated. No torch.

    cat = scan_run(run_dir)
    rd = read_rank(cat, 3)                 # RankData: rank 3's tables, on its own recorded clock
    rd.events["ts_ns"], rd.names[rd.events["name_id"]]

Times stay as the rank recorded them (its host's clock): the per-rank analyses need only differences of one rank's
times, and the clock alignment (``clock.ClockModel``) is applied to the compact per-rank results afterwards. The
string table is the rank's own (its windows' tables merged, sorted); process-group indices are the run's global ones
(``RunCatalog.process_groups``). Memory: one rank's events (≈ 60 bytes each), never the run's.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np

from ...errors import BadShardError, ShardFormatError
from ...storage import schema
from ...storage.selection import SkippedShard, strict_error
from ...storage.validate import check_values
from .catalog import RunCatalog, remap_pg

__all__ = ["RankData", "read_rank", "read_shards", "TABLES", "REQUIRED", "columns_wanted", "merge_strings",
           "filter_steps"]

Table = dict[str, np.ndarray]

#: Tables a rank's data holds, in this order.
TABLES = ("events", "comms", "steps", "memory", "threads", "cuda_memory", "cuda_memory_blocks")
#: Columns always read (merging, matching, alignment and step filtering need them).
REQUIRED = {
    "events": ("ts_ns", "dur_ns", "step"),
    "comms": tuple(schema.TABLES["comms"]),
    "steps": ("step", "start_ns", "end_ns"),
    "memory": ("ts_ns", "step"),
    "threads": (),
    "cuda_memory": ("step", "peak_ns"),
    "cuda_memory_blocks": ("step", "ts_ns", "frame_id", "user_frame_id"),
}
#: (table, column) pairs holding ids into the string table.
_NAME_COLUMNS = (("events", "name_id"), ("threads", "name_id"), ("comms", "op_id"),
                 ("cuda_memory_blocks", "frame_id"), ("cuda_memory_blocks", "user_frame_id"))


@dataclass
class RankData:
    """One rank's tables (each with ``rank`` and ``window`` columns; ``comms.row`` indexes ``events``)."""

    rank: int
    names: np.ndarray  # the rank's string table (object array, sorted)
    events: Table
    comms: Table
    steps: Table
    memory: Table
    threads: Table
    cuda_memory: Table
    cuda_memory_blocks: Table
    attrs: dict[str, Any]  # attributes of the rank's first shard
    windows: list[int] = field(default_factory=list)
    samples: dict[tuple[int, int], Table] = field(default_factory=dict)  # (rank, window) -> /clock/samples (leaders)
    cpu_samples: Table | None = None  # the training thread's sampled CPU waits, every window's, by time (analysis.cpuwait)

    def table(self, name: str) -> Table:
        return getattr(self, name)

    @property
    def host(self) -> str:
        return str(self.attrs.get("host", "?"))


def columns_wanted(columns: Mapping[str, Iterable[str] | None] | None) -> dict[str, list[str] | None]:
    """table -> columns to read (None = all), with the REQUIRED ones added; unknown names raise KeyError."""
    want: dict[str, list[str] | None] = {t: None for t in TABLES}
    for t, cols in (columns or {}).items():
        if t not in want:
            raise KeyError(f"columns: unknown table {t!r}; known: {', '.join(TABLES)}")
        if cols is None:
            continue
        cols = list(cols)
        unknown = [c for c in cols if c not in schema.TABLES[t] and c not in ("rank", "window")]
        if unknown:
            raise KeyError(f"columns[{t!r}]: unknown column(s) {', '.join(unknown)}; known: "
                           + ", ".join(schema.TABLES[t]))
        want[t] = [c for c in schema.TABLES[t] if c in set(cols) | set(REQUIRED[t])]
    return want


def merge_strings(names_list: list[np.ndarray]) -> tuple[np.ndarray, list[np.ndarray]]:
    """One sorted string table, and per input table the local→merged id map."""
    lens = [len(n) for n in names_list]
    if sum(lens) == 0:
        return np.zeros(0, dtype=object), [np.zeros(0, np.uint32) for _ in names_list]
    # a dict and a sort of the distinct names: ~15x faster than np.unique on an object array (whose sort compares
    # every pair through Python), the same order
    # interned: every rank's copy of an op name is then one string, whatever holds it (a rank's top ops, the name
    # flags' cache) — at 1,024 ranks the names decoded per rank were a fifth of the summaries' memory
    uniq = [sys.intern(s) if type(s) is str else s
            for s in sorted(dict.fromkeys(s for n in names_list for s in np.asarray(n, dtype=object).tolist()))]
    index = {s: i for i, s in enumerate(uniq)}
    remaps = [np.fromiter((index[s] for s in np.asarray(n, dtype=object).tolist()), np.uint32, len(n))
              for n in names_list]
    return np.array(uniq, dtype=object), remaps


def read_rank(cat: RunCatalog, rank: int, *, columns: Mapping[str, Iterable[str] | None] | None = None,
              skipped: list[SkippedShard] | None = None) -> RankData:
    """Read every selected shard of `rank` (only the columns asked for, see ``columns_wanted``) into one RankData,
    each shard's values checked as read (``storage.validate.check_values``).

    A shard that fails (a damaged chunk, an id or a time out of range) raises BadShardError — or, given a `skipped`
    list and a catalog that is not strict, is appended to it and left out; when every shard of the rank fails,
    RankUnreadable (a BadShardError) is raised."""
    shards = cat.shards_of(rank)
    if not shards:
        raise KeyError(f"rank {rank} has no shard in {cat.run_dir}")
    return read_shards(rank, shards, columns=columns, skipped=skipped, strict=cat.strict, pg_luts=cat.pg_luts)


def read_shards(rank: int, shards: list, *, columns: Mapping[str, Iterable[str] | None] | None = None,
                skipped: list[SkippedShard] | None = None, strict: bool = False,
                pg_luts: Mapping[Any, np.ndarray] | None = None) -> RankData:
    """:func:`read_rank` of the given shards of `rank` (``storage.shard.Shard``: a run's, or one still in memory),
    their process-group indices mapped by `pg_luts` (shard path -> the run's global indices; none: kept)."""
    pg_luts = pg_luts or {}
    want = columns_wanted(columns)
    kept: list = []
    per_shard: list[dict[str, Table]] = []
    names_list: list[np.ndarray] = []
    samples: dict[tuple[int, int], Table] = {}
    cpu: list[Table] = []
    for s in shards:
        leader = s.attrs.get("clock_role") in ("leader", None)
        try:
            tabs, names = s.tables({**want, "cpu/samples": None, **({"clock/samples": None} if leader else {})},
                                   names=True)
            check_values(s.path, s.attrs, {"clock/samples": {}, "cpu/samples": {}, **tabs}, len(names))
        except BadShardError as e:
            if strict:
                raise strict_error(e) from None
            if skipped is None:
                raise
            skipped.append(SkippedShard(Path(e.path), e.reason))
            continue
        sm = tabs.pop("clock/samples", None)
        cs = tabs.pop("cpu/samples", None)
        if cs is not None and len(cs.get("t_ns", ())):
            cpu.append(cs)
        kept.append(s)
        per_shard.append(tabs)
        names_list.append(names)
        if sm is not None and len(sm["phase"]):
            samples[(s.rank, s.window)] = sm
    if not kept:
        raise RankUnreadable(shards[0].path, f"every shard of rank {rank} failed its checks")
    names, remaps = merge_strings(names_list)
    tables = _concat(kept, per_shard, remaps, [pg_luts.get(s.path) for s in kept])
    cpu_samples = {c: np.concatenate([t[c] for t in cpu]) for c in cpu[0]} if cpu else None
    return RankData(rank=rank, names=names, attrs=kept[0].attrs, windows=[s.window for s in kept],
                    samples=samples, cpu_samples=cpu_samples, **tables)


def read_ranks(cat: RunCatalog, ranks: Iterable[int], *, columns: Mapping[str, Iterable[str] | None] | None = None
               ) -> tuple[list[RankData], list[SkippedShard]]:
    """read_rank for each rank, bad shards left out and returned (``catalog.with_read_skips`` records them)."""
    out, skipped = [], []
    for r in ranks:
        try:
            out.append(read_rank(cat, r, columns=columns, skipped=skipped))
        except RankUnreadable:
            continue
    return out, skipped


class RankUnreadable(BadShardError):
    """Every shard of a rank failed its checks (each is in the caller's ``skipped`` list)."""


def _concat(shards, per_shard: list[dict[str, Table]], remaps, pg_luts) -> dict[str, Table]:
    out: dict[str, Table] = {}
    ev_offset = 0
    fixed: list[dict[str, Table]] = []
    for s, tabs, remap, lut in zip(shards, per_shard, remaps, pg_luts):
        tabs = {t: dict(c) for t, c in tabs.items()}
        n_ev = len(tabs["events"]["ts_ns"])
        for t, col in _NAME_COLUMNS:
            if col in tabs[t] and len(tabs[t][col]):
                ids = tabs[t][col]
                if int(ids.max()) >= len(remap):
                    raise ShardFormatError(
                        f"{s.path}: {t}/{col} {int(ids.max())} is outside the string table ({len(remap)} names); "
                        "the shard is damaged, re-run the capture")
                tabs[t][col] = remap[ids]
        rows = tabs["comms"]["row"]
        if len(rows) and (rows.min() < 0 or rows.max() >= n_ev):
            raise ShardFormatError(f"{s.path}: comms/row outside events (0..{n_ev - 1}); the shard is damaged")
        tabs["comms"]["row"] = rows.astype(np.int64) + ev_offset
        tabs["comms"]["pg"] = remap_pg(tabs["comms"]["pg"], lut)
        if "pg" in tabs["threads"]:
            tabs["threads"]["pg"] = remap_pg(tabs["threads"]["pg"], lut)
        for t in TABLES:
            n = len(next(iter(tabs[t].values()))) if tabs[t] else 0
            tabs[t]["rank"] = np.full(n, s.rank, dtype=np.int32)
            tabs[t]["window"] = np.full(n, s.window, dtype=np.int32)
        ev_offset += n_ev
        fixed.append(tabs)
    for t in TABLES:
        cols = fixed[0][t].keys()
        out[t] = {c: np.concatenate([f[t][c] for f in fixed]) for c in cols}
    return out


def filter_steps(tables: Mapping[str, Table], lo: int, hi: int) -> dict[str, Table]:
    """Rows of steps lo..hi only (events outside every step, step −1, go too); ``comms.row`` follows its events.
    Threads are kept. Returns new tables (the inputs are not changed)."""
    out = dict(tables)
    ev = tables["events"]
    keep = (ev["step"] >= lo) & (ev["step"] <= hi)
    new_row = np.cumsum(keep) - 1
    out["events"] = {c: v[keep] for c, v in ev.items()}
    cm = tables["comms"]
    ck = keep[cm["row"]] if len(cm["row"]) else np.zeros(0, bool)
    cm = {c: v[ck] for c, v in cm.items()}
    cm["row"] = new_row[cm["row"]].astype(np.int64)
    out["comms"] = cm
    for t in ("steps", "memory", "cuda_memory", "cuda_memory_blocks"):
        tab = tables[t]
        k = (tab["step"] >= lo) & (tab["step"] <= hi)
        out[t] = {c: v[k] for c, v in tab.items()}
    return out
