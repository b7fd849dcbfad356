"""Collective matching: instances, aggregates, mismatches and incomplete instances."""

from __future__ import annotations

import numpy as np
import pytest

import distprof
from distprof.analysis.align.matching import SYNC_OPS, match_collectives, realign, with_times
from synth import make_run

NAMES = np.array(["all_reduce", "broadcast"], dtype=object)


def _tables(rows):
    """rows: (rank, window, pg, seq, op_id, bytes, start, dur, role) -> the executed collectives' rows (role 1, as
    ``summary.collective_rows`` gives them) and each one's index in `rows`."""
    a = np.array(rows, dtype=np.int64)
    idx = np.flatnonzero(a[:, 8] == 1)
    a = a[idx]
    return {"rank": a[:, 0].astype(np.int32), "window": a[:, 1].astype(np.int32), "pg": a[:, 2].astype(np.int32),
            "seq": a[:, 3].astype(np.int32), "op_id": a[:, 4].astype(np.uint32), "bytes": a[:, 5],
            "start_ns": a[:, 6], "end_ns": a[:, 6] + a[:, 7]}, idx


def test_instances_hand_computed():
    rows, idx = _tables([
        # rank, window, pg, seq, op, bytes, start, dur, role
        (1, 0, 0, 0, 0, 64, 1_300, 700, 1),  # rank 1 enters last: 1300
        (0, 0, 0, 0, 0, 64, 1_000, 1_000, 1),
        (0, 0, 0, -1, 0, 64, 900, 50, 2),  # enqueue: not matched
        (0, 0, 0, 1, 1, 32, 3_000, 100, 1),
        (1, 0, 0, 1, 1, 32, 2_950, 160, 1),
        (0, 1, 0, 0, 0, 64, 9_000, 10, 1),  # window 1 restarts seq
        (1, 1, 0, 0, 0, 64, 9_001, 9, 1),
    ])
    c = match_collectives(rows, names=NAMES)
    ins, m = c.instances, c.members
    assert len(c) == 3
    assert ins["window"].tolist() == [0, 0, 1] and ins["seq"].tolist() == [0, 1, 0]
    assert ins["op_id"].tolist() == [0, 1, 0] and ins["bytes"].tolist() == [64, 32, 64]
    assert ins["n_ranks"].tolist() == [2, 2, 2] and ins["complete"].all() and ins["consistent"].all()
    assert ins["start_min"].tolist() == [1_000, 2_950, 9_000]
    assert ins["start_max"].tolist() == [1_300, 3_000, 9_001]
    assert ins["end_min"].tolist() == [2_000, 3_100, 9_010]
    assert ins["end_max"].tolist() == [2_000, 3_110, 9_010]
    assert ins["last_rank"].tolist() == [1, 0, 1] and ins["first_rank"].tolist() == [0, 1, 0]
    assert ins["skew_ns"].tolist() == [300, 50, 1]
    assert ins["violation_ns"].tolist() == [0, 0, 0]
    # long table sorted by (inst, rank), rows point back at events/comms
    assert m["inst"].tolist() == [0, 0, 1, 1, 2, 2] and m["rank"].tolist() == [0, 1, 0, 1, 0, 1]
    assert idx[m["row"]].tolist() == [1, 0, 3, 4, 5, 6]
    assert (rows["start_ns"][m["row"]] == m["start_ns"]).all()
    # dense view
    assert c.per_rank("start_ns").tolist() == [[1_000, 1_300], [3_000, 2_950], [9_000, 9_001]]
    assert c.sync_mask(NAMES).tolist() == [True, False, True]
    assert "all_reduce" in SYNC_OPS and "broadcast" not in SYNC_OPS


def test_realign_recomputes_aggregates():
    rows, idx = _tables([(0, 0, 0, 0, 0, 8, 1_000, 1_000, 1), (1, 0, 0, 0, 0, 8, 1_500, 500, 1)])
    c = match_collectives(rows)
    late = realign(c, lambda r, w, t: t + np.where(r == 1, 800, 0))  # rank 1 now [2300, 2800]
    assert late.instances["start_max"].tolist() == [2_300]
    assert late.instances["violation_ns"].tolist() == [300]
    assert late.instances["last_rank"].tolist() == [1]
    assert c.instances["violation_ns"].tolist() == [0]  # original untouched
    same = with_times(c, c.members["start_ns"], c.members["end_ns"])
    assert same.instances["end_min"].tolist() == [2_000]


