"""Findings, verdict and annotations: every rule on a run built to trigger it and on one that must not.

Hand-built MergedRuns (``RunBuilder`` / ``ddp_run`` from test_breakdown, times in ms); one real 2-rank job at the end.
"""

from __future__ import annotations

import json
from dataclasses import asdict, fields, replace
from pathlib import Path

import distprof
import numpy as np
import pytest

from conftest import EXAMPLES, only_run_dir, torchrun
from distprof.analysis.types import FindingRules, RunSummary
from distprof.analysis.summarize.engine import summarize_merged
from distprof.analysis.cross.annotations import AnnotationRank, annotations
from distprof.analysis.findings import findings
from distprof.analysis.names import is_sync_call
from distprof.analysis.report.build import build_report
from distprof.analysis.cross.rootcause import root_cause
from distprof.analysis.cross.step_summary import StepSummary
from distprof.analysis.cross.stragglers import StragglerRule, find_stragglers
from distprof.analysis.cross.stragglers.result import StragglerInfo, StragglerRank, StragglerRuleInfo, Stragglers
from distprof.analysis.findings.finding import Finding
from distprof.analysis.findings.verdict import verdict
from distprof.render.console import render_console
from distprof.storage import schema
from test_breakdown import ANNOT, COMM, COMPUTE, COPY, CPU_OP, KERNEL, MEMCPY, OTHER, RunBuilder, ddp_run

DL = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"


def analyse(run, rules=None):
    v = run if isinstance(run, RunSummary) else summarize_merged(run, rules=rules)
    s = find_stragglers(v)
    rc = root_cause(v, s.info.named)
    return findings(v, stragglers=s, root_cause=rc, rules=rules), s, rc


def measures(run, rules=None):
    """The per-rank measures of a MergedRun or a RunSummary (ranks with steps)."""
    v = run if isinstance(run, RunSummary) else summarize_merged(run, rules=rules)
    return [m.measures for _, m in sorted(v.ranks.items()) if m.measures is not None]


def by_id(fs, rule_id):
    return [f for f in fs if f.id == rule_id]


def stragglers_of(n_instances, rows=()):
    """A stragglers result as find_stragglers hands it: the default rule with a 1 ms floor, `rows` its ranks."""
    rule = StragglerRule()
    parts = {"clock_residual_ms": 0.0, "from_clock_residual_ms": 0.0, "median_step_ms": 0.0, "from_step_time_ms": 0.0,
             "step_noise_ms": 0.0, "from_noise_ms": 0.0}
    info = StragglerInfo(StragglerRuleInfo(text=rule.text(), threshold_ms=1.0, **parts, **asdict(rule)),
                         n_instances=n_instances, named=[d.rank for d in rows if d.named])
    return Stragglers(list(rows), info)


def straggler_row(**given):
    """A stragglers rank row: the figures `given`, every other one 0 (not named unless given)."""
    row = {f.name: 0.0 for f in fields(StragglerRank)}
    row.update(host="h", named=False, extra_work_ms=None)
    return StragglerRank(**{**row, **given})


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
    m = f.metrics
    assert f.rank is None and m["n_ranks"] == 2  # both ranks: one finding
    assert m["tiny_ops_per_step"] == 300 and m["ops_per_step"] == 303  # + aten::linear, aten::add_, aten::copy_
    assert m["tiny_share_pct"] > 50
    assert m["threshold_us"] == 100 and "100 us" in f.evidence
    assert "torch.compile" in f.advice


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
    # its impact is its own kernel time (8 of 40 ms); the 32 ms of idle between the kernels is device_idle's
    assert f.rank == 0 and f.severity == "medium"
    assert f.metrics["impact_pct"] == pytest.approx(20, abs=0.01)
    assert "kernels" in f.title and "of kernel time" in f.title
    assert "8.0 ms of 8.0 ms kernel time" in f.evidence and "op time" not in f.evidence
    (d,) = by_id(fs, "device_idle")
    assert d.metrics["device_idle_ms_per_step"] == pytest.approx(32, abs=1e-6)
    assert f.metrics["impact_pct"] + d.metrics["impact_pct"] == pytest.approx(100)  # nothing counted twice


# -------------------------------------------------------------------------------------- device idle, host sync


RUNTIME, CUDA_SYNC = schema.KIND_CODE["cuda_runtime"], schema.KIND_CODE["cuda_sync"]


def gpu_run(per_step, *, world=1, n_steps=3, step_ms=10.0):
    """A GPU rank per `world`: main thread tid 1, device 0 stream 7; `per_step(b, rank, step, t)` adds one step."""
    b = RunBuilder(world, device="NVIDIA H100 80GB HBM3")
    for r in range(world):
        b.thread(r, 1, schema.THREAD_MAIN)
        for s in range(n_steps):
            t = s * step_ms
            b.step(r, s, t, t + step_ms)
            per_step(b, r, s, t)
    return b.build()


def launch(b, r, s, t0, t1, name="aten::add", k0=None, k1=None):
    """A host op [t0, t1) on the main thread launching one kernel [k0, k1) (times in ms)."""
    b.event(r, name, CPU_OP, COMPUTE, 1, t0, t1, step=s)
    if k0 is not None:
        b.event(r, "cudaLaunchKernel", RUNTIME, OTHER, 1, t0 + 0.01, t0 + 0.02, step=s)
        b.event(r, f"{name}_kernel", KERNEL, COMPUTE, 7, k0, k1, step=s, device=0)


