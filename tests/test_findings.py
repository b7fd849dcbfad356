"""Findings, verdict and annotations: every rule on a run built to trigger it and on one that must not.

Hand-built MergedRuns (``RunBuilder`` / ``ddp_run`` from test_breakdown, times in ms); one real 2-rank job at the end.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import EXAMPLES, only_run_dir, torchrun
from distprof.analysis.annotations import annotations
from distprof.analysis.breakdown import step_breakdown
from distprof.analysis.findings import FindingRules, findings, rank_measures
from distprof.analysis.report import build_report
from distprof.analysis.rootcause import root_cause
from distprof.analysis.stragglers import find_stragglers
from distprof.analysis.verdict import verdict
from distprof.render.console import render_console
from distprof.storage import schema
from test_breakdown import ANNOT, COMM, COMPUTE, CPU_OP, KERNEL, OTHER, RunBuilder, ddp_run

DL = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"


def analyse(run, rules=None):
    bd = step_breakdown(run)
    s = find_stragglers(run)
    rc = root_cause(run, s["named"], breakdown=bd)
    return findings(run, breakdown=bd, stragglers=s, root_cause=rc, rules=rules), s, rc


def by_id(fs, rule_id):
    return [f for f in fs if f["id"] == rule_id]


def loop_run(world=2, n_steps=4, *, step_ms=30.0, dl_ms=0.0, head_gap_ms=0.0, tiny=0, tiny_us=50.0,
             nested_tiny=0, big_ms=10.0, regions=None):
    """A single-threaded loop per rank: [head gap] ops … [DataLoader __next__ at the tail]; steps back to back.

    `tiny` top-level ops of `tiny_us` each; `nested_tiny` tiny children inside the big op (not top-level);
    `regions` {rank: {name: ms}} user annotations at the start of the step.
    """
    b = RunBuilder(world)
    for r in range(world):
        b.thread(r, 1, schema.THREAD_MAIN)
        t = 0.0
        for s in range(n_steps):
            sid = 100 + s
            b.step(r, sid, t, t + step_ms)
            tt = t + head_gap_ms
            for name, ms in (regions or {}).get(r, {}).items():
                b.event(r, name, ANNOT, OTHER, 1, tt, tt + ms, step=sid)
            b.event(r, "aten::linear", CPU_OP, COMPUTE, 1, tt, tt + big_ms, step=sid)
            for k in range(nested_tiny):
                c0 = tt + k * (big_ms / max(nested_tiny, 1))
                b.event(r, "aten::t", CPU_OP, COMPUTE, 1, c0, c0 + tiny_us / 1000, step=sid)
            tt += big_ms
            for _ in range(tiny):
                b.event(r, "aten::add", CPU_OP, COMPUTE, 1, tt, tt + tiny_us / 1000, step=sid)
                tt += tiny_us / 1000 + 0.005
            b.event(r, "Optimizer.step#SGD.step", ANNOT, OTHER, 1, tt, tt + 0.5, step=sid)
            b.event(r, "aten::add_", CPU_OP, COMPUTE, 1, tt, tt + 0.5, step=sid)
            tt += 0.5
            end = t + step_ms
            if dl_ms:
                b.event(r, DL, ANNOT, OTHER, 1, end - dl_ms, end - 0.01, step=sid)
            else:  # busy until the end: an op covers the rest of the step
                b.event(r, "aten::copy_", CPU_OP, COMPUTE, 1, tt, end, step=sid)
            t = end
    return b.build()


def with_memory(run, per_step: dict[int, list[tuple[int, int]]]):
    """Replace run.memory: per rank a list of (bytes, total_bytes) per step, spread evenly over each step."""
    cols = {k: [] for k in ("ts_ns", "bytes", "total_bytes", "device", "step", "rank", "window")}
    st = run.steps
    for i in range(st["step"].size):
        r, s = int(st["rank"][i]), int(st["step"][i])
        evs = per_step(r, s)
        ts = np.linspace(st["start_ns"][i], st["end_ns"][i] - 1, len(evs)).astype(np.int64)
        for t, (nb, tot) in zip(ts, evs):
            cols["ts_ns"].append(t), cols["bytes"].append(nb), cols["total_bytes"].append(tot)
            cols["device"].append(-1), cols["step"].append(s), cols["rank"].append(r), cols["window"].append(0)
    dt = {"ts_ns": np.int64, "bytes": np.int64, "total_bytes": np.int64, "device": np.int16, "step": np.int32,
          "rank": np.int32, "window": np.int32}
    run.memory = {k: np.asarray(v, dt[k]) for k, v in cols.items()}
    return run


def alloc_free(n: int, size: int):
    """n allocations of `size` bytes, each freed at once: the live total swings by `size`."""
    out = []
    for _ in range(n):
        out += [(size, size), (-size, 0)]
    return out


# ----------------------------------------------------------------------------------------------------- tiny ops


def test_tiny_ops_fires_on_many_tiny_top_level_ops():
    run = loop_run(tiny=300, tiny_us=50, big_ms=2.0, step_ms=30.0)
    fs, _, _ = analyse(run)
    (f,) = by_id(fs, "tiny_ops")
    m = f["metrics"]
    assert f["rank"] is None and m["n_ranks"] == 2  # both ranks: one finding
    assert m["tiny_ops_per_step"] == 300 and m["ops_per_step"] == 303  # + aten::linear, aten::add_, aten::copy_
    assert m["tiny_share_pct"] > 50
    assert m["threshold_us"] == 100 and "100 us" in f["evidence"]
    assert "torch.compile" in f["advice"]


def test_tiny_ops_does_not_fire_on_nested_tiny_ops_or_few_ops():
    # 400 tiny ops nested inside one 10 ms op: the top-level op is large -> no finding
    fs, _, _ = analyse(loop_run(nested_tiny=400, big_ms=10.0))
    assert not by_id(fs, "tiny_ops")
    # 50 tiny top-level ops per step: below 100 per step
    fs, _, _ = analyse(loop_run(tiny=50, big_ms=0.05, step_ms=5.0))
    assert not by_id(fs, "tiny_ops")


def test_tiny_kernels_on_a_device_rank():
    b = RunBuilder(1, device="NVIDIA H100 80GB HBM3")
    b.thread(0, 1, schema.THREAD_MAIN)
    b.step(0, 1, 0, 40)
    for k in range(400):  # 400 kernels of 20 us, one every 0.1 ms: the device idles 80 % of the time
        t0 = 0.05 + 0.1 * k
        b.event(0, "elementwise_kernel", KERNEL, COMPUTE, 7, t0, t0 + 0.02, step=1, device=0)
    fs, _, _ = analyse(b.build())
    (f,) = by_id(fs, "tiny_ops")
    assert f["rank"] == 0 and f["severity"] == "high"
    assert f["metrics"]["device_idle_ms_per_step"] == pytest.approx(32, abs=0.1)
    assert "kernels" in f["title"]


# --------------------------------------------------------------------------------------------------- input wait


def test_input_wait_fires_on_dataloader_and_boundary_gap():
    run = loop_run(dl_ms=8.0, head_gap_ms=2.0, step_ms=30.0)
    fs, _, _ = analyse(run)
    (f,) = by_id(fs, "input_wait")
    m = f["metrics"]
    assert m["dataloader_ms_per_step"] == pytest.approx(7.99, abs=1e-6)
    # head gap 2 ms + the 10 us between the DataLoader's end and the step end
    assert m["boundary_gap_ms_per_step"] == pytest.approx(2.01, abs=1e-6)
    assert m["impact_pct"] == pytest.approx(100 * 10 / 30, abs=0.01)
    assert f["severity"] == "high" and "num_workers" in f["advice"]
    assert m["threshold_step_pct"] == 10


def test_input_wait_does_not_fire_on_a_busy_loop_or_on_comm_wait():
    fs, _, _ = analyse(loop_run())
    assert not by_id(fs, "input_wait")
    # DDP: the main thread waits for the all-reduce with no event - that is exposed communication, not input
    fs, _, _ = analyse(ddp_run(4, n_steps=4, allreduce_ms=8.0))
    assert not by_id(fs, "input_wait")
    assert by_id(fs, "exposed_comm")


def test_input_wait_gap_at_step_boundary_under_a_collective_is_not_input():
    run = loop_run(head_gap_ms=5.0, step_ms=30.0)
    ms = rank_measures(run, step_breakdown(run))
    assert ms[0]["boundary_gap_ms_per_step"] == pytest.approx(5.0)
    b = RunBuilder(1)  # the same gap covered by a gloo collective on a worker thread
    b.thread(0, 1, schema.THREAD_MAIN)
    b.thread(0, 2, schema.THREAD_COMM, 0)
    b.step(0, 1, 0, 30)
    i = b.event(0, "gloo:barrier", ANNOT, COMM, 2, 0, 5, step=1)
    b.comm(i, role=schema.ROLE_EXEC, seq=0, op="barrier")
    b.event(0, "aten::mm", CPU_OP, COMPUTE, 1, 5, 30, step=1)
    run = b.build()
    assert rank_measures(run, step_breakdown(run))[0]["boundary_gap_ms_per_step"] == pytest.approx(0.0)


# ------------------------------------------------------------------------------------------------- memory churn


def test_memory_churn_fires_on_allocation_rate():
    run = with_memory(loop_run(step_ms=30.0), lambda r, s: alloc_free(1000, 4096))  # 33 allocations per ms
    fs, _, _ = analyse(run)
    (f,) = by_id(fs, "memory_churn")
    m = f["metrics"]
    assert m["allocs_per_step"] == 1000 and m["allocs_per_ms"] == pytest.approx(1000 / 30)
    assert m["churn_rate"] == 1 and m["churn_turnover"] == 0 and m["churn_swing"] == 0
    assert f["severity"] == "low"  # 1.7x the threshold
    assert "--memory-history" in f["advice"]


def test_memory_churn_fires_on_turnover_and_on_swings_between_steps():
    mib = 2**20
    # 100 allocations of 8 MiB each, freed at once: 800 MiB allocated per step for an 8 MiB swing
    fs, _, _ = analyse(with_memory(loop_run(), lambda r, s: alloc_free(100, 8 * mib)))
    (f,) = by_id(fs, "memory_churn")
    assert f["metrics"]["churn_turnover"] == 1 and f["metrics"]["turnover"] == pytest.approx(100)
    # the per-step peak alternates 100 MiB / 400 MiB (variable shapes)
    fs, _, _ = analyse(with_memory(loop_run(), lambda r, s: alloc_free(2, (100 if s % 2 else 400) * mib)))
    (f,) = by_id(fs, "memory_churn")
    assert f["metrics"]["churn_swing"] == 1 and f["metrics"]["peak_swing_mib"] == pytest.approx(300)


def test_memory_churn_does_not_fire_on_ordinary_steps():
    mib = 2**20
    # 90 allocations per 30 ms step, each step allocating its 64 MiB working set about once
    def ordinary(r, s):
        ev, tot = [], 0
        for _ in range(90):
            tot += int(0.7 * mib)
            ev.append((int(0.7 * mib), tot))
        for _ in range(90):
            tot -= int(0.7 * mib)
            ev.append((-int(0.7 * mib), tot))
        return ev

    fs, _, _ = analyse(with_memory(loop_run(), ordinary))
    assert not by_id(fs, "memory_churn")
    fs, _, _ = analyse(loop_run())  # no memory events at all
    assert not by_id(fs, "memory_churn")


# ------------------------------------------------------------------------------------- exposed communication


def test_exposed_comm_fires_when_allreduce_is_not_hidden():
    fs, _, _ = analyse(ddp_run(4, n_steps=4, allreduce_ms=8.0))
    (f,) = by_id(fs, "exposed_comm")
    assert f["rank"] is None and f["metrics"]["n_ranks"] == 4
    assert f["metrics"]["impact_pct"] > 25 and f["severity"] == "high"
    assert "bucket_cap_mb" in f["advice"] and "no_sync" in f["advice"]


def test_exposed_comm_does_not_fire_when_small_or_when_it_is_the_straggler_wait():
    fs, _, _ = analyse(ddp_run(4, n_steps=4, allreduce_ms=0.2))
    assert not by_id(fs, "exposed_comm")
    # others wait ~20 ms per step for rank 2: that is the straggler's finding, not exposed communication
    fs, _, _ = analyse(ddp_run(4, n_steps=4, late_rank=2, late_ms=20, allreduce_ms=0.5))
    assert not by_id(fs, "exposed_comm")
    assert by_id(fs, "straggler_rank")


# --------------------------------------------------------------------------------------------------- stragglers


def test_straggler_rank_with_idle_and_compute_root_causes():
    fs, s, rc = analyse(ddp_run(4, n_steps=4, late_rank=2, late_ms=20))
    (f,) = by_id(fs, "straggler_rank")
    assert f["rank"] == 2 and f["host"] == "host0" and f["severity"] == "high"
    assert f["metrics"]["late_fraction"] == 1.0 and f["metrics"]["mean_lateness_ms"] == pytest.approx(20, abs=0.1)
    assert "[idle]" in f["evidence"] and "outside any recorded op" in f["advice"]
    assert fs[0] is f  # most severe first
    fs, _, _ = analyse(ddp_run(4, n_steps=4, late_rank=1, late_ms=20, late_kind="compute"))
    (f,) = by_id(fs, "straggler_rank")
    assert f["rank"] == 1 and "aten::slow" in f["advice"]


def test_no_straggler_finding_without_a_late_rank():
    fs, _, _ = analyse(ddp_run(4, n_steps=4))
    assert not by_id(fs, "straggler_rank") and not by_id(fs, "straggler_host")


def test_straggler_host_when_its_ranks_are_late_together():
    late = {(s, r): 15.0 for s in range(4) for r in (2, 3)}
    fs, s, _ = analyse(ddp_run(4, n_steps=4, hosts=["a", "a", "b", "b"], late_at=late))
    (h,) = by_id(fs, "straggler_host")
    assert h["host"] == "b" and h["rank"] is None and h["metrics"]["n_late_ranks"] == 2
    assert not by_id(fs, "straggler_rank")  # its ranks are covered by the host finding
    assert "throttling" in h["advice"]
    # one late rank on a two-host run: a rank finding, no host finding
    fs, _, _ = analyse(ddp_run(4, n_steps=4, hosts=["a", "a", "b", "b"], late_rank=3, late_ms=15))
    assert not by_id(fs, "straggler_host")
    assert [f["rank"] for f in by_id(fs, "straggler_rank")] == [3]


def test_thresholds_are_configurable():
    run = loop_run(dl_ms=2.0, step_ms=30.0)  # about 7 % of step time
    fs, _, _ = analyse(run)
    assert not by_id(fs, "input_wait")
    fs, _, _ = analyse(run, FindingRules(input_min_step_pct=5.0))
    (f,) = by_id(fs, "input_wait")
    assert f["metrics"]["threshold_step_pct"] == 5.0 and f["severity"] == "low"


def test_per_rank_findings_when_few_ranks_fire():
    # rank 3 of 4 waits for input, the others not -> one finding for rank 3
    b = RunBuilder(4)
    for r in range(4):
        b.thread(r, 1, schema.THREAD_MAIN)
        for s in range(3):
            t = 40.0 * s
            b.step(r, s, t, t + 40)
            gap = 12.0 if r == 3 else 0.0
            b.event(r, "aten::mm", CPU_OP, COMPUTE, 1, t + gap, t + 40, step=s)
    fs, _, _ = analyse(b.build())
    (f,) = by_id(fs, "input_wait")
    assert f["rank"] == 3 and f["host"] == "host0"
    assert f["metrics"]["impact_pct"] == pytest.approx(30)


# ----------------------------------------------------------------------------------------------------- verdict


def test_verdict_sentences():
    run = ddp_run(4, n_steps=4, late_rank=2, late_ms=20)
    rep = build_report(run)
    v = rep["verdict"]
    assert v.startswith("Rank 2 on host host0 is late in 100 % of collectives, costing the others")
    assert "outside any recorded op" in v
    rep = build_report(ddp_run(4, n_steps=4, allreduce_ms=8.0))
    assert rep["verdict"].startswith("No straggler: ranks arrive within")
    assert "exposed communication" in rep["verdict"]
    rep = build_report(loop_run(world=1, dl_ms=8.0))
    assert rep["verdict"].startswith(
        "Steps take 30.0 ms on average; 27 % of step time on rank 0 is spent waiting for input")
    empty = RunBuilder(2).build()
    assert build_report(empty)["verdict"].startswith("No recorded steps")


def test_verdict_without_findings_names_the_largest_part():
    s = {"n_rank_steps": 4, "step_ms_mean": 10.0, "compute_pct": 80.0, "idle_pct": 20.0}
    assert verdict(s, {"n_instances": 0, "ranks": []}, [], []) == \
        "Steps take 10.0 ms on average; 80 % of step time is compute."


# ------------------------------------------------------------------------------------------------- annotations


def test_annotations_per_rank_and_step():
    regions = {0: {"forward": 4.0, "backward": 8.0, "DistributedDataParallel.forward": 3.0},
               1: {"forward": 6.0, "backward": 8.0, "Optimizer.step#Adam.step": 1.0}}
    run = loop_run(regions=regions)
    ann = annotations(run)
    assert [a["name"] for a in ann] == ["backward", "forward"]  # framework regions and ProfilerStep# excluded
    fwd = ann[1]
    assert fwd["ranks"]["0"] == {"ms_per_step": pytest.approx(4.0), "count_per_step": 1.0}
    assert fwd["ranks"]["1"]["ms_per_step"] == pytest.approx(6.0)
    assert fwd["spread_pct"] == pytest.approx(100 * 2 / 5)
    assert ann[0]["spread_pct"] == pytest.approx(0)
    # a region only one rank runs: 0 on the other
    ann = annotations(loop_run(regions={1: {"eval": 2.0}}))
    assert ann[0]["ranks"]["0"]["ms_per_step"] == 0 and ann[0]["spread_pct"] == pytest.approx(200)


def test_report_json_and_console():
    run = ddp_run(4, n_steps=4, late_rank=2, late_ms=20)
    rep = build_report(run)
    json.dumps(rep, allow_nan=False)
    assert set(rep) >= {"verdict", "findings", "annotations"}
    sev = [{"high": 0, "medium": 1, "low": 2}[f["severity"]] for f in rep["findings"]]
    assert sev == sorted(sev)
    for f in rep["findings"]:
        assert set(f) == {"id", "severity", "rank", "host", "title", "evidence", "advice", "metrics"}
        assert all(isinstance(v, (int, float)) for v in f["metrics"].values())
    text = render_console(rep, color=False)
    assert "\x1b[" not in text
    lines = text.splitlines()
    assert lines[1].startswith("Verdict: Rank 2 on host host0")
    assert any(ln.startswith("Findings") for ln in lines[:6])
    assert "\x1b[" in render_console(rep, color=True)
    # renderers tolerate reports without the new keys
    old = {k: v for k, v in rep.items() if k not in ("verdict", "findings", "annotations")}
    assert "Verdict" not in render_console(old)


# ---------------------------------------------------------------------------------------------- a real job


@pytest.mark.slow
def test_real_job_input_wait_and_annotations(tmp_path):
    torchrun(2, ["-m", "distprof.launch", "--out", "out", "--wait", "1", "--warmup", "1", "--active", "3",
                 str(EXAMPLES / "slow_input.py"), "--steps", "7", "--item-ms", "2"], cwd=tmp_path)
    from distprof.analysis.run import load_run

    rep = build_report(load_run(only_run_dir(tmp_path / "out"), progress=False))
    (f,) = by_id(rep["findings"], "input_wait")
    assert f["rank"] is None and f["metrics"]["n_ranks"] == 2
    # 8 samples x 2 ms of sleep per batch, in DataLoader __next__ on the main thread
    assert 14 <= f["metrics"]["dataloader_ms_per_step"] <= 40
    names = [a["name"] for a in rep["annotations"]]
    assert set(names) == {"forward", "loss", "backward"}
    for a in rep["annotations"]:
        assert set(a["ranks"]) == {"0", "1"}
        assert all(v["count_per_step"] == 1 for v in a["ranks"].values())
    assert "waiting for input" in rep["verdict"]
