"""A run directory another user can write to: links planted at every temporary and final name distprof writes,
FIFOs at every file it reads, a link or another user's directory where the run directory goes, and run ids that
are paths. Nothing is ever written through a link, nothing waits on a FIFO, each odd file is named in one line.

Every writer is exercised as the job calls it (storage.writer, capture.status, capture.trigger_files,
storage.watchfile, capture.rundir) and every reader through the CLI; the whole-job versions (torchrun, a FIFO at
job.json before the job starts) are in test_capture_hardening.py."""

from __future__ import annotations

import json
import errno
import os
import socket
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import job_env
from reliability_helpers import one_error_line, run_cli
from shard_factory import good_run

from distprof.capture import rundir, status, trigger_files as tf
from distprof.config import ProfileConfig
from distprof.errors import ConfigError
from distprof.storage import safefs, schema, watchfile as wf
from distprof.storage.writer import ShardWriteError, write_durably

pytestmark = pytest.mark.timeout(60)

SECRET = b"the victim's own file\n"


@pytest.fixture
def victim(tmp_path) -> Path:
    """A file of someone else's that a planted link points at: it must keep its bytes."""
    (tmp_path / "elsewhere").mkdir()
    p = tmp_path / "elsewhere" / "victim"
    p.write_bytes(SECRET)
    return p


def _plant(link: Path, target: Path) -> None:
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(target)


def _regular(p: Path) -> bool:
    return stat.S_ISREG(os.lstat(p).st_mode)


# ---- writes never follow a link ---------------------------------------------------------------------------------
@pytest.mark.parametrize("at", ["tmp", "final"])
def test_a_shard_write_never_follows_a_planted_link(tmp_path, victim, at):
    """Measured before: a link at rank00001.w0001.h5.tmp made the job overwrite its target with the shard's bytes,
    and the final name became a link to it. Now temporaries have unique names (O_EXCL|O_NOFOLLOW) and the final
    name is renamed over: the target keeps its bytes, the shard is a regular file."""
    run = tmp_path / "run"
    final = run / "rank00001.w0001.h5"
    _plant(final.with_name(final.name + ".tmp") if at == "tmp" else final, victim)
    write_durably(final, b"shard bytes")
    assert victim.read_bytes() == SECRET
    assert _regular(final) and final.read_bytes() == b"shard bytes"
    assert stat.S_IMODE(final.stat().st_mode) == safefs.default_mode(0o644)


@pytest.mark.parametrize("links", [True, False], ids=["hard-links", "no-hard-links"])
def test_a_shard_is_never_written_over_one_already_there(tmp_path, victim, monkeypatch, links):
    """A capture writes each shard name once (``replace=False``): a regular file already at the name is another
    process's (a restarted job's earlier attempt, before the run agreement kept attempts apart, got its rank-1 shard
    overwritten by the restart's). It stays; the write fails with a reason that says so; no temporary is left. A
    planted link there holds no data: it is replaced as by every other write, its target untouched. Where the file
    system has no hard links, the name is checked, then renamed onto."""
    if not links:
        def no_link(*a, **k):
            raise PermissionError(errno.EPERM, "Operation not permitted")
        monkeypatch.setattr(safefs.os, "link", no_link)
    run = tmp_path / "run"
    run.mkdir()
    final = run / "rank00001.w0000.h5"
    final.write_bytes(b"the earlier attempt's shard")
    with pytest.raises(ShardWriteError, match="already there"):
        write_durably(final, b"shard bytes", replace=False)
    assert final.read_bytes() == b"the earlier attempt's shard"
    assert sorted(p.name for p in run.iterdir()) == [final.name]
    planted = run / "rank00002.w0000.h5"
    _plant(planted, victim)
    fresh = run / "rank00000.w0000.h5"
    for p in (fresh, planted):
        assert write_durably(p, b"shard bytes", replace=False) == len(b"shard bytes")
        assert _regular(p) and p.read_bytes() == b"shard bytes"
        assert stat.S_IMODE(p.stat().st_mode) == safefs.default_mode(0o644)
    assert victim.read_bytes() == SECRET
    assert sorted(p.name for p in run.iterdir()) == sorted([final.name, fresh.name, planted.name])


