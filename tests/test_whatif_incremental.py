"""The what-if's cheaper replays (analysis/graph/whatif.py's Estimator, schedule.py's replay from a row) give exactly
the full replay's figures: a change's replay starts at the first level whose inputs it changes, a change asked for
again is not replayed again, and a change that changes nothing the replay reads is the measured replay. Checked bit
for bit against a full chained replay, on synthetic runs with changes on some ranks and some steps only."""

from __future__ import annotations

import numpy as np
import pytest
from synth import make_run
from whatif_jobs import simulated_run

import distprof
from distprof.analysis.cross.stragglers import find_stragglers
from distprof.analysis.findings import findings
from distprof.analysis.findings.gains import annotate_findings, change_for
from distprof.analysis.graph import whatif
from distprof.analysis.graph.critical_path import replay, step_graph
from distprof.analysis.graph.schedule import first_changed_row, replay_values, schedule
from distprof.analysis.graph.whatif import Estimator, _lead_in, apply, estimator


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """8 ranks, two windows of 4 steps, rank 2 late by 10 ms."""
    return distprof.load(make_run(tmp_path_factory.mktemp("inc"), world_size=8, late_rank=2, late_ms=10,
                                  schedule={"wait": 1, "warmup": 1, "active": 4, "repeat": 2},
                                  run_id="inc").run_dir)


def _full_gain(run, g, c) -> np.ndarray:
    """The gain per step from two full chained replays (what the Estimator did before it replayed from a row)."""
    base = replay(g, chain=True).step_ms(g)
    changed = replay(_lead_in(g, apply(run, g, c)), chain=True).step_ms(g)
    steps, si = np.unique(g.rs_step, return_inverse=True)
    si = si.reshape(-1)
    n = np.maximum(np.bincount(si, minlength=steps.size), 1)
    return np.bincount(si, weights=base - changed, minlength=steps.size) / n


def _simulated(make: str):
    """The simulated two-rank job, rank 1 late before its forward; "lanes": with six bucket all-reduces per step
    queued on two communication lanes (gloo's worker threads), so events hang off an earlier event's end."""
    lanes = {"buckets": 6, "lanes": 2} if make == "lanes" else {}
    return simulated_run(windows=2, gap_steps=1, pre={(1, it): 20.0 for it in range(30)}, **lanes)


CHANGES = [whatif.Straggler(ranks=(2,)), whatif.Straggler(ranks=(1, 6)), whatif.OverlapComm(),
           whatif.OverlapComm(ranks=(5,)), whatif.FasterCollective("all_reduce", 2.0, ranks=(0, 7)),
           whatif.NoIdle(ranks=(3,)), whatif.NoIdle(), whatif.NoInputWait(ranks=(4,)), whatif.NoCpuWait(ranks=(2,)),
           whatif.FasterOp("aten::mm", 2.0, ranks=(6,)), whatif.FasterCollective("broadcast", 2.0)]


def test_every_change_gives_the_full_replays_gain_bit_for_bit(run):
    g = step_graph(run)
    assert (g.rs_prev >= 0).any() and schedule(g) is not None and (g.rs_prev < 0).sum() == 16  # 8 ranks x 2 windows
    est = Estimator(run, g)
    for c in CHANGES:
        w = est.estimate(c)
        assert np.array_equal(w.per_step_gain_ms, _full_gain(run, g, c)), c
    assert est.estimate(whatif.Straggler(ranks=(2,))).gain_ms_per_step > 8.0  # the late rank's delay is seen


def test_an_estimator_elsewhere_from_the_replay_gives_the_same_gains(run):
    """Another MPI process holding a copy of the graph and the measured replay (``Estimator.replayed``, pickled as
    it travels) estimates the what-ifs that read the graph alone with the gains the run's own estimator gives, bit
    for bit; handed back (``take_gains``), they are not replayed again."""
    import pickle

    g = step_graph(run)
    est = Estimator(run, g)
    graph_only = [c for c in CHANGES if whatif.reads_graph_only(c)]
    assert len(graph_only) == 4 and not any(whatif.reads_graph_only(c) for c in CHANGES if c not in graph_only)
    g2, replayed = pickle.loads(pickle.dumps((g, est.replayed()), protocol=5))
    elsewhere = Estimator(None, g2, replayed=replayed)
    gains = elsewhere.gains(graph_only)
    assert elsewhere.replays == len(graph_only)
    for c, gain in zip(graph_only, gains):
        assert np.array_equal(gain, _full_gain(run, g, c)), c
    est.take_gains(graph_only, gains)
    rows = [est.estimate(c) for c in graph_only]
    assert est.replays == 0  # every one taken, none replayed here
    assert [w.per_step_gain_ms.tolist() for w in rows] == [x.tolist() for x in gains]
    assert all(w.measured_step_ms is not None for w in rows)  # the run's own step times, not the other process's none


