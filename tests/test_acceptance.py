"""Issue acceptance on real gloo runs: 4-rank examples/ddp_mlp.py (small width so injected delays dominate), and the
straggler items of issue 22 on 2-rank jobs shaped like accelerator training (every rank sleeps its "device time").

Tolerances are a little wider than the figures measured on a quiet machine (see the closing notes), because CI
shares 2 cores between the ranks; the delays are at least 30 % of the step, so that noise cannot cross the margins.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shlex

import numpy as np
import pytest

import distprof
from conftest import EXAMPLES, ROOT, job_env, only_run_dir, torchrun
from distprof.analysis.report.build import build_report
from distprof.render.html import render_html

pytestmark = pytest.mark.slow


def _run(tmp_path, tag, script_args, **env):
    e = job_env(DISTPROF_RUN_ID=tag, **env)
    args = ["-m", "distprof.launch", "--out", "out", str(EXAMPLES / "ddp_mlp.py"), "--hidden", "256", "--steps", "12",
            *script_args]
    proc = torchrun(4, args, cwd=tmp_path, env=e, check=False)  # reruns once on the known rare exit abort
    assert proc.returncode == 0, proc.stderr[-4000:]
    return build_report(distprof.load(tmp_path / "out" / tag))


def test_straggler_with_skewed_simulated_clocks(tmp_path):
    # every rank sleeps 30 ms of "device time" per step, so the 4 ranks mostly leave the 2 cores alone: CPU-bound
    # only, the contention moved rank 2's lateness away from its clock-free estimate (49 against 31 ms, 1 run in 6
    # here) or below the floor in 2 of the 5 recorded steps (a CI run on a slow host)
    rep = _run(tmp_path, "slow", ["--slow-rank", "2", "--slow-ms", "40", "--base-ms", "30"],
               DISTPROF_SIM_HOSTS="0,0,1,1", DISTPROF_SIM_CLOCKS="0,3.25@40")
    top = rep.stragglers[0]
    assert top.rank == 2 and top.named
    # on a loaded machine the truth is what the trace shows, not the injected 40 ms (while rank 2 sleeps, the others
    # get its CPU and catch up): rank 2 is clearly late, and the aligned lateness agrees with the clock-free one
    # (durations only, no clock) — the check on the skewed clocks' alignment
    assert top.lateness_ms >= 10, top
    assert abs(top.lateness_ms - top.clock_free_lateness_ms) <= 0.25 * top.lateness_ms + 2, top
    # another rank named beside it is the host holding that rank back (4 CPU-bound ranks on 2 cores: a fresh-clone CI
    # run named rank 3 as well), which the report must say as cpu_contention; rank 2 stays the first
    others = [s.rank for s in rep.stragglers if s.named and s.rank != 2]
    if others:
        assert any(f.id == "cpu_contention" for f in rep.findings), (
            [(s.rank, round(s.lateness_ms, 2)) for s in rep.stragglers], rep.verdict)
    host1 = rep.clock["sim-host1"]
    assert host1.method == "ping-pong" and host1.residual_us is not None
    # truth: host 1 runs 3.25 s + 40 ppm ahead; the reported offset maps it back to rank 0's clock
    shard = distprof.storage.read_shard(sorted((tmp_path / "out" / "slow").glob("rank00002.*.h5"))[0])
    sim = shard.attrs["sim_clock"]
    t = shard.attrs["window_start_ns"]
    truth = -(sim["offset_s"] * 1e9 + sim["drift_ppm"] * 1e-6 * (t - sim["t0_ns"]))
    assert abs(host1.offset_ns - truth) < 500e3, (host1.offset_ns, truth)  # measured ≈10 µs when quiet


def test_no_delay_names_nobody_or_says_the_host_held_it_back(tmp_path):
    # 4 CPU-bound ranks share 2 cores here, so the OS scheduler can hold one rank back for a whole window: that rank
    # really arrives late at every collective, a straggler in what was recorded (the rule takes arrivals as they are;
    # contention is reported, not tuned away). Kept runs of this job named a rank in 3 of 8 (2026-12-04, identical
    # under the lateness before and after its chance change), so "one of two runs names nobody" failed about one CI
    # run in seven. What must hold in every run: a rank named without any injected delay comes with the host's
    # oversubscribed cores said (cpu_contention). The training threads' run-queue wait alone did not always say it
    # (a CI run: 6-10 % of the step on every rank, under the rule's 10 %, with rank 2 named); the shards' CPU budget
    # does: 4 CPU ranks of one intra-op thread on fewer than 4 CPUs are oversubscribed whatever the wait.
    few_cpus = len(os.sched_getaffinity(0)) < 4
    for attempt in ("quiet", "quiet2"):
        (tmp_path / attempt).mkdir()
        rep = _run(tmp_path / attempt, attempt, [])
        named = [s.rank for s in rep.stragglers if s.named]
        contention = [f for f in rep.findings if f.id == "cpu_contention"]
        if named or few_cpus:
            assert contention, (attempt, [(s.rank, round(s.lateness_ms, 2)) for s in rep.stragglers], rep.verdict)
        if few_cpus:
            assert "intra-op thread(s) in all on" in contention[0].evidence, contention[0].evidence


def test_uneven_batch_shows_in_flops_and_compute(tmp_path):
    rep = _run(tmp_path, "uneven", ["--uneven", "--batch", "64"])
    m = rep.imbalance.metrics
    assert m["flops"].max_rank == 3
    per_rank = {r.rank: r for r in rep.imbalance.per_rank}
    ratio = per_rank[3].flops / np.mean([per_rank[r].flops for r in (0, 1, 2)])
    assert ratio == pytest.approx(96 / 64, rel=0.02)
    # Compute time (wall time of ops) is not asserted: with 4 ranks on 2 cores, rank 3 was the compute maximum in
    # some runs and below the others in others (closing notes); FLOPs are exact.


# ---- issue 22: blame counted once, one lateness, the default schedule, the heatmap -----------------------------------

#: ddp_mlp with small buckets (several bucket all-reduces per step, issued before the previous one finished), 20 ms of
#: "device time" per step on every rank, and rank 1 30 ms slower before its backward: about half of the step.
DDP_JOB = ["--hidden", "256", "--batch", "16", "--base-ms", "20", "--bucket-mb", "0.25", "--steps", "14"]
DELAY_MS = 30.0


@pytest.fixture(scope="module")
def ddp_slow(tmp_path_factory):
    d = tmp_path_factory.mktemp("ddp-slow")
    torchrun(2, ["-m", "distprof.launch", "--out", "out", "--wait", "2", "--warmup", "2", "--active", "8",
                 str(EXAMPLES / "ddp_mlp.py"), *DDP_JOB, "--slow-rank", "1", "--slow-ms", f"{DELAY_MS:g}"],
             cwd=d, env=job_env())
    return build_report(distprof.load(only_run_dir(d / "out"), progress=False))


def test_blame_counts_a_waiting_ranks_overlapping_waits_once(ddp_slow):
    """Rank 0 waits for rank 1 in every bucket all-reduce, and the buckets overlap in time: its wait is counted once,
    so it never exceeds its time in collectives, and rank 1's blame is about the delay, not buckets x delay."""
    rep = ddp_slow
    rows = {d.rank: d for d in rep.stragglers}
    assert rep.straggler_info.n_instances >= 2 * 8  # several buckets per step
    comm = float(np.mean(rep.steps["comm_ms"][rep.steps["rank"] == 0]))
    assert rows[1].blame_ms_per_step <= comm + 0.5, (rows[1], comm)
    assert rows[0].wait_ms_per_step <= comm + 0.5
    # about the delay, not buckets x delay: counted per bucket it read 63 ms for this 30 ms delay (add9bd0's parent);
    # counted once it read 45.8 on a loaded 2-core machine (rank 0 itself descheduled while it waited), so the bound
    # leaves room for that and still fails the double count
    assert rows[1].blame_ms_per_step < 1.75 * DELAY_MS, rows[1]
    (f,) = [f for f in rep.findings if f.id == "straggler_rank"]
    assert f.metrics["wait_ms_per_step_each"] <= comm + 0.5


