"""Pick the shards of one run from a run directory: each checked (storage.validate), those of another run left out.

    sel = select_shards(find_shards(run_dir))   # the shards of the majority run, one per (rank, window)
    sel.skipped                                 # SkippedShard(path, reason) for everything left out
    sel.warnings                                # one line per bad file (up to MAX_NAMED), one per other run

A run is its ``run_id`` and, when shards carry one, its ``job`` identity (``{"id": ...}``): two jobs that reused a run id
are two runs. Within the run, shards disagreeing with the majority on ``world_size`` or the profiling schedule are
left out too; a second copy of a rank's window is left out (the one whose file name matches its attributes is kept).
"""

from __future__ import annotations

import json
import logging
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from ..errors import BadShardError, ShardFormatError
from . import schema
from .validate import check_shard, job_id

log = logging.getLogger(__name__)

__all__ = ["select_shards", "ShardSelection", "SkippedShard", "strict_error", "MAX_NAMED"]


@dataclass(frozen=True)
class SkippedShard:
    """A shard left out of a run, and why (one line)."""

    path: Path
    reason: str

    def to_dict(self) -> dict[str, str]:
        return {"path": str(self.path), "reason": self.reason}


@dataclass
class ShardSelection:
    """The shards of one run (checked, one per rank and window, sorted) and what was left out."""

    shards: list
    skipped: list[SkippedShard] = field(default_factory=list)
    #: one line per problem, for the report's warnings (bad files one each, other runs summarised)
    warnings: list[str] = field(default_factory=list)

    @property
    def world_size(self) -> int:
        return int(self.shards[0].attrs["world_size"])


#: Bad files named one line each in the warnings, up to this many (all are in ``skipped``).
MAX_NAMED = 20


def select_shards(paths: Iterable[os.PathLike | str], *, strict: bool = False,
                  check: Callable[[os.PathLike | str], Any] = check_shard) -> ShardSelection:
    """Check every shard and keep those of one run: the run (run_id and job) most shards belong to, then within it
    the majority world size and profiling schedule, then one shard per (rank, window).

    Everything left out is in ``skipped`` with its reason. ``strict``: the first problem raises BadShardError
    instead (one line). Raises ShardFormatError when no shard is usable.
    """
    sel = ShardSelection(shards=[])
    good = []
    n_bad = 0
    for p in paths:
        try:
            good.append(check(p))
        except BadShardError as e:
            if strict:
                raise strict_error(e) from None
            n_bad += 1
            _skip(sel, Path(e.path), e.reason, name=n_bad <= MAX_NAMED)
    if n_bad > MAX_NAMED:
        sel.warnings.append(f"... and {n_bad - MAX_NAMED} more bad shard(s) skipped (all listed in report.json "
                            "skipped_shards)")
    if not good:
        first = sel.skipped[0] if sel.skipped else None
        raise ShardFormatError(f"no usable shard: {len(sel.skipped)} bad shard(s)"
                               + (f", first {first.path}: {first.reason}" if first else ""))
    good = _keep_majority(sel, good, "runs", _run_key, strict)
    good = _keep_majority(sel, good, "world sizes", lambda s: ("world_size", s.attrs["world_size"]), strict)
    good = _keep_majority(sel, good, "profiling schedules", _schedule_key, strict)
    sel.shards = _dedupe(sel, good, strict)
    return sel


def _skip(sel: ShardSelection, path: Path, reason: str, *, name: bool = True) -> None:
    sel.skipped.append(SkippedShard(path, reason))
    if name:
        sel.warnings.append(f"skipped {path}: {reason}")
    log.debug("skipped %s: %s", path, reason)


def strict_error(e: BadShardError) -> BadShardError:
    """`e` as the one-line error of ``--strict``."""
    return BadShardError(e.path, f"{e.reason} (--strict: any bad shard is an error; without it the shard is "
                                 "skipped and named)")


#: what to do about shards that disagree on a field, by field
_FIXES = {
    "run_id": "the directory mixes two runs; move the other run's shards out, or load each run directory on its own",
    "job": "two jobs wrote this run id (a reused --run-id or Slurm job id); move one job's shards out",
    "world_size": "shards from jobs of different sizes; keep one job's shards per directory",
    "config.schedule": "shards captured with different profiling schedules; keep one run's shards per directory",
}


