"""Every rank's executed collectives in one table (``RunSummary.collective_rows``), joined as the ranks are summarised.

    rows = RowsJoiner(expect_ranks=len(ranks))
    for s in summaries_as_they_come:
        rows.take(s)                     # the summary's collectives move into the joiner (the summary keeps none)
    rows.extend(*other_part)             # MPI rank 0: another process's finished table
    table, names = rows.finish()         # rank, window, pg, seq, nccl_seq, op_id, bytes, start/end, ... sorted by rank

The CPU-wait columns (``CPU_WAIT_AT``) are left out of the finished table when no rank sampled its CPU wait (GPU
ranks, imported traces): readers take a missing one as NaN, unknown.

A summary's collectives are a few kB per column per rank. Joining them once every rank was summarised held each row
twice at the join (1,024 LLM-shaped ranks: the ranks' copies 124 MB beside the joined table's 128 MB), and under MPI
every row crossed to rank 0 inside its rank's pickled summary. Here each rank's rows are copied into the joined
columns as soon as its summary is made and the rank's own arrays are dropped, so the next ranks reuse their memory.
The columns are sized once, for the ranks expected at the first rank's row count (and ``SLACK``), grow in place if
ranks have more rows (``ndarray.resize``, a realloc), and give back their spare room in place when finished: the
table is never held twice. An MPI process sends its finished table as one message and rank 0 appends it
(:meth:`RowsJoiner.extend`).

Op names: names are given ids as they come, and ``finish`` renumbers them in sorted name order, so the table and its
names are what joining the ranks at the end gave (the reports are byte-equal).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from ..types import RankSummary

__all__ = ["CPU_WAIT_AT", "ROW_COLUMNS", "RowsJoiner", "joined", "rank_rows"]

Table = dict[str, np.ndarray]

#: Columns of the collective rows and steps: the training thread's cumulative CPU wait (ns, NaN unknown) at the
#: row's start and end (analysis.cpuwait), for the CPU wait within any stretch between them on that rank.
CPU_WAIT_AT = ("cpu_wait_at_start_ns", "cpu_wait_at_end_ns")

#: The joined table's columns and dtypes (those of ``rank.summary.collective_rows``, with the rank and the op's id
#: in the joined names).
ROW_COLUMNS: dict[str, type] = {
    "rank": np.int32, "window": np.int32, "pg": np.int32, "seq": np.int32, "nccl_seq": np.int64,
    "op_id": np.uint32, "bytes": np.int64, "start_ns": np.int64, "end_ns": np.int64, "step": np.int64,
    "ev_row": np.int64, "exposed_ns": np.int64, **{k: np.float64 for k in CPU_WAIT_AT}}

#: What a CPU-wait column holds where another process's finished table left it out: none sampled.
_UNKNOWN: dict[str, float] = dict.fromkeys(CPU_WAIT_AT, np.nan)

#: Spare room when the columns are first sized (the first rank's rows times the ranks expected); past it they grow
#: by half again.
SLACK = 1.02
GROWTH = 1.5


def rank_rows(rank: int, c: Table, op_ids: np.ndarray) -> Table:
    """One rank's collectives (a ``summary.collective_rows`` table) as rows of the joined table; `op_ids` maps its
    ``op`` column to the joined names."""
    n = c["seq"].size
    return {"rank": np.full(n, rank, np.int32), "window": c["window"], "pg": c["pg"], "seq": c["seq"],
            "nccl_seq": c.get("nccl_seq", np.full(n, -1, np.int64)),
            "op_id": op_ids[c["op"]] if n else np.zeros(0, np.uint32),
            "bytes": c["bytes"], "start_ns": c["start_ns"], "end_ns": c["end_ns"], "step": c["step"],
            "ev_row": c["ev_row"], "exposed_ns": c.get("exposed_ns", np.zeros(n, np.int64)),
            **{k: c.get(k, np.full(n, np.nan)) for k in CPU_WAIT_AT}}


def _by_rank(rows: Table) -> Table:
    """`rows` sorted by rank, each rank's rows kept in their order (a column at a time; as they are when sorted)."""
    r = rows["rank"]
    if r.size < 2 or bool(np.all(r[1:] >= r[:-1])):
        return rows
    order = np.argsort(rows["rank"], kind="stable")
    for k in list(rows):
        rows[k] = rows[k][order]
    return rows


