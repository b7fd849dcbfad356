"""What-if estimates (analysis/whatif.py): on synthetic runs whose answer is known (the same run generated without
the delay), on simulated jobs whose every time is computed (a delay before the forward, between forward and backward,
in only some steps), and on real torchrun jobs: the prediction for a removed delay against the delay and the measured
re-run."""

from __future__ import annotations

import numpy as np
import pytest
from synth import make_run
from whatif_jobs import (DELAY_MS, MANY_BUCKETS, PLACED_DEVICE_MS, alternate_windows, job, placed_job,
                         simulated_run)

import distprof
from distprof.analysis.graph import whatif
from distprof.analysis.graph.critical_path import LINK_END, replay, step_graph
from distprof.analysis.report.build import build_report

MS = 1_000_000


def _load(tmp_path_factory, name, **kw):
    return distprof.load(make_run(tmp_path_factory.mktemp(name), world_size=4, schedule={"active": 5},
                                  run_id=name, **kw).run_dir)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return {"late": _load(tmp_path_factory, "late", late_rank=2, late_ms=20),
            "idle": _load(tmp_path_factory, "idle", late_rank=2, late_ms=20, late_kind="idle"),
            "base": _load(tmp_path_factory, "base")}


def test_straggler_at_its_peers_median_predicts_the_run_without_it(runs):
    truth = whatif.step_time_ms(runs["base"])
    w = whatif.estimate(runs["late"], whatif.Straggler(ranks=(2,)))
    assert w.measured_step_ms == pytest.approx(whatif.step_time_ms(runs["late"]))
    assert w.measured_step_ms > truth + 15
    assert w.predicted_step_ms == pytest.approx(truth, rel=0.03)
    assert w.gain_ms_per_step == pytest.approx(20, rel=0.1)
    # the others' waiting goes too: in the replay nobody waits at the first all-reduce any more
    g = step_graph(runs["late"])
    from distprof.analysis.graph.whatif import apply

    rp = replay(apply(runs["late"], g, whatif.Straggler(ranks=(2,))))
    first = g.ev_link == 0
    assert ((rp.start - rp.arrival)[first] / MS).max() < 2.0
    # a rank that is not late gains nothing
    assert whatif.estimate(runs["base"], whatif.Straggler(ranks=(2,))).gain_ms_per_step == pytest.approx(0, abs=0.3)


def test_idle_removed_and_communication_changes(runs):
    idle = whatif.estimate(runs["idle"], whatif.NoIdle())
    assert idle.predicted_step_ms == pytest.approx(whatif.step_time_ms(runs["base"]), rel=0.1)
    assert whatif.estimate(runs["late"], whatif.NoIdle()).gain_ms_per_step < 1.0  # its delay is an op, not idle
    over = whatif.estimate(runs["base"], whatif.OverlapComm())
    half = whatif.estimate(runs["base"], whatif.FasterCollective("all_reduce", 2.0))
    assert over.gain_ms_per_step > 1.0
    assert half.gain_ms_per_step == pytest.approx(over.gain_ms_per_step / 2, rel=0.15)
    assert whatif.estimate(runs["base"], whatif.FasterCollective("broadcast", 2.0)).gain_ms_per_step == 0.0
    # on one rank only, overlapped communication still waits for the others
    assert whatif.estimate(runs["base"], whatif.OverlapComm(ranks=(0,))).gain_ms_per_step < over.gain_ms_per_step
    mm = whatif.estimate(runs["base"], whatif.FasterOp("aten::mm", 2.0))
    assert 0 < mm.gain_ms_per_step < mm.measured_step_ms / 2


def test_bad_changes_are_refused():
    with pytest.raises(ValueError, match="factor"):
        whatif.FasterCollective("all_reduce", 0.0)
    with pytest.raises(ValueError, match="factor"):
        whatif.FasterOp("aten::mm", float("nan"))
    with pytest.raises(ValueError, match="rank"):
        whatif.Straggler()


def test_report_findings_carry_their_estimated_gain(runs):
    rep = build_report(runs["late"])
    f = next(f for f in rep.findings if f.id == "straggler_rank")
    assert f.rank == 2
    assert f.estimated_gain_ms_per_step == pytest.approx(20, rel=0.1)
    assert f.predicted_step_ms == pytest.approx(whatif.step_time_ms(runs["base"]), rel=0.05)
    assert rep.whatif[0].change == "straggler" and rep.whatif[0].predicted_step_ms is not None
    assert all(f2.estimated_gain_ms_per_step is None or f2.estimated_gain_ms_per_step >= -1e-9
               for f2 in rep.findings)
    assert rep.critical_path.ranks[0].rank == 2