def test_one_lateness_and_a_headline_of_what_the_straggler_costs(ddp_slow):
    """2 ranks, rank 1 30 ms late: no figure of either rank doubles the delay; the headline says how much shorter the
    steps would be without it (the finding's what-if gain) and its own extra work, near the delay."""
    rep = ddp_slow
    rows = {d.rank: d for d in rep.stragglers}
    assert rep.straggler_info.named == [1]
    for d in rows.values():
        for name in ("lateness_ms", "extra_work_ms", "blame_ms_per_step", "wait_ms_per_step", "cost_ms_per_step",
                     "clock_free_lateness_ms"):
            v = getattr(d, name)
            assert v is None or abs(v) < 1.5 * DELAY_MS, (name, d)
    assert rows[1].lateness_ms > 0.5 * DELAY_MS and rows[0].lateness_ms < -0.5 * DELAY_MS
    (f,) = [f for f in rep.findings if f.id == "straggler_rank"]
    m = re.search(r"it does ([\d.]+) ms more work per step than its peers .*, and the steps would be ([\d.]+) ms "
                  r"shorter without it", rep.verdict)
    assert m, rep.verdict
    assert abs(float(m[1]) - DELAY_MS) <= 0.3 * DELAY_MS, rep.verdict
    assert float(m[2]) == pytest.approx(f.estimated_gain_ms_per_step, abs=0.05)
    assert rep.verdict.count(" ms") <= 4  # one figure each: extra work, gain (and the root cause's)


