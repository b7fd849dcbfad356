"""The training thread's wait for a CPU (capture/schedstat.py): sampled at step boundaries, stored per step
(``steps.cpu_run_ns`` / ``cpu_wait_ns``, schema 1.3), reported as ``cpu_contention`` and replayed away (NoCpuWait)."""

from __future__ import annotations

import os
import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest

from conftest import EXAMPLES, job_env, only_run_dir, torchrun
from distprof.analysis.findings.cpu import cpu_contention
from distprof.analysis.types import FindingRules
from distprof.analysis.rank.cpuwait import wait_at
from distprof.capture import schedstat
from distprof.storage import find_shards, read_shard

HAVE = os.path.exists(schedstat.PATH)


@pytest.mark.skipif(not HAVE, reason="no /proc/thread-self/schedstat")
def test_samples_follow_the_thread_that_opened_them():
    cpu = schedstat.ThreadCpu()
    a = cpu.sample()
    t0 = time.thread_time()
    while time.thread_time() - t0 < 0.03:  # 30 ms of this thread's own CPU time, however loaded the machine
        pass
    b = cpu.sample()
    assert a is not None and b is not None
    assert b[0] - a[0] >= 20_000_000 and b[1] >= a[1]
    t = time.perf_counter()
    # the fd stays bound to this thread: another thread's spinning does not count here
    c = cpu.sample()
    def spin():
        while time.perf_counter() - t < 0.15:
            pass

    th = threading.Thread(target=spin)
    th.start()
    th.join()
    d = cpu.sample()
    assert d[0] - c[0] < 40_000_000
    cpu.close()
    assert cpu.sample() is None


def test_missing_file_gives_unknown_samples(tmp_path):
    assert schedstat.ThreadCpu(str(tmp_path / "nope")).sample() is None


@pytest.mark.parametrize("marks, run, wait", [
    ({5: (10, 1), 6: (30, 4), 7: (35, 4)}, [20, 5, -1], [3, 0, -1]),  # step 7 has no end sample
    ({5: (10, 1), 6: None, 7: (35, 4)}, [-1, -1, -1], [-1, -1, -1]),  # a failed read: both steps unknown
    ({5: (10, 5), 6: (30, 4)}, [-1, -1, -1], [-1, -1, -1]),  # going backwards: unknown
    (None, [-1, -1, -1], [-1, -1, -1]),
])
def test_step_columns(marks, run, wait):
    r, w = schedstat.step_columns([5, 6, 7], marks)
    assert r.tolist() == run and w.tolist() == wait


@pytest.mark.parametrize("marks, faults", [
    ({5: (10, 1, 100), 6: (30, 4, 8300), 7: (35, 4, 8300)}, [8200, 0, -1]),
    ({5: (10, 1, -1), 6: (30, 4, 7), 7: (35, 4, 9)}, [-1, 2, -1]),  # no stat at step 5's start
    ({5: (10, 1), 6: (30, 4)}, [-1, -1, -1]),  # marks without faults
    ({5: (10, 1, 9), 6: None}, [-1, -1, -1]),
])
def test_step_faults(marks, faults):
    assert schedstat.step_faults([5, 6, 7], marks).tolist() == faults


@pytest.mark.parametrize("marks, ends, run, faults", [
    # each step's own end: torch's profiler step between two steps (stopping or starting the trace) is in neither
    ({5: (10, 1, 0), 6: (30, 4, 50), 7: (35, 4, 60)}, {5: (18, 2, 40), 6: (33, 4, 55), 7: (40, 5, 61)},
     [8, 3, 5], [40, 5, 1]),
    ({5: (10, 1, 0), 6: (30, 4, 50)}, {6: (33, 4, 55)}, [20, 3, -1], [50, 5, -1]),  # no end of its own: the next start
    ({5: (10, 1, 0)}, {5: None}, [-1, -1, -1], [-1, -1, -1]),  # a failed read at its end, and no next start
    ({5: (10, 1, 0), 6: (30, 4, 50)}, {5: (8, 1, 0)}, [-1, -1, -1], [0, -1, -1]),  # CPU time going backwards
])
def test_step_columns_with_end_marks(marks, ends, run, faults):
    r, _ = schedstat.step_columns([5, 6, 7], marks, ends=ends)
    assert r.tolist() == run
    assert schedstat.step_faults([5, 6, 7], marks, ends).tolist() == faults


