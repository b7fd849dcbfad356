"""What a run directory holds, from the shards' attributes only: which shards, ranks, windows and process groups,
and what is missing. No event is read here. Every reader of a run starts from this (``scan_run``).

    cat = scan_run("distprof/<run-id>", steps=(10, 19))
    cat.ranks, cat.shards_of(3), cat.process_groups, cat.warnings

Steps: find, open and check every shard (attributes and layout; ``storage.selection``: bad shards, shards of
another run or job, and second copies of a rank's window are left out and listed in ``skipped``) → name missing ranks, cut or failed windows → with ``steps``, keep the shards whose
windows overlap them → name missing windows → merge the process-group lists (one global index per group name).
"""

from __future__ import annotations

import functools
import logging
import os
import re
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ...errors import IncompleteRunError
from ...progress import progress_enabled
from ...storage.reader import Shard, find_shards, read_status
from ...storage.selection import SkippedShard, select_shards
from ...storage.validate import check_shard
from ..names import rank_ranges
from ..types import RankClockInfo

log = logging.getLogger(__name__)

__all__ = ["RunCatalog", "scan_run", "with_read_skips", "PROGRESS_MIN_SHARDS", "bar"]

#: Shards from this many on get a progress bar (when stderr is a terminal).
PROGRESS_MIN_SHARDS = 16


@dataclass
class RunCatalog:
    """The shards of one run and what their attributes say (see the module docstring)."""

    run_dir: Path | None  # None: a run held in memory (engine.summarize_merged)
    run_id: str
    world_size: int
    shards: list[Shard]  # kept shards, sorted by (rank, window)
    ranks: list[int]  # ranks with at least one shard (whatever the steps selection)
    ranks_missing: list[int]
    first_attrs: dict[int, dict[str, Any]]  # rank -> attributes of its first shard in the selection
    process_groups: list[dict[str, Any]]  # global list: index, name, desc, backend, ranks
    pg_luts: dict[Path, np.ndarray | None]  # shard path -> local pg index -> global index
    steps: tuple[int, int] | None = None
    warnings: list[str] = field(default_factory=list)
    windows_by_rank: dict[int, list[int]] | None = None  # window -> ranks, when there are no shards (in memory)
    skipped: list[SkippedShard] = field(default_factory=list)  # shards left out (bad, another run, a copy), and why
    strict: bool = False  # any bad shard is an error (read_rank raises instead of skipping)
    steps_seen: dict[int, int] = field(default_factory=dict)  # rank -> training steps it ran, from its status file
    #                                                          (only where every rank's says it closed cleanly)
    cut_short: frozenset[tuple[int, int]] = frozenset()  # (rank, window) of shards whose window the script's end cut

    @property
    def hosts(self) -> dict[int, str]:
        return {r: str(a["host"]) for r, a in sorted(self.first_attrs.items())}

    def shards_of(self, rank: int) -> list[Shard]:
        by_rank = self.__dict__.get("_by_rank")
        if by_rank is None:
            by_rank = {}
            for s in self.shards:
                by_rank.setdefault(s.rank, []).append(s)
            self.__dict__["_by_rank"] = by_rank
        return list(by_rank.get(rank, ()))

    @property
    def ranks_read(self) -> list[int]:
        """Ranks with a shard in the selection (the ones whose events are read)."""
        if not self.shards and self.windows_by_rank is not None:
            return sorted({r for rs in self.windows_by_rank.values() for r in rs})
        return sorted({s.rank for s in self.shards})

    def cut_beside_finished(self) -> dict[int, list[int]]:
        """window -> the ranks whose window the script's end cut short while another rank's same window ended with
        the schedule (its loop went on): a loop that ended before the others'. Windows cut short on every rank (a
        job ending mid-window, a termination signal) are not here."""
        out: dict[int, list[int]] = {}
        if not self.cut_short:
            return out
        for w, ranks in self.ranks_by_window().items():
            cut = [r for r in ranks if (r, w) in self.cut_short]
            if 0 < len(cut) < len(ranks):
                out[w] = cut
        return out

    def ranks_by_window(self) -> dict[int, list[int]]:
        if self.windows_by_rank is not None:
            return {w: list(r) for w, r in self.windows_by_rank.items()}
        out: dict[int, list[int]] = {}
        for s in self.shards:
            out.setdefault(s.window, []).append(s.rank)
        return out

    def group_ranks(self) -> dict[int, list[int]]:
        return {int(g["index"]): g["ranks"] for g in self.process_groups if g.get("ranks")}

    def clock_infos(self) -> dict[int, RankClockInfo]:
        return {r: clock_info(r, a) for r, a in self.first_attrs.items()}