@pytest.mark.slow
def test_removed_delay_predicts_the_measured_rerun(tmp_path_factory):
    """2 ranks, rank 1 sleeping 25 ms per step: the prediction without the delay against the same job re-run
    without it. The goal is 15 % or 2 ms (benchmarks/whatif_accuracy.py measures it over delays and rank counts);
    the test's margin is wider, for a loaded machine, and still far from the delayed step."""
    slow = distprof.load(job(tmp_path_factory, "slow", DELAY_MS))
    rerun = float(np.median(whatif.per_step_time_ms(distprof.load(job(tmp_path_factory, "plain")))[1]))
    w = whatif.estimate(slow, whatif.Straggler(ranks=(1,)))
    # per step the measured step less the gain, the median over steps (the odd step the machine holds off moves a
    # mean of 8 by tens of ms)
    predicted = float(np.median(whatif.per_step_time_ms(slow)[1] - w.per_step_gain_ms))
    err = abs(predicted - rerun)
    assert err <= max(4.0, 0.35 * rerun), (w.to_json(), predicted, rerun)
    assert np.isfinite(w.gain_ms_per_step) and np.median(w.per_step_gain_ms) > 0.5 * DELAY_MS, w.to_json()


# ---- a delay anywhere in the iteration (simulated: exact times) ----------------------------------------------------
SIM_DELAY = 20.0


def _gain_vs_truth(**delays):
    """(predicted gain, measured gain: the delayed run's step time less the same run's without the delays)."""
    run = simulated_run(**delays)
    w = whatif.estimate(run, whatif.Straggler(ranks=(1,)))
    return w, whatif.step_time_ms(run) - whatif.step_time_ms(simulated_run())


@pytest.mark.parametrize("place", ["pre", "mid"])
def test_a_delay_anywhere_in_the_iteration_gets_its_full_gain(place):
    """Rank 1 waits 20 ms every iteration, before its forward (a DataLoader wait, a step-begin callback, host
    preprocessing: with steps cut at the forward, in the previous step's tail) or between forward and backward. Either
    way the step is 20 ms longer, and the what-if gives all of it back — in every step, the window's first included
    (its start was late from the unrecorded step before it). Without carrying a step's tail into the next step's
    arrivals, the pre-forward delay got half: the waiting rank's time stayed."""
    w, truth = _gain_vs_truth(**{place: {(1, it): SIM_DELAY for it in range(30)}})
    assert truth == pytest.approx(SIM_DELAY)
    assert w.gain_ms_per_step == pytest.approx(truth, abs=0.01), w.to_json()
    assert w.per_step_gain_ms == pytest.approx(np.full(6, SIM_DELAY), abs=0.01)
    assert w.predicted_step_ms == pytest.approx(whatif.step_time_ms(simulated_run()), abs=0.01)


@pytest.mark.parametrize("place", ["pre", "mid"])
def test_a_delay_only_some_steps_have_gets_its_full_gain(place):
    """The delay in every third iteration: a third of it per step on average, which the what-if gives back — a rank's
    excess in a step that stands out from the peers' spread counts, not only the excess it has in most steps."""
    w, truth = _gain_vs_truth(**{place: {(1, it): SIM_DELAY for it in range(30) if it % 3 == 1}})
    assert truth == pytest.approx(SIM_DELAY / 3, rel=0.01)
    assert w.gain_ms_per_step == pytest.approx(truth, rel=0.02), (w.to_json(), w.per_step_gain_ms)


@pytest.mark.parametrize("place", ["pre", "mid"])
def test_collectives_queued_on_communication_lanes_give_the_full_gain(place):
    """DDP's bucket all-reduces on gloo run on two worker threads: a bucket ready while both are busy starts the
    instant one of them ends the bucket before it. The waiting rank's bucket then began at that end, while it
    arrived during the other lane's event; hung off that event's arrival, the whole wait for the straggler was the
    rank's own work and stayed in the replay (measured on a real 2-rank job with 8 buckets: a 20 ms delay before
    the forward priced at 5.8 ms, with PyTorch's fp16 compression hook at 2.0 ms). Hung off the end it queued
    behind, it gets the full gain."""
    kw = {"buckets": 6, "lanes": 2}
    run = simulated_run(**kw, **{place: {(1, it): SIM_DELAY for it in range(30)}})
    g = step_graph(run)
    queued = (g.ev_prev >= 0) & (g.ev_prev < np.arange(g.n_events) - 1)
    assert queued.any() and (g.ev_link[queued] == LINK_END).all()
    truth = whatif.step_time_ms(run) - whatif.step_time_ms(simulated_run(**kw))
    assert truth == pytest.approx(SIM_DELAY)
    w = whatif.estimate(run, whatif.Straggler(ranks=(1,)))
    assert w.gain_ms_per_step == pytest.approx(truth, abs=0.01), w.to_json()
    assert w.per_step_gain_ms == pytest.approx(np.full(6, SIM_DELAY), abs=0.01)


