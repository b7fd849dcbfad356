"""The matched collectives' members read the collective rows' own values through their row index
(``align/gathered.py``): the same columns as copies would be, nothing held twice, and nothing a reader writes into
a column it read changes what the next reader gets."""

from __future__ import annotations

import numpy as np

from distprof.analysis.align.gathered import GatheredTable
from distprof.analysis.align.matching import _MEMBER_COLS, match_collectives, with_times


def _rows(seed: int = 0, ranks: int = 4, colls: int = 50) -> dict[str, np.ndarray]:
    """`colls` collectives on every rank of one group, each rank's rows in its own start order, ranks interleaved."""
    rng = np.random.default_rng(seed)
    rank = np.repeat(np.arange(ranks), colls)
    seq = np.tile(np.arange(colls), ranks)
    order = rng.permutation(rank.size)
    start = (seq * 1_000 + rng.integers(0, 300, rank.size)).astype(np.int64)
    return {"rank": rank[order].astype(np.int32), "window": np.zeros(rank.size, np.int32)[order],
            "pg": np.zeros(rank.size, np.int32), "seq": seq[order].astype(np.int32),
            "op_id": (seq[order] % 2).astype(np.uint32), "bytes": (64 * (1 + seq[order] % 3)).astype(np.int64),
            "start_ns": start[order], "end_ns": start[order] + 500}


def test_members_are_the_rows_values_by_row_without_holding_them():
    rows = _rows()
    m = match_collectives(rows, names=np.array(["all_reduce", "broadcast"], dtype=object)).members
    assert isinstance(m, GatheredTable)
    assert list(m) == list(_MEMBER_COLS)
    r = m["row"]
    for k, dtype in (("rank", np.int32), ("window", np.int32), ("pg", np.int32), ("seq", np.int32),
                     ("op_id", np.uint32), ("bytes", np.int64), ("start_ns", np.int64), ("end_ns", np.int64)):
        assert m[k].dtype == dtype and np.array_equal(m[k], rows[k][r]), k
    assert np.all(np.diff(m["inst"]) >= 0)
    # only the instance, the row and the two times (which alignment replaces) are held
    assert m.held_nbytes() == sum(m[k].nbytes for k in ("inst", "row", "start_ns", "end_ns")) + r.nbytes


def test_writing_into_a_read_column_changes_nothing_held():
    rows = _rows(1)
    m = match_collectives(rows).members
    before = m["rank"].copy()
    got = m["rank"]
    got[:] = -7
    assert np.array_equal(m["rank"], before)
    assert not (rows["rank"] == -7).any()


def test_setting_a_column_holds_it_and_new_times_share_the_rest():
    rows = _rows(2)
    c = match_collectives(rows)
    m = c.members
    m["row"] = m["row"] + 1000  # a caller re-pointing the rows (merged runs: into the events)
    assert np.array_equal(m["rank"], rows["rank"][m["row"] - 1000])  # the gather index is not the public column
    t = with_times(c, m["start_ns"] + 5, m["end_ns"] + 5)
    assert np.array_equal(t.members["start_ns"], m["start_ns"] + 5)
    assert np.array_equal(t.members["bytes"], m["bytes"])
    assert np.array_equal(c.members["start_ns"] + 5, t.members["start_ns"])  # the original keeps its times
    assert np.array_equal(t.instances["start_min"], c.instances["start_min"] + 5)
    assert "rank" in t.members and "nope" not in t.members and len(t.members) == len(_MEMBER_COLS)
