"""Issue acceptance on real 4-rank gloo runs of examples/ddp_mlp.py (small width so injected delays dominate).

Tolerances are a little wider than the figures measured on a quiet machine (see the closing notes), because CI
shares 2 cores between 4 ranks.
"""

from __future__ import annotations


import numpy as np
import pytest

import distprof
from conftest import EXAMPLES, job_env, torchrun
from distprof.analysis.report.build import build_report

pytestmark = pytest.mark.slow


def _run(tmp_path, tag, script_args, **env):
    e = job_env(DISTPROF_RUN_ID=tag, **env)
    args = ["-m", "distprof.launch", "--out", "out", str(EXAMPLES / "ddp_mlp.py"), "--hidden", "256", "--steps", "12",
            *script_args]
    proc = torchrun(4, args, cwd=tmp_path, env=e, check=False)  # reruns once on the known rare exit abort
    assert proc.returncode == 0, proc.stderr[-4000:]
    return build_report(distprof.load(tmp_path / "out" / tag))


def test_straggler_with_skewed_simulated_clocks(tmp_path):
    rep = _run(tmp_path, "slow", ["--slow-rank", "2", "--slow-ms", "40"],
               DISTPROF_SIM_HOSTS="0,0,1,1", DISTPROF_SIM_CLOCKS="0,3.25@40")
    top = rep.stragglers[0]
    assert top.rank == 2 and top.named
    # on a loaded machine the truth is what the trace shows, not the injected 40 ms (while rank 2 sleeps, the others
    # get its CPU and catch up): rank 2 is clearly late, and the aligned lateness agrees with the clock-free one
    # (durations only, no clock) — the check on the skewed clocks' alignment
    assert top.mean_lateness_ms >= 10, top
    assert abs(top.mean_lateness_ms - top.clock_free_lateness_ms) <= 0.25 * top.mean_lateness_ms + 2, top
    assert [s.rank for s in rep.stragglers if s.named] == [2]
    host1 = rep.clock["sim-host1"]
    assert host1.method == "ping-pong" and host1.residual_us is not None
    # truth: host 1 runs 3.25 s + 40 ppm ahead; the reported offset maps it back to rank 0's clock
    shard = distprof.storage.read_shard(sorted((tmp_path / "out" / "slow").glob("rank00002.*.h5"))[0])
    sim = shard.attrs["sim_clock"]
    t = shard.attrs["window_start_ns"]
    truth = -(sim["offset_s"] * 1e9 + sim["drift_ppm"] * 1e-6 * (t - sim["t0_ns"]))
    assert abs(host1.offset_ns - truth) < 500e3, (host1.offset_ns, truth)  # measured ≈10 µs when quiet


def test_no_delay_names_nobody(tmp_path):
    # 4 ranks share 2 cores here, so the OS scheduler can hold one rank back for a whole 5-step window (one rank
    # really arriving 8 ms late at every collective is a straggler in what was recorded). A second, independent run
    # must then be clean: a rule that names someone without cause fails both.
    details = []
    for attempt in ("quiet", "quiet2"):
        (tmp_path / attempt).mkdir()
        rep = _run(tmp_path / attempt, attempt, [])
        named = [s.rank for s in rep.stragglers if s.named]
        if not named:
            return
        details.append(([(s.rank, round(s.mean_lateness_ms, 2)) for s in rep.stragglers],
                        rep.straggler_info.rule.threshold_ms))
    raise AssertionError(f"a rank was named in two runs without any injected delay: {details}")


def test_uneven_batch_shows_in_flops_and_compute(tmp_path):
    rep = _run(tmp_path, "uneven", ["--uneven", "--batch", "64"])
    m = rep.imbalance.metrics
    assert m["flops"].max_rank == 3
    per_rank = {r.rank: r for r in rep.imbalance.per_rank}
    ratio = per_rank[3].flops / np.mean([per_rank[r].flops for r in (0, 1, 2)])
    assert ratio == pytest.approx(96 / 64, rel=0.02)
    # Compute time (wall time of ops) is not asserted: with 4 ranks on 2 cores, rank 3 was the compute maximum in
    # some runs and below the others in others (closing notes); FLOPs are exact.
