"""Faults while a job is captured, on real torchrun jobs (gloo, 2 ranks, fault_train.py): killed ranks, signals, a
full disk, a file-size limit, an unwritable output directory, a clock reference that answers late, reused and
concurrent run ids.

Every test asserts what a user relies on: training's exit code is what it would be without distprof (torchrun's for
a failed job), nothing finished is lost (every window that ended before the fault is on disk for every rank that was
not SIGKILLed), nothing is mixed (one job per run directory), every file under a final name is a whole shard, no
traceback comes from distprof, and no process outlives the configured timeouts (torchrun never has to SIGKILL a
rank after its 30 s grace).
"""

from __future__ import annotations

import hashlib
import os
import resource
from pathlib import Path

import pytest
from conftest import job_env
from fault_jobs import (
    can_mount_tmpfs,
    distprof_traceback,
    exit_codes,
    finish,
    job_ids,
    launcher_job,
    seconds_since_log_time,
    shards_by_rank,
    sigterm_sent_at,
    status,
    tmp_files,
    torchrun_job,
    unmount,
)

from distprof.capture.signals import FLUSH_S
from distprof.storage import find_shards
from distprof.storage.selection import select_shards

pytestmark = pytest.mark.slow

SCHEDULE_ARGS = ["--wait", "0", "--warmup", "0", "--active", "2", "--repeat", "0"]

#: torchrun's grace between its SIGTERM and its SIGKILL (what it prints when a rank outlived it)
FORCED = "forcefully exiting via"


def no_distprof_traceback(job) -> None:
    tb = distprof_traceback(job.stderr)
    assert tb is None, f"traceback from distprof ({tb}):\n{job.stderr[-4000:]}"


def assert_no_hang(job) -> None:
    """No rank waited for torchrun's SIGKILL, and the job ended well inside distprof's own deadline after the first
    SIGTERM torchrun sent."""
    assert FORCED not in job.stderr, job.stderr[-4000:]
    sent = sigterm_sent_at(job.stderr)
    if sent is not None:
        assert 0 <= seconds_since_log_time(sent) < FLUSH_S + 5, job.stderr[-3000:]


# ---- killed ranks ------------------------------------------------------------------------------------------------
#: (signal, victim rank, where): in the middle of window 2 (steps 4-5) after step 4's backward, or right after the
#: forward of step 4, where window 1 has just been handed to the writer. Simulated hosts 0,1 so the clock side channel
#: runs: the survivor's peer is gone during clock sync too.
KILLS = [("sigkill", 1, "mid"), ("sigterm", 1, "mid"), ("sigterm", 1, "boundary"), ("sigkill", 0, "boundary")]


@pytest.mark.parametrize("sig,victim,where", KILLS, ids=["-".join(map(str, k)) for k in KILLS])
def test_killed_rank(tmp_path, sig, victim, where):
    job = torchrun_job(tmp_path, ["--fault", sig, "--rank", str(victim), "--at", "4", "--where", where],
                       launch=["--sync-timeout", "3"], env=job_env(DISTPROF_SIM_HOSTS="0,1"))
    assert job.rc != 0  # torchrun reports the failed worker, as it does without distprof
    assert exit_codes(job.stderr).get(victim) == (-9 if sig == "sigkill" else -15), job.stderr[-3000:]
    no_distprof_traceback(job)
    assert_no_hang(job)
    run = job.run_dir()
    shards = shards_by_rank(run)  # every file under a final name is a whole shard
    assert job_ids(run) == {next(iter(job_ids(run)))} and None not in job_ids(run)  # one job
    kept = [r for r in (0, 1) if not (r == victim and sig == "sigkill")]
    for r in kept:  # windows 0 and 1 (steps 0-3) ended before the fault on every rank: none is lost
        got = shards.get(r, {})
        assert {0, 1} <= set(got), (r, sorted(got), job.stderr[-3000:])
        assert all(got[w].attrs["complete"] for w in (0, 1))
        assert all(got[w].attrs["complete"] is False for w in got if w >= 2)  # the window in flight: cut short
        st = status(run, r)
        assert st is not None and st["final"], f"rank {r} left no final status file"
        assert {w["window"] for w in st["windows"]} == set(got)
        assert not tmp_files(run, r), tmp_files(run, r)
    if sig == "sigterm":
        st = status(run, victim)
        assert st["signal"] == "SIGTERM"
        assert f"distprof: rank {victim} wrote {len(shards[victim])} shard(s)" in job.stderr
        assert "ended by SIGTERM" in job.stderr


