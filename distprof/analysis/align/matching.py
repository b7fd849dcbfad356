"""Collective matching: which per-rank communication events are one collective instance.

Per process group and window, the k-th exec collective (``/comms`` role 1) on every rank is one instance, k being
torch's own sequence number where every rank's trace has one (NCCL), else the rank's start order (``seq``) made to
agree with the other ranks' where it does not (two collectives gloo started in either order, one in flight at a
window's edge): :mod:`.numbering`. :func:`match_collectives` takes one row per executed collective (every rank's
``summary.collective_rows``, with ``rank`` added) and needs only clock-independent fields plus the rows' times, so
the clock alignment can use it on raw times; :func:`realign` / :func:`with_times` then recompute the per-instance
aggregates on aligned times.

Layout of the result (:class:`Collectives`), all numpy columns:

``members`` — long table, one row per (instance, rank), sorted by (inst, rank):
    inst i8, rank i4, window i4, pg i4, seq i4 (the rank's own number: its start order in the window), op_id u4,
    bytes i8, row i8 (index into the input rows), start_ns i8, end_ns i8. A :class:`.gathered.GatheredTable`: the
    columns that are the input rows' own values (rank to bytes) are read from them through the row on each read,
    not held.
``instances`` — one row per instance, ``inst`` = row number, sorted by (pg, window, seq):
    inst i8, pg i4, window i4, seq i4 (the instance's number in its group and window: torch's sequence number, the
    ranks' common start order, or, where some rank's order was repaired, its place in the aligned order),
    op_id u4 (of the lowest rank), bytes i8 (of the lowest rank, −1 unknown),
    n_ranks i4 (ranks seen), n_expected i4 (group members with data in that window), complete bool,
    consistent bool (op and known sizes agree, no duplicates), first i8 / count i8 (slice of ``members``),
    start_min, start_max, end_min, end_max i8, last_rank i4 (rank that entered last), first_rank i4 (entered first),
    skew_ns i8 (start_max − start_min), violation_ns i8 (max(0, start_max − end_min): must be 0 on aligned clocks
    for synchronising ops).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from .gathered import GatheredTable
from .numbering import instance_numbers

log = logging.getLogger(__name__)

Table = dict[str, np.ndarray]

#: Ops whose instance cannot end on any rank before every rank entered (all ranks send and receive).
SYNC_OPS = frozenset(
    {
        "all_reduce",
        "allreduce",
        "all_gather",
        "allgather",
        "all_gather_into_tensor",
        "allgather_into_tensor_coalesced",
        "reduce_scatter",
        "reduce_scatter_tensor",
        "all_to_all",
        "alltoall",
        "alltoall_base",
        "all_to_all_single",
        "barrier",
    }
)

#: Ops whose message size legitimately differs across the ranks of one instance (uneven splits, root vs the others,
#: the two ends of a point-to-point pair): their sizes are not compared.
VARIABLE_SIZE_OPS = frozenset({"all_to_all", "alltoall", "alltoall_base", "all_to_all_single", "gather", "scatter",
                               "send", "recv", "send_recv"})

_MEMBER_COLS = ("inst", "rank", "window", "pg", "seq", "op_id", "bytes", "row", "start_ns", "end_ns")
#: Member columns that are the collective rows' own values, read through ``row`` (:class:`.gathered.GatheredTable`).
_GATHERED = {"rank": np.int32, "window": np.int32, "pg": np.int32, "seq": np.int32, "op_id": np.uint32,
             "bytes": np.int64}


@dataclass
class Collectives:
    """Matched collective instances (see the module docstring for the columns)."""

    instances: Table
    members: Table
    mismatches: list[dict[str, Any]] = field(default_factory=list)
    incomplete: list[dict[str, Any]] = field(default_factory=list)
    n_mismatched: int = 0
    n_incomplete: int = 0
    torch_numbered: int = 0  # (pg, window) groups numbered by torch's own sequence numbers
    realigned: list[tuple[int, int, int]] = field(default_factory=list)  # (pg, window, rank): start order repaired

    def __len__(self) -> int:
        return len(self.instances["inst"])

    def per_rank(self, column: str, ranks: Sequence[int] | None = None, fill: int = -1) -> np.ndarray:
        """Dense (n_instances, n_ranks) array of a member column; `fill` where a rank has no row."""
        ranks = np.asarray(sorted(set(self.members["rank"].tolist())) if ranks is None else ranks, dtype=np.int64)
        out = np.full((len(self), len(ranks)), fill, dtype=self.members[column].dtype)
        col = np.searchsorted(ranks, self.members["rank"])
        ok = (col < len(ranks)) & (ranks[np.clip(col, 0, len(ranks) - 1)] == self.members["rank"])
        out[self.members["inst"][ok], col[ok]] = self.members[column][ok]
        return out

    def sync_mask(self, names: np.ndarray) -> np.ndarray:
        """Instances of synchronising ops (see SYNC_OPS) — the ones the causality check applies to."""
        if len(self) == 0:
            return np.zeros(0, dtype=bool)
        op_names = np.asarray(names, dtype=object)
        is_sync = np.array([str(n) in SYNC_OPS for n in op_names], dtype=bool)
        ids = self.instances["op_id"].astype(np.int64)
        ok = ids < len(is_sync)
        out = np.zeros(len(ids), dtype=bool)
        out[ok] = is_sync[ids[ok]]
        return out


def _empty(n: int = 0) -> tuple[Table, Table]:
    members = {
        "inst": np.zeros(n, np.int64), "rank": np.zeros(n, np.int32), "window": np.zeros(n, np.int32),
        "pg": np.zeros(n, np.int32), "seq": np.zeros(n, np.int32), "op_id": np.zeros(n, np.uint32),
        "bytes": np.zeros(n, np.int64), "row": np.zeros(n, np.int64),
        "start_ns": np.zeros(n, np.int64), "end_ns": np.zeros(n, np.int64),
    }
    inst = {
        "inst": np.zeros(0, np.int64), "pg": np.zeros(0, np.int32), "window": np.zeros(0, np.int32),
        "seq": np.zeros(0, np.int32), "op_id": np.zeros(0, np.uint32), "bytes": np.zeros(0, np.int64),
        "n_ranks": np.zeros(0, np.int32), "n_expected": np.zeros(0, np.int32), "complete": np.zeros(0, bool),
        "consistent": np.zeros(0, bool), "first": np.zeros(0, np.int64), "count": np.zeros(0, np.int64),
    }
    inst.update(_time_aggregates(members, np.zeros(0, np.int64)))
    return inst, members


def variable_size(names: np.ndarray | None) -> np.ndarray | None:
    """Per op id of `names`: whether its message size differs across ranks by design (VARIABLE_SIZE_OPS)."""
    if names is None:
        return None
    return np.array([str(x) in VARIABLE_SIZE_OPS for x in np.asarray(names, dtype=object)], dtype=bool)


def _sorted_members(rows: Table, sel: np.ndarray, key: np.ndarray
                    ) -> tuple[Table, np.ndarray, np.ndarray, np.ndarray]:
    """The members table of the numbered rows `sel` (instance numbers `key`), sorted by (pg, window, key, rank), with
    where each instance begins: a mask (``new``) and its indices (``first``), and each instance's number."""
    rank = np.asarray(rows["rank"])[sel].astype(np.int32)
    window = np.asarray(rows["window"])[sel].astype(np.int32)
    pg = np.asarray(rows["pg"])[sel].astype(np.int32)
    order = np.lexsort((rank, key, window, pg))
    sel, rank, window, pg, key = sel[order], rank[order], window[order], pg[order], key[order]
    n = len(sel)
    new = np.ones(n, dtype=bool)
    new[1:] = (pg[1:] != pg[:-1]) | (window[1:] != window[:-1]) | (key[1:] != key[:-1])
    row = sel.astype(np.int64)
    # the rows' own values are read through `row` (not held: 39 MB at 1,024 LLM-shaped ranks); times are held, as
    # alignment replaces them
    members = GatheredTable(
        {"inst": (np.cumsum(new) - 1).astype(np.int64), "row": row,
         "start_ns": np.asarray(rows["start_ns"])[sel].astype(np.int64),
         "end_ns": np.asarray(rows["end_ns"])[sel].astype(np.int64)},
        rows, row, _GATHERED, _MEMBER_COLS)
    first = np.flatnonzero(new)
    return members, new, first, key[first].astype(np.int32)


