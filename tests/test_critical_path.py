"""The cross-rank step graph, its replay and the critical path (analysis/graph/critical_path.py, schedule.py,
path_report.py): on synthetic runs with a known straggler, on hand-built steps (two point-to-point stages, a gloo
collective, collectives in opposite orders), and the chained replay on simulated jobs (tests/whatif_jobs.py)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from synth import make_run
from whatif_jobs import simulated_run

import distprof
from distprof.analysis.graph.critical_path import _relax, critical_paths, replay, step_graph
from distprof.analysis.graph.schedule import schedule
from distprof.analysis.graph.path_report import critical_path_report
from distprof.analysis.align.matching import match_collectives
from distprof.analysis.align.p2p import match_p2p

MS = 1_000_000


@pytest.fixture(scope="module")
def late(tmp_path_factory):
    return distprof.load(make_run(tmp_path_factory.mktemp("late"), world_size=4, late_rank=2, late_ms=20,
                                  schedule={"active": 5}, run_id="late").run_dir)


@pytest.fixture(scope="module")
def balanced(tmp_path_factory):
    return distprof.load(make_run(tmp_path_factory.mktemp("bal"), world_size=4, schedule={"active": 5},
                                  run_id="bal").run_dir)


def test_replay_of_the_measured_segments_reproduces_the_steps(late):
    g = step_graph(late)
    rp = replay(g)
    assert rp.converged
    assert g.n_events == 4 * 5 * 2  # 4 ranks x 5 steps x 2 bucket all-reduces, every member
    assert np.abs(rp.rs_end - g.rs_end).max() < 1_000  # ns
    # waiting (S - a) is on the peers, not on the late rank
    wait = (rp.start - rp.arrival) / MS
    assert wait[g.ev_rank == 2].max() < 1.0
    assert wait[(g.ev_rank != 2) & (g.ev_link == 0)].min() > 15.0


def test_critical_path_runs_through_the_straggler(late, balanced):
    cp = critical_path_report(late)
    assert cp.ranks[0].rank == 2 and cp.ranks[0].share_pct > 80
    assert cp.ranks[0].steps_on_path == 5
    # the path is as long as the step: work + transfers, never waiting
    st = late.steps
    assert cp.length_ms_median == pytest.approx(float(np.median(st["step_ms"])), rel=0.05)
    kinds = {s.kind for s in cp.view.segments}
    assert kinds == {"work", "transfer"}
    assert sum(s.ms for s in cp.view.segments) == pytest.approx(
        next(p.length_ms for p in cp.per_step if p.step == cp.view.step), rel=1e-6)
    # balanced: no rank holds the path in most of the time
    b = critical_path_report(balanced)
    assert b.ranks[0].share_pct < 60


def _p2p_run():
    """Two stages, one step [0, 12] / [0, 18] ms: stage 0 works 10 ms and sends (0.5 ms); stage 1 posted its
    receive at 1 ms, gets the data at 12 ms (2 ms after the send began) and works 6 ms."""
    rows = {"rank": np.array([0, 1]), "window": np.array([0, 0]), "pg": np.array([0, 0]), "peer": np.array([1, 0]),
            "is_recv": np.array([False, True]), "bytes": np.array([64, 64]),
            "start_ns": np.array([10, 1]) * MS, "end_ns": np.array([10.5 * MS, 12 * MS]).astype(np.int64),
            "step": np.array([0, 0]), "p2p_seq": np.array([0, 0])}
    z = np.zeros(0, np.int64)
    coll_rows = {"rank": z.astype(np.int32), "window": z.astype(np.int32), "pg": z.astype(np.int32),
                 "seq": z.astype(np.int32), "op_id": z.astype(np.uint32), "bytes": z, "start_ns": z, "end_ns": z,
                 "step": z, "ev_row": z, "exposed_ns": z}
    steps = {"rank": np.array([0, 1], np.int32), "step": np.array([0, 0], np.int32),
             "start_ns": np.array([0, 0], np.int64), "end_ns": np.array([12, 18]) * MS,
             "step_ms": np.array([12.0, 18.0])}
    return SimpleNamespace(steps=steps, collectives=match_collectives(coll_rows), collective_rows=coll_rows,
                           p2p=match_p2p(rows, {0: [0, 1]}), names=np.zeros(0, dtype=object))


def test_point_to_point_joins_sender_to_receiver():
    run = _p2p_run()
    g = step_graph(run)
    rp = replay(g)
    assert np.abs(rp.rs_end - g.rs_end).max() < 1_000
    cp = critical_paths(g, rp)
    assert cp.length_ms[0] == pytest.approx(18.0)
    w = dict(zip(cp.ranks.tolist(), cp.work_ms[0].tolist()))
    assert w[0] == pytest.approx(10.0) and w[1] == pytest.approx(6.0)  # stage 1's own 1 ms and 9 ms wait: off it
    assert cp.transfer_ms[0] == pytest.approx(2.0)
    assert [(s.rank, s.kind) for s in cp.segments] == [(0, "work"), (1, "transfer"), (1, "work")]
    # the sender 4 ms faster: the receiver's step ends 4 ms earlier; the receiver faster: nothing changes
    gap = g.ev_gap.copy()
    gap[g.ev_rank == 0] -= 4 * MS
    assert replay(g.with_segments(gap=gap)).rs_end[1] == pytest.approx(g.rs_end[1] - 4 * MS)
    gap = g.ev_gap.copy()
    gap[g.ev_rank == 1] = 0.0
    assert replay(g.with_segments(gap=gap)).rs_end[1] == pytest.approx(g.rs_end[1])


def _coll_run(end0_ms: float):
    """Two ranks, one all_reduce in one step: rank 0 arrives at 2 ms, rank 1 at 50 ms; the exec event ends at 55.5 ms
    on rank 0's communication thread, while rank 0's main thread ended the step at `end0_ms`."""
    i64 = lambda *v: np.array(v, np.int64)  # noqa: E731
    coll_rows = {"rank": np.array([0, 1], np.int32), "window": np.array([0, 0], np.int32),
                 "pg": np.array([0, 0], np.int32), "seq": np.array([0, 0], np.int32),
                 "op_id": np.array([0, 0], np.uint32), "bytes": i64(64, 64), "start_ns": i64(2, 50) * MS,
                 "end_ns": i64(55.5 * MS, 55 * MS), "step": i64(0, 0), "ev_row": i64(0, 0), "exposed_ns": i64(0, 0)}
    steps = {"rank": np.array([0, 1], np.int32), "step": np.array([0, 0], np.int32),
             "start_ns": i64(0, 0), "end_ns": i64(end0_ms * MS, 56 * MS), "step_ms": np.array([end0_ms, 56.0])}
    no_p2p = {k: np.zeros(0, np.int64) for k in ("rank", "window", "pg", "peer", "bytes", "start_ns", "end_ns",
                                                   "step", "p2p_seq")}
    no_p2p["is_recv"] = np.zeros(0, bool)
    return SimpleNamespace(steps=steps, collectives=match_collectives(coll_rows), collective_rows=coll_rows,
                           p2p=match_p2p(no_p2p, {0: [0, 1]}), names=np.array(["all_reduce"], dtype=object))


@pytest.mark.parametrize("end0_ms", [54.5, 57.0])
def test_a_step_that_ends_after_its_collective_could_proceed_waited_for_it(end0_ms):
    """gloo's exec event ends on its worker thread a little after the main thread went on: the step still waited
    for the collective, so its tail is the time after the event, never the wait (from the arrival) counted as work.
    Then taking rank 1's 48 ms off moves rank 0's step end too."""
    g = step_graph(_coll_run(end0_ms))
    r0 = int(np.flatnonzero(g.rs_rank == 0)[0])
    assert g.rs_tail[r0] == pytest.approx(max(end0_ms - 55.5, 0.0) * MS)
    base = replay(g).rs_end[r0]
    gap = g.ev_gap.copy()
    gap[g.ev_rank == 1] -= 48 * MS
    assert replay(g.with_segments(gap=gap)).rs_end[r0] == pytest.approx(base - 48 * MS)


def test_steps_chain_within_a_window_and_break_at_windows_and_gaps():
    """A rank-step follows the rank's previous step when that is recorded in the same window; a window's first step,
    and the step after a missing one, start a chain."""
    g = step_graph(simulated_run(windows=2, gap_steps=3))
    prev = g.rs_prev
    chained = prev >= 0
    assert (g.rs_rank[prev[chained]] == g.rs_rank[chained]).all()
    assert (g.rs_step[prev[chained]] == g.rs_step[chained] - 1).all()
    assert sorted(g.rs_step[~chained].tolist()) == [2, 2, 11, 11]  # 2 ranks x 2 windows of 6 steps, 3 apart
    assert np.abs(g.rs_between[chained]).max() < 1_000  # a step begins where the previous one ended
    run = simulated_run()
    keep = ~((run.steps["rank"] == 1) & (run.steps["step"] == 4))  # rank 1's step 4 not recorded
    run.steps = {k: v[keep] for k, v in run.steps.items()}
    g = step_graph(run)
    assert g.rs_prev[(g.rs_rank == 1) & (g.rs_step == 5)][0] == -1


@pytest.mark.parametrize("make", ["late", "simulated", "lanes"])
def test_chained_replay_reproduces_the_steps_and_matches_relaxation(late, make):
    """Chained, the measured segments still give the measured steps; with changed segments the level-by-level
    replay (each value once) gives what relaxing every value to a fixed point gives."""
    lanes = {"buckets": 6, "lanes": 2} if make == "lanes" else {}
    run = late if make == "late" else simulated_run(windows=2, gap_steps=1, pre={(1, it): 20.0 for it in range(30)},
                                                    **lanes)
    g = step_graph(run)
    rp = replay(g, chain=True)
    assert rp.converged and schedule(g) is not None
    assert np.abs(rp.rs_end - g.rs_end).max() < 1_000 and np.abs(rp.rs_start - g.rs_start).max() < 1_000
    rng = np.random.default_rng(0)
    for _ in range(3):
        other = g.with_segments(gap=g.ev_gap * rng.uniform(0.2, 1.5, g.n_events),
                                tail=g.rs_tail * rng.uniform(0.2, 1.5, g.rs_rank.size),
                                transfer=g.ev_transfer * rng.uniform(0.0, 2.0, g.n_events))
        a, b = replay(other, chain=True), _relax(other, chain=True, max_passes=None)
        assert b.converged
        for x, y in ((a.arrival, b.arrival), (a.end, b.end), (a.rs_start, b.rs_start), (a.rs_end, b.rs_end)):
            assert np.abs(x - y).max() < 1e-3


def test_chained_steps_without_sync_events_replay():
    """Most steps without a collective (more rank-steps than events, each chained to the last): the chained replay
    still reproduces them and matches relaxation (a shard fuzz found the rank-step anchors indexed as events)."""
    run = simulated_run()
    cr = run.collective_rows
    keep = np.asarray(cr["step"]) == 2
    rows = {k: np.asarray(v)[keep] for k, v in cr.items()}
    run = SimpleNamespace(steps=run.steps, collectives=match_collectives(rows), collective_rows=rows, p2p=run.p2p,
                          names=run.names)
    g = step_graph(run)
    assert g.n_events == 2 and g.rs_rank.size == 12
    other = g.with_segments(tail=g.rs_tail * 0.5)
    a, b = replay(other, chain=True), _relax(other, chain=True, max_passes=None)
    assert np.abs(replay(g, chain=True).rs_end - g.rs_end).max() < 1_000
    assert np.abs(a.rs_end - b.rs_end).max() < 1e-3 and np.abs(a.rs_start - b.rs_start).max() < 1e-3


def test_a_tail_moves_the_next_steps_arrivals_only_when_chained():
    """Rank 1 waits 20 ms before every forward, in its steps' tails, and rank 0 waits for it at the next all-reduce.
    Taking 20 ms off rank 1's tail of one step, chained, brings rank 0's next step end 20 ms earlier; unchained (each
    step from its measured start) it does not."""
    run = simulated_run(pre={(1, it): 20.0 for it in range(30)})
    g = step_graph(run)
    r1 = np.flatnonzero((g.rs_rank == 1) & (g.rs_step == 3))[0]
    r0_next = np.flatnonzero((g.rs_rank == 0) & (g.rs_step == 4))[0]
    tail = g.rs_tail.copy()
    tail[r1] -= 20 * MS
    other = g.with_segments(tail=tail)
    assert replay(other, chain=True).rs_end[r0_next] == pytest.approx(g.rs_end[r0_next] - 20 * MS)
    assert replay(other).rs_end[r0_next] == pytest.approx(g.rs_end[r0_next])


def test_collectives_in_opposite_orders_fall_back_to_relaxation():
    """Rank 0 runs all_reduce A (group 0) then B (group 1), rank 1 B then A, each after the previous one ended: each
    collective waits for the other (a cycle). No level order exists; the replay relaxes instead and still reproduces
    the measured step."""
    i64 = lambda *v: np.array(v, np.int64)  # noqa: E731
    coll_rows = {"rank": np.array([0, 0, 1, 1], np.int32), "window": np.zeros(4, np.int32),
                 "pg": np.array([0, 1, 1, 0], np.int32), "seq": np.zeros(4, np.int32),
                 "op_id": np.zeros(4, np.uint32), "bytes": i64(64, 64, 64, 64), "start_ns": i64(0, 10, 0, 10) * MS,
                 "end_ns": i64(10, 20, 10, 20) * MS, "step": i64(0, 0, 0, 0), "ev_row": i64(0, 1, 2, 3),
                 "exposed_ns": i64(0, 0, 0, 0)}
    steps = {"rank": np.array([0, 1], np.int32), "step": np.array([0, 0], np.int32), "start_ns": i64(0, 0),
             "end_ns": i64(21, 21) * MS, "step_ms": np.array([21.0, 21.0])}
    no_p2p = {k: np.zeros(0, np.int64) for k in ("rank", "window", "pg", "peer", "bytes", "start_ns", "end_ns",
                                                   "step", "p2p_seq")}
    no_p2p["is_recv"] = np.zeros(0, bool)
    run = SimpleNamespace(steps=steps, collectives=match_collectives(coll_rows), collective_rows=coll_rows,
                          p2p=match_p2p(no_p2p, {0: [0, 1], 1: [0, 1]}), names=np.array(["all_reduce"], dtype=object))
    g = step_graph(run)
    assert g.n_events == 4 and g.n_groups == 2
    assert schedule(g) is None
    rp = replay(g, chain=True)
    assert np.abs(rp.rs_end - g.rs_end).max() < 1_000


def test_report_html_and_terminal_show_the_path_and_the_what_ifs(late):
    from distprof.analysis.report.build import build_report
    from distprof.render import render_console
    from distprof.render.html_whatif import fig_critical_path, whatif_table

    rep = build_report(late)
    fig = fig_critical_path(rep)
    ys = {y for trace in fig["data"] for y in trace["y"]}
    assert "rank 2" in ys and {t["name"] for t in fig["data"]} <= {"work", "transfer"}
    assert "at their peers&#x27; median" in whatif_table(rep) or "at their peers' median" in whatif_table(rep)
    text = render_console(rep)
    assert "Critical path" in text and "rank 2" in text.split("Critical path")[1].splitlines()[0]
    assert "Estimated gain if fixed" in text and "What if" in text


@pytest.mark.parametrize("values", [[], [3], [2, 2, 2], [5, 0, 5, 1, 0, 9], list(range(10))[::-1], [7, 1] * 20])
def test_the_relaxations_distinct_sets(values):
    """The frontier's sets of events and instances: the distinct values, each once, and each element's place among
    them — also when the same helper served other arrays before (its slots hold their positions)."""
    from distprof.analysis.graph.critical_path import _Distinct

    d = _Distinct(10)
    d.of(np.arange(10)[::-1])  # an earlier pass's set
    v = np.array(values, dtype=np.int64)
    keep = d.of(v)
    assert sorted(keep.tolist()) == sorted(set(values))
    keep, inv = d.of(v, inverse=True)
    assert sorted(keep.tolist()) == sorted(set(values)) and keep[inv].tolist() == values


def test_ids_in_32_bits_replay_as_in_64():
    """The graph holds its id and index columns in 32 bits (narrow.py); the same graph with them in 64 bits gives
    the same replay, bit for bit, and the same critical paths."""
    from dataclasses import fields, replace

    g = step_graph(simulated_run(windows=2, gap_steps=1, pre={(1, it): 20.0 for it in range(30)}))
    ids = [f.name for f in fields(g) if f.name.startswith("ev_") and getattr(g, f.name) is not None
           and getattr(g, f.name).dtype == np.int32]  # (ev_cpu_wait is None where no rank sampled its CPU wait)
    assert {"ev_rs", "ev_rank", "ev_group", "ev_prev", "ev_partner", "ev_pg", "ev_op"} <= set(ids)
    wide = replace(g, **{k: getattr(g, k).astype(np.int64) for k in ids})
    for chain in (False, True):
        a, b = replay(g, chain=chain), replay(wide, chain=chain)
        for x, y in ((a.arrival, b.arrival), (a.end, b.end), (a.rs_start, b.rs_start), (a.rs_end, b.rs_end)):
            assert np.array_equal(x, y)
        pa, pb = critical_paths(g, a), critical_paths(wide, b)
        assert np.array_equal(pa.work_ms, pb.work_ms) and pa.segments == pb.segments


def test_no_sampled_cpu_wait_holds_no_column_and_prices_as_unknown_everywhere(tmp_path):
    """A run whose ranks sampled no CPU wait (GPU ranks, imports) has no CPU-wait columns in its collective rows: the
    graph then holds none either (None, not a column of NaN: 12 MB at 1,024 LLM-shaped ranks), and a straggler's
    what-if is the one the graph gives with columns of NaN."""
    from dataclasses import replace

    from distprof.analysis.graph.whatif import Straggler, estimate

    run = distprof.load(make_run(tmp_path, world_size=4, late_rank=2, late_ms=8.0).run_dir, progress=False)
    assert "cpu_wait_at_start_ns" not in run.collective_rows
    g = step_graph(run)
    assert g.ev_cpu_wait is None and np.isnan(g.rs_tail_cpu_wait).all()
    nan = np.full(len(run.collective_rows["step"]), np.nan)
    with_nan = replace(run, collective_rows={**run.collective_rows, "cpu_wait_at_start_ns": nan,
                                             "cpu_wait_at_end_ns": nan})
    g2 = step_graph(with_nan)
    assert g2.ev_cpu_wait is not None and np.isnan(g2.ev_cpu_wait).all()
    assert np.array_equal(g.rs_tail_cpu_wait, g2.rs_tail_cpu_wait, equal_nan=True)
    a = estimate(run, Straggler(ranks=(2,)), graph=g)
    b = estimate(with_nan, Straggler(ranks=(2,)), graph=g2)
    assert a.gain_ms_per_step > 0 and a.gain_ms_per_step == b.gain_ms_per_step
    assert a.per_step_gain_ms.tobytes() == b.per_step_gain_ms.tobytes()


@pytest.mark.parametrize("seed", range(4))
def test_dense_groups_are_np_uniques_inverse(seed):
    """The graph's dense group ids (a table over the instance ids) are np.unique's inverse of the kept ids; −1 stays."""
    from distprof.analysis.graph.critical_path import _dense_groups

    rng = np.random.default_rng(seed)
    grp = rng.integers(-1, 40, size=500)  # −1: transfers; some ids missing (instances not kept)
    gid, n = _dense_groups(grp)
    ug, inv = np.unique(grp[grp >= 0], return_inverse=True)
    assert n == ug.size and gid[grp >= 0].tolist() == inv.reshape(-1).tolist()
    assert (gid[grp < 0] == -1).all()
    assert _dense_groups(np.full(3, -1))[1] == 0
