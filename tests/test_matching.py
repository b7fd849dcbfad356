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
    late = realign(c, lambda r, w, *ts: tuple(t + np.where(r == 1, 800, 0) for t in ts))  # rank 1 now [2300, 2800]
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


# ---- instance numbers: torch's sequence numbers, else the ranks' orders aligned ------------------------------------

def _order_rows(per_rank, nccl=None):
    """per_rank: {rank: [(op_id, bytes), ...]} in each rank's start order (one window, pg 0, seq = position) ->
    rows as ``summary.collective_rows`` give them; start_ns = 1000·position + rank; nccl: {rank: [torch seq]}."""
    rows = {k: [] for k in ("rank", "window", "pg", "seq", "op_id", "bytes", "start_ns", "end_ns", "nccl_seq")}
    for r, ops in per_rank.items():
        for k, (op, b) in enumerate(ops):
            for key, v in (("rank", r), ("window", 0), ("pg", 0), ("seq", k), ("op_id", op), ("bytes", b),
                           ("start_ns", 1000 * k + r), ("end_ns", 1000 * k + r + 500),
                           ("nccl_seq", nccl[r][k] if nccl else -1)):
                rows[key].append(v)
    dt = {"rank": np.int32, "window": np.int32, "pg": np.int32, "seq": np.int32, "op_id": np.uint32}
    return {k: np.asarray(v, dt.get(k, np.int64)) for k, v in rows.items()}


def _pairs(c):
    """Per instance: {rank: (op, bytes, own seq)}."""
    m, ins = c.members, c.instances
    return [{int(m["rank"][x]): (int(m["op_id"][x]), int(m["bytes"][x]), int(m["seq"][x]))
             for x in range(int(ins["first"][i]), int(ins["first"][i] + ins["count"][i]))} for i in range(len(c))]


AR, BC, AG = 0, 1, 2
OPS = np.array(["all_reduce", "broadcast", "all_gather"], dtype=object)
STEP = [(BC, 64), (AR, 66048), (AR, 65536), (AR, 65536), (AR, 84), (AR, 65536), (AG, 8)]


def test_two_collectives_started_in_the_other_order_are_paired_by_op_and_size():
    """gloo started two DDP buckets in the other order on rank 1 (twice, overlapping repairs): every instance is
    one op and size, nothing is missing, and the instance order is the reference rank's."""
    mine = STEP * 3
    mine[1], mine[2] = mine[2], mine[1]
    mine[7 + 4], mine[7 + 5] = mine[7 + 5], mine[7 + 4]
    mine[7 + 1], mine[7 + 2] = mine[7 + 2], mine[7 + 1]
    c = match_collectives(_order_rows({0: STEP * 3, 1: mine}), names=OPS)
    assert c.n_mismatched == 0 and c.n_incomplete == 0 and len(c) == 21, c.mismatches[:2]
    assert c.realigned == [(0, 0, 1)]
    for inst in _pairs(c):
        assert inst[0][:2] == inst[1][:2], inst
    assert [p[0][2] for p in _pairs(c)] == list(range(21))  # the reference's order
    assert [p[1][2] for p in _pairs(c)][:3] == [0, 2, 1]  # the member keeps its own seq
    assert c.instances["seq"].tolist() == list(range(21))


def test_position_alone_would_pair_them_wrong():
    """The same rows without the alignment (each rank's seq taken as it is) disagree: what the test above repairs."""
    mine = STEP * 2
    mine[1], mine[2] = mine[2], mine[1]
    rows = _order_rows({0: STEP * 2, 1: mine})
    by_pos = {(int(r), int(s)): (int(o), int(b)) for r, s, o, b in zip(rows["rank"], rows["seq"], rows["op_id"],
                                                                        rows["bytes"])}
    assert by_pos[(0, 1)] != by_pos[(1, 1)]
    assert match_collectives(rows, names=OPS).n_mismatched == 0