@pytest.mark.parametrize("make", ["synth", "simulated", "lanes"])
def test_a_replay_from_the_first_changed_row_is_the_full_replay(run, make):
    """Segments, tails, transfers and window starts changed on some ranks from some step on: the replay that starts at
    the first row reading a changed input equals the full one, value for value, and starts past row 0."""
    r = run if make == "synth" else _simulated(make)
    g = step_graph(r)
    s = schedule(g)
    base = replay_values(g, s)
    rng = np.random.default_rng(1)
    steps = np.unique(g.rs_step)
    later = 0
    for _ in range(12):
        ranks = rng.choice(np.unique(g.rs_rank), size=rng.integers(1, 3), replace=False)
        s0 = rng.choice(steps)
        ev = np.isin(g.ev_rank, ranks) & (g.ev_step >= s0)
        rs = np.isin(g.rs_rank, ranks) & (g.rs_step >= s0)
        what = rng.integers(0, 4)
        other = g.with_segments(
            gap=np.where(ev, g.ev_gap * rng.uniform(0.3, 1.2, g.n_events), g.ev_gap) if what == 0 else None,
            tail=np.where(rs, g.rs_tail * rng.uniform(0.3, 1.2, rs.size), g.rs_tail) if what == 1 else None,
            transfer=np.where(ev, g.ev_transfer * 0.5, g.ev_transfer) if what == 2 else None,
            start=np.where(rs & (g.rs_prev < 0), g.rs_start - 1e6, g.rs_start) if what == 3 else None)
        row = first_changed_row(s, g, other)
        later += row > 0
        full = replay_values(other, s)
        part = replay_values(other, s, base=base, from_row=row)
        assert np.array_equal(full[0], part[0]) and np.array_equal(full[1], part[1]), (ranks, s0, what, row)
    assert later >= 4  # most of these changes start after the first row


def test_a_change_that_changes_nothing_is_the_measured_replay(run):
    """Idle removed on a rank without idle, a collective the run does not have: the replay is not run at all, and
    the gain is exactly 0."""
    g = step_graph(run)
    est = Estimator(run, g)
    assert first_changed_row(schedule(g), g, g.with_segments()) == len(schedule(g).bounds)
    w = est.estimate(whatif.FasterCollective("broadcast", 2.0))
    assert w.gain_ms_per_step == 0.0 and not w.per_step_gain_ms.any()


def test_the_report_table_and_the_findings_share_their_replays(run):
    """annotate_findings and the what-if table (as build_report calls them, on one graph) replay each distinct change
    once — the straggler finding's change is the table's first row — and a finding's figures are those a replay of
    its own gives."""
    g = step_graph(run)
    strag = find_stragglers(run)
    found = findings(run, stragglers=strag, root_cause=[])
    annotate_findings(run, found, graph=g)
    table = whatif.standard(run, stragglers=strag, graph=g)
    est = estimator(run, g)
    assert estimator(run, g) is est and est.run is run
    asked = [change_for(f, run) for f in found if change_for(f, run) is not None]
    assert any(f.id == "straggler_rank" and f.rank == 2 for f in found) and table[0].change == "straggler"
    assert est.replays == len(est._gains) < len(table) + len(asked)
    fresh = Estimator(run, g)
    for f in found:
        c = change_for(f, run)
        if c is not None:
            w = fresh.estimate(c)
            assert (w.gain_ms_per_step, w.predicted_step_ms) == (f.estimated_gain_ms_per_step, f.predicted_step_ms)
    # asked again, with the ranks in another order: the same figures, not a new replay
    n = est.replays
    a = est.estimate(whatif.Straggler(ranks=(6, 1)))
    b = est.estimate(whatif.Straggler(ranks=(1, 6)))
    assert est.replays == n + 1
    assert np.array_equal(a.per_step_gain_ms, b.per_step_gain_ms) and a.per_step_gain_ms is not b.per_step_gain_ms


def test_medians_from_a_presorted_order_are_group_medians():
    """A straggler's peer medians and spread are taken from orders sorted once per graph: the same figures, bit for
    bit, as sorting the subset (ties, NaN, zeros and −0.0 among the values; keys with no row)."""
    from distprof.analysis.graph.whatif import _presorted_spread, _spread, _subset_medians, group_median

    rng = np.random.default_rng(3)
    n = 5_000
    key = rng.integers(0, 300, n)
    v = np.round(rng.exponential(1e5, n), -3)  # many ties
    v[rng.random(n) < 0.05] = 0.0
    v[rng.random(n) < 0.02] = -0.0
    v[rng.random(n) < 0.01] = np.nan
    order = np.lexsort((v, key))
    for frac in (1.0, 0.5, 0.01, 0.0):
        sel = rng.random(n) < frac
        want = group_median(key[sel], v[sel], 300)
        got = _subset_medians(order, sel, key, v, 300)[0]
        assert want.tobytes() == got.tobytes()
        spread = _presorted_spread(order, sel, key, v)
        assert np.asarray(_spread(v[sel], key[sel])).tobytes() == np.asarray(spread).tobytes()