def test_temporaries_are_private_until_renamed(tmp_path, monkeypatch):
    """A temporary is created with mode 0600 (nobody else can open it while it is written) and O_EXCL|O_NOFOLLOW;
    the final file gets 0644 less the umask."""
    seen = []
    real = safefs._write_all

    def spy(fd, data):
        seen.append(stat.S_IMODE(os.fstat(fd).st_mode))
        return real(fd, data)

    monkeypatch.setattr(safefs, "_write_all", spy)
    safefs.write_file(tmp_path, "x.json", b"{}")
    assert seen == [0o600]
    assert stat.S_IMODE((tmp_path / "x.json").stat().st_mode) == safefs.default_mode(0o644)
    assert [p.name for p in tmp_path.iterdir()] == ["x.json"]  # no temporary left


@pytest.mark.parametrize("at", ["tmp", "final"])
def test_the_status_file_never_follows_a_planted_link(tmp_path, victim, at):
    """Measured before: a link at rank00000.status.json.tmp was written through."""
    run = tmp_path / "run"
    name = schema.STATUS_TEMPLATE.format(rank=0)
    _plant(run / (name + ".tmp" if at == "tmp" else name), victim)
    status.write(run, 0, {"rank": 0, "errors": []})
    assert victim.read_bytes() == SECRET
    assert _regular(run / name) and json.loads((run / name).read_text())["rank"] == 0


@pytest.mark.parametrize("name", [tf.LIVE_NAME, tf.ANSWER_NAME, tf.REQUEST_NAME])
def test_trigger_files_never_follow_a_planted_link(tmp_path, victim, name):
    """Measured before: a swapped-in distprof.live.json (a link) was written through to its target."""
    run = tmp_path / "run"
    _plant(run / name, victim)
    tf.write_doc(run / name, {"format": "x"})
    assert victim.read_bytes() == SECRET and _regular(run / name)


def test_a_watch_segment_never_follows_a_planted_link(tmp_path, victim):
    """Measured before: a link at watch/rank00001.s00000.npy was written through."""
    run = tmp_path / "run"
    seg = wf.segment_path(run, 1, 0)
    _plant(seg, victim)
    rows = np.zeros(3, wf.SERIES_DTYPE)
    rows["step"] = [0, 1, 2]
    wf.write_segment(seg, rows)
    assert victim.read_bytes() == SECRET and _regular(seg)
    assert wf.read_segment(seg)["step"].tolist() == [0, 1, 2]
    wf.write_drifts(run, [])
    assert wf.read_drifts(run) == []


def test_a_link_in_place_of_the_watch_directory_is_refused(tmp_path):
    (tmp_path / "elsewhere").mkdir()
    run = tmp_path / "run"
    _plant(run / wf.WATCH_DIR, tmp_path / "elsewhere")
    with pytest.raises(OSError, match="is a symbolic link"):
        wf.ensure_watch_dir(run)
    with pytest.raises(OSError, match="is a symbolic link"):
        wf.write_segment(wf.segment_path(run, 0, 0), np.zeros(0, wf.SERIES_DTYPE))
    assert list((tmp_path / "elsewhere").iterdir()) == []


@pytest.mark.parametrize("planted", ["link-to-a-directory", "link-at-job.json", "fifo-at-job.json", "file"])
def test_a_run_directory_that_is_not_the_jobs_is_never_used(tmp_path, planted):
    """A link in place of OUT/<run-id> (measured before: the job wrote into its target), a link or a FIFO at its
    job.json (measured before: the FIFO hung rank 0 inside init_process_group), or a file there: the run goes to
    <run-id>.2 at once, and what was planted is left as it was."""
    out = tmp_path / "out"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    if planted == "link-to-a-directory":
        _plant(out / "r", elsewhere)
    elif planted == "link-at-job.json":
        (elsewhere / "job.json").write_text(json.dumps({"job": {"id": "victim"}}))
        _plant(out / "r" / rundir.JOB_FILE, elsewhere / "job.json")
    elif planted == "fifo-at-job.json":
        (out / "r").mkdir(parents=True)
        os.mkfifo(out / "r" / rundir.JOB_FILE)
    else:
        out.mkdir()
        (out / "r").write_text("x")
    got: list = []
    t = threading.Thread(target=lambda: got.append(rundir.claim(out, "r", rundir.new_job())), daemon=True)
    t0 = time.monotonic()
    t.start()
    t.join(10)
    if t.is_alive():  # blocked opening the FIFO: free it for the next tests, then fail
        with open(out / "r" / rundir.JOB_FILE, "wb"):
            pass
        pytest.fail("claiming the run directory blocked on a FIFO at job.json")
    assert time.monotonic() - t0 < 5
    (c,) = got
    assert c.run_id == "r.2" and c.run_dir == out / "r.2" and "'r' already belongs to another job" in c.note()
    assert list(elsewhere.iterdir()) in ([], [elsewhere / "job.json"])
    if planted == "fifo-at-job.json":
        assert stat.S_ISFIFO(os.lstat(out / "r" / rundir.JOB_FILE).st_mode)