def test_a_collective_in_flight_at_the_window_start_is_an_instance_of_its_own():
    """Rank 1 recorded the end of an all_gather begun before the window (and rank 0 did not): it is one incomplete
    instance, and every other collective is matched with its own, not shifted by one."""
    c = match_collectives(_order_rows({0: STEP * 3, 1: [(AG, 8)] + STEP * 3}), names=OPS,
                          group_ranks={0: [0, 1]})
    assert c.n_mismatched == 0 and c.n_incomplete == 1, c.mismatches[:2]
    assert c.incomplete[0]["ranks_missing"] == [0] and c.incomplete[0]["seq"] == 0
    full = [p for p in _pairs(c) if len(p) == 2]
    assert len(full) == 21 and all(p[0][:2] == p[1][:2] for p in full)


def test_a_skipped_collective_is_one_missing_instance_not_a_cascade():
    """Rank 2 did not record the 66048 B bucket of the second step: one instance misses it; the ranks after it are
    still paired with their own (positions alone disagree from there on); the reference's numbers stand."""
    ref = STEP * 3
    c = match_collectives(_order_rows({0: ref, 1: ref, 2: ref[:8] + ref[9:]}), names=OPS,
                          group_ranks={0: [0, 1, 2]})
    assert c.n_mismatched == 0 and c.n_incomplete == 1
    assert c.incomplete[0]["ranks_missing"] == [2] and c.incomplete[0]["seq"] == 8
    assert all(len({v[:2] for v in p.values()}) == 1 for p in _pairs(c))


def test_the_same_extra_collective_on_several_ranks_is_one_instance():
    ref = STEP * 2
    c = match_collectives(_order_rows({0: ref, 1: [(AG, 8)] + ref, 2: [(AG, 8)] + ref}), names=OPS,
                          group_ranks={0: [0, 1, 2]})
    assert c.n_mismatched == 0 and c.n_incomplete == 1 and len(c) == 15
    assert c.incomplete[0]["ranks_seen"] == [1, 2] and c.incomplete[0]["ranks_missing"] == [0]


def test_a_repeating_pattern_shifted_by_one_is_not_taken_for_a_reordering():
    """A B A B … on the reference, B A B A B … on a rank that recorded one B more at the start: the B is extra, the
    rest pairs A with A and B with B in order (a reordering of each pair would leave every pair after it wrong)."""
    a, b = (AR, 100), (AR, 200)
    c = match_collectives(_order_rows({0: [a, b] * 6, 1: [b] + [a, b] * 6}), names=OPS, group_ranks={0: [0, 1]})
    assert c.n_mismatched == 0 and c.n_incomplete == 1
    full = [p for p in _pairs(c) if len(p) == 2]
    assert [p[1][2] - p[0][2] for p in full] == [1] * 12  # rank 1's k+1-th with the reference's k-th


def test_a_real_disagreement_is_still_reported():
    """A rank whose collective has another size, with nothing to reorder it with: one mismatched instance."""
    ref = STEP * 2
    other = list(ref)
    other[3] = (AR, 12345)
    c = match_collectives(_order_rows({0: ref, 1: other}), names=OPS)
    assert c.n_mismatched == 1 and c.n_incomplete == 0 and c.mismatches[0]["seq"] == 3
    assert "12345 B on rank 1" in c.mismatches[0]["message"]


def test_torch_sequence_numbers_pair_what_start_order_cannot():
    """Two all-reduces of one size that started in the other order on rank 1: op and size cannot tell them apart,
    torch's own sequence numbers (NCCL's ``Seq``) do; the instances take torch's numbers."""
    ops = [(AR, 64), (AR, 64), (BC, 8)]
    c = match_collectives(_order_rows({0: ops, 1: ops}, nccl={0: [40, 41, 42], 1: [41, 40, 42]}), names=OPS)
    assert c.torch_numbered == 1 and c.instances["seq"].tolist() == [40, 41, 42]
    assert [sorted((r, s) for r, (_, _, s) in p.items()) for p in _pairs(c)] == [
        [(0, 0), (1, 1)], [(0, 1), (1, 0)], [(0, 2), (1, 2)]]
    # one row without a number (or a number twice on a rank): start order, as before
    c = match_collectives(_order_rows({0: ops, 1: ops}, nccl={0: [40, 41, 42], 1: [41, -1, 42]}), names=OPS)
    assert c.torch_numbered == 0 and c.instances["seq"].tolist() == [0, 1, 2]