@pytest.mark.skipif(not HAVE, reason="no /proc/thread-self/schedstat")
def test_page_faults_count_the_memory_the_thread_maps():
    cpu = schedstat.ThreadCpu(faults=True)
    a = cpu.sample()
    buf = bytearray(32 << 20)  # zero pages from the kernel: each page faults when first written
    for i in range(0, len(buf), 4096):
        buf[i] = 1
    b = cpu.sample()
    cpu.close()
    assert a is not None and b is not None and a[2] >= 0
    assert b[2] - a[2] >= 4000  # 8,192 pages written (fewer faults only with huge pages)
    assert schedstat.ThreadCpu().sample()[2] == -1  # not asked for: unknown


def test_wait_at_interpolates_within_the_samples_only():
    s = {"t_ns": np.array([1_000, 2_000, 3_000, 100_000_003_000]), "run_ns": np.zeros(4, np.int64),
         "wait_ns": np.array([10, 30, 30, 90])}
    got = wait_at(s, np.array([1_000, 1_500, 2_500, 3_000, 500, 50_000_000_000, 100_000_003_000, 100_000_004_000]))
    assert got[:4].tolist() == [10.0, 20.0, 30.0, 30.0]
    assert np.isnan(got[4])  # before the first sample
    assert np.isnan(got[5])  # inside a gap longer than MAX_GAP_NS (between windows)
    assert got[6] == 90.0 and np.isnan(got[7])
    assert np.isnan(wait_at(None, np.array([1]))).all() and wait_at(s, np.zeros(0, np.int64)).size == 0


@pytest.mark.skipif(not HAVE, reason="no /proc/thread-self/schedstat")
def test_the_sampler_reads_the_training_thread_only_while_resumed():
    sm = schedstat.WaitSampler(threading.get_native_id(), 0.001)
    assert sm.active
    time.sleep(0.05)
    assert sm.take()["t_ns"].size == 0  # not resumed: nothing gathered
    sm.resume()
    t0 = time.thread_time()
    while time.thread_time() - t0 < 0.05:  # this thread's own CPU time: the samples' run_ns grows with it
        pass
    a = sm.take()
    sm.pause()
    time.sleep(0.02)
    b = sm.take()
    sm.close()
    # in the order taken: the training thread's own last sample can be timed a few µs before the sampler's (two
    # threads, each timed at its read's midpoint); the writer sorts them (drop_flat)
    a = schedstat.drop_flat(a)
    assert a["t_ns"].size >= 2 and (np.diff(a["t_ns"]) >= 0).all()
    assert a["run_ns"][-1] - a["run_ns"][0] >= 30_000_000
    assert b["t_ns"].size <= 1  # at most the one in flight as it paused


def test_a_thread_without_statistics_gives_no_sampler():
    sm = schedstat.WaitSampler(-5, 0.001)  # no such thread
    assert not sm.active and sm.take()["t_ns"].size == 0
    sm.resume()
    sm.close()


def _steps(wait_ms, step_ms=20.0):
    n = len(wait_ms)
    return SimpleNamespace(steps={"rank": np.repeat([0, 1], n), "step": np.tile(np.arange(n), 2),
                                  "step_ms": np.full(2 * n, step_ms),
                                  "cpu_wait_ms": np.r_[np.asarray(wait_ms, float), np.full(n, 0.1)],
                                  "cpu_run_ms": np.full(2 * n, 10.0)},
                           hosts={0: "h", 1: "h"}, attrs={})


def test_the_rule_fires_from_its_thresholds():
    rules = FindingRules()
    hits = cpu_contention(_steps([3.0, 3.0, 2.0]), rules)  # 2.67 ms of 20: 13 %
    assert [h.rank for h in hits] == [0] and hits[0].metrics["cpu_wait_ms_per_step"] == pytest.approx(8 / 3)
    assert cpu_contention(_steps([1.5, 1.5, 1.5]), rules) == []  # 7.5 %: under 10 %
    assert cpu_contention(_steps([0.8, 0.8, 0.8], step_ms=4.0), rules) == []  # 20 % but under 1 ms
    assert cpu_contention(_steps([np.nan] * 3), rules) == []  # unknown (imports, older shards): silent


def _cpu(device="cpu", threads=1, affinity=2, cpus=2, host="h", real_host="vm"):
    return {"device_type": device, "intra_op_threads": threads, "cpu_affinity": affinity, "host_cpus": cpus,
            "host": host, "real_host": real_host}