def launch_bound(b, r, s, t):
    # 20 ops of 0.5 ms back to back, each launching a 50 us kernel 0.3 ms into the op: the device idles 90 %
    for k in range(20):
        o = t + 0.5 * k
        launch(b, r, s, o, o + 0.5, k0=o + 0.3, k1=o + 0.35)


def test_device_idle_fires_on_a_launch_bound_rank():
    fs, _, _ = analyse(gpu_run(launch_bound, world=2))
    (f,) = by_id(fs, "device_idle")
    m = f.metrics
    assert f.rank is None and m["n_ranks"] == 2 and f.severity == "high"
    assert m["impact_pct"] == pytest.approx(90) and m["device_idle_ms_per_step"] == pytest.approx(9)
    assert m["idle_head_ms_per_step"] == pytest.approx(0.3)
    assert m["idle_tail_ms_per_step"] == pytest.approx(0.15)
    assert m["idle_between_ms_per_step"] == pytest.approx(8.55)
    assert m["idle_host_ops_ms_per_step"] == pytest.approx(9)  # the host was inside aten::add all the time
    assert m["idle_input_ms_per_step"] == m["idle_after_sync_ms_per_step"] == m["idle_host_other_ms_per_step"] == 0
    assert m["kernels_per_step"] == 20 and m["threshold_step_pct"] == 10
    assert "(largest: aten::add 9.00 ms (rank 0))" in f.evidence
    assert f.advice.startswith("The device waits for the host to launch work")
    assert "reduce-overhead" in f.advice and "CUDA graphs" in f.advice
    assert not by_id(fs, "tiny_ops") and not by_id(fs, "host_sync")  # 20 kernels per step; no synchronisation


def input_bound(b, r, s, t):
    # DataLoader __next__ for 4 ms, then one op whose kernel keeps the device busy to the end of the step
    b.event(r, DL, ANNOT, OTHER, 1, t, t + 4, step=s)
    launch(b, r, s, t + 4, t + 10, name="aten::mm", k0=t + 4.1, k1=t + 10)


def test_device_idle_split_when_the_host_waits_for_input():
    fs, _, _ = analyse(gpu_run(input_bound))
    (f,) = by_id(fs, "device_idle")
    m = f.metrics
    assert f.rank == 0 and m["impact_pct"] == pytest.approx(41)
    assert m["idle_head_ms_per_step"] == pytest.approx(4.1) and m["idle_between_ms_per_step"] == pytest.approx(0)
    assert m["idle_input_ms_per_step"] == pytest.approx(4.0) and m["idle_host_ops_ms_per_step"] == pytest.approx(0.1)
    assert f.advice.startswith("The device waits while the main thread waits for input")
    assert "num_workers" in f.advice
    assert by_id(fs, "input_wait")  # the cause has its own finding; device_idle says how much device time it costs


def sync_step(b, r, s, t):
    """loss.item() in the middle of the step: the host blocks until the device drains, then runs Python for 1.9 ms."""
    launch(b, r, s, t, t + 1, name="aten::mm", k0=t + 0.5, k1=t + 6)
    b.event(r, "aten::item", CPU_OP, OTHER, 1, t + 1, t + 6.1, step=s)
    b.event(r, "aten::_local_scalar_dense", CPU_OP, OTHER, 1, t + 1, t + 6.1, step=s)
    b.event(r, "cudaMemcpyAsync", RUNTIME, OTHER, 1, t + 1.01, t + 1.05, step=s)  # async: not a sync by itself
    b.event(r, "cudaStreamSynchronize", RUNTIME, OTHER, 1, t + 1.05, t + 6.05, step=s)
    b.event(r, "Stream Sync", CUDA_SYNC, OTHER, 7, t + 1.05, t + 6.05, step=s, device=0)  # the same wait, from CUPTI
    b.event(r, "Memcpy DtoH (Device -> Pinned)", MEMCPY, COPY, 7, t + 6.0, t + 6.02, step=s, device=0)
    launch(b, r, s, t + 8, t + 10, k0=t + 8.2, k1=t + 9.8)


def test_host_sync_and_the_device_idle_it_causes():
    fs, _, _ = analyse(gpu_run(sync_step))
    (h,) = by_id(fs, "host_sync")
    m = h.metrics
    assert h.rank == 0
    # the runtime call and Kineto's cuda_sync record of the same wait count once
    assert m["syncs_per_step"] == 1 and m["sync_calls_per_step"] == 1
    assert m["sync_ms_per_step"] == pytest.approx(5.0) and m["blocked_pct"] == pytest.approx(50)
    # device idle from the copy's end (6.02) to the next kernel (8.2)
    assert m["idle_after_sync_ms_per_step"] == pytest.approx(2.18)
    assert m["impact_pct"] == pytest.approx(21.8) and h.severity == "medium"
    assert "aten::item 5.00 ms (1.0 per step)" in h.evidence
    assert ".item()" in h.advice and "non_blocking=True" in h.advice
    (d,) = by_id(fs, "device_idle")
    dm = d.metrics
    assert dm["device_idle_ms_per_step"] == pytest.approx(0.5 + 2.18 + 0.2)
    assert dm["idle_after_sync_ms_per_step"] == pytest.approx(2.18)  # host_sync's impact is this part of it
    assert dm["idle_host_ops_ms_per_step"] == pytest.approx(0.7)  # head and tail, inside aten::mm / aten::add
    assert d.advice.startswith("Host synchronisations drain the device's queue")