def test_variable_size_ops_are_not_reordered_by_size():
    """all_to_all sizes differ across ranks by design: no repair is attempted for them, nothing is reported."""
    names = np.array(["all_to_all", "all_reduce"], dtype=object)
    c = match_collectives(_order_rows({0: [(0, 10), (0, 30), (1, 8)], 1: [(0, 30), (0, 10), (1, 8)]}), names=names)
    assert c.n_mismatched == 0 and c.realigned == [] and c.instances["seq"].tolist() == [0, 1, 2]


def test_alignment_cost_stays_linear_on_many_ranks():
    """64 ranks x 2,000 collectives, every 8th rank with a reordered pair every step: done in seconds."""
    import time

    ref = STEP * 285
    per = {r: list(ref) for r in range(64)}
    for r in range(0, 64, 8):
        for k in range(1, len(ref) - 7, 7):
            per[r][k], per[r][k + 1] = per[r][k + 1], per[r][k]
    rows = _order_rows(per)
    t = time.perf_counter()
    c = match_collectives(rows, names=OPS)
    assert c.n_mismatched == 0 and c.n_incomplete == 0 and len(c) == len(ref)
    assert time.perf_counter() - t < 60


def _nccl_trace(rank: int, seqs: list[int], t0: float) -> dict:
    """One rank's Kineto trace: ProfilerStep#3, then per torch sequence number a record_param_comms (Seq), its
    launch and its NCCL all-reduce kernel (all the same size), 100 us apart from `t0`."""
    def x(cat, name, ts, dur, tid, pid=1, **args):
        return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args}

    evs = [x("user_annotation", "ProfilerStep#3", t0, 1000, 11)]
    for k, s in enumerate(seqs):
        t = t0 + 100 + 100 * k
        evs += [x("cpu_op", "record_param_comms", t, 5, 11, **{
                    "Collective name": "allreduce", "dtype": "Float", "In msg nelems": 256, "Out msg nelems": 256,
                    "Seq": s, "Process Group Name": "0", "Process Group Ranks": "[0, 1]", "Group size": 2}),
                x("cuda_runtime", "cudaLaunchKernel", t + 1, 2, 11, correlation=100 + s),
                x("kernel", "ncclDevKernel_AllReduce_Sum_f32_RING_LL", t + 10, 20, 20, pid=0, device=0, stream=20,
                  correlation=100 + s)]
    return {"distributedInfo": {"rank": rank, "world_size": 2, "backend": "nccl",
                                "pg_config": [{"pg_name": "0", "pg_desc": "default_pg", "pg_size": 2,
                                               "ranks": [0, 1]}]},
            "baseTimeNanoseconds": 1_790_857_026_000_000_000, "traceEvents": evs}


def test_nccl_sequence_numbers_from_the_trace_match_across_ranks(tmp_path):
    """Rank 0's recording holds one more all-reduce (Seq 40) than rank 1's, all of one size: by position rank 0's
    Seq 40 would silently pair with rank 1's Seq 41; torch's numbers pair 41 with 41 and leave 40 to rank 0."""
    import json

    from distprof.importers.run import import_traces

    paths = []
    for rank, seqs in ((0, [40, 41, 42]), (1, [41, 42])):
        paths.append(tmp_path / f"rank-{rank}.json")
        paths[-1].write_text(json.dumps(_nccl_trace(rank, seqs, 0.0 if rank == 0 else 100.0)))
    import_traces(paths, tmp_path / "run", progress=False)
    run = distprof.load(tmp_path / "run")
    c = run.collectives
    # the members of instance 41 are rank 0's second collective and rank 1's first
    assert [sorted((r, s) for r, (_, _, s) in p.items()) for p in _pairs(c)] == [[(0, 0)], [(0, 1), (1, 0)],
                                                                                [(0, 2), (1, 1)]]
    assert c.torch_numbered == 1 and c.instances["seq"].tolist() == [40, 41, 42] and c.n_mismatched == 0


def _start_orders_differ(run) -> bool:
    """Whether the two ranks' collectives, in each one's start order, differ somewhere in op or size."""
    cr = run.collective_rows
    orders = []
    for r in (0, 1):
        k = np.flatnonzero(cr["rank"] == r)
        k = k[np.lexsort((cr["seq"][k], cr["pg"][k], cr["window"][k]))]
        orders.append(list(zip(cr["op_id"][k].tolist(), cr["bytes"][k].tolist())))
    return orders[0] != orders[1]


