"""Load a run directory into one MergedRun: every shard, checked, merged, clock-aligned. No torch.

    run = load_run("distprof/<run-id>")              # all windows
    run = load_run(path, steps=(10, 19))             # only global steps 10..19 (inclusive)
    run = load_run(path, columns={"events": ["name_id", "ts_ns", "dur_ns", "tid"]})

Steps: find and open every shard (attributes only) → check they belong together (run_id, world_size, schedule) →
name missing ranks/shards → read the needed columns → merge the string tables (np.unique + remap arrays) and the
process-group lists → concatenate with ``rank``/``window`` columns, ``comms.row`` pointing into the merged events →
match collectives on raw times → build the clock model (clock.py) and align every time column → filter steps → sort
events by (rank, ts_ns).
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from ..errors import BadShardError, IncompleteRunError
from ..progress import progress_enabled
from ..storage import schema
from ..storage.reader import Shard, find_shards, read_status
from ..storage.selection import SkippedShard, select_shards, strict_error
from ..storage.validate import check_values
from .clock import ClockModel, RankClockInfo, estimate_clocks
from .matching import match_collectives
from .model import MergedRun
from .names import rank_ranges

log = logging.getLogger(__name__)

Table = dict[str, np.ndarray]

#: Tables merged into MergedRun, in this order.
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
#: Shards from this many on get a progress bar (when stderr is a terminal).
PROGRESS_MIN_SHARDS = 16


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

    strict: any bad shard (storage.validate.check_shard), shard of another run, missing rank or missing window is an
        error (BadShardError / IncompleteRunError) instead of a warning.

    Every shard is checked before use (storage.validate, storage.selection): a bad one, or one of another run
    (run_id / job / world_size / schedule differ from the majority's), is left out and named in
    ``MergedRun.warnings`` and ``MergedRun.skipped_shards``; missing ranks or windows are named in the warnings;
    loading carries on. Raises IncompleteRunError when there is nothing to load.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise IncompleteRunError(f"{run_dir}: no such run directory; pass the <out>/<run-id> folder the capture wrote")
    paths = find_shards(run_dir)
    if not paths:
        raise IncompleteRunError(
            f"{run_dir}: no shard files (rank*.w*.h5); pass the <out>/<run-id> folder, or check the capture's "
            "status files for errors")
    if steps is not None:
        lo, hi = int(steps[0]), int(steps[1])
        if lo > hi:
            raise ValueError(f"steps=({lo}, {hi}): the first step must not be after the last")

    show = progress_enabled(progress, len(paths), PROGRESS_MIN_SHARDS)
    sel = select_shards(_bar(paths, show, "checking shards"), strict=strict)
    shards, skipped = sel.shards, list(sel.skipped)
    world_size = sel.world_size
    warnings: list[str] = list(sel.warnings)

    listed = shards
    if steps is not None:
        kept = [s for s in shards if _overlaps(s, lo, hi)]
        if not kept:
            spans = sorted({(int(s.attrs["first_step"]), int(s.attrs["last_step"])) for s in shards})
            raise IncompleteRunError(
                f"{run_dir}: no window covers steps {lo}..{hi} (recorded: "
                + ", ".join(f"{a}..{b}" for a, b in spans) + "); pick steps inside a recorded window")
        shards = kept

    shards, per_shard, names_list, samples = _read(_bar(shards, show, "reading shards"), _columns(columns), strict,
                                                   skipped, warnings)
    if not shards:
        raise IncompleteRunError(f"{run_dir}: no readable shard ({len(skipped)} skipped, first "
                                 f"{skipped[0].path}: {skipped[0].reason})")
    lost = {sk.path for sk in skipped}

    all_ranks = sorted({s.rank for s in listed if s.path not in lost})
    ranks_missing = sorted(set(range(world_size)) - set(all_ranks))
    if ranks_missing:
        warnings.append(_missing_ranks_message(run_dir, ranks_missing, world_size))
        if strict:
            raise IncompleteRunError(f"{run_dir}: {warnings[-1]} (--strict: every rank needs a shard)")
    _note_shard_problems([s for s in listed if s.path not in lost], warnings)
    if _note_missing_windows(shards, warnings) and strict:
        raise IncompleteRunError(f"{run_dir}: {warnings[-1]} (--strict: every rank needs every window)")

    names, remaps = _merge_strings(names_list)
    process_groups, pg_maps = _merge_process_groups(shards)
    tables = _concat(shards, per_shard, remaps, pg_maps)

    events, comms = tables["events"], tables["comms"]
    ranks_by_window: dict[int, list[int]] = {}
    for s in shards:
        ranks_by_window.setdefault(s.window, []).append(s.rank)
    group_ranks = {int(g["index"]): g["ranks"] for g in process_groups if g.get("ranks")}
    matched = match_collectives(comms, events, names=names, group_ranks=group_ranks or None,
                                ranks_by_window=ranks_by_window)

    first_attrs: dict[int, dict[str, Any]] = {}
    for s in shards:
        first_attrs.setdefault(s.rank, s.attrs)
    infos = {r: _clock_info(r, a) for r, a in first_attrs.items()}
    model = estimate_clocks(infos, samples, matched, names=names)
    warnings.extend(model.warnings)
    _align(tables, model)

    if matched.n_mismatched:
        warnings.append(f"{matched.n_mismatched} collective instance(s) disagree across ranks on op or size "
                        f"(capture mismatch or a rank skipped a collective); first: {matched.mismatches[0]['message']}")
    if matched.n_incomplete:
        warnings.append(f"{matched.n_incomplete} collective instance(s) missing on some ranks of their group; "
                        f"first: {matched.incomplete[0]['message']}")

    if steps is not None:
        _filter_steps(tables, lo, hi)
    _sort_events(tables)

    for w in warnings:
        log.warning("%s", w)
    return MergedRun(
        run_id=str(shards[0].attrs["run_id"]),
        world_size=world_size,
        ranks_present=all_ranks,
        ranks_missing=ranks_missing,
        hosts={r: str(a["host"]) for r, a in sorted(first_attrs.items())},
        names=names,
        events=tables["events"],
        comms=tables["comms"],
        steps=tables["steps"],
        memory=tables["memory"],
        threads=tables["threads"],
        cuda_memory=tables["cuda_memory"],
        cuda_memory_blocks=tables["cuda_memory_blocks"],
        clock=model.hosts,
        attrs=dict(sorted(first_attrs.items())),
        process_groups=process_groups,
        warnings=warnings,
        skipped_shards=skipped,
    )


# ---- shards: progress, consistency, gaps ---------------------------------------------------------------------------


def _bar(items: Sequence, show: bool, desc: str):
    if not show:
        return items
    from tqdm import tqdm

    return tqdm(items, desc=desc, unit="shard", file=sys.stderr, leave=False)


def _read(shards: Iterable[Shard], want: dict[str, list[str] | None], strict: bool, skipped: list[SkippedShard],
          warnings: list[str]):
    """Each shard's tables, string table and clock samples, their values checked (storage.validate.check_values; the
    attributes and layout were checked when the shard was opened). A shard that fails is left out: named in
    `skipped` and `warnings`, or (strict) raised. Returns (shards read, their tables, their strings, samples)."""
    readable: list[Shard] = []
    per_shard: list[dict[str, Table]] = []
    names_list: list[np.ndarray] = []
    samples: dict[tuple[int, int], Table] = {}
    for s in shards:
        try:
            tabs = {t: s.table(t, want[t]) for t in TABLES}
            names = s.names
            clock_tab = s.table("clock/samples") if s.attrs.get("clock_role") in ("leader", None) \
                and s.has("clock/samples") else None
            check_values(s.path, s.attrs, {**tabs, "clock/samples": clock_tab or {}}, len(names))
        except BadShardError as e:  # a damaged data chunk, an id or a time out of range
            if strict:
                raise strict_error(e) from None
            skipped.append(SkippedShard(Path(e.path), e.reason))
            warnings.append(f"skipped {e.path}: {e.reason}")
            continue
        readable.append(s)
        per_shard.append(tabs)
        names_list.append(names)
        if clock_tab is not None and len(clock_tab["phase"]):
            samples[(s.rank, s.window)] = clock_tab
    return readable, per_shard, names_list, samples


def _missing_ranks_message(run_dir: Path, missing: list[int], world_size: int) -> str:
    msg = f"rank(s) {rank_ranges(missing, sep=',')} of 0..{world_size - 1} have no shard: their data is absent from every analysis"
    status = read_status(run_dir)
    notes = []
    for r in missing:
        errs = (status.get(r) or {}).get("errors") or []
        if errs:
            e = errs[-1]
            notes.append(f"rank {r}: {e.get('stage', '?')}: {e.get('message', e)}" if isinstance(e, dict)
                         else f"rank {r}: {e}")
    if notes:
        msg += " (" + "; ".join(notes[:3]) + ")"
    return msg


def _note_shard_problems(shards: list[Shard], warnings: list[str]) -> None:
    cut = [s for s in shards if s.attrs.get("complete") is False]
    if cut:
        warnings.append("window(s) cut short (the script ended mid-window): "
                        + ", ".join(f"rank {s.rank} window {s.window}" for s in cut[:8])
                        + (f" and {len(cut) - 8} more" if len(cut) > 8 else ""))
    errs = {}
    for s in shards:
        e = s.attrs.get("errors") or []
        if e:
            errs[s.rank] = e[-1]
    if errs:
        items = list(errs.items())[:3]
        warnings.append("capture errors recorded on rank(s) " + rank_ranges(errs, sep=',') + ": " + "; ".join(
            f"rank {r}: {e.get('stage', '?')}: {e.get('message', '')}" if isinstance(e, dict) else f"rank {r}: {e}"
            for r, e in items))


def _note_missing_windows(shards: list[Shard], warnings: list[str]) -> int:
    """Name each window some ranks lack; returns how many windows do."""
    ranks = sorted({s.rank for s in shards})
    have: dict[int, set[int]] = {}
    for s in shards:
        have.setdefault(s.window, set()).add(s.rank)
    n = 0
    for w in sorted(have):
        lack = [r for r in ranks if r not in have[w]]
        if lack:
            n += 1
            warnings.append(f"window {w}: rank(s) {rank_ranges(lack, sep=',')} have no shard for it (lost or still being written)")
    return n


def _overlaps(s: Shard, lo: int, hi: int) -> bool:
    return int(s.attrs["first_step"]) <= hi and int(s.attrs["last_step"]) >= lo


def _columns(columns: Mapping[str, Iterable[str] | None] | None) -> dict[str, list[str] | None]:
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
        keep = [c for c in schema.TABLES[t] if c in set(cols) | set(REQUIRED[t])]
        want[t] = keep
    return want


# ---- merging ---------------------------------------------------------------------------------------------------------


def _merge_strings(names_list: list[np.ndarray]) -> tuple[np.ndarray, list[np.ndarray]]:
    """One sorted global string table, and per shard the local→global id map."""
    lens = [len(n) for n in names_list]
    if sum(lens) == 0:
        return np.zeros(0, dtype=object), [np.zeros(0, np.uint32) for _ in names_list]
    allnames = np.concatenate([np.asarray(n, dtype=object) for n in names_list])
    uniq, inv = np.unique(allnames, return_inverse=True)
    bounds = np.cumsum([0] + lens)
    remaps = [inv[bounds[i]:bounds[i + 1]].astype(np.uint32) for i in range(len(names_list))]
    return uniq.astype(object), remaps


def _merge_process_groups(shards: list[Shard]) -> tuple[list[dict[str, Any]], list[np.ndarray | None]]:
    """Union of the shards' process-group lists, keyed by pg name; per shard the local→global index map."""
    glob: list[dict[str, Any]] = []
    by_key: dict[str, int] = {}
    maps: list[np.ndarray | None] = []
    for s in shards:
        pgs = s.attrs.get("process_groups")
        if not isinstance(pgs, list) or not pgs:
            maps.append(None)
            continue
        lut = np.full(max(int(g.get("index", i)) for i, g in enumerate(pgs)) + 1, -1, dtype=np.int32)
        for i, g in enumerate(pgs):
            key = str(g.get("name", g.get("index", i)))
            if key not in by_key:
                by_key[key] = len(glob)
                glob.append({"index": len(glob), "name": g.get("name", key), "desc": g.get("desc", ""),
                             "backend": g.get("backend", ""), "ranks": list(g.get("ranks") or [])})
            lut[int(g.get("index", i))] = by_key[key]
        maps.append(lut)
    return glob, maps