# ---- readers never block on a FIFO ------------------------------------------------------------------------------
def _cli(argv: list, timeout: float = 40) -> subprocess.CompletedProcess:
    """``distprof ARGV`` in its own process: a hang is a timeout here, not a stuck test run."""
    return subprocess.run([sys.executable, "-m", "distprof", *map(str, argv)], capture_output=True, text=True,
                          timeout=timeout, env=job_env(), stdin=subprocess.DEVNULL)


def test_a_fifo_at_a_missing_ranks_status_file_is_named_not_waited_on(tmp_path):
    """Measured before: `distprof report` hung reading rank00002.status.json (a FIFO) to say why rank 2 is
    missing."""
    run = good_run(tmp_path / "g")
    for p in run.glob("rank00002.*"):
        p.unlink()
    os.mkfifo(run / schema.STATUS_TEMPLATE.format(rank=2))
    p = _cli(["report", run, "--no-progress", "--json", tmp_path / "r.json"])
    assert p.returncode == 0, p.stderr
    warnings = json.loads((tmp_path / "r.json").read_text())["warnings"]
    assert any("rank00002.status.json: is a FIFO, not a regular file" in w for w in warnings), warnings


def _watch_run(tmp_path: Path) -> Path:
    run = good_run(tmp_path / "g")
    wf.ensure_watch_dir(run)
    for r in range(3):
        rows = np.zeros(20, wf.SERIES_DTYPE)
        rows["step"] = np.arange(20)
        rows["step_ms"] = 20.0
        wf.write_segment(wf.segment_path(run, r, 0), rows)
    return run


@pytest.mark.parametrize("where", ["drifts", "segment"])
def test_a_fifo_in_the_watch_directory_is_named_not_waited_on(tmp_path, where):
    """Measured before: a FIFO at watch/drifts.json hung `distprof report`; one named like a segment was skipped
    without a word (now: named)."""
    run = _watch_run(tmp_path)
    target = run / wf.WATCH_DIR / (wf.DRIFTS_NAME if where == "drifts" else "rank00003.s00000.npy")
    os.mkfifo(target)
    p = _cli(["report", run, "--no-progress", "--json", tmp_path / "r.json"])
    assert p.returncode == 0, p.stderr
    skipped = json.loads((tmp_path / "r.json").read_text())["watch"]["skipped"]
    assert any(f"{target.name}: is a FIFO, not a regular file" in s for s in skipped), skipped


def _live(run: Path, **kw) -> None:
    doc = tf.LiveStatus(session="s1", run_id="r", pid=os.getpid(), host=socket.gethostname(), world_size=2,
                        started_ns=time.time_ns(), updated_ns=time.time_ns(), heartbeat_s=2.0, step=40,
                        schedule={}).to_doc()
    doc.update(kw)
    (run / tf.LIVE_NAME).write_text(json.dumps(doc))


@pytest.mark.parametrize("planted", ["fifo", "link"])
def test_distprof_trigger_replaces_a_fifo_or_link_at_trigger_json(tmp_path, victim, planted):
    """Measured before: a FIFO at trigger.json hung `distprof trigger` (writing into it) past its --timeout; a link
    there had its target overwritten after 'replacing a bad request file'. Now the request is a new file renamed
    over the name, and the command ends within its --timeout."""
    run = tmp_path / "run"
    run.mkdir()
    _live(run)
    req = run / tf.REQUEST_NAME
    os.mkfifo(req) if planted == "fifo" else req.symlink_to(victim)
    t0 = time.monotonic()
    p = _cli(["trigger", run, "--timeout", "1"], timeout=30)
    assert time.monotonic() - t0 < 20
    assert p.returncode == 1 and "no answer from the job within 1 s" in p.stderr, p.stderr
    assert "replacing a bad request file" in p.stderr
    assert ("is a FIFO" if planted == "fifo" else "is a symbolic link") in p.stderr
    assert victim.read_bytes() == SECRET and _regular(req)
    assert tf.read_request(req).session == "s1"