def busy_device(b, r, s, t):
    launch(b, r, s, t, t + 10, name="aten::conv", k0=t + 0.1, k1=t + 9.8)
    b.event(r, "cudaEventSynchronize", RUNTIME, OTHER, 1, t + 5, t + 5.01, step=s)  # short, device busy after


def test_device_idle_and_host_sync_do_not_fire_on_a_busy_device_or_a_cpu_rank():
    run = gpu_run(busy_device)
    fs, _, _ = analyse(run)
    assert not by_id(fs, "device_idle") and not by_id(fs, "host_sync")
    (m,) = measures(run)
    assert m.device.device_idle_ms_per_step == pytest.approx(0.3) and m.device.syncs_per_step == 1
    # a CPU rank whose main thread idles: input_wait's business, never device_idle/host_sync
    fs, _, _ = analyse(loop_run(head_gap_ms=10.0))
    assert by_id(fs, "input_wait") and not by_id(fs, "device_idle") and not by_id(fs, "host_sync")
    # thresholds are FindingRules fields
    fs, _, _ = analyse(gpu_run(launch_bound), FindingRules(idle_min_step_pct=95.0))
    assert not by_id(fs, "device_idle")
    fs, _, _ = analyse(gpu_run(sync_step), FindingRules(sync_min_step_pct=60.0))
    assert not by_id(fs, "host_sync")


@pytest.mark.parametrize("name,sync", [
    ("cudaDeviceSynchronize", True), ("cudaStreamSynchronize", True), ("cudaEventSynchronize", True),
    ("cudaMemcpy", True), ("cudaMemcpy2D", True), ("cudaStreamSynchronize_ptsz", True),
    ("hipDeviceSynchronize", True), ("hipStreamSynchronize", True), ("hipMemcpyWithStream", True),
    ("cuStreamSynchronize", True), ("cuCtxSynchronize", True), ("cuMemcpyDtoH_v2", True),
    ("cudaMemcpyAsync", False), ("cudaMemcpy2DAsync", False), ("hipMemcpyAsync", False),
    ("cuMemcpyDtoHAsync_v2", False), ("cudaLaunchKernel", False), ("cudaStreamWaitEvent", False),
    ("cudaEventQuery", False), ("cudaStreamQuery", False), ("cudaEventRecord", False),
])
def test_sync_call_names(name, sync):
    assert is_sync_call(name) is sync


def test_verdict_uses_the_findings_own_number_and_unit():
    # device rank: tiny_ops speaks of kernel time, with the share of its title
    b = RunBuilder(1, device="NVIDIA H100 80GB HBM3")
    b.thread(0, 1, schema.THREAD_MAIN)
    b.step(0, 1, 0, 40)
    for k in range(400):
        b.event(0, "elementwise_kernel", KERNEL, COMPUTE, 7, 0.05 + 0.1 * k, 0.07 + 0.1 * k, step=1, device=0)
    fs, s, rc = analyse(b.build())
    (tiny,) = by_id(fs, "tiny_ops")
    share = f"{tiny.metrics['tiny_share_pct']:.0f} % of kernel time"
    assert share in tiny.title
    summary = StepSummary(n_rank_steps=1, step_ms_mean=40.0)
    assert f"{share} on rank 0 is in kernels under 100 us" in verdict(summary, s, rc, [tiny])
    # CPU rank: op time
    fs, s, rc = analyse(loop_run(world=1, tiny=300, tiny_us=50, big_ms=2.0))
    (tiny,) = by_id(fs, "tiny_ops")
    assert "of op time" in tiny.title and "% of op time on rank 0 is in ops under 100 us" in verdict(
        summary, s, rc, [tiny])
    # device_idle: its impact (share of step time) and its largest cause
    fs, s, rc = analyse(gpu_run(launch_bound))
    (d,) = by_id(fs, "device_idle")
    assert verdict(summary, s, rc, fs).endswith(
        "no kernel or copy runs on the device on rank 0 for 90 % of step time, mostly while the host is inside ops, "
        "dispatching and launching work (launch/CPU-bound).")


# ---------------------------------------------------------------------------------- imported real GPU traces

HTA_DATA = Path(__file__).parent / "data" / "hta"


@pytest.fixture(scope="module")
def hta_reports(tmp_path_factory):
    from distprof.importers.run import import_traces

    out = {}
    for name in ("amd_trace", "ns_resolution_trace", "nccl_parser_config"):
        d = tmp_path_factory.mktemp(name)
        import_traces([HTA_DATA / name], d, rank=0, progress=False)
        run = distprof.load(d, progress=False)
        out[name] = (build_report(run), measures(run)[0], float(np.mean(run.steps["idle_ms"])))
    return out