def _remap_pg(pg: np.ndarray, lut: np.ndarray | None) -> np.ndarray:
    if lut is None or len(pg) == 0:
        return pg
    ok = (pg >= 0) & (pg < len(lut))
    out = pg.copy()
    out[ok] = lut[pg[ok]]
    return out


def _concat(shards: list[Shard], per_shard: list[dict[str, Table]], remaps, pg_maps) -> dict[str, Table]:
    out: dict[str, Table] = {}
    ev_offset = 0
    fixed: list[dict[str, Table]] = []
    for s, tabs, remap, lut in zip(shards, per_shard, remaps, pg_maps):
        tabs = {t: dict(c) for t, c in tabs.items()}
        n_ev = len(tabs["events"]["ts_ns"])
        for t, col in (("events", "name_id"), ("threads", "name_id"), ("comms", "op_id"),
                       ("cuda_memory_blocks", "frame_id"), ("cuda_memory_blocks", "user_frame_id")):
            if col in tabs[t] and len(tabs[t][col]):  # in range: storage.validate.check_values
                tabs[t][col] = remap[tabs[t][col]]
        tabs["comms"]["row"] = tabs["comms"]["row"].astype(np.int64) + ev_offset
        tabs["comms"]["pg"] = _remap_pg(tabs["comms"]["pg"], lut)
        if "pg" in tabs["threads"]:
            tabs["threads"]["pg"] = _remap_pg(tabs["threads"]["pg"], lut)
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