def test_distprof_trigger_names_a_fifo_at_the_live_file(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    os.mkfifo(run / tf.LIVE_NAME)
    p = _cli(["trigger", run, "--timeout", "1"], timeout=30)
    assert p.returncode == 2 and "distprof.live.json: is a FIFO, not a regular file" in one_error_line(p.stderr)


def test_readers_are_bounded_by_what_they_allow(tmp_path):
    """A status file of 20 MB (more than a status file may hold) is skipped and named, not read."""
    run = good_run(tmp_path / "g")
    for p in run.glob("rank00002.*"):
        p.unlink()
    big = run / schema.STATUS_TEMPLATE.format(rank=2)
    with open(big, "wb") as fh:
        fh.truncate(20 << 20)
    rc, out, err = run_cli(["report", run, "--no-progress", "--json", tmp_path / "r.json"])
    assert rc == 0, err
    warnings = json.loads((tmp_path / "r.json").read_text())["warnings"]
    assert any("rank00002.status.json: 20,971,520 bytes, more than a status file's" in w for w in warnings)


# ---- run ids ------------------------------------------------------------------------------------------------------
BAD_RUN_IDS = {
    "parent": ("../../x", "is a path, not a name"),
    "absolute": ("/tmp/x", "is a path, not a name"),
    "slash": ("a/b", "is a path, not a name"),
    "nul": ("a\x00b", "holds a NUL character"),
    "long": ("x" * 300, "300 characters long"),
    "dot": ("..", "is a path, not a name"),
    "space": ("my run", "holds characters other than"),
    "empty-leading-dash": ("-x", "must begin with a letter"),
}


@pytest.mark.parametrize("kind", sorted(BAD_RUN_IDS))
def test_a_run_id_that_is_not_one_safe_name_is_refused_by_the_api(kind):
    """Measured before: `..` wrote shards into the parent of --out; a NUL lost every window behind 'trigger failed
    (ValueError: embedded null byte)'. Now ProfileConfig refuses it with one line."""
    value, phrase = BAD_RUN_IDS[kind]
    with pytest.raises(ConfigError, match=phrase):
        ProfileConfig(run_id=value)
    assert ProfileConfig(run_id="exp-42_lr0.1").run_id == "exp-42_lr0.1"


@pytest.mark.parametrize("kind", ["parent", "absolute", "slash"])
def test_a_bad_run_id_is_one_error_before_training_starts(tmp_path, kind, capsys):
    """`python -m distprof.launch --run-id ../../x train.py`: exit 2 and one line; the script never runs."""
    from distprof import launch

    script = tmp_path / "train.py"
    script.write_text("open('ran', 'w').close()\n")
    with pytest.raises(SystemExit) as e:
        launch.main(["--out", str(tmp_path / "out"), "--run-id", BAD_RUN_IDS[kind][0], str(script)])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert BAD_RUN_IDS[kind][1] in err.splitlines()[-1]
    assert not (tmp_path / "ran").exists() and not (tmp_path / "out").exists()


def test_an_unsafe_launcher_id_is_not_used_as_a_run_id(monkeypatch):
    from distprof.capture.setup import env_run_id

    monkeypatch.setenv("SLURM_JOB_ID", "../../etc")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "ok-123")
    assert env_run_id() == "ok-123"


def test_a_dangling_out_is_named_as_such(tmp_path, capsys):
    """Measured before: a dangling-symlink --out recorded nothing and said '(File exists)'."""
    from distprof import launch

    out = tmp_path / "out"
    out.symlink_to(tmp_path / "gone")
    script = tmp_path / "train.py"
    script.write_text("open('ran', 'w').close()\n")
    with pytest.raises(SystemExit) as e:
        launch.main(["--out", str(out), str(script)])
    assert e.value.code == 2
    line = capsys.readouterr().err.splitlines()[-1]
    assert "is a symbolic link to" in line and "which does not exist (a dangling link)" in line
    with pytest.raises(rundir.ClaimError, match="dangling link"):
        rundir.claim(out, "r", rundir.new_job())
    with pytest.raises(ShardWriteError):  # and a write below it is one error, never through the link
        write_durably(out / "r" / "x.h5", b"x")