@pytest.mark.parametrize("make", ["synth", "simulated", "lanes"])
def test_levels_from_the_position_bound_are_the_levels_from_zero(run, make):
    """The schedule raises levels from a lower bound (an arrival's position in its rank-step + 1): the same levels
    as raising them from 0, which took a step's depth of passes over every value."""
    from distprof.analysis.graph.schedule import _deps, _levels, _settle

    r = run if make == "synth" else _simulated(make)
    g = step_graph(r)
    d = _deps(g)
    cap = d.n + d.nu + 2 * d.nrs + 2
    lv, lv_e = _settle(d, g, np.zeros(d.n + d.nu + d.nrs, np.int64), np.zeros(d.nrs, np.int64), chain=False,
                       max_passes=cap)
    assert (lv[:d.n] > 0).all()
    got = _levels(g, d)
    # the chained levels from the guess built on the local ones: the guess, then raised, from either start
    span = int(max(lv.max(), lv_e.max())) + 1
    pos = np.arange(d.nrs) - np.maximum.accumulate(np.where(g.rs_prev < 0, np.arange(d.nrs), 0))
    lv[:d.n] += pos[g.ev_rs] * span
    lv[d.n + d.nu:] = np.where(d.chained, pos * span, 0)
    lv[d.n:d.n + d.nu] = np.maximum.reduceat(lv[d.mem_ev], d.mem_bounds)
    want = _settle(d, g, lv, lv_e + pos * span, chain=True, max_passes=cap)
    assert got[0].tobytes() == want[0].tobytes() and got[1].tobytes() == want[1].tobytes()


@pytest.mark.parametrize("make", ["synth", "simulated", "lanes"])
def test_relaxing_only_the_moving_arrivals_is_relaxing_all(run, make, monkeypatch):
    """The unchained replay (the report's critical path) recomputes, after its first pass, only the arrivals whose
    inputs moved: the same arrivals, ends, step ends and pass count as recomputing every one in every pass, also
    when the passes are cut short."""
    from distprof.analysis.graph import critical_path as cp

    r = run if make == "synth" else _simulated(make)
    g = step_graph(r)
    rng = np.random.default_rng(2)
    graphs = [g, g.with_segments(gap=g.ev_gap * rng.uniform(0.2, 1.5, g.n_events),
                                 transfer=g.ev_transfer * rng.uniform(0.0, 2.0, g.n_events))]
    for h in graphs:
        for limit in (None, 1, 2, 3):
            got = {}
            for share in (1, 10**9):  # only the moving arrivals in every pass; every arrival in every pass
                monkeypatch.setattr(cp, "FRONTIER_SHARE", share)
                rp = cp.replay(h, max_passes=limit)
                got[share] = (rp.arrival.tobytes(), rp.end.tobytes(), rp.rs_end.tobytes(), rp.last_arriver.tobytes(),
                              rp.passes, rp.converged)
            assert got[1] == got[10**9], limit
    assert cp.replay(graphs[1]).passes >= 2  # the changed graph settles over passes: there is a frontier to follow


@pytest.mark.parametrize("make", ["synth", "simulated", "lanes"])
@pytest.mark.parametrize("chain", [False, True])
def test_closing_the_chains_in_a_pass_gives_the_levels_of_one_hop_per_pass(run, make, chain):
    """_settle closes each rank-step's chain of arrivals within a pass: the same least levels as raising each value
    only by what it reads (one sync event per pass), from the same start, in fewer passes."""
    from distprof.analysis.graph import schedule as S

    r = run if make == "synth" else _simulated(make)
    g = step_graph(r)
    d = S._deps(g)
    cap = d.n + d.nu + 2 * d.nrs + 2
    assert S._chain_closer(d, g) is not None  # the graph's events are laid out rank-step by rank-step
    passes = {}
    real = S._pass

    def counted(*a):
        passes[a[-1] is not None] = passes.get(a[-1] is not None, 0) + 1
        return real(*a)

    def start():
        return np.zeros(d.n + d.nu + d.nrs, np.int64), np.zeros(d.nrs, np.int64)

    S._pass = counted
    try:
        got = S._settle(d, g, *start(), chain=chain, max_passes=cap)
        want = S._settle_every_hop(d, g, *start(), chain=chain, max_passes=cap)
    finally:
        S._pass = real
    assert got is not None and want is not None
    assert got[0].tobytes() == want[0].tobytes() and got[1].tobytes() == want[1].tobytes()
    assert passes[True] <= passes[False], passes
    if make == "synth":  # steps of many collectives: a rise crosses them in one pass, not one per pass
        assert passes[True] < passes[False], passes