def test_the_chain_breaks_between_windows():
    """Two windows with unrecorded iterations between them: each window's steps chain, the second window's first step
    starts where it was measured to (lead-in aside), and the gain is still the whole delay."""
    pre = {(1, it): SIM_DELAY for it in range(40)}
    run = simulated_run(windows=2, gap_steps=3, pre=pre)
    g = step_graph(run)
    assert (g.rs_prev < 0).sum() == 4  # 2 ranks x 2 windows
    w = whatif.estimate(run, whatif.Straggler(ranks=(1,)))
    assert w.gain_ms_per_step == pytest.approx(SIM_DELAY, abs=0.01)


def test_a_rank_not_late_gains_nothing_and_others_changes_chain_too():
    """A rank without a delay gains nothing (also when another is late before its forward), and the other changes
    replay the chained graph as well: overlapping the all-reduce's transfer saves it once per step."""
    run = simulated_run(pre={(1, it): SIM_DELAY for it in range(30)})
    assert whatif.estimate(run, whatif.Straggler(ranks=(0,))).gain_ms_per_step == pytest.approx(0.0, abs=0.01)
    base = simulated_run()
    assert whatif.estimate(base, whatif.OverlapComm()).gain_ms_per_step == pytest.approx(1.0, abs=0.01)


# ---- the same on real torchrun jobs --------------------------------------------------------------------------------
#: 30 % of the step or more: the noise of a loaded 2-core machine cannot cross the margins below.
PLACED_DELAY_MS = 0.75 * PLACED_DEVICE_MS


def _own_ms(run) -> dict[tuple[int, int], float]:
    """What the trace shows: each rank's own time in each step (its work segments and its tail, waits excluded), ms
    by (rank, step)."""
    g = step_graph(run)
    own = g.rs_tail + np.bincount(g.ev_rs, weights=g.ev_gap, minlength=g.rs_rank.size)
    return {(int(r), int(s)): float(o) / MS for r, s, o in zip(g.rs_rank, g.rs_step, own)}


def _rank1_excess_ms(run) -> float:
    """Rank 1's own time per step less rank 0's, the median over the steps both have (ms)."""
    own = _own_ms(run)
    steps = sorted({s for r, s in own if r == 0} & {s for r, s in own if r == 1})
    return float(np.median([own[(1, s)] - own[(0, s)] for s in steps]))


def _peer_own_ms(run) -> float:
    """Rank 0's own time per step, the median over steps (ms)."""
    return float(np.median([o for (r, _), o in _own_ms(run).items() if r == 0]))


@pytest.mark.slow
@pytest.mark.parametrize("job_name,place", [("ddp", "pre"), ("loop", "callback"), ("ddp", "mid")])
def test_a_real_delay_anywhere_is_priced_at_the_delay(tmp_path_factory, job_name, place):
    """2 ranks (gloo), 40 ms of device sleep per iteration, rank 1 30 ms slower before its forward (DDP, a plain
    loop), in an on_step_begin callback (a framework-style loop: DataLoader, clipping, scheduler, a logging
    all-reduce), or between forward and backward. The trace shows rank 1's extra time per step; the gain per step
    (the median over steps) gives all of it back. Before steps were chained, a delay before the forward got half
    (0.48-0.54 of it in six runs; chained 0.83-0.99): the peers' wait for the late rank in the next step stayed.
    Measured against the trace, not the sleep: on a loaded machine the delayed rank can lose its core while it
    sleeps and come back tens of ms later, all of it the rank's excess (one run: 57 ms for a 30 ms sleep)."""
    run = distprof.load(placed_job(tmp_path_factory, job_name, place, PLACED_DELAY_MS))
    excess = _rank1_excess_ms(run)
    w = whatif.estimate(run, whatif.Straggler(ranks=(1,)))
    gain = float(np.median(w.per_step_gain_ms))
    assert excess >= 0.5 * PLACED_DELAY_MS, excess  # the delay is there (the peer's own time moves with the load)
    assert 0.7 * excess <= gain <= 1.25 * excess + 2.0, (excess, gain, w.to_json(), w.per_step_gain_ms)


