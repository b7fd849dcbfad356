"""Clock alignment: offsets from ping-pongs, drift, fallback on collectives, residual check."""

from __future__ import annotations

import numpy as np
import pytest

from distprof.analysis import load_run
from distprof.analysis.clock import (
    ClockModel,
    Segment,
    fit_segments,
    phase_offsets,
    residuals,
)
from distprof.analysis.matching import match_collectives
from distprof.analysis.model import HostClock
from synth import make_run

BASE = 1_790_856_000 * 10**9  # epoch ns: too large for a double to hold exactly


def _samples(phase, send, rtt, off):
    send = BASE + np.asarray(send, dtype=np.int64)
    rtt = np.asarray(rtt, dtype=np.int64)
    return {
        "phase": np.asarray(phase, dtype=np.uint8),
        "peer": np.zeros(len(send), dtype=np.int32),
        "t_send_ns": send,
        "t_remote_ns": send + rtt // 2 + np.asarray(off, dtype=np.int64),
        "t_recv_ns": send + rtt,
    }


def test_phase_offsets_keep_lowest_rtt():
    # 4 samples: rtt 100, 200, 1000 (asymmetric outlier, offset 500), 150. keep max(3, 25%) = 3 lowest-RTT samples
    # -> offsets 10, 20, 30 -> median 20; local midpoints 50, 1100, 3075 -> median 1100.
    est = phase_offsets(_samples([0, 0, 0, 0], [0, 1000, 2000, 3000], [100, 200, 1000, 150], [10, 20, 500, 30]))
    assert est["phase"].tolist() == [0]
    assert est["offset_ns"][0] == pytest.approx(20.0)
    assert est["t_local_ns"][0] == BASE + 1100
    assert est["n"][0] == 4 and est["n_kept"][0] == 3
    assert est["rtt_min_ns"][0] == 100
    assert est["spread_ns"][0] == pytest.approx(20.0)


def test_phase_offsets_per_phase_and_fraction():
    # 16 samples per phase, keep 25% = 4. Phase 1 offsets are 1000 more.
    n = 16
    rtt = np.arange(n) * 10 + 100
    off = np.where(np.arange(n) < 4, 7, 9999)  # only the 4 lowest-RTT samples carry the true offset
    s0 = _samples([0] * n, np.arange(n) * 1000, rtt, off)
    s1 = _samples([1] * n, 10**9 + np.arange(n) * 1000, rtt, off + 1000)
    both = {k: np.concatenate([s0[k], s1[k]]) for k in s0}
    est = phase_offsets(both)
    assert est["phase"].tolist() == [0, 1]
    assert est["offset_ns"].tolist() == pytest.approx([7.0, 1007.0])
    assert est["n_kept"].tolist() == [4, 4]


def test_fit_segments_line_between_phases():
    est = {
        0: {"phase": np.array([0, 1]), "t_local_ns": np.array([BASE, BASE + 10**9]),
            "offset_ns": np.array([-5e9, -5e9 - 40e3])},  # -40 µs over 1 s = -40 ppm
        1: {"phase": np.array([0]), "t_local_ns": np.array([BASE + 3 * 10**9]), "offset_ns": np.array([-5e9 - 120e3])},
    }
    segs, glob = fit_segments(est)
    assert segs[0].t_ref_ns == BASE and segs[0].offset_ns == -5e9
    assert segs[0].slope * 1e6 == pytest.approx(-40.0)
    assert segs[1].slope * 1e6 == pytest.approx(-40.0)  # one phase only: global slope
    assert glob.slope * 1e6 == pytest.approx(-40.0)
    t = np.array([BASE + 5 * 10**8])
    assert segs[0].apply(t)[0] == t[0] - 5 * 10**9 - 20_000


@pytest.mark.parametrize("outliers", [0.0, 0.5])
def test_offset_and_drift_recovered(tmp_path, outliers):
    """Host 1 runs 3.25 s ahead with +40 ppm drift; everything aligned to host 0 within a few µs."""
    # long steps (≈0.3 s) so the windows span seconds: the drift estimate needs a baseline
    run = make_run(tmp_path, hosts=[0, 0, 1, 1], clocks={1: (3.25, 40.0)}, schedule={"repeat": 3},
                   fwd_ms=100.0, bwd_ms=200.0, sync_outlier_frac=outliers, seed=3)
    m = load_run(run.run_dir)
    hc = m.clock["sim-host1"]
    assert hc.method == "ping-pong" and hc.ranks == [2, 3]
    assert m.clock["sim-host0"].offset_ns == 0 and m.clock["sim-host0"].method == "reference"
    # offset at t_ref: what must be added to host-1 time there (−3.25 s − 40 ppm × 12 h = −4.978 s)
    truth = int(run.correction_ns(2, np.int64(hc.t_ref_ns)))
    assert abs(hc.offset_ns - truth) < 3_000
    assert hc.drift_ppm == pytest.approx(-40.0 / (1 + 40e-6), abs=0.5)
    # every aligned step boundary equals the truth within a few µs
    for r in range(4):
        sel = m.steps["rank"] == r
        want = run.to_recorded(0, run.steps[r]["start"])
        assert np.abs(m.steps["start_ns"][sel] - want).max() < 5_000
    assert hc.residual_us == 0.0 and hc.residual_max_us == 0.0
    assert not m.warnings