def test_sigterm_to_the_whole_job(tmp_path):
    """SIGTERM to torchrun (what Slurm's scancel or a Ctrl-C'd shell does): it forwards SIGTERM to every rank; each
    saves its finished windows and the one in flight, cut short, writes its status file and dies by SIGTERM -- the
    exit status torchrun gives is that of the same job without distprof (a single process's own death by SIGTERM is
    checked by test_sigterm_single_process)."""
    fault = ["--fault", "sigterm-job", "--rank", "0", "--at", "5", "--where", "mid"]
    (tmp_path / "plain").mkdir()
    base = torchrun_job(tmp_path / "plain", fault, distprof=False)
    job = torchrun_job(tmp_path, fault)
    assert job.rc == base.rc  # torchrun's own status for a SIGTERM it was sent (it prints no worker summary then)
    assert exit_codes(job.stderr) == exit_codes(base.stderr), (job.stderr[-3000:], base.stderr[-3000:])
    assert "done" not in job.stdout and "done" not in base.stdout  # every rank ended by the signal, not its loop
    no_distprof_traceback(job)
    assert_no_hang(job)
    run = job.run_dir()
    shards = shards_by_rank(run)
    for r in (0, 1):
        assert {0, 1} <= set(shards[r]) and all(shards[r][w].attrs["complete"] for w in (0, 1)), sorted(shards[r])
        st = status(run, r)
        assert st["signal"] == "SIGTERM" and st["final"]
        assert not tmp_files(run, r)
    assert "ended by SIGTERM" in job.stderr


# ---- the disk ----------------------------------------------------------------------------------------------------
def _fsize_limit(kb: int):
    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (kb * 1024, resource.RLIM_INFINITY))
    return limit


@pytest.mark.parametrize("kind", ["tmpfs", "ulimit-f"])
def test_full_disk_loses_windows_not_training(tmp_path, kind):
    """A 120 kB file system (room for about two of the 16-22 kB shards of the six windows each rank records, in 4 kB
    pages, beside the run's small files and the 64 kB every write keeps free, where the status files go; before that
    floor, shards could fill it and leave no page for a status file) or a 8 kB file-size limit (no shard fits):
    training ends as always (exit 0, every step done), every window that did not fit is lost with
    one warning per rank naming it and why, listed in the status file and the closing line; what was written is
    whole; no temporary is left."""
    out = tmp_path / "out"
    if kind == "tmpfs":
        if not can_mount_tmpfs(out, 120):
            pytest.skip("cannot mount a tmpfs here (needs root); the ulimit-f case covers the write errors")
        preexec, want = None, "not enough space on"
    else:
        preexec, want = _fsize_limit(8), "file-size limit reached"
    try:
        job = torchrun_job(tmp_path, [], preexec_fn=preexec)
        assert job.rc == 0, job.stderr[-4000:]
        assert "done 0" in job.stdout and "done 1" in job.stdout
        no_distprof_traceback(job)
        run = job.run_dir()
        shards = shards_by_rank(run)
        for r in (0, 1):
            st = status(run, r)
            assert st is not None and st["final"]
            lost = {w["window"]: w for w in st["lost"]}
            written = {w["window"] for w in st["windows"]}
            assert lost and not (set(lost) & written), st
            assert written | set(lost) == set(range(6)), (written, sorted(lost))
            assert set(shards.get(r, {})) == written
            assert all(want in w["reason"] for w in lost.values()), [w["reason"] for w in lost.values()]
            assert all(w["first_step"] == 2 * w["window"] for w in lost.values())
            # the other rank's (or torch's) output can land on the same line: the messages are found within lines
            warned = [ln[ln.index(f"distprof: rank {r}: window"):] for ln in job.stderr.splitlines()
                      if f"distprof: rank {r}: window" in ln]
            assert len(warned) == 1 and "not saved" in warned[0] and want in warned[0], job.stderr[-3000:]
            line = [ln[ln.index(f"distprof: rank {r} wrote"):] for ln in job.stderr.splitlines()
                    if f"distprof: rank {r} wrote" in ln]
            assert len(line) == 1 and f"lost {len(lost)} window(s)" in line[0] and want in line[0], \
                (line, job.stderr[-3000:])
        assert not tmp_files(run)
    finally:
        if kind == "tmpfs":
            unmount(out)


