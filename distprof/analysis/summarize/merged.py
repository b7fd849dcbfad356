"""Every event of every rank in one clock-aligned MergedRun — for small runs and interactive work. No torch.

    run = load_run("distprof/<run-id>")              # all windows
    run = load_run(path, steps=(10, 19))             # only global steps 10..19 (inclusive)
    run = load_run(path, columns={"events": ["name_id", "ts_ns", "dur_ns", "tid"]})

Memory grows with ranks × events: the analyses and ``distprof report`` use the bounded per-rank path instead
(``distprof.load`` → ``engine.summarize``). Steps: scan the shards (``catalog.scan_run``) → read each rank
(``rankdata.read_rank``) → match the collectives and build the clock model exactly as the summaries do
(``align.reduce.join``) → one string table, ``comms.row`` pointing into the merged events → align every time
column → filter steps → sort events by (rank, ts_ns).
"""

from __future__ import annotations

import logging
import os
from typing import Iterable, Mapping

import numpy as np

from ...errors import IncompleteRunError
from ..align.matching import Collectives, match_collectives
from ..align.reduce import Joined, join
from ..align.rows import joined
from ..load.catalog import RunCatalog, scan_run, with_read_skips
from ..load.rankdata import (
    REQUIRED,
    TABLES,
    RankData,
    filter_steps,
    merge_strings,
    read_rank,
    read_ranks,
)
from ..rank.summary import collective_rows
from ..types import MergedRun

log = logging.getLogger(__name__)

__all__ = ["load_run", "rank_merged", "match_run", "TABLES", "REQUIRED"]

Table = dict[str, np.ndarray]


def _concat_ranks(rds: list[RankData], remaps: list[np.ndarray]) -> dict[str, Table]:
    """Every table of the ranks `rds` concatenated, their string ids remapped into the merged table (`remaps`, one
    per rank) and ``comms.row`` pointing into the merged events."""
    ev_offset = 0
    fixed = []
    for rd, remap in zip(rds, remaps):
        tabs = {t: dict(rd.table(t)) for t in TABLES}
        for t, col in (("events", "name_id"), ("threads", "name_id"), ("comms", "op_id"),
                       ("cuda_memory_blocks", "frame_id"), ("cuda_memory_blocks", "user_frame_id")):
            if col in tabs[t] and len(tabs[t][col]):
                tabs[t][col] = remap[tabs[t][col]]
        tabs["comms"]["row"] = tabs["comms"]["row"] + ev_offset
        ev_offset += len(tabs["events"]["ts_ns"])
        fixed.append(tabs)
    return {t: {c: np.concatenate([f[t][c] for f in fixed]) for c in fixed[0][t]} for t in TABLES}


def _merged(cat: RunCatalog, j: Joined, names: np.ndarray, tables: dict[str, Table]) -> MergedRun:
    """The MergedRun of the catalogue `cat`, the join `j` (clock model, warnings) and the merged `tables`."""
    return MergedRun(
        run_id=cat.run_id,
        world_size=cat.world_size,
        ranks_present=list(cat.ranks),
        ranks_missing=list(cat.ranks_missing),
        hosts=cat.hosts,
        names=names,
        events=tables["events"],
        comms=tables["comms"],
        steps=tables["steps"],
        memory=tables["memory"],
        threads=tables["threads"],
        cuda_memory=tables["cuda_memory"],
        cuda_memory_blocks=tables["cuda_memory_blocks"],
        clock=j.model.hosts,
        attrs=dict(sorted(cat.first_attrs.items())),
        process_groups=cat.process_groups,
        warnings=j.warnings,
        skipped_shards=list(cat.skipped),
    )


def load_run(
    run_dir: str | os.PathLike,
    *,
    steps: tuple[int, int] | None = None,
    progress: bool | None = None,
    columns: Mapping[str, Iterable[str] | None] | None = None,
    strict: bool = False,
) -> MergedRun:
    """Read every shard of `run_dir` and merge them into one clock-aligned MergedRun.

    steps: keep only global steps ``lo..hi`` (inclusive): shards outside are not read; rows whose ``step`` is outside
        (including −1, outside every step) are dropped; threads are kept.
    progress: True forces a tqdm bar, False hides it, None shows it for >= 16 shards when stderr is a terminal.
    columns: table -> columns to read (None = all). Tables not named are read in full; the columns merging needs
        (see REQUIRED) are always read.

    strict: any bad shard (storage.validate), shard of another run, missing rank or missing window is an error
        (BadShardError / IncompleteRunError) instead of a warning.

    Every shard is checked before use (``catalog.scan_run``, ``rankdata.read_rank``): a bad one, or one of another
    run, is left out and named in ``MergedRun.warnings`` and ``MergedRun.skipped_shards``; missing ranks or windows are
    named in the warnings; loading carries on. Raises IncompleteRunError when there is nothing to load.
    """
    cat = scan_run(run_dir, steps=steps, progress=progress, strict=strict)
    rds, skipped = read_ranks(cat, cat.ranks_read, columns=columns)
    if not rds:
        raise IncompleteRunError(f"{run_dir}: no readable shard ({len(skipped)} skipped, first "
                                 f"{skipped[0].path}: {skipped[0].reason})")
    cat = with_read_skips(cat, skipped, {rd.rank for rd in rds})
    parts = []
    for rd in rds:
        rows, ops = collective_rows(rd)
        parts.append((rd.rank, rows, ops))
    j = join(cat, *joined(parts), {k: v for rd in rds for k, v in rd.samples.items()})
    names, remaps = merge_strings([rd.names for rd in rds])
    tables = _concat_ranks(rds, remaps)
    _align(tables, j.model)
    if steps is not None:
        tables = filter_steps(tables, int(steps[0]), int(steps[1]))
    _sort_events(tables)
    return _merged(cat, j, names, tables)