def _clock_info(rank: int, a: Mapping[str, Any]) -> RankClockInfo:
    def opt_int(key):
        v = a.get(key)
        return int(v) if v is not None and v != "" else None

    role = a.get("clock_role")
    return RankClockInfo(rank=rank, host=str(a["host"]), role=str(role) if role else None,
                         leader=opt_int("clock_leader"), reference=opt_int("clock_reference"))


# ---- alignment, filtering, sorting -----------------------------------------------------------------------------------


def _align(tables: dict[str, Table], model: ClockModel) -> None:
    for t, cols in (("events", ("ts_ns",)), ("steps", ("start_ns", "end_ns")), ("memory", ("ts_ns",)),
                    ("cuda_memory", ("peak_ns",)), ("cuda_memory_blocks", ("ts_ns",))):
        tab = tables[t]
        for c in cols:
            if c in tab and len(tab[c]):
                tab[c] = model.align(tab["rank"], tab["window"], tab[c])


def _filter_steps(tables: dict[str, Table], lo: int, hi: int) -> None:
    ev = tables["events"]
    keep = (ev["step"] >= lo) & (ev["step"] <= hi)
    new_row = np.cumsum(keep) - 1
    tables["events"] = {c: v[keep] for c, v in ev.items()}
    cm = tables["comms"]
    ck = keep[cm["row"]] if len(cm["row"]) else np.zeros(0, bool)
    cm = {c: v[ck] for c, v in cm.items()}
    cm["row"] = new_row[cm["row"]].astype(np.int64)
    tables["comms"] = cm
    for t in ("steps", "memory", "cuda_memory", "cuda_memory_blocks"):
        tab = tables[t]
        k = (tab["step"] >= lo) & (tab["step"] <= hi)
        tables[t] = {c: v[k] for c, v in tab.items()}


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