def test_the_heatmap_shows_lateness_and_step_time_second(ddp_slow):
    """In synchronous training every rank's step is as long: the heatmap shows lateness (rank 1 red, rank 0 blue),
    with step time as the second view."""
    import json

    page = render_html(ddp_slow)
    figs = json.loads(re.search(r'<script type="application/json" id="dp-figures">(.*?)</script>', page, re.S)[1])
    late, step = figs["fig-steps"]["data"]
    assert late["name"] == "lateness" and late["visible"] is True and step["visible"] is False
    rows = {y: [v for v in z if v is not None] for y, z in zip(late["y"], late["z"])}
    assert np.mean(rows["rank 1"]) > 0.5 * DELAY_MS and np.mean(rows["rank 0"]) < -0.5 * DELAY_MS
    steps = {y: [v for v in z if v is not None] for y, z in zip(step["y"], step["z"])}
    assert abs(np.mean(steps["rank 1"]) - np.mean(steps["rank 0"])) < 0.2 * DELAY_MS  # step time: the same


@pytest.mark.parametrize("job", ["callbacks", "hf_trainer"])
def test_the_default_schedule_names_a_rank_late_in_every_step(tmp_path, job):
    """The launcher's default window (5 recorded steps): a rank late by a third of the step or more in every step is
    named — a framework-style loop whose delay sits in an on_step_begin callback and varies from step to step (30 to
    90 ms: no steady lateness to bound with 5 steps), and Hugging Face's Trainer."""
    if job == "hf_trainer":
        if any(importlib.util.find_spec(m) is None for m in ("transformers", "accelerate")):
            if os.environ.get("CI") == "true":
                pytest.fail("transformers/accelerate not installed; CI must run the framework tests", pytrace=False)
            pytest.skip("transformers/accelerate not installed (bash launch/setup.sh installs them)")
        target = [str(EXAMPLES / "hf_trainer.py"), "--steps", "12", "--base-ms", "30", "--slow-rank", "1",
                  "--slow-ms", "40"]
    else:
        target = [str(ROOT / "benchmarks" / "_straggler_job.py"), "--style", "callbacks", "--steps", "12",
                  "--device-ms", "40", "--slow-rank", "1", "--slow-ms", "90,30,60,30,90,45"]
    torchrun(2, ["-m", "distprof.launch", "--out", "out", *target], cwd=tmp_path,
             env=job_env(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false"), timeout=420)
    rep = build_report(distprof.load(only_run_dir(tmp_path / "out"), progress=False))
    assert rep.run.n_steps == 5
    top = rep.stragglers[0]
    assert rep.straggler_info.named == [1], ([(d.rank, round(d.lateness_ms, 1), d.late_step_fraction)
                                              for d in rep.stragglers], rep.straggler_info.rule)
    assert top.late_step_fraction >= 0.8
    assert "rank 1 on host" in rep.verdict.lower() and "straggler" in rep.verdict  # it may follow a worse finding


def test_the_readme_demo_headline_names_the_delay(tmp_path):
    """launch/demo.sh's job (rank 1 made 20 ms slow), run as the script runs it: the headline names rank 1, and its
    extra work is of the injected delay's size: more than half of it, less than twice it. (Within 15 % is the issue's
    bar for the demo on an idle machine, measured there: docs/accuracy.md. A fresh-clone CI run read 16.1 ms; with
    another process busy beside the two ranks, runs read 19.3–33.5 ms for the 20 ms: a band that a loaded machine's
    noise crosses is not a test's to hold.)"""
    words = shlex.split((ROOT / "launch" / "demo.sh").read_text().replace("\\\n", " "), comments=True)
    i = words.index("distprof.launch")
    j = words.index("examples/ddp_mlp.py", i)
    opts, k = [], i + 1
    while k < j:  # the launcher's options but where the output goes
        skip = words[k] in ("--out", "--run-id")
        opts += [] if skip else words[k:k + 2]
        k += 2
    script = words[j + 1:words.index("echo", j)] if "echo" in words[j:] else words[j + 1:]
    delay = float(script[script.index("--slow-ms") + 1])
    torchrun(2, ["-m", "distprof.launch", "--out", "out", *opts, str(EXAMPLES / "ddp_mlp.py"), *script],
             cwd=tmp_path, env=job_env())
    rep = build_report(distprof.load(only_run_dir(tmp_path / "out"), progress=False))
    m = re.search(r"it does ([\d.]+) ms more work per step", rep.verdict)
    assert "Rank 1 on host" in rep.verdict and m and 0.5 * delay < float(m[1]) < 2.0 * delay, rep.verdict