@pytest.mark.slow
def test_a_real_delay_is_priced_at_the_delay_with_a_bucket_per_block(tmp_path_factory):
    """The same with DDP's gradients in six buckets (small bucket_cap_mb): gloo runs their all-reduces on two worker
    threads, so while rank 0's first buckets wait for the late rank its later ones queue behind them. Each queued
    one began at an earlier bucket's end, not during the bucket just before it, where the step graph used to hang
    it: a 20 ms delay was then priced at 5.8 ms on a job like this one (8 buckets; 2.0 ms with the fp16
    compression hook).

    Measured against rank 1's tail (its time after its last bucket, where a delay before the forward lies) less rank
    0's, not its whole own time: rank 0's backward work done while its buckets queued is hidden in that wait (the
    trace has each all-reduce's start on its lane, not when its bucket was ready), so its own time reads short by
    it."""
    run = distprof.load(placed_job(tmp_path_factory, "ddp", "pre", PLACED_DELAY_MS, extra=MANY_BUCKETS))
    per_step = np.bincount(np.asarray(run.collective_rows["step"])[np.asarray(run.collective_rows["rank"]) == 0])
    assert np.median(per_step[per_step > 0]) >= 4, per_step  # several bucket all-reduces per step
    g = step_graph(run)
    tails = {(int(r), int(st)): t / MS for r, st, t in zip(g.rs_rank, g.rs_step, g.rs_tail)}
    excess = float(np.median([tails[(1, st)] - tails[(0, st)] for r, st in tails if r == 1 and (0, st) in tails]))
    w = whatif.estimate(run, whatif.Straggler(ranks=(1,)))
    gain = float(np.median(w.per_step_gain_ms))
    assert excess >= 0.5 * PLACED_DELAY_MS, excess
    assert 0.7 * excess <= gain <= 1.25 * excess + 2.0, (excess, gain, w.to_json(), w.per_step_gain_ms)


@pytest.mark.slow
def test_a_real_pre_forward_delay_predicts_the_rerun(tmp_path_factory):
    """The pre-forward case against the same job without the delay: one job whose windows alternate with and without
    it (re-runs launched apart drifted apart here by 10 ms of CPU contention on every rank). In each delayed window,
    the predicted step (per step the measured step less the gain; the median over steps) is the next window's (the
    median of its steps) within 15 % — the old replay was off by half the delay, 15 ms on a ~48 ms step.

    The what-if holds the other rank's own time as measured. On a loaded 2-core machine that time itself moves with
    the delay (rank 0's own time 51 ms per step in the delayed windows, 45-46 ms in the others, in one CI run: woken
    from a 30 ms wait, it waits for a core), and the re-run's step moves with it; a GPU rank's kernels do not. So the
    prediction is compared after taking out the peer's own-time drift between the two windows, which the trace
    shows (that CI run: off by 6.2 and 8.4 ms uncorrected, 0.1 and 3.1 ms corrected)."""
    path = placed_job(tmp_path_factory, "ddp", "pre", PLACED_DELAY_MS, alternate=4)
    wins = alternate_windows(4)
    for k in (0, 2):
        run = distprof.load(path, steps=wins[k], progress=False)
        rerun = distprof.load(path, steps=wins[k + 1], progress=False)
        w = whatif.estimate(run, whatif.Straggler(ranks=(1,)))
        predicted = float(np.median(whatif.per_step_time_ms(run)[1] - w.per_step_gain_ms))
        truth = float(np.median(whatif.per_step_time_ms(rerun)[1]))
        drift = _peer_own_ms(run) - _peer_own_ms(rerun)
        assert abs(predicted - drift - truth) <= 0.15 * truth, (k, predicted, drift, truth, w.per_step_gain_ms)


# ---- the heaviest ops of the standard table -------------------------------------------------------------------------
def _ops_rank(names: list[str], kinds: list[str], rows: list[tuple[int, float]]):
    """What _heaviest_ops reads of one rank's summary: its op names and kinds, and (name index, own ms) rows."""
    from types import SimpleNamespace

    name = np.array([r[0] for r in rows], dtype=np.int32)
    dur = np.array([r[1] for r in rows], dtype=np.float32)
    return SimpleNamespace(op_totals={"name": name, "dur_ms": dur}, op_names=np.array(names, dtype=object),
                           op_kinds=kinds)