def test_real_traces_device_idle_and_host_sync(hta_reports):
    # every rule's device idle is the breakdown's device idle
    for rep, m, idle_ms in hta_reports.values():
        assert m.device_rank and m.device.device_idle_ms_per_step == pytest.approx(idle_ms, rel=1e-9)
    # MI250 toy run: the device idles 98 % of the step while the host is in ops (one 6.5 ms hipLaunchKernel)
    rep, m, _ = hta_reports["amd_trace"]
    (d,) = by_id(rep.findings, "device_idle")
    assert d.rank == 0 and d.severity == "high" and rep.findings[0] is d
    assert d.metrics["impact_pct"] == pytest.approx(rep.summary.idle_pct, abs=0.01)
    assert d.metrics["impact_pct"] > 95 and "aten::add_" in d.evidence
    assert d.advice.startswith("The device waits for the host to launch work")
    assert "no kernel or copy runs on the device on rank 0 for 98 % of step time" in rep.verdict
    # its two synchronous input copies (hipMemcpyWithStream under aten::to) drain the queue: a low finding
    (h,) = by_id(rep.findings, "host_sync")
    assert h.severity == "low" and "aten::to" in h.evidence and h.metrics["sync_calls_per_step"] == 1
    # V100, 97 % compute: nothing about idle, syncs or tiny kernels (its one cudaDeviceSynchronize is outside steps)
    rep, m, _ = hta_reports["ns_resolution_trace"]
    assert not {f.id for f in rep.findings} & {"device_idle", "host_sync", "tiny_ops"}
    assert m.device.syncs_per_step == 0
    # A100 DDP rank: 76 % device idle while the host dispatches ops -> device_idle, high; tiny kernels hold 51 % of
    # kernel time but only 9 % of step time (below tiny_ops' 10 %); 8 short cudaEventSynchronize per step: no host_sync
    rep, m, _ = hta_reports["nccl_parser_config"]
    assert [f.id for f in rep.findings] == ["device_idle"]
    (d,) = rep.findings
    assert d.severity == "high" and 75 < d.metrics["impact_pct"] < 78
    assert d.metrics["idle_host_ops_ms_per_step"] > 0.8 * d.metrics["device_idle_ms_per_step"]
    assert m.ops.tiny_share_pct == pytest.approx(51.4, abs=0.1) and m.ops.tiny_ms_per_step == pytest.approx(19.8, abs=0.1)
    assert m.device.syncs_per_step == 8 and m.device.sync_ms_per_step < 0.1
    assert rep.verdict.startswith("Steps take 222.4 ms on average; no kernel or copy runs on the device on rank 0 "
                                     "for 76 % of step time, mostly while the host is inside ops")


# --------------------------------------------------------------------------------------------------- input wait


def test_input_wait_fires_on_dataloader_and_boundary_gap():
    run = loop_run(dl_ms=8.0, head_gap_ms=2.0, step_ms=30.0)
    fs, _, _ = analyse(run)
    (f,) = by_id(fs, "input_wait")
    m = f.metrics
    assert m["dataloader_ms_per_step"] == pytest.approx(7.99, abs=1e-6)
    # head gap 2 ms + the 10 us between the DataLoader's end and the step end
    assert m["boundary_gap_ms_per_step"] == pytest.approx(2.01, abs=1e-6)
    assert m["impact_pct"] == pytest.approx(100 * 10 / 30, abs=0.01)
    assert f.severity == "high" and "num_workers" in f.advice
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
    ms = measures(run)
    assert ms[0].input.boundary_gap_ms_per_step == pytest.approx(5.0)
    b = RunBuilder(1)  # the same gap covered by a gloo collective on a worker thread
    b.thread(0, 1, schema.THREAD_MAIN)
    b.thread(0, 2, schema.THREAD_COMM, 0)
    b.step(0, 1, 0, 30)
    i = b.event(0, "gloo:barrier", ANNOT, COMM, 2, 0, 5, step=1)
    b.comm(i, role=schema.ROLE_EXEC, seq=0, op="barrier")
    b.event(0, "aten::mm", CPU_OP, COMPUTE, 1, 5, 30, step=1)
    run = b.build()
    assert measures(run)[0].input.boundary_gap_ms_per_step == pytest.approx(0.0)


# ------------------------------------------------------------------------------------------------- memory churn


def test_memory_churn_fires_on_allocation_rate():
    run = with_memory(loop_run(step_ms=30.0), lambda r, s: alloc_free(1000, 4096))  # 33 allocations per ms
    fs, _, _ = analyse(run)
    (f,) = by_id(fs, "memory_churn")
    m = f.metrics
    assert m["allocs_per_step"] == 1000 and m["allocs_per_ms"] == pytest.approx(1000 / 30)
    assert m["churn_rate"] == 1 and m["churn_turnover"] == 0 and m["churn_swing"] == 0
    assert f.severity == "low"  # 1.7x the threshold
    assert "--memory-history" in f.advice


def test_memory_churn_fires_on_turnover_and_on_swings_between_steps():
    mib = 2**20
    # 100 allocations of 8 MiB each, freed at once: 800 MiB allocated per step for an 8 MiB swing
    fs, _, _ = analyse(with_memory(loop_run(), lambda r, s: alloc_free(100, 8 * mib)))
    (f,) = by_id(fs, "memory_churn")
    assert f.metrics["churn_turnover"] == 1 and f.metrics["turnover"] == pytest.approx(100)
    # the per-step peak alternates 100 MiB / 400 MiB (variable shapes)
    fs, _, _ = analyse(with_memory(loop_run(), lambda r, s: alloc_free(2, (100 if s % 2 else 400) * mib)))
    (f,) = by_id(fs, "memory_churn")
    assert f.metrics["churn_swing"] == 1 and f.metrics["peak_swing_mib"] == pytest.approx(300)


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


# ----------------------------------------------------------------------------- memory churn, allocator history

GiB = 2**30