@pytest.mark.parametrize("kind", ["read-only", "not-a-directory"])
def test_unwritable_out(tmp_path, kind):
    """--out on a read-only file system (or a path through a regular file): training runs as always; every rank says
    once that nothing is recorded and why, and the closing line says the same (not 'fewer steps than the schedule')."""
    out = tmp_path / "out"
    arg = "out"
    if kind == "read-only":
        if not can_mount_tmpfs(out, 64, "ro"):
            out.mkdir()
            out.chmod(0o555)
            if os.access(out, os.W_OK):
                pytest.skip("cannot make a read-only directory here (root without mount)")
        cause = ("read-only file system", "permission denied")
    else:
        out.write_text("a file, not a directory")
        arg = "out/runs"
        cause = ("Not a directory",)
    try:
        job = torchrun_job(tmp_path, [], out=arg)
        assert job.rc == 0 and "done 0" in job.stdout and "done 1" in job.stdout, job.stderr[-3000:]
        no_distprof_traceback(job)
        for r in (0, 1):
            said = [ln for ln in job.stderr.splitlines() if f"distprof: rank {r}" in ln]
            assert any("cannot create the run directory" in ln and "nothing is recorded" in ln and
                       any(c in ln for c in cause) for ln in said), said
        assert "fewer steps" not in job.stderr
        assert "distprof: rank 0 wrote no shard: cannot create the run directory" in job.stderr, job.stderr[-2000:]
    finally:
        if kind == "read-only":
            unmount(out)


# ---- clock sync --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("fault", ["stop-peer", "hold-gil"])
def test_clock_sync_survives_a_late_reference(tmp_path, fault):
    """The reference (rank 0) cannot answer for 3 s, three times the sync timeout, right where window 1 ends: frozen
    by SIGSTOP (a peer that is late), or holding the GIL in one C call (a checkpoint at the window boundary). That
    window's exchange times out; later windows have their samples again (a fresh connection), and training is
    unaffected."""
    victim_side = ["--rank", "1"] if fault == "stop-peer" else ["--rank", "0"]
    job = torchrun_job(tmp_path, ["--fault", fault, *victim_side, "--at", "3", "--where", "mid", "--seconds", "3"],
                       launch=["--sync-timeout", "1"], env=job_env(DISTPROF_SIM_HOSTS="0,1"))
    assert job.rc == 0 and "done 1" in job.stdout, job.stderr[-4000:]
    no_distprof_traceback(job)
    run = job.run_dir()
    leader = shards_by_rank(run)[1]
    assert sorted(leader) == list(range(6))
    st = status(run, 1)
    assert any("timed out" in e["message"] for e in st["errors"]), st["errors"]  # the fault was real

    def phases(w):
        cs = leader[w].table("clock/samples")
        return {int(p) for p in cs["phase"]}

    assert phases(0) == {0, 1}
    assert phases(4) == {0, 1} and phases(5) == {0, 1}, [phases(w) for w in range(6)]


# ---- run ids -----------------------------------------------------------------------------------------------------
def _digest(run_dir: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(run_dir.iterdir())}


TRAIN = """
import sys, torch
m = torch.nn.Linear(8, 8)
o = torch.optim.SGD(m.parameters(), lr=0.1)
for i in range(6):
    m(torch.randn(4, 8)).sum().backward(); o.step(); o.zero_grad()
"""


@pytest.mark.parametrize("how", ["--run-id", "SLURM_JOB_ID"])
def test_reused_run_id_goes_to_a_new_directory(tmp_path, how):
    """A second job with the run id of a finished one (the same --run-id; two job steps of one Slurm allocation,
    which share SLURM_JOB_ID) writes to <run-id>.2, says so, and leaves the first job's files as they were."""
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    sched = ["--out", "out", "--wait", "0", "--warmup", "1", "--active", "2"]
    first = second = None
    for step in ("0", "1"):
        if how == "--run-id":
            proc = launcher_job(tmp_path, [*sched, "--run-id", "r42", str(script)])
        else:
            proc = launcher_job(tmp_path, [*sched, str(script)], env=job_env(SLURM_JOB_ID="r42", SLURM_STEP_ID=step))
        assert proc.returncode == 0, proc.stderr
        if step == "0":
            first = _digest(tmp_path / "out" / "r42")
        else:
            second = proc
    assert _digest(tmp_path / "out" / "r42") == first  # untouched
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["r42", "r42.2"]
    assert "wrote 1 shard(s) to out/r42.2" in second.stderr and "'r42' already belongs to another job" in second.stderr
    ids = [job_ids(tmp_path / "out" / d) for d in ("r42", "r42.2")]
    assert all(len(i) == 1 and None not in i for i in ids) and ids[0] != ids[1]
    assert next(iter(shards_by_rank(tmp_path / "out" / "r42.2")[0].values())).attrs["run_id"] == "r42.2"


