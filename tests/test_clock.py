"""Clock alignment: offsets from ping-pongs, drift, fallback on collectives, residual check."""

from __future__ import annotations

import distprof
import numpy as np
import pytest

from distprof.analysis import load_run
from distprof.analysis.align.clock import ClockModel, Segment, fit_segments, phase_offsets, residuals
from distprof.analysis.align.matching import match_collectives
from distprof.analysis.types import HostClock
from synth import make_run

BASE = 1_790_856_000 * 10**9  # epoch ns: too large for a double to hold exactly


def _samples(phase, send, d_out, d_ret, offset):
    """Ping-pongs built from one-way delays: remote clock = local clock + offset."""
    send = BASE + np.asarray(send, dtype=np.int64)
    d_out, d_ret = np.asarray(d_out, dtype=np.int64), np.asarray(d_ret, dtype=np.int64)
    offset = np.broadcast_to(np.asarray(offset, dtype=np.int64), send.shape)
    return {
        "phase": np.asarray(phase, dtype=np.uint8),
        "peer": np.zeros(len(send), dtype=np.int32),
        "t_send_ns": send,
        "t_remote_ns": send + d_out + offset,
        "t_recv_ns": send + d_out + d_ret,
    }


def test_phase_offsets_hand_computed():
    # true offset 20; sample 2 has a 900 ns delay on the ping (asymmetric outlier).
    # min-delay: min ping (d_out + 20) = 70, min pong (d_ret − 20) = 30 -> (70 − 30)/2 = 20.
    # median-rtt: rtts 100, 115, 950, 122 -> keep max(3, 25 %) = 3 lowest: per-sample offsets 20, 22.5, 11 -> 20.
    s = _samples([0] * 4, [0, 1000, 2000, 3000], [50, 60, 900, 52], [50, 55, 50, 70], 20)
    est = phase_offsets(s)
    assert est["phase"].tolist() == [0]
    assert est["offset_ns"][0] == pytest.approx(20.0)
    assert est["offset_median_ns"][0] == pytest.approx(20.0)
    assert est["rtt_min_ns"][0] == 100 and est["rtt_eff_ns"][0] == 100
    assert est["n"][0] == 4 and est["n_kept"][0] == 3
    # local midpoints 50, 1057.5, 2475, 3061 -> median 1766.25 -> rounded
    assert est["t_local_ns"][0] == BASE + 1766
    assert phase_offsets(s, estimator="median-rtt")["offset_ns"][0] == pytest.approx(20.0)
    with pytest.raises(ValueError, match="estimator"):
        phase_offsets(s, estimator="mean")


def test_a_sample_whose_round_trip_spans_a_clock_step_does_not_hide_it():
    """The pinging host's clock jumps +5 s during one sample's round trip (seen in CI: that sample's round trip is
    5 s and its offset half-way, within its bound of both sides, so comparing consecutive samples saw no step; the
    phase mixed both sides: offset −2.5 s, best round trip −5 s, which then made every estimate of the host 2.5 s
    uncertain and hid the step from the fit). The phase keeps one side; its round trip is never negative."""
    step = 5_000_000_000
    n = 8
    send = BASE + np.arange(n, dtype=np.int64) * 100_000
    remote = send + 40_000  # peer's clock; true offset 0 before the step
    recv = send + 80_000
    send[5:] += step  # samples 5.. are sent after the jump of the leader's clock ...
    recv[4:] += step  # ... and sample 4's reply arrives after it: its round trip spans the step
    s = {"phase": np.ones(n, np.uint8), "peer": np.zeros(n, np.int32), "t_send_ns": send, "t_remote_ns": remote,
         "t_recv_ns": recv}
    end = phase_offsets(s)  # phase 1, a window's end: the samples before the step
    assert bool(end["stepped"][0]) and end["n"][0] == 5
    assert end["offset_ns"][0] == pytest.approx(0.0, abs=1.0) and end["rtt_eff_ns"][0] == 80_000
    s["phase"] = np.zeros(n, np.uint8)  # phase 0, a window's start: the samples after it
    start = phase_offsets(s)
    assert bool(start["stepped"][0]) and start["n"][0] == 3
    assert start["offset_ns"][0] == pytest.approx(-step, abs=1.0) and start["rtt_eff_ns"][0] == 80_000