def rank_merged(run, rank: int, *, columns: Mapping[str, Iterable[str] | None] | None = None
                ) -> tuple[MergedRun, np.ndarray]:
    """One rank of a summarised run (``types.RunSummary``) as a MergedRun on the aligned clock, with the run's
    steps selection applied — what the timeline and the export stream, rank by rank — and, per event row, its row
    in the rank's unfiltered events (``summary.collective_rows``' ``ev_row``)."""
    cat = run.catalog
    rd = read_rank(cat, rank, columns=columns)
    tables = {t: dict(rd.table(t)) for t in TABLES}
    n = len(tables["events"]["ts_ns"])
    tables["events"]["_orig"] = np.arange(n, dtype=np.int64)
    _align(tables, run.model)
    if run.steps_selection is not None:
        tables = filter_steps(tables, *run.steps_selection)
    _sort_events(tables)
    orig = tables["events"].pop("_orig")
    return MergedRun(
        run_id=run.run_id, world_size=run.world_size, ranks_present=list(run.ranks_present),
        ranks_missing=list(run.ranks_missing), hosts=run.hosts, names=rd.names, events=tables["events"],
        comms=tables["comms"], steps=tables["steps"], memory=tables["memory"], threads=tables["threads"],
        cuda_memory=tables["cuda_memory"], cuda_memory_blocks=tables["cuda_memory_blocks"], clock=run.clock,
        attrs=run.attrs, process_groups=run.process_groups, warnings=run.warnings), orig


def match_run(run: MergedRun, *, max_reports: int = 200) -> Collectives:
    """Match the collectives of a MergedRun (times already aligned); members' ``row`` indexes ``run.events``."""
    from ...storage.schema import ROLE_EXEC

    cm = run.comms
    sel = np.flatnonzero(np.asarray(cm["role"]) == ROLE_EXEC)
    ev_row = np.asarray(cm["row"], np.int64)[sel]
    start = np.asarray(run.events["ts_ns"], np.int64)[ev_row]
    rows = {"rank": np.asarray(cm["rank"])[sel], "window": np.asarray(cm["window"])[sel],
            "pg": np.asarray(cm["pg"])[sel], "seq": np.asarray(cm["seq"])[sel],
            "nccl_seq": np.asarray(cm["nccl_seq"])[sel] if "nccl_seq" in cm else np.full(sel.size, -1, np.int64),
            "op_id": np.asarray(cm["op_id"])[sel], "bytes": np.asarray(cm["bytes"])[sel],
            "start_ns": start, "end_ns": start + np.asarray(run.events["dur_ns"], np.int64)[ev_row]}
    group_ranks = {}
    for i, g in enumerate(run.process_groups or []):
        ranks = g.get("ranks") if isinstance(g, dict) else None
        if ranks:
            group_ranks[int(g.get("index", i))] = [int(r) for r in ranks]
    out = match_collectives(rows, names=run.names, group_ranks=group_ranks or None, max_reports=max_reports)
    out.members["row"] = ev_row[out.members["row"]]  # into run.events
    return out


# ---- alignment, sorting ----------------------------------------------------------------------------------------------


def _align(tables: dict[str, Table], model) -> None:
    for t, cols in (("events", ("ts_ns",)), ("steps", ("start_ns", "end_ns")), ("memory", ("ts_ns",)),
                    ("cuda_memory", ("peak_ns",)), ("cuda_memory_blocks", ("ts_ns",))):
        tab = tables[t]
        for c in cols:
            if c in tab and len(tab[c]):
                tab[c] = model.align(tab["rank"], tab["window"], tab[c])


def _sort_events(tables: dict[str, Table]) -> None:
    """Sort events by (rank, ts_ns) (stable), remapping comms.row; comms end up sorted by row."""
    ev = tables["events"]
    rank, ts = ev["rank"], ev["ts_ns"]
    if len(ts) > 1:
        ordered = (rank[1:] > rank[:-1]) | ((rank[1:] == rank[:-1]) & (ts[1:] >= ts[:-1]))
        if not ordered.all():
            order = np.lexsort((ts, rank))
            inv = np.empty_like(order)
            inv[order] = np.arange(len(order))
            tables["events"] = {c: v[order] for c, v in ev.items()}
            tables["comms"]["row"] = inv[tables["comms"]["row"]].astype(np.int64)
    cm = tables["comms"]
    if len(cm["row"]) > 1 and not (np.diff(cm["row"]) >= 0).all():
        o = np.argsort(cm["row"], kind="stable")
        tables["comms"] = {c: v[o] for c, v in cm.items()}
