"""Imbalance statistics and MFU."""

from __future__ import annotations

import pytest
from test_breakdown import ddp_run

from distprof.analysis.summarize.engine import summarize_merged
from distprof.analysis.cross.imbalance import imbalance, imbalance_stats
from distprof.analysis.cross.mfu import mfu, peak_tflops_for


def test_worked_example_from_anchors():
    # the POP metrics' worked example: L = [100, 100, 100, 130] ms
    s = imbalance_stats([100, 100, 100, 130], [0, 1, 2, 3])
    assert s.mean == pytest.approx(107.5)
    assert s.lambda_ == pytest.approx(0.2093, abs=1e-4)
    assert s.cv == pytest.approx(0.1209, abs=1e-4)  # population σ
    assert s.lb == pytest.approx(0.827, abs=1e-3)
    assert s.max_rank == 3 and s.min == 100
    assert s.max_over_min == pytest.approx(1.3)


def test_degenerate_values():
    s = imbalance_stats([0.0, 0.0], [0, 1])
    assert s.lambda_ is None and s.cv is None and s.lb is None
    assert imbalance_stats([], []).mean is None


def test_uneven_batch():
    # rank 1 has a 1.5× batch: 1.5× FLOPs and 1.5× compute per step
    imb = imbalance(summarize_merged(ddp_run(4, n_steps=3, batch={1: 1.5})))
    m = imb.metrics
    assert m["flops"].max_rank == 1
    assert m["compute_ms"].max_rank == 1
    assert m["flops"].max_over_min == pytest.approx(1.5, rel=1e-6)
    # compute 21 ms vs 31.5 (forward 10, backward 2×5, optimizer 1; the optimizer is not scaled)
    assert m["compute_ms"].max == pytest.approx(31.0)
    assert m["compute_ms"].min == pytest.approx(21.0)
    # step times are equal (everyone waits for the slow rank at the all-reduce)
    assert m["step_ms"].lambda_ == pytest.approx(0.0, abs=1e-9)
    per = {p.rank: p for p in imb.per_rank}
    assert per[1].tflops == pytest.approx(per[0].tflops * 1.5, rel=1e-6)


def test_peak_table():
    assert peak_tflops_for("NVIDIA H100 80GB HBM3") == 989
    assert peak_tflops_for("NVIDIA H100 PCIe") == 756
    assert peak_tflops_for("NVIDIA H200") == 989
    assert peak_tflops_for("NVIDIA A100-SXM4-80GB") == 312
    assert peak_tflops_for("Tesla V100-SXM2-16GB") == 125
    assert peak_tflops_for("NVIDIA L4") == 121
    assert peak_tflops_for("AMD Instinct MI300X") == 1307
    assert peak_tflops_for("cpu") is None
    assert peak_tflops_for("") is None


def test_mfu_cpu_needs_override():
    run = ddp_run(2, n_steps=2)
    assert mfu(summarize_merged(run)) == []
    rows = mfu(summarize_merged(run), peak_tflops=1.0)
    assert [r.peak_source for r in rows] == ["override", "override"]
    # 5e9 + 1000 FLOPs per step over the step's wall time

    bd = summarize_merged(run).steps
    step_s = bd["step_ms"][bd["rank"] == 0].sum() / 1e3
    assert rows[0].achieved_tflops == pytest.approx(2 * (5e9 + 1000) / step_s / 1e12)
    assert rows[0].mfu == pytest.approx(rows[0].achieved_tflops)


def test_mfu_from_device_name():
    run = ddp_run(2, n_steps=1)
    for a in run.attrs.values():
        a["device"] = "NVIDIA A100-SXM4-40GB"
    rows = mfu(summarize_merged(run))
    assert rows[0].peak_tflops == 312 and rows[0].peak_source == "table"