def test_phase_offsets_contended_phase():
    """Most pings delayed one way (a busy reference): min-delay stays right, the lowest-RTT median does not."""
    n = 16
    d_out = np.full(n, 60_000)
    d_out[1:] += np.arange(1, n) * 40_000  # all but one ping queued behind other work
    d_ret = np.full(n, 60_000)
    d_ret[0] += 5_000
    s0 = _samples([0] * n, np.arange(n) * 10**6, d_out, d_ret, 7_000)
    s1 = _samples([1] * n, 10**9 + np.arange(n) * 10**6, np.full(n, 60_000), np.full(n, 60_000), 1_007_000)
    both = {k: np.concatenate([s0[k], s1[k]]) for k in s0}
    est = phase_offsets(both)
    assert est["phase"].tolist() == [0, 1]
    # min ping = 60 µs + 7 µs; min pong = 60 µs − 7 µs (any sample but 0) -> exact
    assert est["offset_ns"].tolist() == pytest.approx([7_000.0, 1_007_000.0])
    assert est["offset_median_ns"][0] == pytest.approx(37_000.0)  # kept 4 lowest-RTT: 4.5, 27, 47, 67 µs
    assert est["rtt_eff_ns"].tolist() == [120_000, 120_000]


def test_fit_segments_line_between_phases():
    def e(t, o, eff=100_000):
        return {"phase": np.arange(len(t)), "t_local_ns": BASE + np.asarray(t, dtype=np.int64),
                "offset_ns": np.asarray(o, dtype=np.float64), "rtt_eff_ns": np.full(len(t), eff)}

    # -40 µs over 1 s = -40 ppm in window 0; window 1 has one phase on the same line
    est = {0: e([0, 10**9], [-5e9, -5e9 - 40e3]), 1: e([3 * 10**9], [-5e9 - 120e3])}
    segs, glob = fit_segments(est, drift_prior_ppm=1e6)  # no prior: plain least squares
    assert segs[0].t_ref_ns == BASE and segs[0].offset_ns == pytest.approx(-5e9)
    assert segs[0].slope * 1e6 == pytest.approx(-40.0)
    assert segs[1].slope * 1e6 == pytest.approx(-40.0)  # one phase only: global slope
    assert segs[1].offset_ns == pytest.approx(-5e9 - 120e3)
    assert glob.slope * 1e6 == pytest.approx(-40.0)
    t = np.array([BASE + 5 * 10**8])
    assert segs[0].apply(t)[0] == t[0] - 5 * 10**9 - 20_000
    # with the default prior (0 ± 50 ppm) and 2 µs uncertainties the data still dominate
    segs, glob = fit_segments(est)
    assert glob.slope * 1e6 == pytest.approx(-40.0, abs=0.2)
    # a phase measured under contention (best round trip 300 µs worse -> ±150 µs) no longer bends the drift
    bad = {0: {**e([0, 3 * 10**8], [0.0, -100e3]), "rtt_eff_ns": np.array([100_000, 400_000])}}
    segs, glob = fit_segments(bad)
    assert abs(segs[0].slope * 1e6) < 60  # not the −333 ppm the two points imply
    assert abs(segs[0].offset_ns) < 1_000  # follows the good phase


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
    rows = {"op_id": np.array([0, 0], np.uint32), "pg": np.array([0, 0], np.int32), "seq": np.array([0, 0], np.int32),
            "bytes": np.array([8, 8]), "rank": np.array([0, 1], np.int32), "window": np.array([0, 0], np.int32),
            "start_ns": np.array([100_000, 150_000]), "end_ns": np.array([200_000, 210_000])}
    names = np.array(["all_reduce"], dtype=object)
    c = match_collectives(rows, names=names)
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
    m = distprof.load(run.run_dir)
    assert m.clock["sim-host1"].residual_max_us == 0.0
    from distprof.analysis.align.matching import with_times

    c = m.collectives
    shift = np.where(c.members["rank"] == 1, 5_000_000, 0)
    bad = with_times(c, c.members["start_ns"] + shift, c.members["end_ns"] + shift)
    # rank 1 now enters 5 ms later, so rank 0 "ended" before it: violation = 5 ms − (end rank 0 − start rank 1)
    start, end = c.per_rank("start_ns"), c.per_rank("end_ns")
    want = np.maximum(0, start[:, 1] + 5_000_000 - np.minimum(end[:, 0], end[:, 1] + 5_000_000))
    assert bad.instances["violation_ns"].tolist() == want.tolist()
    assert bad.instances["violation_ns"].min() > 3_000_000  # gloo all_reduce here lasts ≈1.5 ms


def test_reference_rank_missing(tmp_path):
    """Rank 0 (the reference) lost its shard: its host is found through its members, samples still apply."""
    run = make_run(tmp_path, hosts=[0, 0, 1, 1], clocks={1: (3.25, 40.0)}, missing_ranks=[0])
    m = load_run(run.run_dir)
    assert m.ranks_missing == [0]
    assert m.clock["sim-host0"].method == "reference" and m.clock["sim-host1"].method == "ping-pong"
    sel = m.steps["rank"] == 2
    assert np.abs(m.steps["start_ns"][sel] - run.to_recorded(0, run.steps[2]["start"])).max() < 5_000