def with_history(run, per_step, sites=()):
    """Give run CUDA allocator-history tables: `per_step(rank, step)` -> cuda_memory column values of that step's
    row (device 0, window 0; missing columns 0, `complete` 1); `sites` [(user frame, bytes, live_at_peak)]
    blocks allocated in every step of every rank."""
    names = list(run.names)

    def sid(text):
        if text not in names:
            names.append(text)
        return names.index(text)

    cm = {c: [] for c in [*schema.TABLES["cuda_memory"], "rank", "window"]}
    blk = {c: [] for c in [*schema.TABLES["cuda_memory_blocks"], "rank", "window"]}
    st = run.steps
    for i in range(st["step"].size):
        r, s = int(st["rank"][i]), int(st["step"][i])
        row = {c: 0 for c in cm}
        row.update(step=s, rank=r, complete=1, peak_ns=int(st["start_ns"][i]))
        row.update(per_step(r, s))
        for c in cm:
            cm[c].append(row[c])
        for user, nbytes, live in sites:
            b = {c: 0 for c in blk}
            b.update(step=s, rank=r, ts_ns=int(st["start_ns"][i]), bytes=nbytes, live_at_peak=int(live),
                     lifetime_ns=-1, frame_id=sid("empty (/usr/lib/python3.11/site-packages/torch/x.py:1)"),
                     user_frame_id=sid(user))
            for c in blk:
                blk[c].append(b[c])
    dt = {**schema.TABLES["cuda_memory"], "rank": np.int32, "window": np.int32}
    run.cuda_memory = {c: np.asarray(v, dt[c]) for c, v in cm.items()}
    dtb = {**schema.TABLES["cuda_memory_blocks"], "rank": np.int32, "window": np.int32}
    run.cuda_memory_blocks = {c: np.asarray(v, dtb[c]) for c, v in blk.items()}
    run.names = np.array(names, dtype=object)
    return run


def steady(n_alloc=90, mib_per_alloc=0.7, base=2 * GiB, reserved=None):
    """A step allocating its working set once: n_alloc allocations on top of `base`, all freed by the step end."""
    work = int(n_alloc * mib_per_alloc * 2**20)
    return lambda r, s: dict(n_alloc=n_alloc, alloc_bytes=work, n_free=n_alloc, free_bytes=work,
                             alloc_peak_bytes=base + work, alloc_end_bytes=base,
                             reserved_peak_bytes=reserved or int(1.2 * (base + work)),
                             reserved_end_bytes=reserved or int(1.2 * (base + work)))


def test_memory_churn_uses_the_allocator_history_and_names_the_sites():
    # 1000 allocations of 1 MiB per 30 ms step (33 per ms), no profiler memory events at all
    run = with_history(loop_run(step_ms=30.0), steady(n_alloc=1000, mib_per_alloc=1.0),
                       sites=[("forward (/home/u/train.py:42)", 64 * 2**20, True),
                              ("loss (/home/u/train.py:57)", 8 * 2**20, False)])
    assert run.has_memory_history and run.memory["ts_ns"].size == 0
    fs, _, _ = analyse(run)
    (f,) = by_id(fs, "memory_churn")
    m = f.metrics
    assert f.rank is None and m["n_ranks"] == 2 and m["memory_history"] == 1
    assert m["allocs_per_step"] == 1000 and m["allocs_per_ms"] == pytest.approx(1000 / 30)
    assert m["alloc_mib_per_step"] == pytest.approx(1000) and m["swing_mib_per_step"] == pytest.approx(1000)
    assert m["turnover"] == pytest.approx(1.0)  # the working set is allocated once per step
    assert (m["churn_rate"], m["churn_turnover"], m["churn_swing"], m["churn_fragmentation"]) == (1, 0, 0, 0)
    assert f.severity == "low"  # 1.7x the threshold
    assert "CUDA allocations per step" in f.title and "From the CUDA allocator history" in f.evidence
    # the sites, largest first, with their bytes per step and whether they were alive at the peak
    ev = f.evidence
    assert ev.index("forward (/home/u/train.py:42): 64.0 MiB in 1.0 allocations per step, 100 % alive") < ev.index(
        "loss (/home/u/train.py:57): 8.0 MiB in 1.0 allocations per step.")
    assert "Reuse buffers at the sites named" in f.advice and "memory_viz" in f.advice
    assert "expandable_segments" not in f.advice


def test_memory_churn_history_fragmentation_swing_and_turnover():
    mib = 2**20
    # reserved 6 GiB for a 2 GiB allocated peak: fragmentation only
    run = with_history(loop_run(), steady(base=2 * GiB - 63 * mib, reserved=6 * GiB))
    fs, _, _ = analyse(run)
    (f,) = by_id(fs, "memory_churn")
    m = f.metrics
    assert (m["churn_rate"], m["churn_turnover"], m["churn_swing"], m["churn_fragmentation"]) == (0, 0, 0, 1)
    assert m["reserved_ratio"] == pytest.approx(3.0, rel=1e-3) and m["reserved_gap_mib"] == pytest.approx(4096, abs=1)
    assert f.severity == "medium"  # 3x / 1.5 = 2x the threshold
    assert "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in f.advice
    assert "empty_cache() is not a fix" in f.advice and "Reuse buffers" not in f.advice
    assert "reserves 6144 MiB for a 2048 MiB allocated peak" in f.title

    # peaks alternate 1 GiB / 2 GiB (variable shapes): swing between steps
    def shapes(r, s):
        work = (1 if s % 2 else 2) * GiB
        return dict(n_alloc=10, alloc_bytes=work, alloc_peak_bytes=work, reserved_peak_bytes=2 * GiB,
                    reserved_end_bytes=2 * GiB)
    fs, _, _ = analyse(with_history(loop_run(), shapes))
    (f,) = by_id(fs, "memory_churn")
    assert f.metrics["churn_swing"] == 1 and f.metrics["peak_swing_mib"] == pytest.approx(1024)
    assert "Keep input shapes fixed" in f.advice

    # 800 MiB allocated per step around a 8 MiB swing; the step ends 8 MiB below its start, the next starts there:
    # the swing is the peak minus the lower of the step's and the previous step's end level
    def turnover(r, s):
        base = (200 + 8 * (s % 2)) * mib  # ends alternate 200 / 208 MiB
        return dict(n_alloc=100, alloc_bytes=800 * mib, alloc_peak_bytes=208 * mib, alloc_end_bytes=base,
                    reserved_peak_bytes=256 * mib)
    fs, _, _ = analyse(with_history(loop_run(n_steps=4), turnover))
    (f,) = by_id(fs, "memory_churn")
    m = f.metrics
    # step 100: no previous step, 208 - 200 = 8; 101 ends at 208 after 100 ended at 200: 8; and so on
    assert m["swing_mib_per_step"] == pytest.approx(8) and m["turnover"] == pytest.approx(100)
    assert m["churn_turnover"] == 1 and m["churn_rate"] == 0


