"""What-if estimates (analysis/whatif.py): on synthetic runs whose answer is known (the same run generated without
the delay), and on real torchrun jobs: the prediction for a removed delay against the measured re-run."""

from __future__ import annotations

import numpy as np
import pytest
from synth import make_run
from whatif_jobs import DELAY_MS, job

import distprof
from distprof.analysis.graph import whatif
from distprof.analysis.graph.critical_path import replay, step_graph
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
    rerun = whatif.step_time_ms(distprof.load(job(tmp_path_factory, "plain")))
    w = whatif.estimate(slow, whatif.Straggler(ranks=(1,)))
    err = abs(w.predicted_step_ms - rerun)
    assert err <= max(4.0, 0.35 * rerun), (w.to_json(), rerun)
    assert np.isfinite(w.gain_ms_per_step) and w.gain_ms_per_step > 0.5 * DELAY_MS, w.to_json()
