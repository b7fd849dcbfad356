"""--watch: the drift rule (tables), the series files (atomic flushes, a killed job, damaged files, version 1 rows), the
options, a real 2-rank job in which one rank starts sleeping (a window triggered within 20 steps, shards and report
naming it), the same in every job style — DDP with one bucket and many, FSDP2, a 2-D mesh, a pipeline by hand and
under pipelining's GPipe — and balanced runs of each drifting nobody, and the synchronisation points one process can
show: the end of backward where DDP waits, the functional collectives' wait, NCCL's completion hook (a stand-in group;
the real one in tests/gpu/check_gpu.py)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from conftest import ROOT, job_env, only_run_dir, python, torchrun
from test_html_report import browser  # noqa: F401  (the fixture: a headless Chromium)
from distprof.drift import DriftRule, DriftTracker, flag_drift, own_ms, peer_median
from distprof.analysis.report.watch import watch_report
from distprof.config import ProfileConfig, WatchConfig, config_from_mapping
from distprof.errors import ConfigError
from distprof.storage import read_shard, find_shards
from distprof.storage import watchfile as wf

JOB = ROOT / "tests" / "watch_job.py"
NAN = float("nan")


# ---- the rule ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("column, expected", [
    ([10.0, 30.0], [30.0, 10.0]),  # two ranks: each one's peer is the other
    ([10.0, 20.0, 60.0], [40.0, 35.0, 15.0]),
    ([10.0, 10.0, 10.0, 50.0], [10.0, 10.0, 10.0, 10.0]),  # the outlier does not move its own baseline
    ([10.0, NAN, 30.0], [30.0, NAN, 10.0]),  # a rank without a value has no median and does not count
    ([10.0, NAN, NAN], [NAN, NAN, NAN]),  # nobody to compare with
])
def test_peer_median_leaves_the_rank_out(column, expected):
    got = peer_median(np.array(column)[:, None])[:, 0]
    np.testing.assert_allclose(got, expected, equal_nan=True)


def test_peer_median_matches_a_direct_computation():
    rng = np.random.default_rng(0)
    own = rng.gamma(4, 5, size=(9, 40))
    own[rng.random(own.shape) < 0.1] = np.nan
    got = peer_median(own)
    for i in range(own.shape[0]):
        for j in range(own.shape[1]):
            rest = np.delete(own[:, j], i)
            rest = rest[~np.isnan(rest)]
            want = np.median(rest) if rest.size and not np.isnan(own[i, j]) else np.nan
            np.testing.assert_allclose(got[i, j], want, equal_nan=True)


@pytest.mark.parametrize("own, peers, threshold, min_ms, flagged", [
    (13.0, 10.0, 0.2, 1.0, True),  # +30 % and +3 ms
    (11.9, 10.0, 0.2, 1.0, False),  # +19 %: under the threshold
    (1.3, 1.0, 0.2, 1.0, False),  # +30 % but only 0.3 ms: under the floor
    (10.0, 13.0, 0.2, 1.0, False),  # faster than the others is no drift
    (NAN, 10.0, 0.2, 1.0, False),  # no value, no drift
])
def test_flag_drift_threshold_and_floor(own, peers, threshold, min_ms, flagged):
    f, excess, med = flag_drift(np.array([[own], [peers], [peers]]), DriftRule(threshold, 3, min_ms))
    assert bool(f[0, 0]) is flagged and not f[1:, 0].any()
    if not np.isnan(own):
        assert excess[0, 0] == pytest.approx(own - peers) and med[0, 0] == peers


def _series(n_steps: int, slow: dict[int, tuple[int, int, float]], n_ranks: int = 4, base: float = 20.0,
            noise: float = 0.0, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    own = base + noise * rng.standard_normal((n_ranks, n_steps))
    for r, (a, b, extra) in slow.items():
        own[r, a:b] += extra
    return own


@pytest.mark.parametrize("slow, spans", [
    ({}, []),
    ({2: (30, 80, 15.0)}, [(2, 30, 79, False)]),  # starts at its first step, ends at its last
    ({2: (30, 34, 15.0)}, []),  # 4 steps: shorter than the rule's 5
    ({1: (10, 200, 15.0)}, [(1, 10, 199, True)]),  # to the end of the series: still open
    ({1: (10, 20, 15.0), 3: (50, 70, 9.0)}, [(1, 10, 19, False), (3, 50, 69, False)]),
])
def test_tracker_starts_and_ends(slow, spans):
    rule = DriftRule(threshold=0.2, steps=5, min_ms=1.0)
    own = _series(200, slow)
    tr = DriftTracker(rule)
    tr.feed(np.arange(200), np.arange(own.shape[0]), own)
    assert [(s.rank, s.first_step, s.last_step, s.open) for s in tr.spans] == spans


def test_tracker_gaps_shorter_than_the_rule_do_not_end_a_drift_and_chunks_do_not_matter():
    rule = DriftRule(threshold=0.2, steps=5, min_ms=1.0)
    own = _series(300, {2: (40, 160, 15.0)}, noise=0.5, seed=3)
    own[2, 90:93] = 20.0  # three ordinary steps inside the drift
    whole = DriftTracker(rule)
    whole.feed(np.arange(300), np.arange(4), own)
    chunked = DriftTracker(rule)
    confirmed = []
    for a in range(0, 300, 7):
        confirmed += chunked.feed(np.arange(a, min(a + 7, 300)), np.arange(4), own[:, a:a + 7])
    assert [(s.rank, s.first_step, s.last_step) for s in whole.spans] == [(2, 40, 159)]
    assert [s.to_dict() for s in chunked.spans] == [s.to_dict() for s in whole.spans]
    assert [s.confirmed_step for s in confirmed] == [44]  # known once the rule held for 5 steps


def test_noise_alone_is_no_drift():
    rule = DriftRule(threshold=0.2, steps=5, min_ms=1.0)
    own = _series(5000, {}, n_ranks=16, noise=2.0, seed=1)  # 10 % noise per step
    tr = DriftTracker(rule)
    tr.feed(np.arange(5000), np.arange(16), own)
    assert tr.spans == []


def test_own_work_is_step_time_minus_time_blocked():
    rows = np.zeros(3, wf.SERIES_DTYPE)
    rows["step_ms"] = [50.0, 50.0, 5.0]
    rows["comm_ms"] = [30.0, 0.0, 6.0]  # the last: rounding, never negative
    np.testing.assert_allclose(own_ms(rows), [20.0, 50.0, 0.0])


# ---- options -------------------------------------------------------------------------------------------------------
def test_watch_options_from_env_and_flags():
    cfg = config_from_mapping({}, {"DISTPROF_WATCH": "1", "DISTPROF_WATCH_THRESHOLD": "0.5",
                                   "DISTPROF_WATCH_STEPS": "7", "DISTPROF_WATCH_INTERVAL_S": "0.5",
                                   "DISTPROF_WATCH_COOLDOWN_S": "60"})
    assert cfg.watch == WatchConfig(enabled=True, threshold=0.5, steps=7, interval_s=0.5, cooldown_s=60.0)
    assert ProfileConfig().watch.enabled is False
    from distprof.launch import config_from_args, get_args_parser

    args = get_args_parser().parse_args(["--watch", "--watch-threshold", "0.3", "--watch-steps", "4",
                                         "--watch-interval", "1", "--watch-cooldown", "10", "x.py"])
    cfg = config_from_args(args)
    assert cfg.watch == WatchConfig(enabled=True, threshold=0.3, steps=4, interval_s=1.0, cooldown_s=10.0)
    for bad, match in (({"threshold": 0.0}, "watch_threshold"), ({"steps": 0}, "watch_steps"),
                       ({"interval_s": 0.0}, "watch_interval_s")):
        with pytest.raises(ConfigError, match=match):
            ProfileConfig(watch=WatchConfig(**bad))


# ---- the series files ----------------------------------------------------------------------------------------------
def _rows(steps) -> np.ndarray:
    rows = np.zeros(len(steps), wf.SERIES_DTYPE)
    rows["step"] = steps
    rows["step_ms"] = 10.0
    return rows


def test_segment_round_trip_and_damaged_files_are_named(tmp_path):
    (tmp_path / wf.WATCH_DIR).mkdir()
    p = wf.segment_path(tmp_path, 1, 0)
    wf.write_segment(p, _rows(range(100)))
    assert list(wf.read_rank_series(tmp_path, 1)["step"]) == list(range(100))
    assert not list((tmp_path / wf.WATCH_DIR).glob("*.tmp"))
    data = p.read_bytes()
    for body, match in ((data[:-7], "bytes of rows"), (b"not numpy at all", "not a watch segment"),
                        (b"\0" * (wf.MAX_SEGMENT_BYTES + 1), "more than a watch segment")):
        p.write_bytes(body)
        with pytest.raises(wf.WatchFileError, match=match) as e:
            wf.read_segment(p)
        assert str(p) in str(e.value) and "\n" not in str(e.value)
    other = np.zeros(3, [("step", "<i8")])
    with open(p, "wb") as fh:
        np.save(fh, other)
    with pytest.raises(wf.WatchFileError, match="dtype"):
        wf.read_segment(p)
    # the report skips a damaged segment and names it; the other rank is still there
    wf.write_segment(wf.segment_path(tmp_path, 0, 0), _rows(range(100)))
    section = watch_report(tmp_path)
    assert section.n_ranks == 2 and any(str(p) in s for s in section.skipped)


KILL_SCRIPT = """
import time, torch
model = torch.nn.Linear(4, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
while True:
    opt.zero_grad()
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    time.sleep(0.005)
"""


@pytest.mark.slow
def test_a_killed_job_leaves_a_readable_series(tmp_path):
    script = tmp_path / "forever.py"
    script.write_text(KILL_SCRIPT)
    out = tmp_path / "out"
    env = job_env(DISTPROF_WATCH_INTERVAL_S="0.1")
    proc = subprocess.Popen([sys.executable, "-m", "distprof.launch", "--out", str(out), "--run-id", "k",
                             "--watch", "--schedule", "none", str(script)], cwd=tmp_path, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        seg = wf.segment_path(out / "k", 0, 0)
        deadline = time.monotonic() + 60
        flushed = 0
        while time.monotonic() < deadline:
            try:
                flushed = wf.read_segment(seg).size
            except (wf.WatchFileError, FileNotFoundError):
                flushed = 0
            if flushed >= 40:  # several flushes in: the job is busy rewriting its segment
                break
            time.sleep(0.05)
        assert flushed >= 40, proc.stderr.read().decode()[-2000:] if proc.poll() is not None else "no flush"
        time.sleep(0.37)  # kill it anywhere in a flush cycle
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    rows = wf.read_rank_series(out / "k", 0)  # whatever moment it died in, the file is whole
    assert rows.size >= flushed
    assert list(rows["step"]) == list(range(rows.size))
    assert np.all(rows["step_ms"] > 0) and np.all(rows["end_ns"] > 0)


# ---- a real job ----------------------------------------------------------------------------------------------------
SLOW_FROM, SLOW_UNTIL = 60, 130  # slow long enough for the window to fall in it
AGAIN = "160:200"  # and again to the end: a second drift, within the cool-down


@pytest.fixture(scope="module")
def sleeper_run(tmp_path_factory):
    """The job of the done-when test, run once for the tests below: (its folder, its run directory)."""
    tmp_path = tmp_path_factory.mktemp("sleeper")
    out = tmp_path / "out"
    # side threads every 0.1 s: rank 0 hears of the drift within ~0.2 s, ~3 steps (20 steps is 1.4 s here)
    env = job_env(DISTPROF_WATCH_INTERVAL_S="0.1", DISTPROF_TRIGGER_POLL_S="0.2", DISTPROF_TRIGGER_MARGIN="5")
    torchrun(2, ["-m", "distprof.launch", "--out", str(out), "--watch", "--schedule", "none", "--watch-steps", "5",
                 "--watch-threshold", "0.5", str(JOB), "--steps", "200", "--sleep-ms", "40", "--slow-rank", "1",
                 "--slow-from", str(SLOW_FROM), "--slow-until", str(SLOW_UNTIL), "--slow-again", AGAIN,
                 "--slow-ms", "30"], cwd=tmp_path, env=env)
    run_dir = only_run_dir(out)
    python(["-m", "distprof", "report", str(run_dir), "--json", str(tmp_path / "r.json"), "--html",
            str(tmp_path / "r.html"), "--no-progress"], cwd=tmp_path)
    return tmp_path, run_dir


@pytest.mark.slow
def test_a_rank_that_starts_sleeping_triggers_a_window_that_names_it(sleeper_run):
    tmp_path, run_dir = sleeper_run
    drifts = wf.read_drifts(run_dir)
    assert [d["rank"] for d in drifts] == [1, 1], drifts
    d = drifts[0]
    assert SLOW_FROM - 2 <= d["first_step"] <= SLOW_FROM + 3
    assert drifts[1]["state"] == "cooldown" and drifts[1]["request_id"] is None  # one window per --watch-cooldown
    # triggered (rank 0 placed the window) within 20 steps of the drift's start; the window then recorded
    assert d["state"] == "done" and d["decided_at_step"] - SLOW_FROM <= 20, d
    shards = find_shards(run_dir)
    assert len(shards) == 2
    for p in shards:
        attrs = read_shard(p).attrs
        assert attrs["window"] == d["window"] and attrs["trigger"]["request_id"] == d["request_id"]
        assert attrs["trigger"]["reason"].startswith("watch: rank 1 ")
    proc = python(["-m", "distprof", "report", str(run_dir), "--no-progress"], cwd=tmp_path)
    report = json.loads((tmp_path / "r.json").read_text())
    named = [s["rank"] for s in report["stragglers"] if s["named"]]
    assert named == [1]  # the triggered window's trace names the sleeping rank
    w = report["watch"]
    spans = sorted((x["rank"], x["first_step"], x["last_step"], x["open"]) for x in w["drifts"])
    assert [x[0] for x in spans] == [1, 1] and not spans[0][3] and spans[1][3]  # ended; lasted to the end
    a0, b0 = (int(v) for v in AGAIN.split(":"))
    assert SLOW_FROM - 2 <= spans[0][1] <= SLOW_FROM + 3 and SLOW_UNTIL - 4 <= spans[0][2] <= SLOW_UNTIL + 3
    assert a0 - 2 <= spans[1][1] <= a0 + 3
    assert w["triggers"][0]["window"] == d["window"] and w["triggers"][0]["drift"]["rank"] == 1
    assert "drift: rank 1 from step" in proc.stdout and f"-> window {d['window']}" in proc.stdout
    # the heatmap shows when: rank 1's row steps up at the drift (both ranks' steps are long after it: rank 0
    # waits for rank 1), and rank 1's own-work line jumps while the others' median does not
    hm = w["heatmap"]
    assert hm["bin_steps"] == 1 and hm["rows"] == ["rank 0", "rank 1"]
    bins = np.array(hm["bin_first_steps"])
    before, after = (bins >= 5) & (bins < SLOW_FROM - 3), (bins > SLOW_FROM + 3) & (bins < SLOW_UNTIL - 3)
    row1 = np.array(hm["step_ms"][1], dtype=float)
    assert np.nanmedian(row1[after]) - np.nanmedian(row1[before]) > 15
    own0, own1 = (np.array(hm["own_ms"][i], dtype=float) for i in (0, 1))
    assert np.nanmedian(own1[after]) - np.nanmedian(own0[after]) > 15  # in own work only the sleeper's row is hot
    line = np.array(w["lines"]["ranks"][0]["own_ms"], dtype=float)
    assert w["lines"]["ranks"][0]["rank"] == 1
    assert np.nanmedian(line[after]) - np.nanmedian(line[before]) > 15
    per = {p["rank"]: p for p in w["per_rank"]}
    assert per[0]["comm_ms_median"] > per[1]["comm_ms_median"] + 10  # rank 0 is the one blocked
    assert "fig-watch-heatmap" in (tmp_path / "r.html").read_text()


# ---- what one rank times ---------------------------------------------------------------------------------------------
class _SlowData(torch.utils.data.Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        time.sleep(0.02)
        return i


def test_recorder_times_data_wait_optimizer_and_blocking_waits_on_the_training_thread_only(tmp_path):
    import threading

    import torch
    import torch.distributed as dist

    from distprof.capture.watch import WatchRecorder

    rec = WatchRecorder(threading.get_ident())
    rec.install()
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        p = torch.nn.Parameter(torch.zeros(1000))
        p.grad = torch.ones(1000)
        opt = torch.optim.SGD([p], lr=0.1)
        loader = iter(torch.utils.data.DataLoader(_SlowData(), batch_size=None))
        rec.step_end(0, False)  # a first boundary: the next row is one step
        next(loader)
        opt.step()
        dist.barrier()
        side = threading.Thread(target=lambda: [next(loader), dist.barrier()])  # not the training thread's
        side.start()
        side.join()
        rec.step_end(1, False)
        rows, taken, lost = rec.take(0)
    finally:
        dist.destroy_process_group()
        rec.remove()
    assert (taken, lost) == (2, 0) and list(rows["step"]) == [0, 1]
    r = rows[1]
    assert 20.0 <= r["data_ms"] < 40.0 <= r["step_ms"]  # one batch on this thread (20 ms), not the other's
    assert 0 < r["opt_ms"] < r["step_ms"] and 0 < r["comm_ms"] < r["step_ms"] and r["mem_peak"] == -1
    from torch._C._distributed_c10d import Work
    from torch.utils.data.dataloader import _BaseDataLoaderIter

    assert not hasattr(Work.wait, "__distprof_watch__") and not hasattr(_BaseDataLoaderIter.__next__,
                                                                         "__distprof_watch__")


def test_a_single_process_watch_flushes_every_step_at_close(tmp_path):
    import distprof

    with distprof.profile(out=str(tmp_path), run_id="one", schedule="none", watch=True, watch_interval_s=0.05) as p:
        for _ in range(30):
            time.sleep(0.002)
            p.step()
    rows = wf.read_rank_series(tmp_path / "one", 0)
    assert list(rows["step"]) == list(range(30)) and np.all(rows["step_ms"] >= 2.0)
    assert wf.read_drifts(tmp_path / "one") == []  # one rank: nobody to compare with
    # no window was recorded: the report is the series alone
    proc = python(["-m", "distprof", "report", str(tmp_path / "one"), "--json", str(tmp_path / "r.json")],
                  cwd=tmp_path)
    assert "Whole run (--watch): 1 rank(s), steps 0-29" in proc.stdout
    rep = json.loads((tmp_path / "r.json").read_text())
    assert rep["watch"]["per_rank"][0]["steps"] == 30 and "only the --watch series" in rep["warnings"][0]


def test_the_loops_last_step_is_in_the_series_and_ends_where_its_iteration_did(tmp_path):
    """Steps advanced by the optimizer (the launcher's way): the last iteration has no boundary after it, and the close
    ends it. Its row is in the series (it was lost), ending at its optimizer step: the 0.3 s the script spends after
    the loop (an evaluation, a checkpoint) is no step's."""
    import torch

    import distprof

    model = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with distprof.profile(out=str(tmp_path), run_id="opt", schedule="none", watch=True, watch_interval_s=0.05,
                          step_on="optimizer"):
        for _ in range(6):
            time.sleep(0.01)
            model(torch.ones(2, 8)).sum().backward()
            opt.step()
            opt.zero_grad()
        time.sleep(0.3)  # after the loop
    rows = wf.read_rank_series(tmp_path / "opt", 0)
    assert list(rows["step"]) == list(range(6))
    # a step runs from its first forward to the next one (each sleep is its previous step's); the last ends at its
    # optimizer step, 0.3 s before the close
    assert np.all(rows["step_ms"][:-1] >= 10.0) and rows["step_ms"][-1] < 200.0, rows["step_ms"]
    assert np.all(rows["opt_ms"] > 0) and np.all(rows["opt_ms"] < rows["step_ms"])


def test_a_boundary_after_the_iteration_end_replaces_its_row():
    """The recorder's row kept at an iteration's end is written only by the close, never beside its boundary's."""
    import threading

    from distprof.capture.watch import WatchRecorder

    rec = WatchRecorder(threading.get_ident())
    try:
        rec.iteration_end(0)
        rec.step_end(0, False)
        rec.end_iteration()  # the boundary came: nothing kept
        rec.iteration_end(1)
        time.sleep(0.02)  # after the loop: not in step 1
        rec.end_iteration()
        rec.end_iteration()  # once
        rows, taken, lost = rec.take(0)
    finally:
        rec.remove()  # a boundary wraps the functional collectives' wait once their module is imported
    assert (taken, lost) == (2, 0) and list(rows["step"]) == [0, 1] and rows["step_ms"][1] < 20.0


@pytest.mark.slow
def test_a_watch_that_cannot_write_warns_once_and_training_goes_on(tmp_path):
    run_dir = tmp_path / "out" / "w"
    run_dir.mkdir(parents=True)
    (run_dir / wf.WATCH_DIR).write_text("a file where the watch folder goes")
    script = tmp_path / "loop.py"
    script.write_text(KILL_SCRIPT.replace("while True:", "for _ in range(20):"))
    proc = python(["-m", "distprof.launch", "--out", str(tmp_path / "out"), "--run-id", "w", "--watch",
                   "--watch-interval", "0.05", "--wait", "2", "--warmup", "1", "--active", "3", str(script)],
                  cwd=tmp_path, env=job_env())
    assert proc.stderr.count("watch failed") == 1, proc.stderr[-3000:]
    assert "training goes on" in proc.stderr
    assert len(find_shards(run_dir)) == 1  # the scheduled window is still written


@pytest.mark.slow
def test_browser_draws_the_watch_charts(sleeper_run, browser):  # noqa: F811  (the fixture)
    from test_html_report import assert_charts_drawn, open_report

    info = open_report(browser, sleeper_run[0] / "r.html", "watch-report.png")
    assert_charts_drawn(info, {"fig-watch-heatmap", "fig-watch-own", "fig-watch-lines"})
    assert "Drifts and the windows they triggered" in info["text"] and "window 0 (steps" in info["text"]


def test_store_reads_of_rank_0_are_bounded_whatever_the_job_size():
    from distprof.capture.watch import MAX_PUBLISH, STORE_READS_PER_S, read_interval_s

    assert read_interval_s(2.0, 2) == 2.0
    assert read_interval_s(2.0, 1001) == pytest.approx(1000 / STORE_READS_PER_S)  # 1,000 others: each every 10 s
    assert 1000 / read_interval_s(2.0, 1001) <= STORE_READS_PER_S
    assert MAX_PUBLISH * 4 + 12 <= 4096  # one rank's key: a few kB at most


# ---- every job style: the waits the watch sees (capture/syncpoints.py) ----------------------------------------------
STYLE_FROM, STYLE_STEPS = 30, 110
#: style -> (ranks, tests/watch_job.py arguments, the slow rank's extra ms): every rank sleeps (device-like time that
#: leaves the loaded machine's CPU to the others). The extra is about the peers' own work per step (measured idle:
#: ddp 42 ms, fsdp2 53, pipelines 44, mesh2d 151), twice the rule's --watch-threshold 0.5: a slowed step stays flagged
#: unless noise moves it by half a step's own work. (mesh2d's 100 ms, 0.6 of its own work under CI's load, let one
#: noisy step in a few break every run of 8 flagged steps until step 82.)
STYLES = {
    "ddp-one-bucket": (2, ["--style", "ddp", "--sleep-ms", "40", "--where", "before-backward"], 40.0),
    "ddp-many-buckets": (2, ["--style", "ddp", "--bucket-mb", "0.001", "--sleep-ms", "40",
                             "--where", "before-forward"], 40.0),
    "fsdp2": (2, ["--style", "fsdp2", "--sleep-ms", "40"], 60.0),  # more CPU per step than the others: more sleep
    "mesh2d": (4, ["--style", "mesh2d", "--sleep-ms", "120"], 150.0),  # 4 busy ranks on the 2 cores: longer sleeps
    "pipeline": (2, ["--style", "pipeline", "--sleep-ms", "40"], 50.0),
    "gpipe": (2, ["--style", "gpipe", "--sleep-ms", "40"], 50.0),
}


def _style_run(tmp_path, style: str, slow_rank: int, steps: int):
    """One --watch --schedule none run of `style` (slow_rank -1: balanced) -> (run dir, series by rank)."""
    nproc, args, extra = STYLES[style]
    out = tmp_path / "out"
    env = job_env(DISTPROF_WATCH_INTERVAL_S="0.1", DISTPROF_TRIGGER_POLL_S="0.2", DISTPROF_TRIGGER_MARGIN="3")
    torchrun(nproc, ["-m", "distprof.launch", "--out", str(out), "--watch", "--schedule", "none", "--watch-steps", "8",
                     "--watch-threshold", "0.5", "--warmup", "1", "--active", "2", str(JOB), *args,
                     "--steps", str(steps), "--slow-rank", str(slow_rank), "--slow-from", str(STYLE_FROM),
                     "--slow-ms", str(extra)], cwd=tmp_path, env=env)
    run_dir = only_run_dir(out)
    return run_dir, {r: wf.read_rank_series(run_dir, r) for r in range(nproc)}


def _own_median(rows: np.ndarray, lo: int, hi: int) -> float:
    keep = (rows["step"] >= lo) & (rows["step"] < hi)
    return float(np.median(own_ms(rows[keep])))


@pytest.mark.slow
@pytest.mark.parametrize("style", sorted(STYLES))
def test_a_rank_that_starts_sleeping_drifts_in_every_job_style(tmp_path, style):
    """Half-way through, rank 1 sleeps more every step: its own work rises above its peers' (their waits at the
    synchronisation points are seen: DDP's reducer at the end of backward, FSDP2's and pipelining's waits, tensor
    parallelism's wait_tensor), it alone drifts from that step, and the window it asks for is recorded."""
    nproc, _, extra = STYLES[style]
    run_dir, series = _style_run(tmp_path, style, 1, STYLE_STEPS)
    after = {r: _own_median(rows, STYLE_FROM + 3, STYLE_STEPS) for r, rows in series.items()}
    before = {r: _own_median(rows, 3, STYLE_FROM) for r, rows in series.items()}
    peers = float(np.median([v for r, v in after.items() if r != 1]))
    seen = f"own work before {before}, after {after}"
    assert after[1] - peers > 0.6 * extra, seen  # the sleeper's own work carries its sleep ...
    for r in range(nproc):
        if r != 1:
            assert after[r] - before[r] < 0.4 * extra, seen  # ... its peers' does not: they wait for it
    drifts = wf.read_drifts(run_dir)
    assert drifts and {d["rank"] for d in drifts} == {1}, (drifts, seen)
    d = drifts[0]
    # from the step it began (a loaded machine's noise can break the first runs of 8 steps), and not before
    assert STYLE_FROM - 2 <= d["first_step"] <= STYLE_FROM + 25, (d, seen)
    assert d["state"] == "done", d  # the window was recorded ...
    from distprof.capture import trigger_files as tf

    a = tf.read_answer(run_dir / tf.ANSWER_NAME)
    assert (a.request_id, a.state) == (d["request_id"], "done"), (a, d)  # ... as the trigger answered
    shards = find_shards(run_dir)
    assert len(shards) == nproc and all(read_shard(p).attrs["window"] == d["window"] for p in shards)


@pytest.mark.slow
def test_a_drift_the_job_ends_before_recording_says_so(tmp_path):
    """The drift starts 14 steps before the job's end: its window (placed a lead of steps ahead) is not recorded.
    watch/drifts.json gives the trigger's final answer to its request — written after the trigger's close, where a
    window recorded or cut at the job's end is answered — never a state the job left behind ("asked", "scheduled")."""
    from distprof.capture import trigger_files as tf

    run_dir, _ = _style_run(tmp_path, "ddp-one-bucket", 1, STYLE_FROM + 14)
    drifts = wf.read_drifts(run_dir)
    assert [d["rank"] for d in drifts] == [1], drifts
    d = drifts[0]
    # cut, unless a loaded machine's slow steps placed the window so near that it was recorded: final either way
    assert d["state"] in ("cut", "done", "incomplete"), d
    assert d["state"] != "cut" or "job ended" in d["message"], d
    answer = run_dir / tf.ANSWER_NAME
    if answer.exists():  # the request was placed: its answer and the drift's state are the same
        a = tf.read_answer(answer)
        assert a.request_id == d["request_id"] and a.state == d["state"], (a, d)


@pytest.mark.slow
@pytest.mark.parametrize("style", sorted(STYLES))
def test_a_balanced_job_drifts_nobody_in_every_job_style(tmp_path, style):
    run_dir, series = _style_run(tmp_path, style, -1, 50)
    assert wf.read_drifts(run_dir) == [], {r: _own_median(rows, 3, 50) for r, rows in series.items()}
    assert find_shards(run_dir) == []


# ---- the synchronisation points, one process -----------------------------------------------------------------------
def test_the_wait_at_the_end_of_backward_is_timed_net_of_python_waits():
    """What DDP's reducer does, without DDP: a callback queued once the last gradient is ready waits (30 ms) in the
    autograd engine's final callbacks; the watch's hooks time it — less the 10 ms of it that a Python wait
    (counted apart, as Work.wait is) already holds — and not the backward's own work before it."""
    import threading

    from torch.autograd import Variable

    from distprof.capture.watch import WatchRecorder

    rec = WatchRecorder(threading.get_ident())
    rec.install()
    try:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        first_weight = model[0].weight  # its gradient is the last one ready: where DDP queues its own callback

        def reducer_wait():
            time.sleep(0.03)
            rec.comm_ns += 10_000_000  # a Python wait inside it, counted apart

        def compute_then_reduce(_p):
            time.sleep(0.02)  # work of the backward pass itself, before the synchronisation: not a wait
            Variable._execution_engine.queue_callback(reducer_wait)

        model(torch.randn(4, 8)).sum().backward()
        opt.step()  # the optimizer's parameters get the watch's hooks here
        rec.step_end(0, False)
        handle = first_weight.register_post_accumulate_grad_hook(compute_then_reduce)
        try:
            opt.zero_grad()
            model(torch.randn(4, 8)).sum().backward()
            opt.step()
        finally:
            handle.remove()
        rec.step_end(1, False)
        model(torch.randn(4, 8)).sum().backward()  # no wait at its end: nothing added
        rec.step_end(2, False)
        rows, _, _ = rec.take(0)
    finally:
        rec.remove()
    assert rec.tail.backwards == 2
    comm = rows["comm_ms"]
    assert 30.0 <= comm[1] < 30.0 + 15.0, comm  # 20 ms of its own + 10 counted apart; the 20 ms before: own work
    assert comm[2] < 5.0 and comm[1] < rows["step_ms"][1] - 15.0, rows
    assert not first_weight._post_accumulate_grad_hooks  # hooks gone with the recorder


def test_functional_collective_waits_count_and_gloo_groups_get_no_device_timing(tmp_path):
    """tensor parallelism / DTensor wait in the functional collectives' wait_tensor (never Work.wait from Python):
    wrapped once the module is imported, counted on the training thread; a gloo group is not hooked for device
    times (NCCL only), and the series says "not measured"."""
    import threading

    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol

    from distprof.capture.watch import WatchRecorder

    rec = WatchRecorder(threading.get_ident())
    rec.install()
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        wrapped = hasattr(funcol.wait_tensor, "__distprof_watch__")
        rec.step_end(0, False)  # the module was imported before: wrapped at install
        out = funcol.all_reduce(torch.ones(4), "sum", dist.group.WORLD)  # an AsyncCollectiveTensor ...
        assert float(out.sum()) == 4.0  # ... that waits at its first use
        rec.step_end(1, False)
        rec.step_end(2, False)  # a step without any wait
        rows, _, _ = rec.take(0)
        assert not rec.device.active
    finally:
        dist.destroy_process_group()
        rec.remove()
    assert wrapped and not hasattr(funcol.wait_tensor, "__distprof_watch__")
    assert rows["comm_ms"][1] > 0.0 and rows["comm_ms"][2] == 0.0 and np.isnan(rows["dev_comm_ms"]).all()


def test_device_time_goes_to_the_step_that_issued_the_collective():
    from distprof.capture.syncpoints import device_ms_per_row

    ends = np.array([100, 200, 300], dtype=np.int64)  # steps (0, 100], (100, 200], (200, 300]
    issued = np.array([50, 60, 100, 150, 301, 320, -5], dtype=np.int64)
    active = np.array([1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0])
    per, later = device_ms_per_row(0, ends, issued, active)
    np.testing.assert_allclose(per, [7.0, 8.0, 0.0])  # -5: before the first step (already settled), not counted
    assert later.tolist() == [False, False, False, False, True, True, False]  # kept for the steps to come


class _Info:
    """What ProcessGroupNCCL hands its completion hook (torch's WorkInfo): pybind turns its times into datetime."""

    def __init__(self, issued_ns: int, active_ms: float) -> None:
        import datetime as dt

        self.time_started = dt.datetime.fromtimestamp(issued_ns / 1e9)
        self.time_finished = self.time_started
        self.active_duration = dt.timedelta(milliseconds=active_ms)
        self.op_type, self.seq = "ALLREDUCE", 1


class _Group:
    """Stands in for an NCCL group: it keeps the completion hook registered on it, as NCCL keeps one per group."""

    def __init__(self) -> None:
        self.hook = None

    def _register_on_completion_hook(self, hook):
        if self.hook is not None:
            raise RuntimeError("ProcessGroupNCCL OnCompletion hook already registered")
        self.hook = hook

    def _has_hooks(self):
        return self.hook is not None


def test_the_nccl_completion_hook_never_raises_and_passes_on_to_a_users_own_hook():
    from torch._C._distributed_c10d import ProcessGroup

    from distprof.capture.syncpoints import DeviceComm

    dev = DeviceComm()
    dev.install()
    try:
        g = _Group()
        dev._hook(g)
        assert dev.active
        seen = []
        ProcessGroup._register_on_completion_hook(g, seen.append)  # the user's, after ours: joins ours
        g.hook(_Info(1_000_000_000, 2.5))
        g.hook(object())  # a record without the fields: not ours to fail on (NCCL would abort its communicators)
        issued, active = dev.drain()
        assert issued.tolist() == [1_000_000_000] and active.tolist() == [2.5] and len(seen) == 2
    finally:
        dev.remove()
    g.hook(_Info(2_000_000_000, 1.0))  # after close: still passed on, no longer recorded
    assert len(seen) == 3 and dev.drain()[0].size == 0
    ProcessGroup._register_on_completion_hook(g, seen.append)  # NCCL holds our hook: a user's still joins it
    g.hook(_Info(3_000_000_000, 1.0))
    assert len(seen) == 5
    wrapper = ProcessGroup._register_on_completion_hook
    ProcessGroup._register_on_completion_hook = wrapper.__distprof_watch__  # this test's process: torch's own back
    unhooked = DeviceComm()
    unhooked.install()
    unhooked.remove()  # no group hooked: torch's own method is put back
    assert not hasattr(ProcessGroup._register_on_completion_hook, "__distprof_watch__")


def test_nccl_rows_wait_for_their_collectives_then_carry_their_device_time():
    from distprof.capture.watch import Watch
    from distprof.config import ProfileConfig

    w = Watch(ProfileConfig(), None, trigger=None, step=lambda: 0, on_error=lambda s, e: None)
    dev = w.recorder.device
    dev._hook(_Group())
    now = time.time_ns()
    dev.since_ns = w._row_end = now - 10_000_000_000
    rows = np.zeros(3, wf.SERIES_DTYPE)
    rows["step"] = [0, 1, 2]
    rows["step_ms"] = 100.0
    rows["end_ns"] = [now - 5_000_000_000, now - 4_000_000_000, now - 100_000_000]  # the last one just ended
    rows["dev_comm_ms"] = np.nan
    for issued, ms in ((now - 6_000_000_000, 3.0), (now - 4_500_000_000, 5.0), (now - 200_000_000, 7.0)):
        dev._done.append((issued, ms))
    out = w._settle(rows, final=False)
    assert out["step"].tolist() == [0, 1] and out["dev_comm_ms"].tolist() == [3.0, 5.0]  # step 2: not yet settled
    assert w._held["step"].tolist() == [2]
    out = w._settle(rows[:0], final=True)  # at the close: whatever came in
    assert out["step"].tolist() == [2] and out["dev_comm_ms"].tolist() == [7.0] and not w._held.size
    np.testing.assert_allclose(own_ms(out), [93.0])  # the larger of the host's and the device's wait


def test_version_1_series_still_read(tmp_path):
    (tmp_path / wf.WATCH_DIR).mkdir()
    old = np.zeros(5, wf.SERIES_DTYPE_V1)
    old["step"] = range(5)
    old["step_ms"] = 50.0
    old["comm_ms"] = 20.0
    with open(wf.segment_path(tmp_path, 0, 0), "wb") as fh:
        np.save(fh, old)
    rows = wf.read_rank_series(tmp_path, 0)
    assert rows.dtype == wf.SERIES_DTYPE and rows["step"].tolist() == list(range(5))
    assert np.isnan(rows["dev_comm_ms"]).all() and own_ms(rows).tolist() == [30.0] * 5


def _own_rows(first: int, own: list[float]) -> np.ndarray:
    rows = np.zeros(len(own), wf.SERIES_DTYPE)
    rows["step"] = np.arange(first, first + len(own))
    rows["step_ms"] = own
    rows["dev_comm_ms"] = np.nan
    return rows


def test_publications_rank_0_never_read_leave_no_holes_in_its_table():
    """Rank 1 publishes twice before rank 0 reads its key once (rank 0's reads are paced, and a busy host delays
    them): the steps of the overwritten publication still reach rank 0, so the drift starts at its first step. Before,
    each publication carried only the steps since the last one; on a loaded CI host the watch's own sleeper job
    started its drift 4-8 steps late (at step 64, 66, 68 for 60) with every step of the series slow."""
    from torch.distributed import HashStore

    from distprof.capture.watch import Watch
    from distprof.config import ProfileConfig, WatchConfig

    cfg = ProfileConfig(watch=WatchConfig(enabled=True, threshold=0.5, steps=5))
    store = HashStore()
    w0, w1 = (Watch(cfg, None, trigger=None, step=lambda: 0, on_error=lambda s, e: None) for _ in range(2))
    for r, w in enumerate((w0, w1)):
        w._world, w._store, w._prefix = 2, store, "t/"
        w._join(r)
    slow = [42.0] * 3 + [72.0] * 9  # rank 1 slow from step 3 on
    for lo, hi in ((0, 6), (6, 12)):  # two publications, no read between them
        w1._remember(_own_rows(lo, slow[lo:hi]))
        w1._publish()
    w0._remember(_own_rows(0, [42.0] * 12))
    w0._compare(now=1.0, final=False)
    assert [(d["rank"], d["first_step"], d["flagged_steps"]) for d in w0._drifts] == [(1, 3, 9)]