def test_memory_churn_history_does_not_fire_on_ordinary_steps_and_replaces_the_events():
    mib = 2**20
    # the profiler's events alone would fire (1000 allocations per step); the history says the steps are ordinary
    run = with_memory(loop_run(step_ms=30.0), lambda r, s: alloc_free(1000, 4096))
    assert by_id(analyse(run)[0], "memory_churn")
    fs, _, _ = analyse(with_history(run, steady()))
    assert not by_id(fs, "memory_churn")
    # reserved twice the allocated peak, but only 512 MiB above it: below the fragmentation floor
    fs, _, _ = analyse(with_history(loop_run(), steady(base=512 * mib - 63 * mib, reserved=1024 * mib)))
    assert not by_id(fs, "memory_churn")
    # incomplete steps (ring buffer full) are left out of the counts when complete ones exist
    def partial(r, s):
        d = steady()(r, s)
        if s == 100:
            d.update(complete=0, n_alloc=100_000)
        return d
    run = with_history(loop_run(), partial)
    assert measures(run)[0].history.allocs_per_step == 90
    assert not by_id(analyse(run)[0], "memory_churn")


def test_memory_churn_with_and_without_history_on_different_ranks():
    run = with_memory(loop_run(step_ms=30.0), lambda r, s: alloc_free(1000, 4096))
    run = with_history(run, steady(n_alloc=1000, mib_per_alloc=1.0))
    keep = run.cuda_memory["rank"] == 0
    run.cuda_memory = {c: v[keep] for c, v in run.cuda_memory.items()}
    ms = measures(run)
    assert ms[0].history is not None and ms[1].history is None
    fs, _, _ = analyse(run)
    (f,) = by_id(fs, "memory_churn")
    assert f.rank is None and f.metrics["n_ranks"] == 2 and f.metrics["memory_history"] == 0.5
    # rank 0's history says ordinary, rank 1 (events only) still churns: one finding for rank 1, worded as before
    run = with_history(with_memory(loop_run(step_ms=30.0), lambda r, s: alloc_free(1000, 4096)), steady())
    keep = run.cuda_memory["rank"] == 0
    run.cuda_memory = {c: v[keep] for c, v in run.cuda_memory.items()}
    (f,) = by_id(analyse(run)[0], "memory_churn")
    assert f.rank == 1 and "memory_history" not in f.metrics and "--memory-history" in f.advice


def test_memory_churn_from_a_captured_history(tmp_path):
    """End to end on CPU with torch.cuda.memory faked: capture -> shard tables -> load_run -> finding."""
    import time

    import distprof
    from distprof.capture.memhistory import MemoryHistory
    from test_memhistory import LiveFakeCudaMemory

    fake = LiveFakeCudaMemory()
    p = distprof.profile(out=str(tmp_path), wait=0, warmup=1, active=3, repeat=1, run_id="mh")
    p._memhist = MemoryHistory(100_000, memory=fake)
    with p:
        for _ in range(5):
            for _ in range(600):  # 600 small allocations freed at once: churn by rate
                fake.free(fake.malloc(4096, 77))
            time.sleep(0.002)
            p.step()
    assert not p.errors, p.errors
    run = distprof.load(tmp_path / "mh")
    hist = measures(run)[0].history
    assert hist.allocs_per_step == 600 and hist.frees_per_step == 600, hist
    # the rate per ms depends on this machine's speed: judge by allocations per step only
    fs, _, _ = analyse(run, FindingRules(churn_min_allocs_per_ms=1e-3))
    (f,) = by_id(fs, "memory_churn")
    m = f.metrics
    assert f.rank == 0 and m["memory_history"] == 1 and m["allocs_per_step"] == 600 and m["churn_rate"] == 1
    assert "step (/home/u/train.py:77): 32.0 KiB in 8.0 allocations per step" in f.evidence  # 8 largest of 4 KiB


# ------------------------------------------------------------------------------------- exposed communication