def bar(items: Sequence, show: bool, desc: str, unit: str = "shard"):
    if not show:
        return items
    from tqdm import tqdm

    return tqdm(items, desc=desc, unit=unit, file=sys.stderr, leave=False)


def scan_run(run_dir: str | os.PathLike, *, steps: tuple[int, int] | None = None,
             progress: bool | None = None, strict: bool = False,
             check: Callable[[os.PathLike | str], Shard] | None = None, defer_layout: bool = False) -> RunCatalog:
    """Open and check every shard of `run_dir` (attributes and layout, ``storage.selection``) and keep one run's.

    A bad shard, one of another run (run_id / job / world_size / schedule differ from the majority's) or a second copy
    of a rank's window is left out, listed in ``skipped`` and named in ``warnings``; missing ranks or windows are
    named in ``warnings``. `strict`: each of those is an error instead (BadShardError / IncompleteRunError). Raises
    IncompleteRunError when there is nothing to load. `check`: what checks one shard (default
    ``storage.validate.check_shard``; the MPI engine passes the answers its processes found in parallel).
    `defer_layout`: a shard that stores its summary has its layout checked when its tables are first read, not now
    (the report may never read them).
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise IncompleteRunError(f"{run_dir}: no such run directory; pass the <out>/<run-id> folder the capture wrote")
    paths = find_shards(run_dir)
    if not paths:
        raise IncompleteRunError(_no_shard_message(run_dir))
    if steps is not None:
        lo, hi = int(steps[0]), int(steps[1])
        if lo > hi:
            raise ValueError(f"steps=({lo}, {hi}): the first step must not be after the last")
        steps = (lo, hi)

    show = progress_enabled(progress, len(paths), PROGRESS_MIN_SHARDS)
    own = check is None
    if own:
        check = functools.partial(check_shard, defer_layout=defer_layout)
    sel = select_shards(bar(paths, show and own, "checking shards"), strict=strict,
                        check=check)  # ShardFormatError: nothing usable
    shards, world_size = sel.shards, sel.world_size
    warnings: list[str] = list(sel.warnings)

    all_ranks = sorted({s.rank for s in shards})
    ranks_missing = sorted(set(range(world_size)) - set(all_ranks))
    status = read_status(run_dir, warnings)  # bounded, never blocks on a FIFO; bad status files are named
    if ranks_missing:
        warnings.append(_missing_ranks_message(ranks_missing, world_size, status))
        if strict:
            raise IncompleteRunError(f"{run_dir}: {warnings[-1]} (--strict: every rank needs a shard)")
    _note_shard_problems(shards, warnings)
    warnings.extend(lost_windows_messages(shards, status))

    if steps is not None:
        kept = [s for s in shards if _overlaps(s, *steps)]
        if not kept:
            spans = sorted({(int(s.attrs["first_step"]), int(s.attrs["last_step"])) for s in shards})
            raise IncompleteRunError(
                f"{run_dir}: no window covers steps {steps[0]}..{steps[1]} (recorded: "
                + ", ".join(f"{a}..{b}" for a, b in spans) + "); pick steps inside a recorded window")
        shards = kept
    if _note_missing_windows(shards, warnings) and strict:
        raise IncompleteRunError(f"{run_dir}: {warnings[-1]} (--strict: every rank needs every window)")
    first_attrs: dict[int, dict[str, Any]] = {}
    for s in shards:
        first_attrs.setdefault(s.rank, s.attrs)
    process_groups, luts = _merge_process_groups(shards)
    return RunCatalog(run_dir=run_dir, run_id=str(shards[0].attrs["run_id"]), world_size=world_size, shards=shards,
                      ranks=all_ranks, ranks_missing=ranks_missing, first_attrs=first_attrs,
                      process_groups=process_groups, pg_luts={s.path: lut for s, lut in zip(shards, luts)},
                      steps=steps, warnings=warnings, skipped=list(sel.skipped), strict=strict,
                      steps_seen=clean_steps_seen(status, all_ranks),
                      cut_short=frozenset((s.rank, s.window) for s in shards if s.attrs.get("complete") is False))


def with_read_skips(cat: RunCatalog, skipped: list[SkippedShard], ranks_read: set[int]) -> RunCatalog:
    """`cat` without the shards that failed when their data was read (``rankdata.read_ranks``): they are listed in
    ``skipped`` and named in ``warnings``; a rank that lost every shard becomes a missing rank."""
    if not skipped:
        return cat
    lost = {sk.path for sk in skipped}
    shards = [s for s in cat.shards if s.path not in lost]
    gone = sorted({s.rank for s in cat.shards if s.path in lost} - set(ranks_read))
    warnings = list(cat.warnings) + [f"skipped {sk.path}: {sk.reason}" for sk in skipped]
    if gone:
        warnings.append(f"rank(s) {rank_ranges(gone, sep=',')}: every shard was skipped; their data is absent from "
                        "every analysis")
    ranks = [r for r in cat.ranks if r not in gone]
    return replace(cat, shards=shards, ranks=ranks, ranks_missing=sorted(set(cat.ranks_missing) | set(gone)),
                   first_attrs={r: a for r, a in cat.first_attrs.items() if r not in gone},
                   pg_luts={p: lut for p, lut in cat.pg_luts.items() if p not in lost},
                   warnings=warnings, skipped=list(cat.skipped) + list(skipped))


#: The most training steps a status file is believed to count (a larger number is a forged or broken file).
MAX_STEPS_SEEN = 10**12


def clean_steps_seen(status: Mapping[int, dict], ranks: Sequence[int]) -> dict[int, int]:
    """rank -> the training steps its status file counts (``steps_seen``), for every rank in `ranks` — or nothing,
    unless each of them wrote a final status file after a clean end (no termination signal, no script error: a rank
    killed or failed mid-loop stops early for that reason, not for want of batches) with a count in range."""
    out = {}
    for r in ranks:
        doc = status.get(r)
        n = doc.get("steps_seen") if doc is not None else None
        if (doc is None or doc.get("final") is not True or doc.get("signal") is not None
                or doc.get("script_error") is not None or n.__class__ is not int or not 0 <= n <= MAX_STEPS_SEEN):
            return {}
        out[r] = n
    return out


def _no_shard_message(run_dir: Path) -> str:
    """Why a run directory holds no shard, in one line: the script failed before a window was recorded (its status
    files say so: ``script_error``), else where to look."""
    failed = sorted((d["rank"], d) for d in read_status(run_dir).values() if isinstance(d.get("script_error"), str))
    if failed:
        rank, doc = failed[0]
        why = (doc["script_error"].splitlines() or [""])[0][:300]
        return (f"{run_dir}: no shard: the job failed before a window was recorded (rank {rank}: the script ended "
                f"with {why} after {doc.get('iterations', 0)} step(s)); nothing to analyse")
    return (f"{run_dir}: no shard files (rank*.w*.h5); pass the <out>/<run-id> folder, or check the capture's "
            "status files for errors")


# ---- consistency and gaps --------------------------------------------------------------------------------------------


#: A recorded error quoted in a warning is cut to this many characters (report.json stays bounded).
MAX_QUOTED_CHARS = 300
#: Ranks whose lost windows are named one by one; the others are counted.
MAX_LOST_RANKS = 8
_LOST_RE = re.compile(r"window (\d+) lost: (.*)", re.S)


def _quote(text: Any) -> str:
    t = str(text)
    return t if len(t) <= MAX_QUOTED_CHARS else t[:MAX_QUOTED_CHARS - 3] + "..."


def _error_text(e: Any, rank: int) -> str:
    return (f"rank {rank}: {_quote(e.get('stage', '?'))}: {_quote(e.get('message', e))}" if isinstance(e, dict)
            else f"rank {rank}: {_quote(e)}")


def _missing_ranks_message(missing: list[int], world_size: int, status: Mapping[int, dict]) -> str:
    msg = (f"rank(s) {rank_ranges(missing, sep=',')} of 0..{world_size - 1} have no shard: their data is absent "
           "from every analysis")
    notes = []
    for r in missing:
        errs = (status.get(r) or {}).get("errors") or []
        if errs:
            notes.append(_error_text(errs[-1], r))
    if notes:
        msg += " (" + "; ".join(notes[:3]) + ")"
    return msg


def _is_lost_entry(e: Any) -> bool:
    return isinstance(e, dict) and isinstance(e.get("message"), str) and _LOST_RE.match(e["message"]) is not None


def _note_shard_problems(shards: list[Shard], warnings: list[str]) -> None:
    cut = [s for s in shards if s.attrs.get("complete") is False]
    if cut:
        warnings.append("window(s) cut short (the script ended mid-window): "
                        + ", ".join(f"rank {s.rank} window {s.window}" for s in cut[:8])
                        + (f" and {len(cut) - 8} more" if len(cut) > 8 else ""))
    errs = {}
    for s in shards:
        e = [x for x in s.attrs.get("errors") or [] if not _is_lost_entry(x)]  # lost windows: their own warning
        if e:
            errs[s.rank] = e[-1]
    if errs:
        items = list(errs.items())[:3]
        warnings.append("capture errors recorded on rank(s) " + rank_ranges(errs, sep=',') + ": "
                        + "; ".join(_error_text(e, r) for r, e in items))


def lost_windows(shards: list[Shard], status: Mapping[int, dict]) -> dict[int, dict[int, str]]:
    """rank -> window -> why, for every window a rank recorded and could not store: from its status file (every one,
    written at its close) and from the errors its later shards carry (while it runs)."""
    out: dict[int, dict[int, str]] = {}
    for r, doc in status.items():
        for w in doc.get("lost") or []:
            if isinstance(w, dict) and w.get("window").__class__ is int and w["window"] >= 0:
                out.setdefault(r, {})[w["window"]] = str(w.get("reason", ""))
    for s in shards:
        for e in s.attrs.get("errors") or []:
            m = _LOST_RE.match(e["message"]) if _is_lost_entry(e) else None
            if m:
                out.setdefault(s.rank, {}).setdefault(int(m.group(1)), m.group(2))
    have = {(s.rank, s.window) for s in shards}
    return {r: {w: why for w, why in ws.items() if (r, w) not in have} for r, ws in sorted(out.items())
            if any((r, w) not in have for w in ws)}


def lost_windows_messages(shards: list[Shard], status: Mapping[int, dict]) -> list[str]:
    """One warning per rank that lost windows, naming every one of them (consecutive ones as a range, grouped by the
    kind of reason: the text before its first ':'), at most MAX_LOST_RANKS ranks, then one line for the rest."""
    lost = lost_windows(shards, status)
    out = []
    for r, ws in list(lost.items())[:MAX_LOST_RANKS]:
        groups: dict[str, list[int]] = {}
        first_reason: dict[str, str] = {}
        for w in sorted(ws):
            kind = ws[w].split(":", 1)[0]
            groups.setdefault(kind, []).append(w)
            first_reason.setdefault(kind, ws[w])
        parts = [f"{_window_ranges(g)}: {_quote(first_reason[k])}" for k, g in groups.items()]
        out.append(f"rank {r} lost {len(ws)} window(s) it recorded (not on disk): " + "; ".join(parts))
    if len(lost) > MAX_LOST_RANKS:
        rest = list(lost)[MAX_LOST_RANKS:]
        out.append(f"rank(s) {rank_ranges(rest, sep=',')} lost {sum(len(lost[r]) for r in rest)} more window(s) "
                   "(their status files name each)")
    return out


def _window_ranges(ws: list[int]) -> str:
    """[2, 3, 4, 9] -> 'w0002-w0004, w0009'."""
    spans: list[list[int]] = []
    for w in ws:
        if spans and w == spans[-1][1] + 1:
            spans[-1][1] = w
        else:
            spans.append([w, w])
    return ", ".join(f"w{a:04d}" if a == b else f"w{a:04d}-w{b:04d}" for a, b in spans)


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
            warnings.append(f"window {w}: rank(s) {rank_ranges(lack, sep=',')} have no shard for it "
                            "(lost or still being written)")
    return n


def _overlaps(s: Shard, lo: int, hi: int) -> bool:
    return int(s.attrs["first_step"]) <= hi and int(s.attrs["last_step"]) >= lo


# ---- process groups and clock roles ---------------------------------------------------------------------------------


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
                             "backend": g.get("backend", ""), "ranks": list(g.get("ranks") or []),
                             **({"zero": g["zero"]} if isinstance(g.get("zero"), dict) else {})})
            lut[int(g.get("index", i))] = by_key[key]
        maps.append(lut)
    return glob, maps


def remap_pg(pg: np.ndarray, lut: np.ndarray | None) -> np.ndarray:
    """Shard-local process-group indices -> the run's global ones (unknown stay as they are)."""
    if lut is None or len(pg) == 0:
        return pg
    ok = (pg >= 0) & (pg < len(lut))
    out = pg.copy()
    out[ok] = lut[pg[ok]]
    return out


def clock_info(rank: int, a: Mapping[str, Any]) -> RankClockInfo:
    def opt_int(key):
        v = a.get(key)
        return int(v) if v is not None and v != "" else None

    role = a.get("clock_role")
    return RankClockInfo(rank=rank, host=str(a["host"]), role=str(role) if role else None,
                         leader=opt_int("clock_leader"), reference=opt_int("clock_reference"))