def test_concurrent_jobs_with_one_run_id(tmp_path):
    """Two jobs started at once with the same --run-id: one gets the directory, the other <run-id>.2; each holds all
    of its own windows and nothing of the other's."""
    procs = [torchrun_job(tmp_path, [], launch=["--run-id", "same"], start=True) for _ in range(2)]
    jobs = [finish(p, t0, tmp_path / "out") for p, t0 in procs]
    for j in jobs:
        assert j.rc == 0, j.stderr[-3000:]
        no_distprof_traceback(j)
    dirs = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert dirs == ["same", "same.2"]
    ids = []
    for d in dirs:
        run = tmp_path / "out" / d
        shards = shards_by_rank(run)
        assert {r: sorted(ws) for r, ws in shards.items()} == {0: list(range(6)), 1: list(range(6))}
        sel = select_shards(find_shards(run))
        assert not sel.skipped and not sel.warnings
        (jid,) = job_ids(run)
        ids.append(jid)
    assert ids[0] != ids[1]


# ---- signals to a single process ---------------------------------------------------------------------------------
LOOP = """
import signal, sys, time, torch
if sys.argv[1] == "user":
    def handler(sig, frame):
        print("user handler", flush=True)
        sys.exit(3)
    signal.signal(signal.SIGTERM, handler)
m = torch.nn.Linear(16, 16)
o = torch.optim.SGD(m.parameters(), lr=0.1)
for i in range(10_000):
    m(torch.randn(4, 16)).sum().backward(); o.step(); o.zero_grad()
    print("step", i, flush=True)
    time.sleep(0.02)
"""


@pytest.mark.parametrize("handler", ["default", "user"])
def test_sigterm_single_process(tmp_path, handler):
    """SIGTERM to `python -m distprof.launch train.py` after step 5 (windows w0000-w0002 finished, w0003 recording):
    with Python's default disposition the process dies by SIGTERM (returncode -15, as without distprof) after saving
    the finished windows, the one in flight cut short, and a final status file naming the signal; a script's own
    handler (installed after distprof's) runs and its exit code stands, with the same files saved by the close."""
    import signal
    import subprocess
    import sys
    import time

    script = tmp_path / "loop.py"
    script.write_text(LOOP)
    proc = subprocess.Popen([sys.executable, "-m", "distprof.launch", "--out", "out", "--run-id", "r", *SCHEDULE_ARGS,
                             str(script), handler], cwd=tmp_path, env=job_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    lines = []
    for line in proc.stdout:  # pytest's timeout bounds this loop
        lines.append(line)
        if line.startswith("step 6"):
            break
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        rest, err = proc.communicate(timeout=FLUSH_S + 10)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError("the process outlived distprof's own deadline after SIGTERM") from None
    took = time.monotonic() - t0
    assert proc.returncode == (-signal.SIGTERM if handler == "default" else 3), err[-3000:]
    assert took < FLUSH_S, took
    assert distprof_traceback(err) is None, err[-3000:]
    run = tmp_path / "out" / "r"
    shards = shards_by_rank(run)[0]
    assert {0, 1, 2} <= set(shards) and all(shards[w].attrs["complete"] for w in (0, 1, 2)), sorted(shards)
    assert all(shards[w].attrs["complete"] is False for w in shards if w > 2 and w == max(shards))
    st = status(run, 0)
    assert st["final"] and {w["window"] for w in st["windows"]} == set(shards)
    assert st["signal"] == ("SIGTERM" if handler == "default" else None), st["signal"]
    if handler == "user":
        assert "user handler" in rest
    assert not tmp_files(run)
    print(f"SIGTERM ({handler}) to exit: {took:.2f} s")


def test_trigger_job_finds_the_latest_job_with_the_run_id(tmp_path):
    """`distprof trigger --job 1234` goes to the latest job with that id: a second job step of the allocation runs in
    1234.2 (the first one's directory is finished)."""
    from distprof.capture.rundir import latest_run_dir

    assert latest_run_dir(tmp_path, "1234") == tmp_path / "1234"
    for name in ("1234", "1234.2", "1234.3", "12345"):
        (tmp_path / name).mkdir()
    assert latest_run_dir(tmp_path, "1234") == tmp_path / "1234.3"
    assert latest_run_dir(tmp_path, "12345") == tmp_path / "12345"