def test_reference_host_with_own_clock(tmp_path):
    """Everything is aligned to the reference host's clock, whatever that clock is."""
    run = make_run(tmp_path, hosts=[0, 1, 2], world_size=3, clocks={0: (1.0, 0.0), 1: (-2.5, -15.0), 2: (0.0, 25.0)})
    m = load_run(run.run_dir)
    for r in range(3):
        sel = m.steps["rank"] == r
        want = run.to_recorded(0, run.steps[r]["end"])
        assert np.abs(m.steps["end_ns"][sel] - want).max() < 5_000
    assert {h: c.method for h, c in m.clock.items()} == {
        "sim-host0": "reference", "sim-host1": "ping-pong", "sim-host2": "ping-pong"}


def test_single_host(tmp_path):
    run = make_run(tmp_path, world_size=2)
    m = load_run(run.run_dir)
    assert list(m.clock) == ["sim-host0"]
    hc = m.clock["sim-host0"]
    assert hc.method == "single-host" and hc.offset_ns == 0
    assert hc.residual_us == 0.0  # still computed
    assert (m.steps["start_ns"] == np.concatenate([run.steps[r]["start"] for r in range(2)])).all()  # untouched


def test_fallback_to_collectives(tmp_path):
    """No samples (imported traces, failed sync): align from collective end times, and say so."""
    run = make_run(tmp_path, hosts=[0, 0, 1, 1], clocks={1: (3.25, 40.0)}, clock_sync=False, end_jitter_us=30.0)
    m = load_run(run.run_dir)
    hc = m.clock["sim-host1"]
    assert hc.method == "collectives"
    assert any("collective end times" in w and "sim-host1" in w for w in m.warnings)
    for r in (2, 3):
        sel = m.steps["rank"] == r
        want = run.to_recorded(0, run.steps[r]["start"])
        assert np.abs(m.steps["start_ns"][sel] - want).max() < 60_000  # ~end jitter + drift over the window
    assert hc.residual_us is not None and hc.residual_us < 50


def test_residual_hand_computed():
    """2 ranks on 2 hosts, one all_reduce; host B's model is 100 µs too late -> 50 µs causality violation."""
    comms = {"row": np.array([0, 1]), "op_id": np.array([0, 0], np.uint32), "role": np.array([1, 1], np.uint8),
             "pg": np.array([0, 0], np.int32), "seq": np.array([0, 0], np.int32), "bytes": np.array([8, 8]),
             "rank": np.array([0, 1], np.int32), "window": np.array([0, 0], np.int32)}
    events = {"ts_ns": np.array([100_000, 150_000]), "dur_ns": np.array([100_000, 60_000]),
              "rank": np.array([0, 1], np.int32), "window": np.array([0, 0], np.int32)}
    names = np.array(["all_reduce"], dtype=object)
    c = match_collectives(comms, events, names=names)
    model = ClockModel(reference_host="A", rank_host={0: "A", 1: "B"},
                       hosts={"A": HostClock("A", 0.0), "B": HostClock("B", 100_000.0)},
                       segments={("B", 0): Segment(0, 100_000.0, 0.0)})
    # aligned: rank0 [100, 200] µs, rank1 [250, 310] µs -> rank0 ended 50 µs before rank 1 entered
    res = residuals(model, c, names=names)
    assert res == {"A": (50.0, 50.0), "B": (50.0, 50.0)}
    assert model.hosts["B"].residual_us == 50.0 and model.hosts["B"].residual_max_us == 50.0
    model.segments[("B", 0)] = Segment(0, 0.0, 0.0)
    assert residuals(model, c, names=names) == {"A": (0.0, 0.0), "B": (0.0, 0.0)}


def test_wrong_offset_shows_in_residual(tmp_path):
    """Shifting a host by 5 ms after the fact makes collectives end before they started: the residual shows it."""
    run = make_run(tmp_path, hosts=[0, 1], world_size=2, clocks={1: (0.5, 0.0)})
    m = load_run(run.run_dir)
    assert m.clock["sim-host1"].residual_max_us == 0.0
    from distprof.analysis.matching import match_run, with_times

    c = match_run(m)
    shift = np.where(c.members["rank"] == 1, 5_000_000, 0)
    bad = with_times(c, c.members["start_ns"] + shift, c.members["end_ns"] + shift)
    # rank 1 now enters 5 ms later, so rank 0 "ended" before it: violation = 5 ms − (end rank 0 − start rank 1)
    start, end = c.per_rank("start_ns"), c.per_rank("end_ns")
    want = np.maximum(0, start[:, 1] + 5_000_000 - np.minimum(end[:, 0], end[:, 1] + 5_000_000))
    assert bad.instances["violation_ns"].tolist() == want.tolist()
    assert bad.instances["violation_ns"].min() > 3_000_000  # gloo all_reduce here lasts ≈1.5 ms
