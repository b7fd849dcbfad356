"""``distprof diff`` (analysis/diff.py): parts that add up, noise bands, the verdict — on synthetic runs and on real
torchrun jobs (a 25 ms straggler against the same job without it; two runs of the unchanged job)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from synth import make_run
from whatif_jobs import DELAY_MS, job, twins

import distprof
from distprof.analysis.diff import diff_runs
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