def _consistency(members: Table, new: np.ndarray, first: np.ndarray,
                 names: np.ndarray | None) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per instance: whether its members disagree on the op, on a known size (ops of VARIABLE_SIZE_OPS aside) or
    hold a rank twice, and its distinct ranks."""
    op = members["op_id"].astype(np.int64)
    op_bad = np.maximum.reduceat(op, first) != np.minimum.reduceat(op, first)
    b = members["bytes"]
    known = b >= 0
    big = np.iinfo(np.int64).max
    bmax = np.maximum.reduceat(np.where(known, b, -1), first)
    bmin = np.minimum.reduceat(np.where(known, b, big), first)
    bytes_bad = (bmax >= 0) & (bmax != bmin)
    if names is not None and bytes_bad.any():  # uneven splits, roots and pairs differ by design
        variable = variable_size(names)
        i_op = op[first]
        bytes_bad &= ~np.where(i_op < len(variable), variable[np.minimum(i_op, len(variable) - 1)], False)
    rank = members["rank"]
    dup = np.zeros(new.size, dtype=bool)
    dup[1:] = ~new[1:] & (rank[1:] == rank[:-1])
    dup_bad = np.maximum.reduceat(dup.astype(np.int8), first) > 0
    # Distinct ranks per instance (duplicates do not count twice).
    n_ranks = np.add.reduceat((~dup).astype(np.int64), first)
    return op_bad, bytes_bad, dup_bad, n_ranks


def match_collectives(
    rows: Table,
    *,
    names: np.ndarray | None = None,
    group_ranks: Mapping[int, Sequence[int]] | None = None,
    ranks_by_window: Mapping[int, Sequence[int]] | None = None,
    max_reports: int = 200,
) -> Collectives:
    """Match collectives across ranks.

    rows: one row per executed collective: rank, window, pg, seq (rows with seq < 0 are not numbered and skipped),
    op_id (into `names`), bytes, start_ns, end_ns (times as they are: raw or aligned), and optionally nccl_seq
    (torch's sequence number of the collective in its group, −1 unknown).
    names: string table of op_id, for readable reports.
    group_ranks: pg index -> member ranks (from ``process_groups``); default: ranks seen in that pg.
    ranks_by_window: window -> ranks that have data for it (shards present); default: ranks seen in `rows`.
    max_reports: at most this many dicts in ``mismatches`` and in ``incomplete`` (the counts are always exact).
    """
    sel = np.flatnonzero(np.asarray(rows["seq"]) >= 0)
    if len(sel) == 0:
        inst, members = _empty()
        return Collectives(inst, members)
    numbering = instance_numbers(rows, sel, variable_size(names))
    members, new, first, inst_seq = _sorted_members(rows, sel, numbering.key)
    op_bad, bytes_bad, dup_bad, n_ranks = _consistency(members, new, first, names)
    rank, pg, window = members["rank"], members["pg"], members["window"]
    i_pg, i_win = pg[first], window[first]
    n_expected = _expected_counts(i_pg, i_win, rank, pg, window, rows, group_ranks, ranks_by_window)
    complete = n_ranks >= n_expected
    instances: Table = {
        "inst": np.arange(len(first), dtype=np.int64),
        "pg": i_pg,
        "window": i_win,
        "seq": inst_seq,
        "op_id": members["op_id"][first],
        "bytes": members["bytes"][first],
        "n_ranks": n_ranks.astype(np.int32),
        "n_expected": n_expected.astype(np.int32),
        "complete": complete,
        "consistent": ~(op_bad | bytes_bad | dup_bad),
        "first": first.astype(np.int64),
        "count": np.diff(np.append(first, new.size)).astype(np.int64),
    }
    instances.update(_time_aggregates(members, first))

    out = Collectives(instances, members, torch_numbered=numbering.torch_groups, realigned=numbering.realigned)
    if out.realigned:
        log.debug("collective order repaired to match the reference rank's for (pg, window, rank) %s",
                  out.realigned[:20])
    out.n_mismatched = int((op_bad | bytes_bad | dup_bad).sum())
    out.n_incomplete = int((~complete).sum())
    out.mismatches = _mismatch_reports(out, op_bad, bytes_bad, dup_bad, names, max_reports)
    out.incomplete = _incomplete_reports(out, group_ranks, ranks_by_window, rows, names, max_reports)
    if out.n_mismatched:
        log.debug("%d collective instance(s) disagree across ranks", out.n_mismatched)
    return out


def _time_aggregates(members: Table, first: np.ndarray) -> Table:
    """Per-instance min/max of start and end, first/last arrival, skew, causality violation."""
    if len(first) == 0:
        z = np.zeros(0, np.int64)
        return {"start_min": z, "start_max": z.copy(), "end_min": z.copy(), "end_max": z.copy(),
                "last_rank": np.zeros(0, np.int32), "first_rank": np.zeros(0, np.int32), "skew_ns": z.copy(),
                "violation_ns": z.copy()}
    s, e, inst, rank = members["start_ns"], members["end_ns"], members["inst"], members["rank"]
    smin = np.minimum.reduceat(s, first)
    smax = np.maximum.reduceat(s, first)
    emin = np.minimum.reduceat(e, first)
    emax = np.maximum.reduceat(e, first)
    idx = np.arange(len(s), dtype=np.int64)
    big = np.iinfo(np.int64).max
    last_pos = np.minimum.reduceat(np.where(s == smax[inst], idx, big), first)
    first_pos = np.minimum.reduceat(np.where(s == smin[inst], idx, big), first)
    return {
        "start_min": smin,
        "start_max": smax,
        "end_min": emin,
        "end_max": emax,
        "last_rank": rank[last_pos].astype(np.int32),
        "first_rank": rank[first_pos].astype(np.int32),
        "skew_ns": smax - smin,
        "violation_ns": np.maximum(smax - emin, 0),
    }


def _ranks_by_window(rows: Table, ranks_by_window) -> dict[int, np.ndarray]:
    if ranks_by_window is not None:
        return {int(w): np.unique(np.asarray(list(r), dtype=np.int64)) for w, r in ranks_by_window.items()}
    r = np.asarray(rows["rank"], dtype=np.int64)
    w = np.asarray(rows["window"], dtype=np.int64)
    if len(r) == 0:
        return {}
    key = np.unique(w * (1 << 32) + r)
    ws, rs = key >> 32, key & 0xFFFFFFFF
    bounds = np.flatnonzero(np.diff(ws)) + 1
    return {int(ws[g[0]]): rs[g] for g in np.split(np.arange(len(key)), bounds) if len(g)}


def _group_members(pg: int, seen: dict[int, np.ndarray], group_ranks) -> np.ndarray:
    """The group's ranks: as the run declares them, else those seen in it (`seen`: :func:`_ranks_seen`)."""
    if group_ranks is not None and pg in group_ranks and len(group_ranks[pg]):
        return np.unique(np.asarray(list(group_ranks[pg]), dtype=np.int64))
    return seen.get(pg, np.zeros(0, np.int64))


def _ranks_seen(rank: np.ndarray, pgs: np.ndarray) -> dict[int, np.ndarray]:
    """pg -> the ranks seen in it, sorted, from one sort of the (pg, rank) pairs (not a pass per group)."""
    if not len(rank):
        return {}
    pg, r = np.asarray(pgs, np.int64), np.asarray(rank, np.int64)
    o = np.lexsort((r, pg))
    pg, r = pg[o], r[o]
    new = np.r_[True, (pg[1:] != pg[:-1]) | (r[1:] != r[:-1])]
    pg, r = pg[new], r[new]
    starts = np.flatnonzero(np.r_[True, pg[1:] != pg[:-1]])
    ends = np.r_[starts[1:], pg.size]
    return {int(pg[a]): r[a:b] for a, b in zip(starts.tolist(), ends.tolist())}


def _n_common(a: np.ndarray, b: np.ndarray) -> int:
    """How many values two sorted arrays of distinct values share (``len(np.intersect1d(a, b))`` without sorting
    both again: at 16,384 ranks each group x window intersected its members with every rank)."""
    if not a.size or not b.size:
        return 0
    pos = np.minimum(np.searchsorted(b, a), b.size - 1)
    return int(np.count_nonzero(b[pos] == a))


def _expected_counts(i_pg, i_win, rank, pg, window, rows, group_ranks, ranks_by_window) -> np.ndarray:
    """Ranks expected in each instance: group members that have data for the instance's window (one pass per
    pg × window, each group's members found once)."""
    rbw = _ranks_by_window(rows, ranks_by_window)
    pw = i_pg.astype(np.int64) * (1 << 32) + i_win.astype(np.int64)
    keys, inverse = np.unique(pw, return_inverse=True)
    members: dict[int, np.ndarray] = {}
    seen: dict[int, np.ndarray] | None = None
    counts = np.zeros(keys.size, dtype=np.int64)
    for k, key in enumerate(keys.tolist()):
        p, w = key >> 32, key & 0xFFFFFFFF
        if w >= 1 << 31:
            w -= 1 << 32
        mem = members.get(p)
        if mem is None:
            if seen is None and not (group_ranks is not None and len(group_ranks.get(p, ()))):
                seen = _ranks_seen(rank, pg)
            mem = members[p] = _group_members(p, seen or {}, group_ranks)
        have = rbw.get(w)
        counts[k] = _n_common(mem, have) if have is not None else len(mem)
    return counts[inverse.reshape(-1)]


def _name(names, op_id) -> str:
    if names is None or op_id >= len(names):
        return f"op#{op_id}"
    return str(names[op_id])


def _mismatch_reports(c: Collectives, op_bad, bytes_bad, dup_bad, names, max_reports) -> list[dict[str, Any]]:
    bad = np.flatnonzero(op_bad | bytes_bad | dup_bad)[:max_reports]
    out = []
    m, ins = c.members, c.instances
    for i in bad:  # loop over problem instances only, capped
        sl = slice(int(ins["first"][i]), int(ins["first"][i] + ins["count"][i]))
        ranks = m["rank"][sl].tolist()
        ops = [_name(names, int(o)) for o in m["op_id"][sl]]
        sizes = m["bytes"][sl].tolist()
        kinds = [k for k, flag in (("op", op_bad[i]), ("bytes", bytes_bad[i]), ("duplicate", dup_bad[i])) if flag]
        where = f"pg {int(ins['pg'][i])} window {int(ins['window'][i])} seq {int(ins['seq'][i])}"
        groups: dict[tuple, list[int]] = {}
        for r, o, s in zip(ranks, ops, sizes):
            groups.setdefault((o, s), []).append(r)
        parts = [f"{o} of {s} B on rank{'s' if len(rs) > 1 else ''} {','.join(map(str, rs))}"
                 for (o, s), rs in sorted(groups.items(), key=lambda kv: -len(kv[1]))]
        msg = f"collective {where}: ranks disagree ({', '.join(kinds)}): " + "; ".join(parts)
        if "duplicate" in kinds:
            msg += " (a rank has two events with this seq)"
        out.append({
            "kind": "+".join(kinds), "inst": int(i), "pg": int(ins["pg"][i]), "window": int(ins["window"][i]),
            "seq": int(ins["seq"][i]), "ranks": ranks, "ops": ops, "bytes": sizes, "message": msg,
        })
    return out


def _incomplete_reports(c: Collectives, group_ranks, ranks_by_window, rows, names, max_reports):
    ins, m = c.instances, c.members
    bad = np.flatnonzero(~ins["complete"])[:max_reports]
    if len(bad) == 0:
        return []
    rbw = _ranks_by_window(rows, ranks_by_window)
    out = []
    for i in bad:  # problem instances only, capped
        sl = slice(int(ins["first"][i]), int(ins["first"][i] + ins["count"][i]))
        seen = np.unique(m["rank"][sl]).astype(np.int64)
        p, w = int(ins["pg"][i]), int(ins["window"][i])
        declared = group_ranks is not None and len(group_ranks.get(p, ()))
        mem = _group_members(p, {} if declared else {p: np.unique(m["rank"][m["pg"] == p]).astype(np.int64)},
                             group_ranks)
        have = rbw.get(w)
        exp = np.intersect1d(mem, have) if have is not None else mem
        missing = np.setdiff1d(exp, seen).tolist()
        op = _name(names, int(ins["op_id"][i]))
        out.append({
            "inst": int(i), "pg": p, "window": w, "seq": int(ins["seq"][i]), "op": op,
            "ranks_seen": seen.tolist(), "ranks_missing": missing,
            "message": f"collective pg {p} window {w} seq {int(ins['seq'][i])} ({op}) seen on ranks "
                       f"{','.join(map(str, seen.tolist()))} but not on {','.join(map(str, missing))}",
        })
    return out


def with_times(c: Collectives, start_ns: np.ndarray, end_ns: np.ndarray) -> Collectives:
    """A copy of `c` whose member times are `start_ns`/`end_ns` (aligned to members' rows), aggregates recomputed."""
    times = {"start_ns": np.asarray(start_ns, dtype=np.int64), "end_ns": np.asarray(end_ns, dtype=np.int64)}
    m = c.members
    members = m.with_columns(**times) if isinstance(m, GatheredTable) else {**m, **times}
    instances = dict(c.instances)
    instances.update(_time_aggregates(members, c.instances["first"]))
    return replace(c, instances=instances, members=members)


def realign(c: Collectives, align_all: Callable[..., tuple[np.ndarray, ...]]) -> Collectives:
    """Apply a clock alignment ``align_all(rank, window, start, end) -> (aligned start, aligned end)`` to the member
    times (see clock.ClockModel.align_all)."""
    m = c.members
    return with_times(c, *align_all(m["rank"], m["window"], m["start_ns"], m["end_ns"]))