def test_leader_missing_falls_back(tmp_path):
    """Host 1's leader (rank 2) lost its shard: rank 3 has no samples, so collectives align host 1."""
    run = make_run(tmp_path, hosts=[0, 0, 1, 1], clocks={1: (3.25, 40.0)}, missing_ranks=[2])
    m = load_run(run.run_dir)
    assert m.clock["sim-host1"].method == "collectives" and m.clock["sim-host1"].ranks == [3]
    sel = m.steps["rank"] == 3
    assert np.abs(m.steps["start_ns"][sel] - run.to_recorded(0, run.steps[3]["start"])).max() < 60_000
    assert any("sim-host1" in w and "collective end times" in w for w in m.warnings)


def test_reference_host_entirely_missing(tmp_path):
    """Only rank 0 lived on the reference host and its shard is gone: the others still meet on its clock."""
    run = make_run(tmp_path, world_size=3, hosts=[0, 1, 2], clocks={1: (3.25, 40.0), 2: (-1.5, -20.0)},
                   missing_ranks=[0])
    m = load_run(run.run_dir)
    assert set(m.clock) == {"sim-host1", "sim-host2"}
    assert {c.method for c in m.clock.values()} == {"ping-pong"}
    assert any("no shard from the clock reference rank 0" in w for w in m.warnings)
    for r in (1, 2):
        sel = m.steps["rank"] == r
        assert np.abs(m.steps["start_ns"][sel] - run.to_recorded(0, run.steps[r]["start"])).max() < 5_000


def test_per_host_aggregates_are_each_hosts_own():
    """The collective fallback aggregates every host's members in one pass; each host's figures are those of a
    pass over that host alone (ties in end times, unused instances, ranks without a host and an empty host)."""
    from types import SimpleNamespace

    from distprof.analysis.align.clock import _host_aggregates, _per_host_aggregates

    rng = np.random.default_rng(7)
    n_inst, n_ranks = 40, 24
    inst = np.repeat(np.arange(n_inst), n_ranks)
    rank = np.tile(np.arange(n_ranks), n_inst)
    keep = rng.random(inst.size) > 0.2
    inst, rank = inst[keep], rank[keep]
    start = 1_700_000_000_000_000_000 + inst * 1_000_000 + rng.integers(0, 50_000, inst.size)
    end = start + rng.integers(0, 3, inst.size) * 1000  # many equal ends
    ends = np.full(n_inst, np.iinfo(np.int64).max)
    np.minimum.at(ends, inst, end)
    c = SimpleNamespace(members={"rank": rank, "inst": inst, "start_ns": start, "end_ns": end},
                        instances={"end_min": ends, "window": np.arange(n_inst) % 3})
    rank_host = {r: f"h{r % 5}" for r in range(n_ranks - 2)}  # two ranks on no host
    use = rng.random(n_inst) > 0.3
    hosts = ["h3", "h0", "h4", "h1", "h2", "empty"]
    per = _per_host_aggregates(c, rank_host, use, hosts)
    for h in hosts:
        one = _host_aggregates(c, rank_host, use, {h})
        assert per[h].keys() == one.keys()
        for k in one:
            assert np.array_equal(per[h][k], one[k]), (h, k)
    assert per["empty"]["inst"].size == 0 and per["h0"]["inst"].size > 0


@pytest.mark.parametrize("windows", [[0, 3, 3, 7, 0, 1], [-2, 5, 5, -2, 0, 9], [1 << 40, 0, 1 << 40, 2, 2, 0]])
def test_align_looks_segments_up_by_host_and_window(windows):
    """Each row gets its own (host, window) segment — window numbers counted through a lookup table, or sorted when
    negative or huge — and align_all gives align's times for every column from one lookup."""
    w = np.array(windows, np.int64)
    rank = np.array([0, 1, 2, 1, 2, 3])  # rank 3: unknown to the model, its times kept
    segs = {(h, int(x)): Segment(1_000 * int(i), 10.0 * (i + 1) * (1 if h == "B" else -1), 1e-6 * i)
            for i, x in enumerate(sorted(set(windows))) for h in ("A", "B")}
    model = ClockModel(reference_host="A", rank_host={0: "A", 1: "B", 2: "B"}, hosts={}, segments=segs)
    t0 = np.arange(6, dtype=np.int64) * 1_000_000 + 123
    t1 = t0 + 5_000
    want = [segs[({0: "A", 1: "B", 2: "B"}[int(r)], int(x))].apply(t[i:i + 1])[0] if r != 3 else t[i]
            for t in (t0,) for i, (r, x) in enumerate(zip(rank, w))]
    assert model.align(rank, w, t0).tolist() == want
    a0, a1 = model.align_all(rank, w, t0, t1)
    assert a0.tolist() == want and a1.tolist() == model.align(rank, w, t1).tolist()
    assert [x.size for x in model.align_all(rank[:0], w[:0], t0[:0], t1[:0])] == [0, 0]