def test_size_and_op_mismatch_reported():
    rows, idx = _tables([
        (0, 0, 0, 0, 0, 64, 0, 10, 1), (1, 0, 0, 0, 0, 64, 0, 10, 1), (2, 0, 0, 0, 0, 32, 0, 10, 1),
        (0, 0, 0, 1, 0, 64, 20, 10, 1), (1, 0, 0, 1, 1, 64, 20, 10, 1), (2, 0, 0, 1, 0, -1, 20, 10, 1),
    ])
    c = match_collectives(rows, names=NAMES)
    assert c.instances["consistent"].tolist() == [False, False]
    assert c.n_mismatched == 2
    a, b = c.mismatches
    assert a["kind"] == "bytes" and a["seq"] == 0 and a["bytes"] == [64, 64, 32]
    assert "all_reduce of 64 B on ranks 0,1; all_reduce of 32 B on rank 2" in a["message"]
    assert b["kind"] == "op"  # unknown size (-1) is not a size mismatch
    assert "broadcast" in b["message"]


def test_incomplete_and_duplicate():
    rows, idx = _tables([
        (0, 0, 0, 0, 0, 8, 0, 10, 1), (1, 0, 0, 0, 0, 8, 0, 10, 1), (2, 0, 0, 0, 0, 8, 0, 10, 1),
        (0, 0, 0, 1, 0, 8, 20, 10, 1), (2, 0, 0, 1, 0, 8, 20, 10, 1),  # rank 1 lacks seq 1
        (0, 0, 0, 2, 0, 8, 40, 10, 1), (0, 0, 0, 2, 0, 8, 45, 10, 1), (1, 0, 0, 2, 0, 8, 40, 10, 1),
        (2, 0, 0, 2, 0, 8, 40, 10, 1),
    ])
    c = match_collectives(rows, names=NAMES, group_ranks={0: [0, 1, 2]})
    assert c.instances["complete"].tolist() == [True, False, True]
    assert c.instances["n_ranks"].tolist() == [3, 2, 3]
    assert c.n_incomplete == 1
    inc = c.incomplete[0]
    assert inc["seq"] == 1 and inc["ranks_missing"] == [1] and inc["ranks_seen"] == [0, 2]
    assert "not on 1" in inc["message"]
    assert c.instances["consistent"].tolist() == [True, True, False]
    assert c.mismatches[0]["kind"] == "duplicate"
    # a rank with no data at all in that window is not expected there
    c2 = match_collectives(rows, group_ranks={0: [0, 1, 2, 3]}, ranks_by_window={0: [0, 1, 2]})
    assert c2.instances["n_expected"].tolist() == [3, 3, 3]


def test_empty():
    rows, idx = _tables([(0, 0, 0, -1, 0, 8, 0, 10, 2)])
    c = match_collectives(rows)
    assert len(c) == 0 and c.members["inst"].dtype == np.int64 and c.mismatches == []


def test_synthetic_run_matches(tmp_path):
    run = make_run(tmp_path, world_size=4, late_rank=2, late_ms=20.0, schedule={"repeat": 2})
    c = distprof.load(run.run_dir).collectives
    n = len(run.collectives["window"])
    assert len(c) == n and c.instances["complete"].all() and c.instances["consistent"].all()
    assert c.instances["bytes"].tolist() == run.collectives["bytes"].tolist()
    # the late rank entered the first bucket of every step last, and its peers waited ≈ late_ms in gloo
    first_bucket = c.instances["seq"] % 2 == 0
    assert (c.instances["last_rank"][first_bucket] == 2).all()
    assert (c.instances["skew_ns"][first_bucket] > 19_000_000).all()
    assert c.instances["violation_ns"].max() == 0
    dur = c.per_rank("end_ns") - c.per_rank("start_ns")
    assert (dur[first_bucket][:, 0] - dur[first_bucket][:, 2] > 19_000_000).all()


def test_synthetic_mismatch_and_drop(tmp_path):
    run = make_run(tmp_path, world_size=3, bytes_override={(1, 0, 2): 123}, drop_collectives=[(2, 0, 5)])
    m = distprof.load(run.run_dir)
    c = m.collectives
    bad = [d for d in c.mismatches if d["kind"] == "bytes"]
    assert len(bad) == 1 and bad[0]["seq"] == 2 and "123 B on rank 1" in bad[0]["message"]
    assert c.n_incomplete == 1 and c.incomplete[0]["ranks_missing"] == [2] and c.incomplete[0]["seq"] == 5
    assert any("disagree" in w for w in m.warnings) and any("missing on some ranks" in w for w in m.warnings)


@pytest.mark.parametrize("n", [0, 1])
def test_match_on_runs_with_few_ranks(tmp_path, n):
    run = make_run(tmp_path, world_size=1 + n)
    c = distprof.load(run.run_dir).collectives
    assert len(c) == len(run.collectives["window"])
    assert c.instances["complete"].all()
