"""Clock steps (NTP stepping a clock, a VM migrating): one host's clock jumps while a run is recorded. Synthetic runs
(tests/synth.py) whose host 1 steps at a chosen time, every time that host records passing through the step; the
report must see the step, keep the clock table sane, leave out a window the step cut, and still name the real
straggler. The real-job version (DISTPROF_SIM_CLOCKS with a step) is in test_capture_hardening.py."""

from __future__ import annotations

import json

import numpy as np
import pytest
from reliability_helpers import run_cli

import distprof
from distprof.analysis.align.clock import STEP_MIN_NS, estimate_clocks, phase_offsets
from distprof.analysis.types import RankClockInfo
from distprof.storage import find_shards, read_shard
from synth import make_run

pytestmark = pytest.mark.timeout(120)

#: host 1 (ranks 2, 3) is 30 ms late on rank 3 each step: the straggler the report must keep naming
KW = dict(world_size=4, hosts=[0, 0, 1, 1], late_rank=3, late_ms=30, schedule={"repeat": 4}, n_layers=1,
          buckets=(65536,))
HOST1 = (2, 3)
#: columns that hold times of the recording rank's own clock
LOCAL = {"events": ("ts_ns",), "steps": ("start_ns", "end_ns"), "memory": ("ts_ns",), "clock/local": ("time_ns",)}


def _stepper(at_ns: int, jump_ns: int):
    """A synth `mutate` hook: host 1's clock jumps by `jump_ns` at its local time `at_ns`."""
    def mutate(rank, window, tables, strings, attrs):
        if rank not in HOST1:
            return
        for table, cols in LOCAL.items():
            for c in cols:
                if table in tables:
                    v = tables[table][c]
                    tables[table][c] = np.where(v >= at_ns, v + jump_ns, v)
        cs = tables.get("clock/samples")
        if cs is not None:  # the leader's own send and receive times; the reference's stay
            for c in ("t_send_ns", "t_recv_ns"):
                cs[c] = np.where(cs[c] >= at_ns, cs[c] + jump_ns, cs[c])
        for k in ("window_start_ns", "window_end_ns"):
            if attrs[k] >= at_ns:
                attrs[k] += jump_ns
    return mutate


def _spans(run_dir) -> dict[int, tuple[int, int]]:
    """Window -> (start, end) of rank 2 (host 1's leader) as recorded."""
    out = {}
    for p in find_shards(run_dir):
        a = read_shard(p).attrs
        if a["rank"] == 2:
            out[a["window"]] = (a["window_start_ns"], a["window_end_ns"])
    return out


def _stepped_run(tmp_path, where: str, jump_ns: int):
    """The same synthetic run, with host 1 stepping between windows 1 and 2 (`where` "between") or in the middle
    of window 2 ("inside")."""
    spans = _spans(make_run(tmp_path / "plain", **KW).run_dir)
    if where == "between":
        at = (spans[1][1] + spans[2][0]) // 2
    else:
        at = (spans[2][0] + spans[2][1]) // 2
    return make_run(tmp_path / where, mutate=_stepper(at, jump_ns), **KW).run_dir


def _report(run_dir, tmp_path) -> dict:
    """report.json of `run_dir` (the documented contract: docs/report-format.md)."""
    out = tmp_path / "report.json"
    rc, _, err = run_cli(["report", run_dir, "--json", out, "--no-progress"])
    assert rc == 0, err
    return json.loads(out.read_text())


def _named(rep: dict) -> set[int]:
    return set(rep["straggler_info"]["named"])


def _clock_warnings(rep: dict) -> list[str]:
    return [w for w in rep["warnings"] if "clock step" in w]


@pytest.mark.parametrize("jump_s", [5.0, -0.5])
def test_a_step_between_windows_is_aligned_on_each_side(tmp_path, jump_s):
    """Measured before: the drift came out near -10^6 ppm (the step read as drift over the run) and the late rank
    was lost. Now the windows on each side of the step are aligned on their own: a sane drift, one warning, every
    window kept, the straggler named."""
    run_dir = _stepped_run(tmp_path, "between", int(jump_s * 1e9))
    run = distprof.load(run_dir)
    assert sorted(np.unique(run.steps["window"]).tolist()) == [0, 1, 2, 3]
    rep = _report(run_dir, tmp_path)
    assert abs(rep["clock"]["sim-host1"]["drift_ppm"]) < 100, rep["clock"]
    warned = _clock_warnings(rep)
    assert len(warned) == 1 and "between window 1 and window 2" in warned[0], rep["warnings"]
    assert "left out" not in warned[0]
    assert _named(rep) == {3}, rep["straggler_info"]