OVERSUBSCRIBED_CASES = [
    # (attrs per rank, expected rank -> (the host's ranks, their threads, the CPUs))
    ([_cpu()] * 4, {r: (4, 4, 2) for r in range(4)}),  # 4 CPU ranks on 2 cores: the acceptance test's job
    ([_cpu()] * 2, {}),  # 2 on 2: within the cores
    ([_cpu(threads=2)] * 2, {0: (2, 4, 2), 1: (2, 4, 2)}),  # 2 ranks of 2 intra-op threads on 2 cores
    ([_cpu("cuda", threads=64, affinity=64, cpus=64)] * 8, {}),  # GPU ranks: their threads wait on the device
    ([_cpu(threads=2, affinity=2, cpus=8)] * 4, {}),  # each bound to 2 CPUs of 8 (numactl), 2 threads each
    ([_cpu(threads=3, affinity=2, cpus=8)] * 4, {r: (4, 12, 8) for r in range(4)}),  # ... 3 threads each
    ([_cpu(host=f"sim-host{r % 2}") for r in range(4)], {r: (4, 4, 2) for r in range(4)}),  # one OS host, simulated two
    ([_cpu(real_host="a"), _cpu(real_host="a"), _cpu(real_host="b"), _cpu(real_host="b")], {}),  # 2 per host
    ([_cpu(), _cpu(), {"device_type": "cpu", "host": "h"}, _cpu()], {}),  # one shard without them: unknown
]


@pytest.mark.parametrize("attrs, expected", OVERSUBSCRIBED_CASES)
def test_oversubscribed_hosts(attrs, expected):
    from distprof.analysis.findings.cpu import oversubscribed

    assert oversubscribed(SimpleNamespace(attrs=dict(enumerate(attrs)))) == expected


def test_cpu_ranks_on_an_oversubscribed_host_are_reported_whatever_their_wait():
    """4 CPU ranks on 2 cores waiting 6-10 % of their steps (a CI run: rank 2 named, no finding): reported, and the
    text says why."""
    run = SimpleNamespace(steps={"rank": np.repeat(np.arange(4), 3), "step": np.tile(np.arange(3), 4),
                                 "step_ms": np.full(12, 20.0), "cpu_wait_ms": np.full(12, 1.5),
                                 "cpu_run_ms": np.full(12, 8.0)},
                          hosts=dict.fromkeys(range(4), "vm"), attrs=dict.fromkeys(range(4), _cpu()))
    hits = cpu_contention(run, FindingRules())
    assert sorted(h.rank for h in hits) == [0, 1, 2, 3] and hits[0].impact_pct == pytest.approx(7.5)
    from distprof.analysis.findings.cpu import cpu_contention_text

    assert "4 rank(s) computing on the CPU with 4 intra-op thread(s) in all on 2 CPU(s)" in \
        cpu_contention_text({**hits[0].metrics, "impact_pct": 7.5}, "all 4 ranks", hits[0])[1]
    run.attrs = dict.fromkeys(range(4), _cpu(cpus=4, affinity=4))  # 4 cores: the wait rule alone, 7.5 % < 10 %
    assert cpu_contention(run, FindingRules()) == []


def _interval_wait(t: np.ndarray, w: np.ndarray, at: np.ndarray) -> np.ndarray:
    """The wait gathered in the sample interval holding each time of `at` (0 on a sample)."""
    i = np.clip(np.searchsorted(t, at, side="right"), 1, t.size - 1)
    return np.where(t[i - 1] == at, 0, w[i] - w[i - 1])