class RowsJoiner:
    """The collective rows of the ranks given to :meth:`take` / :meth:`add` (in any order), and of other joiners'
    finished tables (:meth:`extend`), in one table whose columns grow in place (see the module docstring)."""

    def __init__(self, expect_ranks: int = 1) -> None:
        self._expect = max(int(expect_ranks), 1)  # ranks the table will hold: sizes it at the first rank
        self._ids: dict[str, int] = {}  # op name -> id, in order of first sight
        self._cols: Table = {}
        self._n = 0  # rows held
        self._ranks = 0  # ranks held

    def take(self, s: RankSummary) -> None:
        """Move `s`'s collectives into the joiner: the summary is left with an empty table, and its rank's rows
        come back as views of the joined table in the RunSummary (``reduce.rows_in_one_home``)."""
        self.add(s.rank, s.collectives, s.ops_names)
        s.collectives = {k: np.zeros(0, v.dtype) for k, v in s.collectives.items()}  # no view: frees the rows

    def add(self, rank: int, c: Table, ops_names: np.ndarray) -> None:
        """Add one rank's collectives (`ops_names`: the names its ``op`` column indexes)."""
        self._append(rank_rows(rank, c, self._lut(ops_names)), ranks=1)

    def extend(self, rows: Table, names: np.ndarray) -> None:
        """Add another joiner's finished table (`names`: the op names its ``op_id`` indexes)."""
        n_ranks = int(np.count_nonzero(np.diff(rows["rank"]))) + 1 if rows["rank"].size else 0  # sorted by rank
        self._append({**rows, "op_id": self._lut(names)[rows["op_id"]]} if rows["op_id"].size else rows, n_ranks)

    def _lut(self, names: np.ndarray) -> np.ndarray:
        ids = self._ids
        return np.array([ids.setdefault(n, len(ids)) for n in np.asarray(names, dtype=object).tolist()],
                        dtype=np.uint32)

    def _append(self, part: Table, ranks: int) -> None:
        m = int(part["rank"].size)
        if m:
            self._room(self._n + m, per_rank=m / max(ranks, 1))
            for k, col in self._cols.items():
                col[self._n:self._n + m] = part[k] if k in part else _UNKNOWN[k]  # a finished table left it out
            self._n += m
        self._ranks += ranks

    def _room(self, need: int, per_rank: float) -> None:
        """Columns that hold at least `need` rows: first sized for the ranks still expected, then grown in place."""
        if not self._cols:
            cap = max(need, int(per_rank * SLACK * max(self._expect - self._ranks, 1)) + 64)
            self._cols = {k: np.empty(cap, t) for k, t in ROW_COLUMNS.items()}
            return
        cap = len(self._cols["rank"])
        if need > cap:
            cap = max(need, int(cap * GROWTH))
            for col in self._cols.values():
                col.resize(cap, refcheck=False)  # the joiner holds the only reference: realloc

    def finish(self) -> tuple[Table, np.ndarray]:
        """The joined table, sorted by rank (each rank's rows in the order given), and the sorted op names its
        ``op_id`` indexes. The joiner is empty afterwards."""
        rows = self._cols or {k: np.zeros(0, t) for k, t in ROW_COLUMNS.items()}
        for col in rows.values():
            if len(col) != self._n:
                col.resize(self._n, refcheck=False)  # the spare room handed back (realloc shrinks in place)
        for k in CPU_WAIT_AT:
            if k in rows and rows[k].size and np.isnan(rows[k]).all():
                del rows[k]  # no rank sampled its CPU wait (GPU ranks, imports): 21 MB of NaN at 1,024 LLM ranks
        names = np.array(list(self._ids), dtype=object)
        order = np.argsort(names, kind="stable")
        renumber = np.empty(len(order), np.uint32)
        renumber[order] = np.arange(len(order), dtype=np.uint32)
        np.take(renumber, rows["op_id"], out=rows["op_id"])  # in place (mode "raise" buffers the overlap)
        self.__init__(self._expect)
        return _by_rank(rows), names[order]  # ranks given out of order (MPI shares) put back in order


def joined(parts: list[tuple[int, Table, np.ndarray]]) -> tuple[Table, np.ndarray]:
    """Every rank's collective rows (rank, rows, op names) in one table: :class:`RowsJoiner` over `parts`."""
    j = RowsJoiner(len(parts))
    for rank, c, ops_names in parts:
        j.add(rank, c, ops_names)
    return j.finish()