def _run_key(s) -> tuple[str, Any]:
    return ("run_id", s.attrs["run_id"]) if job_id(s.attrs) is None else ("run_id", s.attrs["run_id"], job_id(s.attrs))


def _schedule_key(s) -> tuple[str, Any] | None:
    cfg = s.attrs.get("config")
    sch = cfg.get("schedule") if isinstance(cfg, dict) else None
    return None if sch is None else ("config.schedule", sch)  # shards without one (imported) agree with any


def _differs(mine: tuple, kept: tuple) -> tuple[str, Any, Any]:
    """(field, this value, the kept value) of the first field where two keys differ."""
    if mine[0] == "run_id" and mine[1] == kept[1]:  # same run id: the jobs differ
        return "job", (mine[2] if len(mine) > 2 else None), (kept[2] if len(kept) > 2 else None)
    return mine[0], mine[1], kept[1]


def _keep_majority(sel: ShardSelection, shards: list, what: str, key: Callable[[Any], tuple | None],
                   strict: bool) -> list:
    """Keep the shards whose `key` most shards share (a None key agrees with every key); skip the others (strict:
    refuse the first) with one reason each, and add one line summing up."""
    keys = [key(s) for s in shards]
    canon = [None if k is None else json.dumps(k, sort_keys=True, default=str) for k in keys]
    counts = Counter(c for c in canon if c is not None)
    if len(counts) <= 1:
        return shards
    # most shards, then most ranks, then the first in (rank, window) order: deterministic
    ranks = {c: len({s.rank for s, cc in zip(shards, canon) if cc == c}) for c in counts}
    first: dict[str, int] = {}
    for i, c in enumerate(canon):
        if c is not None:
            first.setdefault(c, i)
    win = max(counts, key=lambda c: (counts[c], ranks[c], -first[c]))
    ref = shards[first[win]]
    kept = [s for s, c in zip(shards, canon) if c is None or c == win]
    others: Counter = Counter()
    summary = None
    for s, k, c in zip(shards, keys, canon):
        if c is None or c == win:
            continue
        field_name, mine, theirs = _differs(k, keys[first[win]])
        summary = summary or (field_name, theirs)
        reason = (f"{field_name} {mine!r} differs from {theirs!r} in {counts[win]} other shard(s) "
                  f"(e.g. {ref.path.name}): {_FIXES[field_name]}")
        if strict:
            raise strict_error(BadShardError(s.path, reason))
        _skip(sel, s.path, reason, name=False)
        others[f"{field_name} {mine!r}"] += 1
    field_name, theirs = summary
    sel.warnings.append(
        f"{ref.path.parent}: shards of {len(counts)} different {what}: kept {field_name} {theirs!r} "
        f"({len(kept)} shard(s)); skipped " + ", ".join(f"{n} shard(s) of {w}" for w, n in others.most_common())
        + f" ({_FIXES[field_name]}; --strict refuses such a directory)")
    return kept


def _dedupe(sel: ShardSelection, shards: list, strict: bool) -> list:
    """One shard per (rank, window): the one whose file name matches its attributes, else the first."""
    by_key: dict[tuple[int, int], list] = {}
    for s in shards:
        by_key.setdefault((s.rank, s.window), []).append(s)
    out = []
    for (rank, window), group in sorted(by_key.items()):
        expect = schema.SHARD_TEMPLATE.format(rank=rank, window=window)
        group.sort(key=lambda s: (s.path.name != expect, str(s.path)))
        keep = group[0]
        if keep.path.name != expect:
            sel.warnings.append(f"{keep.path}: attributes say rank {rank} window {window} (expected file name "
                                f"{expect})")
        for s in group[1:]:
            reason = f"rank {rank} window {window} is also in {keep.path.name}; remove the copy"
            if strict:
                raise strict_error(BadShardError(s.path, reason))
            _skip(sel, s.path, reason)
        out.append(keep)
    return out