def _heaviest_by_definition(ranks: list, k: int) -> list[str]:
    """Own time per leaf name (a kernel, or an aten:: op) summed per rank, then over ranks; ties in the order first
    seen (rank by rank, in each rank's order of names)."""
    tot: dict[str, float] = {}
    for s in ranks:
        per: dict[int, float] = {}
        for i, ms in zip(s.op_totals["name"].tolist(), s.op_totals["dur_ms"].tolist()):
            per[i] = per.get(i, 0.0) + ms
        for i in sorted(per):
            nm, kind = str(s.op_names[i]), (s.op_kinds[i] if i < len(s.op_kinds) else "")
            if per[i] and (kind == "kernel" or nm.startswith("aten::")):
                tot[nm] = tot.get(nm, 0.0) + per[i]
    return [n for n, _ in sorted(tot.items(), key=lambda x: -x[1])[:k]]


HEAVIEST_CASES = [
    # (ranks as (names, kinds, rows), k, expected)
    ([(["nn.Module: Linear", "aten::mm", "gemm"], ["cpu_op", "cpu_op", "kernel"], [(0, 90.0), (1, 5.0), (2, 7.0)])],
     2, ["gemm", "aten::mm"]),  # the module holds its ops' time: not a leaf
    ([(["aten::mm", "aten::add"], ["cpu_op", "cpu_op"], [(0, 5.0), (1, 3.0)]),
      (["aten::add", "aten::mm"], ["cpu_op", "cpu_op"], [(0, 4.0), (1, 1.0)])],
     2, ["aten::add", "aten::mm"]),  # names summed across ranks whose lists differ in order
    ([(["aten::b", "aten::a"], ["cpu_op", "cpu_op"], [(0, 2.0), (1, 2.0)]),
      (["aten::a", "aten::b"], ["cpu_op", "cpu_op"], [(0, 2.0), (1, 2.0)])],
     2, ["aten::b", "aten::a"]),  # a tie: the name first seen first
    ([(["aten::z", "aten::y"], ["cpu_op", "cpu_op"], [(0, 0.0), (1, 1.0)]),
      (["aten::z", "aten::y"], ["cpu_op", "cpu_op"], [(0, 1.0), (1, 0.0)])],
     2, ["aten::y", "aten::z"]),  # no time in the first rank: seen only where it has some
    ([(["aten::mm", "gemm", "my_region"], ["cpu_op"], [(0, 1.0), (1, 9.0), (2, 9.0)])],
     3, ["aten::mm"]),  # no kind recorded: a leaf only by its aten:: name
    ([(["aten::mm", "aten::mm"], ["cpu_op", "cpu_op"], [(0, 1.0), (1, 2.0)]),
      (["aten::add"], ["cpu_op"], [(0, 2.5)])],
     5, ["aten::mm", "aten::add"]),  # one name twice in a rank's list: both counted
    ([(["aten::a", "aten::b", "aten::a"], ["cpu_op"] * 3, [(0, 1.0), (1, 2.0), (2, 1.0)])],
     2, ["aten::a", "aten::b"]),  # ... and first seen at its first place in the list (a tie here)
    ([([], [], []), (["aten::mm"], ["cpu_op"], [(0, 1.0), (0, 2.0)])], 1, ["aten::mm"]),  # a rank with no ops
    ([([], [], [])], 1, []),
]


@pytest.mark.parametrize("ranks,k,expected", HEAVIEST_CASES)
def test_heaviest_ops_table(ranks, k, expected):
    from types import SimpleNamespace

    rs = [_ops_rank(*r) for r in ranks]
    got = whatif._heaviest_ops(SimpleNamespace(ranks=dict(enumerate(rs))), k)
    assert got == expected == _heaviest_by_definition(rs, k)


def test_heaviest_ops_agree_with_the_definition_on_random_ranks():
    from types import SimpleNamespace

    rng = np.random.default_rng(7)
    pool = [f"aten::op{i}" for i in range(12)] + [f"kernel{i}" for i in range(6)] + ["region", "nn.Module: M"]
    kinds_of = {n: ("kernel" if n.startswith("kernel") else "cpu_op") for n in pool}
    for _ in range(30):
        rs = []
        for _r in range(int(rng.integers(1, 8))):
            names = list(rng.choice(pool, size=int(rng.integers(0, len(pool))), replace=False))
            rows = [(int(rng.integers(len(names))), float(rng.integers(0, 4))) for _ in range(8)] if names else []
            rs.append(_ops_rank(names, [kinds_of[n] for n in names], rows))
        k = int(rng.integers(1, 6))
        assert whatif._heaviest_ops(SimpleNamespace(ranks=dict(enumerate(rs))), k) == _heaviest_by_definition(rs, k)