def test_a_step_inside_a_window_leaves_it_out(tmp_path):
    """A +5 s step in the middle of window 2: that window cannot be aligned (part of it is on each clock); it is
    left out of the cross-rank analyses with one warning naming it, the others are aligned, the straggler named."""
    run_dir = _stepped_run(tmp_path, "inside", 5 * 10**9)
    run = distprof.load(run_dir)
    assert 2 not in set(np.unique(run.steps["window"]).tolist())
    assert 2 not in set(np.unique(run.collectives.instances["window"]).tolist())
    rep = _report(run_dir, tmp_path)
    assert abs(rep["clock"]["sim-host1"]["drift_ppm"]) < 100, rep["clock"]
    warned = _clock_warnings(rep)
    assert len(warned) == 1 and "inside window 2" in warned[0] and "window(s) 2" in warned[0], rep["warnings"]
    assert _named(rep) == {3}, rep["straggler_info"]  # named, and no rank made late or early by the step


def _pingpong(phase: int, t0: int, n: int, offset: int, step_at: int | None = None, jump: int = 0) -> dict:
    """`n` ping-pongs of 100 µs round trips from local time `t0`; the leader's clock steps by `jump` at its (true)
    time `step_at`: every local time from then on moves."""
    send = t0 + np.arange(n, dtype=np.int64) * 1_000_000
    recv = send + 100_000
    remote = send + 50_000 + offset
    if step_at is not None:
        send, recv = (np.where(t >= step_at, t + jump, t) for t in (send, recv))
    return {"phase": np.full(n, phase, np.uint8), "peer": np.zeros(n, np.int32), "t_send_ns": send,
            "t_remote_ns": remote, "t_recv_ns": recv}


def test_a_step_during_a_ping_pong_is_not_damage():
    """A -0.5 s step of the leader's clock in the middle of a window start's ping-pongs made one round trip
    -498,759,089 ns: the shard was refused as damaged (measured before) and the window's phase averaged two clocks.
    Now the shard is accepted, the negative round trip dropped, and the phase keeps the samples on the window's side
    of the step."""
    from distprof.storage.validate import check_values

    t0 = 1_790_000_000 * 10**9
    s = _pingpong(0, t0, 16, offset=7_000, step_at=t0 + 8_050_000, jump=-500_000_000)  # mid-round-trip 8
    rtt = s["t_recv_ns"] - s["t_send_ns"]
    assert rtt.min() < -400_000_000  # the forged-looking round trip
    check_values("x.h5", {"world_size": 2, "process_groups": []}, {"clock/samples": s}, 1)  # not damage
    est = phase_offsets(s)
    assert bool(est["stepped"][0])
    assert est["offset_ns"][0] == pytest.approx(7_000 + 500_000_000, abs=1_000)  # the new clock's offset
    # window 0 before the step, window 1 after it: one step between them, both windows kept
    w0 = _pingpong(0, t0 - 2_000_000_000, 16, 7_000)
    w0_end = _pingpong(1, t0 - 1_000_000_000, 16, 7_000)
    w1_end = _pingpong(1, t0 + 100_000_000, 16, 500_007_000)  # on the stepped clock
    infos = {0: RankClockInfo(0, "h0", "reference", 0, 0), 1: RankClockInfo(1, "h1", "leader", 1, 0)}
    samples = {(1, 0): {k: np.concatenate([w0[k], w0_end[k]]) for k in w0},
               (1, 1): {k: np.concatenate([s[k], w1_end[k]]) for k in s}}
    model = estimate_clocks(infos, samples)
    assert len(model.steps) == 1 and not model.steps[0].inside and not model.left_out
    assert abs(model.steps[0].jump_ns - 500_000_000) < STEP_MIN_NS
    assert abs(model.hosts["h1"].drift_ppm) < 100
