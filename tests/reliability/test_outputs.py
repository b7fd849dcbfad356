"""Output paths (``--json``, ``--html``, ``timeline -o``, ``export -o``, ``import -o``): regular files atomically,
devices and FIFOs in place, directories refused, symlinks followed and kept; a write error is an error exit."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from reliability_helpers import one_error_line, run_cli
from shard_factory import good_run

#: (argv before the path, argv after it) per file output
FILE_OUTPUTS = {
    "report --json": (["report", "{run}", "--json"], []),
    "report --html": (["report", "{run}", "--html"], []),
    "timeline -o": (["timeline", "{run}", "-o"], []),
}


@pytest.fixture(scope="module")
def good_run_dir(tmp_path_factory):
    """A valid 3-rank run (shard_factory.good_run) for the tests of this module to copy or read."""
    return good_run(tmp_path_factory.mktemp("good"))


def _argv(kind: str, run: Path, target: Path) -> list:
    before, after = FILE_OUTPUTS[kind]
    return [a.format(run=run) for a in before] + [target, *after, "--no-progress"]


def _device(tmp_path: Path, name: str, minor: int) -> Path:
    """A character device like /dev/null (minor 3) or /dev/full (7): made in tmp_path when we may (root), so that
    a regression replacing it harms nothing; else the system's own (which a non-root process cannot replace)."""
    p = tmp_path / name
    if os.geteuid() == 0:
        os.mknod(p, 0o666 | stat.S_IFCHR, os.makedev(1, minor))
        return p
    return Path("/dev") / name


def _is_char_device(p: Path) -> bool:
    return stat.S_ISCHR(os.lstat(p).st_mode)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", sorted(FILE_OUTPUTS))
def test_dev_full_is_an_error_exit_and_the_device_stays(good_run_dir, tmp_path, kind):
    dev = _device(tmp_path, "full", 7)
    rc, out, err = run_cli(_argv(kind, good_run_dir, dev))
    assert rc == 2 and "No space left on device" in one_error_line(err) and str(dev) in err
    assert _is_char_device(dev)  # measured before: exit 0 and the node replaced by a regular file (as root)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", sorted(FILE_OUTPUTS))
def test_dev_null_is_written_in_place(good_run_dir, tmp_path, kind):
    dev = _device(tmp_path, "null", 3)
    rc, out, err = run_cli(_argv(kind, good_run_dir, dev))
    assert rc == 0, err
    assert _is_char_device(dev) and not list(tmp_path.glob("*.tmp"))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", sorted(FILE_OUTPUTS))
def test_a_symlink_s_target_is_written_and_the_link_kept(good_run_dir, tmp_path, kind):
    (tmp_path / "real").mkdir()
    target = tmp_path / "real" / "out.data"
    target.write_text("old")
    os.chmod(target, 0o640)
    link = tmp_path / "link.data"
    link.symlink_to(target)
    rc, out, err = run_cli(_argv(kind, good_run_dir, link))
    assert rc == 0, err
    assert link.is_symlink() and os.readlink(link) == str(target)  # measured before: the link was replaced
    assert target.stat().st_size > 100 and stat.S_IMODE(target.stat().st_mode) == 0o640
    assert not list(tmp_path.rglob("*.tmp"))
    dangling = tmp_path / "dangling.data"
    dangling.symlink_to(tmp_path / "real" / "new.data")
    rc, out, err = run_cli(_argv(kind, good_run_dir, dangling))
    assert rc == 0 and dangling.is_symlink() and (tmp_path / "real" / "new.data").stat().st_size > 100


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", sorted(FILE_OUTPUTS))
def test_a_fifo_gets_the_data_in_place(good_run_dir, tmp_path, kind):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got = bytearray()

    def read():
        with open(fifo, "rb") as fh:
            got.extend(fh.read())

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    rc, out, err = run_cli(_argv(kind, good_run_dir, fifo))
    reader.join(20)
    assert rc == 0, err
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and len(got) > 100


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", sorted(FILE_OUTPUTS))
def test_a_directory_is_refused_in_one_line(good_run_dir, tmp_path, kind):
    d = tmp_path / "adir"
    d.mkdir()
    rc, out, err = run_cli(_argv(kind, good_run_dir, d))
    assert rc == 2 and "is a directory" in one_error_line(err)
    assert list(d.iterdir()) == []


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", sorted(FILE_OUTPUTS))
def test_an_unwritable_place_is_one_line(good_run_dir, tmp_path, kind):
    for target in (Path("/proc/distprof-out"), tmp_path / "missing" / "out.data"):
        rc, out, err = run_cli(_argv(kind, good_run_dir, target))
        assert rc == 2 and str(target.parent) in one_error_line(err), err


@pytest.mark.timeout(60)
def test_json_to_dev_stdout_follows_the_summary_in_a_redirected_file(good_run_dir, tmp_path):
    """``--json /dev/stdout > out.txt``: the report goes through stdout after the summary (not over the file).

    The path is a link of our own to /proc/self/fd/1, as /dev/stdout is: a regression replaces that link, never the
    system's /dev/stdout (the code before this test replaced /dev/stdout itself, as root)."""
    stdout = tmp_path / "stdout"
    stdout.symlink_to("/proc/self/fd/1")
    out = tmp_path / "out.txt"
    with open(out, "wb") as fh:
        proc = subprocess.run([sys.executable, "-m", "distprof", "report", str(good_run_dir), "--json",
                               str(stdout), "--no-progress"], stdout=fh, stderr=subprocess.PIPE, timeout=50)
    assert proc.returncode == 0, proc.stderr
    assert stdout.is_symlink()
    text = out.read_text()
    assert text.startswith("distprof report: run good")
    start = text.index('{\n "format"')
    end = text.rindex("}") + 1
    assert json.loads(text[start:end])["format"] == "distprof-report"
    assert text[end:].strip() == f"report written to {stdout}"


@pytest.mark.timeout(60)
def test_export_and_import_directories(good_run_dir, tmp_path):
    f = tmp_path / "a-file"
    f.write_text("keep")
    dev = _device(tmp_path, "null", 3)
    for target in (f, dev):
        rc, out, err = run_cli(["export", good_run_dir, "-o", target, "--no-progress"])
        assert rc == 2 and "not a directory" in one_error_line(err)
    assert f.read_text() == "keep" and _is_char_device(dev)
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    rc, out, err = run_cli(["export", good_run_dir, "-o", tmp_path / "link", "--no-progress"])
    assert rc == 0 and (tmp_path / "link").is_symlink() and len(list((tmp_path / "real").glob("rank-*"))) == 3
    trace = Path(__file__).resolve().parents[1] / "data" / "hta" / "cpu_only"
    for target in (f, dev):
        rc, out, err = run_cli(["import", trace, "-o", target, "--no-progress"])
        assert rc == 2 and "not a directory" in one_error_line(err)
    assert f.read_text() == "keep" and _is_char_device(dev)