def test_exposed_comm_fires_when_allreduce_is_not_hidden():
    fs, _, _ = analyse(ddp_run(4, n_steps=4, allreduce_ms=8.0))
    (f,) = by_id(fs, "exposed_comm")
    assert f.rank is None and f.metrics["n_ranks"] == 4
    assert f.metrics["impact_pct"] > 25 and f.severity == "high"
    assert "bucket_cap_mb" in f.advice and "no_sync" in f.advice


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
    assert f.rank == 2 and f.host == "host0" and f.severity == "high"
    assert f.metrics["late_fraction"] == 1.0 and f.metrics["lateness_ms"] == pytest.approx(20, abs=0.1)
    assert "[idle]" in f.evidence and "outside any recorded op" in f.advice
    assert fs[0] is f  # most severe first
    fs, _, _ = analyse(ddp_run(4, n_steps=4, late_rank=1, late_ms=20, late_kind="compute"))
    (f,) = by_id(fs, "straggler_rank")
    assert f.rank == 1 and "aten::slow" in f.advice


def test_cpu_time_and_page_faults_are_their_own_finding_not_the_stragglers():
    """The same work on every rank, but rank 2's training thread needed 1.5x the CPU time per step and took 8,000
    page faults per step against its peers' 50: the cpu_time finding says so; the straggler finding of the same rank
    says nothing of CPUs; without the samples there is no cpu_time finding."""
    run = ddp_run(4, n_steps=4, late_rank=2, late_ms=20, late_kind="compute")
    run.steps["cpu_run_ns"] = np.where(run.steps["rank"] == 2, 45_000_000, 30_000_000)
    run.steps["page_faults"] = np.where(run.steps["rank"] == 2, 8000, 50)
    fs, _, _ = analyse(run)
    (f,) = by_id(fs, "cpu_time")
    assert f.rank == 2 and f.metrics["ratio"] == pytest.approx(1.5)
    assert "1.50x its peers'" in f.title and "8,000 page faults per step" in f.evidence
    (st,) = by_id(fs, "straggler_rank")
    assert "CPU" not in st.evidence and "page faults" not in st.evidence
    fs, _, _ = analyse(ddp_run(4, n_steps=4, late_rank=2, late_ms=20, late_kind="compute"))
    assert not by_id(fs, "cpu_time")
    even = ddp_run(4, n_steps=4, late_rank=2, late_ms=20, late_kind="compute")
    even.steps["cpu_run_ns"] = np.full(even.steps["rank"].size, 30_000_000)
    assert not by_id(analyse(even)[0], "cpu_time")


def test_no_straggler_finding_without_a_late_rank():
    fs, _, _ = analyse(ddp_run(4, n_steps=4))
    assert not by_id(fs, "straggler_rank") and not by_id(fs, "straggler_host")


def test_straggler_host_when_its_ranks_are_late_together():
    late = {(s, r): 15.0 for s in range(4) for r in (2, 3)}
    fs, s, _ = analyse(ddp_run(4, n_steps=4, hosts=["a", "a", "b", "b"], late_at=late))
    (h,) = by_id(fs, "straggler_host")
    assert h.host == "b" and h.rank is None and h.metrics["n_late_ranks"] == 2
    assert not by_id(fs, "straggler_rank")  # its ranks are covered by the host finding
    assert "throttling" in h.advice
    # one late rank on a two-host run: a rank finding, no host finding
    fs, _, _ = analyse(ddp_run(4, n_steps=4, hosts=["a", "a", "b", "b"], late_rank=3, late_ms=15))
    assert not by_id(fs, "straggler_host")
    assert [f.rank for f in by_id(fs, "straggler_rank")] == [3]


def test_thresholds_are_configurable():
    run = loop_run(dl_ms=2.0, step_ms=30.0)  # about 7 % of step time
    fs, _, _ = analyse(run)
    assert not by_id(fs, "input_wait")
    fs, _, _ = analyse(run, FindingRules(input_min_step_pct=5.0))
    (f,) = by_id(fs, "input_wait")
    assert f.metrics["threshold_step_pct"] == 5.0 and f.severity == "low"


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
    assert f.rank == 3 and f.host == "host0"
    assert f.metrics["impact_pct"] == pytest.approx(30)


# ----------------------------------------------------------------------------------------------------- verdict


def test_verdict_sentences():
    run = ddp_run(4, n_steps=4, late_rank=2, late_ms=20)
    rep = build_report(summarize_merged(run))
    v = rep.verdict
    # what it costs: no CPU samples here, so its lateness stands for its extra work; the what-if gain of its finding
    (f,) = by_id(rep.findings, "straggler_rank")
    assert v.startswith("Rank 2 on host host0 is a straggler in 100 % of steps: it arrives 20.0 ms after its peers at "
                        f"the step's collectives, and the steps would be {f.estimated_gain_ms_per_step:.1f} ms "
                        "shorter without it")
    assert f.estimated_gain_ms_per_step == pytest.approx(20.0, abs=1.0)
    assert "outside any recorded op" in v
    rep = build_report(summarize_merged(ddp_run(4, n_steps=4, allreduce_ms=8.0)))
    assert rep.verdict.startswith("No straggler: ranks arrive within")
    assert "exposed communication" in rep.verdict
    rep = build_report(summarize_merged(loop_run(world=1, dl_ms=8.0)))
    assert rep.verdict.startswith(
        "Steps take 30.0 ms on average; 27 % of step time on rank 0 is spent waiting for input")
    empty = RunBuilder(2).build()
    assert build_report(summarize_merged(empty)).verdict.startswith("No recorded steps")


