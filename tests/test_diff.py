"""``distprof diff`` (analysis/report/diff.py): parts that add up, noise bands, the verdict — on synthetic runs and
on real torchrun jobs (a 25 ms straggler against the same job without it; two runs of the unchanged job)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from synth import make_run
from whatif_jobs import DELAY_MS, job, twins

import distprof
from distprof.analysis.report.diff import diff_runs
from distprof.cli import main


def _load(tmp_path_factory, name, **kw):
    return distprof.load(make_run(tmp_path_factory.mktemp(name), world_size=4, schedule={"active": 5},
                                  run_id=name, **kw).run_dir)


@pytest.fixture(scope="module")
def synth(tmp_path_factory):
    return {"late": _load(tmp_path_factory, "late", late_rank=2, late_ms=20),
            "base": _load(tmp_path_factory, "base")}


def _rank_part(d, rank):
    return next(p for p in d.splits["rank"].parts if p.label == f"rank {rank}")


def test_splits_add_up_and_name_the_straggler(synth):
    d = diff_runs(synth["base"], synth["late"])
    assert d.significant and d.step.delta == pytest.approx(20, rel=0.1)
    for sp in d.splits.values():
        assert sp.total == pytest.approx(d.step.delta, abs=1e-6), sp.name
    p = _rank_part(d, 2)
    assert p.significant and p.share_pct >= 80
    assert "rank 2" in d.verdict and "slower" in d.verdict
    # B against A is the mirror image
    r = diff_runs(synth["late"], synth["base"])
    assert r.step.delta == pytest.approx(-d.step.delta) and "faster" in r.verdict


def test_a_run_against_itself_has_no_change(synth):
    d = diff_runs(synth["late"], synth["late"])
    assert d.step.delta == 0 and not d.significant
    assert all(p.delta == 0 and not p.significant for sp in d.splits.values() for p in sp.parts)
    assert not any(p.significant for p in d.ops + d.memory + d.flops)
    assert "inside the noise" in d.verdict


@pytest.mark.slow
def test_real_straggler_is_named_with_most_of_the_change(tmp_path_factory, tmp_path):
    plain, slow = job(tmp_path_factory, "plain"), job(tmp_path_factory, "slow", DELAY_MS)
    out, html = tmp_path / "diff.json", tmp_path / "diff.html"
    assert main(["diff", str(plain), str(slow), "--json", str(out), "--html", str(html), "--no-progress"]) == 0
    doc = json.loads(out.read_text())
    assert doc["significant"] and doc["step_time"]["delta"] > 0.6 * DELAY_MS
    rank1 = next(p for p in doc["splits"]["rank"]["parts"] if p["label"] == "rank 1")
    assert rank1["significant"] and rank1["share_pct"] >= 80, doc["splits"]["rank"]
    for sp in doc["splits"].values():
        assert sp["total_delta_ms"] == pytest.approx(doc["step_time"]["delta"], abs=1e-6)
    assert "rank 1" in doc["verdict"]
    assert "rank 1" in html.read_text() and "<script" not in html.read_text()


@pytest.mark.slow
def test_two_runs_of_the_unchanged_job_differ_by_nothing_significant(tmp_path_factory):
    a, b = (distprof.load(p) for p in twins(tmp_path_factory))
    d = diff_runs(a, b)
    assert not d.significant, d.verdict
    assert "inside the noise" in d.verdict
    assert np.isfinite(d.step.band) and d.step.band > 0


def test_bad_run_is_one_line_error(tmp_path, capsys):
    assert main(["diff", str(tmp_path / "nope"), str(tmp_path / "nope2"), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "nope" in err[0]


def test_different_world_sizes(synth, tmp_path_factory):
    two = distprof.load(make_run(tmp_path_factory.mktemp("two"), world_size=2, schedule={"active": 5},
                                 run_id="two").run_dir)
    d = diff_runs(synth["base"], two)
    assert (d.a_world, d.b_world) == (4, 2) and "world size 4 -> 2" in d.verdict
    for sp in d.splits.values():
        assert sp.total == pytest.approx(d.step.delta, abs=1e-6), sp.name
    labels = {p.label: p for p in d.splits["rank"].parts}
    assert labels["rank 3"].b is None and labels["rank 3"].a is not None  # only in A


# ---- the noise band ------------------------------------------------------------------------------------------------
def _band(a, b, **rules):
    from distprof.analysis.report.diff import DiffRules, _part

    return _part("x", np.asarray(a, float), np.asarray(b, float), 0.0, DiffRules(**rules)).band


def test_few_steps_get_students_t_not_three_standard_errors():
    """8 steps a run: the band is Student's t at Welch's degrees of freedom (3-sigma confidence), wider than 3 SE; with
    many steps it tends to 3 SE."""
    from distprof.analysis.cross.stragglers import t_quantile

    a = np.array([10.0, 12, 11, 13, 9, 12, 10, 11])  # alternating: no positive autocorrelation
    b = a + 1.0
    se = np.sqrt(2 * a.var(ddof=1) / a.size)
    tail = 0.5 * math.erfc(3 / math.sqrt(2))
    assert _band(a, b) == pytest.approx(t_quantile(tail, 14) * se, rel=1e-6)
    assert _band(a, b) > 1.15 * 3 * se  # t(14) at 99.73 % is 3.64
    big = np.tile(a, 200)
    assert _band(big, big + 1) == pytest.approx(3 * np.sqrt(2 * big.var(ddof=1) / big.size), rel=0.02)


def test_steps_that_come_in_spells_widen_the_band():
    """The same 20 step times, once alternating and once in two spells (a load that came and went): the spells carry
    less information about the mean, so their band is wider; the means are the same."""
    alt = np.array([10.0, 14] * 10)
    spells = np.sort(alt)
    assert _band(spells, spells) > 1.5 * _band(alt, alt)


def test_noise_floor_flag(tmp_path_factory, capsys):
    """--noise-floor sets the least band (% of A's step time): a 20 ms straggler gone from a 35 ms step is inside a
    90 % floor, not the default; a bad value is one line, no traceback."""
    runs = [str(make_run(tmp_path_factory.mktemp(k), world_size=4, schedule={"active": 5}, run_id=k, **kw).run_dir)
            for k, kw in (("late", {"late_rank": 2, "late_ms": 20}), ("base", {}))]
    assert main(["diff", *runs, "--json", "-", "--no-progress", "--noise-floor", "90"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["rules"]["floor_pct"] == 90 and not doc["significant"]
    assert doc["step_time"]["band"] >= 0.9 * doc["step_time"]["a"] > -doc["step_time"]["delta"]
    assert main(["diff", *runs, "--json", "-", "--no-progress"]) == 0
    assert json.loads(capsys.readouterr().out)["significant"]
    with pytest.raises(SystemExit) as e:
        main(["diff", *runs, "--noise-floor", "-3"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "--noise-floor" in err[-1] and "Traceback" not in "".join(err)