@pytest.mark.slow
def test_a_rank_beside_busy_processes_waits_for_a_cpu(tmp_path):
    """Each rank starts 3 CPU-bound processes (ddp_mlp --busy-procs): 8 runnable processes on this machine's cores
    — every recorded step has its samples, and the ranks wait for a CPU a large share of their steps (more load on
    the machine only makes that share larger)."""
    if not HAVE:
        pytest.skip("no /proc/thread-self/schedstat")
    busy = max(3, 2 * (os.cpu_count() or 2))
    torchrun(2, ["-m", "distprof.launch", "--out", "out", "--wait", "1", "--warmup", "1", "--active", "4",
                 str(EXAMPLES / "ddp_mlp.py"), "--hidden", "512", "--steps", "7", "--busy-procs", str(busy)],
             cwd=tmp_path, env=job_env())
    run = only_run_dir(tmp_path / "out")
    for p in find_shards(run):
        sh = read_shard(p)
        st = sh.table("steps")
        assert (st["cpu_run_ns"] > 0).all() and (st["cpu_wait_ns"] >= 0).all() and (st["cpu_wait_opt_ns"] >= 0).all()
        assert (st["page_faults"] >= 0).all()
        # the side thread's samples cover every step and are the training thread's: the wait they give a step is
        # within its wall time, and over the steps together it is the step marks' (each step's marks are taken inside
        # its span, torch's profiler step between two steps in neither; the first step is left out, as the window's
        # start under this load can take the thread hundreds of ms of waiting, and the rest differ only at their two
        # ends)
        cs = sh.table("cpu/samples")
        t, w = cs["t_ns"], cs["wait_ns"]
        # (a sampler starved by this load can take as few as one sample per step: 4 in a CI run, 0.62 s apart)
        assert t.size >= 2 and (np.diff(t) >= 0).all() and (np.diff(w) >= 0).all()
        assert t[0] <= st["start_ns"].min() and t[-1] >= st["end_ns"].max()
        est = wait_at(cs, st["end_ns"]) - wait_at(cs, st["start_ns"])
        wall = st["end_ns"] - st["start_ns"]
        # interpolation spreads the wait of the sample interval around each end evenly: a starved sampler's
        # interval can be long, and the estimate is off by at most the wait gathered in those two intervals
        slack = sum(_interval_wait(t, w, st[c]) for c in ("start_ns", "end_ns"))
        assert np.isfinite(est).all() and (est >= 0).all() and (est <= wall + slack + 1e6).all(), (est, wall, slack)
        o = np.argsort(st["start_ns"])[1:]
        total, marks = float(est[o].sum()), float(st["cpu_wait_ns"][o].sum())
        # the steps are back to back, so inside the range the interpolation errors cancel; at its two outer ends they
        # do not: the window's last step ends just before the trace stops, and under this load that stop waits for a
        # CPU for tens of ms inside the same sample interval (spread evenly, part of it lands before the step's end)
        ends = float(_interval_wait(t, w, st["start_ns"][o[:1]])[0] + _interval_wait(t, w, st["end_ns"][o[-1:]])[0])
        assert abs(total - marks) <= 0.2 * marks + ends + 40e6, (est, st["cpu_wait_ns"], ends)
    import distprof
    from distprof.analysis.graph import whatif
    from distprof.analysis.report.build import build_report

    rs = distprof.load(run, progress=False)
    rep = build_report(rs)
    f = [x for x in rep.findings if x.id == "cpu_contention"]
    assert f and f[0].metrics["impact_pct"] >= 10, [(x.id, x.title) for x in rep.findings]
    assert f[0].estimated_gain_ms_per_step > 0
    w = whatif.estimate(rs, whatif.NoCpuWait())
    assert 0 < w.gain_ms_per_step < w.measured_step_ms


def test_flat_samples_are_dropped_without_changing_any_interpolated_wait():
    t = np.arange(0, 12_000, 1_000, dtype=np.int64)
    w = np.array([0, 0, 0, 0, 5, 9, 9, 9, 9, 9, 12, 12], dtype=np.int64)
    s = {"t_ns": t, "run_ns": t // 2, "wait_ns": w}
    kept = schedstat.drop_flat(s)
    assert kept["t_ns"].tolist() == [0, 3_000, 4_000, 5_000, 9_000, 10_000, 11_000]
    q = np.arange(0, 11_001, 250)
    assert np.array_equal(wait_at(kept, q), wait_at(s, q))


def test_samples_timed_out_of_their_read_order_keep_the_counters_monotone():
    """Two threads sample; the later read can carry the earlier midpoint (a CI run: 1.5 µs apart, the wait 27 µs
    lower in the later-timed sample). The writer's samples never go back in run or wait, and the interpolated wait
    of a step never comes out negative."""
    s = {"t_ns": np.array([0, 1_000, 2_000, 2_001, 3_000], np.int64),
         "run_ns": np.array([0, 500, 900, 880, 1_400], np.int64),
         "wait_ns": np.array([0, 10, 60, 33, 70], np.int64)}
    kept = schedstat.drop_flat(s)
    assert (np.diff(kept["wait_ns"]) >= 0).all() and (np.diff(kept["run_ns"]) >= 0).all()
    assert kept["wait_ns"].tolist() == [0, 10, 60, 60, 70] and kept["run_ns"].tolist() == [0, 500, 900, 900, 1_400]
    q = np.arange(0, 3_001, 100)
    assert (np.diff(wait_at(kept, q)) >= 0).all()