def test_verdict_without_findings_names_the_largest_part():
    s = StepSummary(n_rank_steps=4, step_ms_mean=10.0, compute_pct=80.0, idle_pct=20.0)
    assert verdict(s, stragglers_of(0), [], []) == \
        "Steps take 10.0 ms on average; 80 % of step time is compute."


# ------------------------------------------------------------------------------------------------- annotations


def test_annotations_per_rank_and_step():
    regions = {0: {"forward": 4.0, "backward": 8.0, "DistributedDataParallel.forward": 3.0},
               1: {"forward": 6.0, "backward": 8.0, "Optimizer.step#Adam.step": 1.0}}
    run = loop_run(regions=regions)
    ann = annotations(summarize_merged(run))
    assert [a.name for a in ann] == ["backward", "forward"]  # framework regions and ProfilerStep# excluded
    fwd = ann[1]
    assert fwd.ranks["0"] == AnnotationRank(ms_per_step=pytest.approx(4.0), count_per_step=1.0)
    assert fwd.ranks["1"].ms_per_step == pytest.approx(6.0)
    assert fwd.spread_pct == pytest.approx(100 * 2 / 5)
    assert ann[0].spread_pct == pytest.approx(0)
    # a region only one rank runs: 0 on the other
    ann = annotations(summarize_merged(loop_run(regions={1: {"eval": 2.0}})))
    assert ann[0].ranks["0"].ms_per_step == 0 and ann[0].spread_pct == pytest.approx(200)


def test_report_json_and_console():
    run = ddp_run(4, n_steps=4, late_rank=2, late_ms=20)
    rep = build_report(summarize_merged(run))
    doc = json.loads(json.dumps(rep.to_json(), allow_nan=False))
    assert set(doc) >= {"verdict", "findings", "annotations"}
    sev = [{"high": 0, "medium": 1, "low": 2}[f.severity] for f in rep.findings]
    assert sev == sorted(sev) and rep.findings
    for f in doc["findings"]:
        assert set(f) == {"id", "severity", "rank", "host", "title", "evidence", "advice", "metrics",
                          "estimated_gain_ms_per_step", "predicted_step_ms"}
        assert all(isinstance(v, (int, float)) for v in f["metrics"].values())
    text = render_console(rep, color=False)
    assert "\x1b[" not in text
    lines = text.splitlines()
    assert lines[1].startswith("Verdict: Rank 2 on host host0")
    assert any(ln.startswith("Findings") for ln in lines[:6])
    assert "\x1b[" in render_console(rep, color=True)
    # a report without a verdict or findings (a --watch series alone) prints no verdict and says no rule fired
    bare = render_console(replace(rep, verdict="", findings=[]))
    assert "Verdict" not in bare and "Findings: none" in bare


# ---------------------------------------------------------------------------------------------- a real job


@pytest.mark.slow
def test_real_job_input_wait_and_annotations(tmp_path):
    torchrun(2, ["-m", "distprof.launch", "--out", "out", "--wait", "1", "--warmup", "1", "--active", "3",
                 str(EXAMPLES / "slow_input.py"), "--steps", "7", "--item-ms", "2"], cwd=tmp_path)

    rep = build_report(distprof.load(only_run_dir(tmp_path / "out"), progress=False))
    (f,) = by_id(rep.findings, "input_wait")
    assert f.rank is None and f.metrics["n_ranks"] == 2
    # 8 samples x 2 ms of sleep per batch, in DataLoader __next__ on the main thread
    assert 14 <= f.metrics["dataloader_ms_per_step"] <= 40
    names = [a.name for a in rep.annotations]
    assert set(names) == {"forward", "loss", "backward"}
    for a in rep.annotations:
        assert set(a.ranks) == {"0", "1"}
        assert all(v.count_per_step == 1 for v in a.ranks.values())
    assert "waiting for input" in rep.verdict


def test_verdict_leads_with_the_most_severe_finding():
    # a low-severity straggler (1.2 ms of a 40 ms step) and 45 % exposed communication: the latter leads
    s = StepSummary(n_rank_steps=8, step_ms_mean=40.0)
    strag = stragglers_of(8, [straggler_row(rank=1, host="h", named=True, late_step_fraction=1.0, lateness_ms=1.3,
                                            cost_ms_per_step=1.2)])
    exposed = Finding("exposed_comm", "high", None, None, "x", "", "", {"impact_pct": 45.0})
    low = Finding("straggler_rank", "low", 1, "h", "y", "", "", {"impact_pct": 3.0})
    v = verdict(s, strag, [], [exposed, low])
    assert v.startswith("45 % of step time is exposed communication. Also, rank 1 on host h is a straggler in 100 % "
                        "of steps: it arrives 1.3 ms after its peers at the step's collectives, and the steps lose "
                        "1.2 ms to it")
    # the straggler leads when it is the most severe
    high = replace(low, severity="high", metrics={"impact_pct": 50.0})
    v = verdict(s, strag, [], [high, exposed])
    assert v.startswith("Rank 1 on host h is a straggler") and v.endswith("Also, 45 % of step time is exposed "
                                                                          "communication.")
    # with its extra work known and the finding's what-if gain, the headline says what it costs in those terms
    strag.ranks[0].extra_work_ms = 2.5
    v = verdict(s, strag, [], [replace(high, estimated_gain_ms_per_step=1.1), exposed])
    assert v.startswith("Rank 1 on host h is a straggler in 100 % of steps: it does 2.5 ms more work per step than its "
                        "peers before the step's collectives, and the steps would be 1.1 ms shorter without it.")