@pytest.mark.slow
def test_hf_trainer_buckets_are_matched_with_their_own(tmp_path):
    """A real 2-rank Hugging Face Trainer job (gloo, examples/hf_trainer.py with 50 kB DDP buckets: six buckets of
    different sizes per step, which gloo's two worker threads can start in the other order on one rank), rank 1
    sleeping 30 ms more per forward: no collective is reported as disagreeing or missing, every instance pairs one op
    and size, and the slowed rank is the one its peer waits for at the gradient all-reduces. Where the two ranks' start
    orders differ somewhere, the matching must have repaired them.

    The job runs again (at most 3 times in all) until the start orders differ, and the assertions then read that run,
    else the last one. How often they differ depends on how the host wakes gloo's workers: 4 runs in 5 on 2026-12-02,
    0 in 4 here and in 4 of a CI run on 2026-12-06 (which failed the test when it required a reordering). The repair
    itself is pinned by test_two_collectives_started_in_the_other_order_are_paired_by_op_and_size."""
    from conftest import EXAMPLES, job_env, only_run_dir, torchrun

    pytest.importorskip("transformers")
    for attempt in range(3):
        d = tmp_path / f"run{attempt}"
        d.mkdir()
        torchrun(2, ["-m", "distprof.launch", "--out", "out", "--wait", "2", "--warmup", "2", "--active", "12",
                     str(EXAMPLES / "hf_trainer.py"), "--steps", "18", "--bucket-mb", "0.05", "--base-ms", "10",
                     "--slow-rank", "1", "--slow-ms", "30"],
                 cwd=d, env=job_env(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false"),
                 timeout=420)
        run = distprof.load(only_run_dir(d / "out"))
        differ = _start_orders_differ(run)
        if differ:
            break
    print(f"start orders differ: {differ} (run {attempt + 1})")
    assert not [w for w in run.warnings if "disagree" in w or "missing on some ranks" in w], run.warnings
    if differ:
        assert run.collectives.realigned, "the start orders differ, yet no rank's order was repaired"
    c = run.collectives
    assert c.instances["consistent"].all() and c.instances["complete"].all()
    ins = c.instances
    grads = (run.names[ins["op_id"]] == "all_reduce") & (ins["bytes"] > 1000)
    assert grads.sum() >= 12 * 4, ins["bytes"].tolist()
    # the bucket rank 0 waits at for rank 1 (the first of each step; the later ones both enter at once)
    waited = grads & (ins["skew_ns"] >= 15_000_000)
    assert waited.sum() >= 10 and (ins["last_rank"][waited] == 1).mean() >= 0.9, (
        ins["last_rank"][grads].tolist(), (ins["skew_ns"][grads] / 1e6).round(1).tolist())


def test_each_collective_row_is_held_once(tmp_path):
    """After the join a rank's collectives are views of its rows of run.collective_rows: the same rows and op names as
    its own summary had, and no second copy (1,024 LLM-shaped ranks held 124 MB of them twice). Left out: torch's
    sequence numbers, which the matching alone reads, and CPU waits no rank sampled (NaN)."""
    from distprof.analysis.align.rows import CPU_WAIT_AT

    from distprof.analysis.load.catalog import scan_run
    from distprof.analysis.load.rankdata import read_rank
    from distprof.analysis.rank.summary import summarize_rank

    made = make_run(tmp_path, world_size=3, late_rank=1, late_ms=5.0, schedule={"repeat": 2})
    run = distprof.load(made.run_dir)
    cat = scan_run(made.run_dir)
    for r in (0, 1, 2):
        own = summarize_rank(read_rank(cat, r))
        held = run.ranks[r].collectives
        assert held["seq"].size == own.collectives["seq"].size > 0
        for k, v in own.collectives.items():
            if k not in held:
                assert k == "nccl_seq" or (k in CPU_WAIT_AT and np.isnan(v).all()), k
                continue
            if k == "op":
                assert list(run.ranks[r].ops_names[held["op"]]) == list(own.ops_names[v])
            else:
                assert np.array_equal(held[k], v, equal_nan=v.dtype.kind == "f"), k
            assert np.shares_memory(held[k], run.collective_rows["op_id" if k == "op" else k])
