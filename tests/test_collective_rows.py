"""The run's collective rows joined as the ranks are summarised (analysis/align/rows.py): the same table, in any order
of the ranks, split over processes or not, whatever the first rank's size says of the others."""

from __future__ import annotations

import numpy as np
import pytest

from distprof.analysis.align.rows import CPU_WAIT_AT, ROW_COLUMNS, RowsJoiner, joined

OPS = np.array(["all_gather", "all_reduce", "broadcast", "reduce_scatter", "send"], dtype=object)


def _rank_table(rank: int, n: int, rng: np.random.Generator) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """One rank's collectives as ``summary.collective_rows`` gives them, with its own op names (a subset, in its own
    order)."""
    names = rng.permutation(OPS)[: int(rng.integers(1, len(OPS) + 1))]
    start = np.sort(rng.integers(0, 10**9, n)).astype(np.int64)
    c = {"window": rng.integers(0, 2, n).astype(np.int32), "pg": rng.integers(0, 3, n).astype(np.int32),
         "seq": np.arange(n, dtype=np.int32), "nccl_seq": np.arange(n, dtype=np.int64) + rank,
         "op": rng.integers(0, len(names), n).astype(np.int32), "bytes": rng.integers(0, 10**6, n).astype(np.int64),
         "start_ns": start, "end_ns": start + 1000, "step": rng.integers(-1, 5, n).astype(np.int64),
         "ev_row": np.arange(n, dtype=np.int64) * 3, "exposed_ns": rng.integers(0, 500, n).astype(np.int64),
         "cpu_wait_at_start_ns": rng.random(n), "cpu_wait_at_end_ns": np.where(rng.random(n) < 0.2, np.nan, 1.0)}
    return c, names


def _reference(parts: dict[int, tuple[dict[str, np.ndarray], np.ndarray]]) -> tuple[dict, np.ndarray]:
    """The table built the plain way: ranks in order, each row's op looked up by name in the sorted union."""
    names = np.unique(np.concatenate([n for _, n in parts.values()]))
    cols: dict[str, list] = {k: [] for k in ROW_COLUMNS}
    for rank in sorted(parts):
        c, own = parts[rank]
        cols["rank"].append(np.full(c["seq"].size, rank))
        cols["op_id"].append(np.searchsorted(names, own[c["op"]]))
        for k in ROW_COLUMNS:
            if k not in ("rank", "op_id"):
                cols[k].append(c[k])
    return {k: np.concatenate(v).astype(ROW_COLUMNS[k]) for k, v in cols.items()}, names


def _same(got: tuple[dict, np.ndarray], want: tuple[dict, np.ndarray]) -> None:
    rows, names = got
    assert names.tolist() == want[1].tolist()
    assert set(rows) == set(ROW_COLUMNS)
    for k, t in ROW_COLUMNS.items():
        assert rows[k].dtype == t, k
        np.testing.assert_array_equal(rows[k], want[0][k], err_msg=k)


def _parts(sizes: list[int], seed: int = 0) -> dict[int, tuple[dict[str, np.ndarray], np.ndarray]]:
    rng = np.random.default_rng(seed)
    return {r: _rank_table(r, n, rng) for r, n in enumerate(sizes)}


@pytest.mark.parametrize("sizes, expect", [
    ([50] * 8, 8),  # as many rows on every rank, the ranks expected known
    ([3] + [200] * 7, 8),  # the first rank says little of the others: the columns grow
    ([200] * 8, 1),  # the ranks expected too few
    ([0, 40, 0, 7, 90], 5),  # ranks without collectives among them
])
def test_joined_in_any_order_is_the_plain_join(sizes, expect):
    parts = _parts(sizes)
    want = _reference(parts)
    for order in (sorted(parts), sorted(parts, reverse=True), [3, 0, 4, 1, 2, 5, 7, 6][: len(parts)]):
        j = RowsJoiner(expect)
        for r in order:
            c, names = parts[r]
            j.add(r, dict(c), names)
        _same(j.finish(), want)


def test_another_process_s_table_appended_gives_the_same_join():
    """MPI: each process joins its share (ranks dealt out, not in blocks) and rank 0 appends the other's table."""
    parts = _parts([30, 60, 10, 45, 0, 80, 25])
    want = _reference(parts)
    shares = ([0, 2, 5], [1, 3, 4, 6])
    other = RowsJoiner(len(shares[1]))
    for r in shares[1]:
        other.add(r, *parts[r])
    j = RowsJoiner(len(parts))
    for r in shares[0]:
        j.add(r, *parts[r])
    j.extend(*other.finish())
    _same(j.finish(), want)


def test_take_moves_the_rows_out_of_the_summary():
    """The summary keeps an empty table of the same columns and dtypes, and no view of its old arrays."""
    from types import SimpleNamespace

    parts = _parts([20, 20])
    j = RowsJoiner(2)
    summaries = [SimpleNamespace(rank=r, collectives=dict(c), ops_names=n) for r, (c, n) in parts.items()]
    for s in summaries:
        j.take(s)
    for s, (c, _) in zip(summaries, parts.values()):
        assert set(s.collectives) == set(c)
        assert all(v.size == 0 and v.dtype == c[k].dtype and v.base is None for k, v in s.collectives.items())
    _same(j.finish(), _reference(parts))


def _unsampled(parts, ranks):
    """`parts` with no CPU wait sampled on `ranks` (GPU ranks, imported traces: NaN)."""
    return {r: ({**c, **{k: np.full(c["seq"].size, np.nan) for k in CPU_WAIT_AT}} if r in ranks else c, n)
            for r, (c, n) in parts.items()}


def test_cpu_wait_columns_no_rank_sampled_are_left_out():
    """No rank sampled its CPU wait: the columns are left out (readers take them as NaN); one rank that did keeps
    them, NaN on the others — also where another process's finished table left them out."""
    parts = _unsampled(_parts([30, 60, 10, 45]), {0, 1, 2, 3})
    rows, _ = joined([(r, c, n) for r, (c, n) in parts.items()])
    assert set(rows) == set(ROW_COLUMNS) - set(CPU_WAIT_AT)
    parts = _unsampled(_parts([30, 60, 10, 45]), {1, 2, 3})
    want = _reference(parts)
    other = RowsJoiner(2)
    for r in (1, 3):
        other.add(r, *parts[r])
    part = other.finish()
    assert not set(CPU_WAIT_AT) & set(part[0])
    j = RowsJoiner(4)
    for r in (0, 2):
        j.add(r, *parts[r])
    j.extend(*part)
    _same(j.finish(), want)
    assert np.isnan(want[0]["cpu_wait_at_start_ns"][30:]).all()


def test_nothing_joined_is_an_empty_table_of_the_columns():
    rows, names = RowsJoiner(4).finish()
    assert names.size == 0 and {k: v.dtype for k, v in rows.items()} == {k: np.dtype(t) for k, t in ROW_COLUMNS.items()}
    assert all(v.size == 0 for v in rows.values())
    rows, names = joined([])
    assert rows["rank"].size == 0


def test_a_finished_table_holds_no_spare_room():
    """The columns are sized for the ranks expected with some slack, and handed back to their size when finished."""
    parts = _parts([100] * 4)
    j = RowsJoiner(400)  # far more ranks expected than come
    for r, (c, n) in parts.items():
        j.add(r, c, n)
    rows, _ = j.finish()
    assert all(v.size == 400 and v.base is None for v in rows.values())
