"""Hostile names (terminal escapes, forged lines, HTML, bidi overrides, 5,000 characters) in op names, annotations,
hosts, the run id and recorded errors: the terminal gets them escaped and bounded, every file keeps them exactly."""

from __future__ import annotations

import gzip
import json
import re

import pytest
from reliability_helpers import run_cli

from synth import make_run

TITLE = "\x1b]0;TITLE\x07"  # measured: retitled the terminal
FORGED = "\nVerdict: No straggler at all"  # measured: printed as its own verdict line
HTML = "<script>alert(1)</script>"
BIDI = "\u202eevil"
LONG = "L" * 5000
OP = f"aten::mm{TITLE}{FORGED}{HTML}{BIDI}"
ANNOTATION = f"data_prep{TITLE}{LONG}"  # replaces DistributedDataParallel.forward: a user region
HOST = f"node{TITLE}\r\n1"
RUN_ID = "run\x1b[2J"
ERROR = f"disk{TITLE}{FORGED}"

#: what may reach the terminal: printable text, newlines between lines, our own SGR colour codes when asked
_SGR = re.compile(r"\x1b\[[0-9;]*m")
_CONTROL = re.compile(r"[\x00-\x09\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def _hostile(rank, window, tables, strings, attrs):
    for i, s in enumerate(strings):
        if s == "aten::mm":
            strings[i] = OP
        elif s == "DistributedDataParallel.forward":
            strings[i] = ANNOTATION
    if rank == 1:
        attrs["host"] = HOST
        attrs["errors"] = [{"stage": "write", "message": ERROR}]
    attrs["run_id"] = RUN_ID


@pytest.fixture(scope="module")
def hostile_run(tmp_path_factory):
    # rank 2 runs a long hostile-named op each step: it is the straggler, the op its root cause
    return make_run(tmp_path_factory.mktemp("hostile"), world_size=3, hosts=[0, 1, 1], run_id="hostile",
                    late_rank=2, late_ms=25, mutate=_hostile).run_dir


def _terminal_safe(text: str, color: bool = False) -> None:
    if color:
        text = _SGR.sub("", text)
    assert not _CONTROL.search(text), repr(_CONTROL.search(text).group(0))
    assert max(len(ln) for ln in text.splitlines()) < 400


@pytest.mark.timeout(60)
@pytest.mark.parametrize("color", ["never", "always"])
def test_terminal_summary_escapes_and_bounds_every_name(hostile_run, tmp_path, color):
    rc, out, err = run_cli(["report", hostile_run, "--no-progress", "--color", color, "--json", tmp_path / "r.json"])
    assert rc == 0, err
    _terminal_safe(out, color == "always")
    _terminal_safe(err)
    plain = _SGR.sub("", out)
    assert sum(ln.startswith("Verdict:") for ln in plain.splitlines()) == 1  # the forged one is not a line
    assert "aten::mm\\x1b]0;TITLE\\x07\\nVerdict: No straggler" in plain  # visible as text
    assert "node\\x1b]0;TITLE\\x07\\r\\n1" in plain and "run\\x1b[2J" in plain
    assert "disk\\x1b]0;TITLE\\x07\\nVerdict" in err  # the recorded error, in a warning line
    assert "L" * 500 not in plain  # the 5,000-character annotation is shortened
    rep = json.loads((tmp_path / "r.json").read_text())  # report.json keeps every name exactly
    assert rep["run"]["id"] == RUN_ID and HOST in rep["run"]["hosts"].values()
    assert OP in {op["name"] for rc_ in rep["root_cause"] for op in rc_["ops"]}
    assert ANNOTATION in {a["name"] for a in rep["annotations"]}


@pytest.mark.timeout(60)
def test_html_escapes_the_same_names(hostile_run, tmp_path):
    rc, out, err = run_cli(["report", hostile_run, "--no-progress", "--html", tmp_path / "r.html"])
    assert rc == 0, err
    page = (tmp_path / "r.html").read_text()
    assert HTML not in page and "<script>alert" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page or "\\u003cscript\\u003ealert" in page


@pytest.mark.timeout(90)
def test_timeline_and_export_keep_names_exactly(hostile_run, tmp_path):
    rc, out, err = run_cli(["timeline", hostile_run, "-o", tmp_path / "t.json", "--no-progress"])
    assert rc == 0, err
    _terminal_safe(out)
    _terminal_safe(err)
    names = {e.get("name") for e in json.loads((tmp_path / "t.json").read_text())["traceEvents"]}
    assert OP in names and ANNOTATION in names
    rc, out, err = run_cli(["export", hostile_run, "-o", tmp_path / "k", "--no-progress"])
    assert rc == 0, err
    _terminal_safe(out)
    with gzip.open(tmp_path / "k" / "rank-2.json.gz", "rt") as fh:
        doc = json.load(fh)
    assert OP in {e.get("name") for e in doc["traceEvents"]}


@pytest.mark.timeout(60)
def test_errors_and_warnings_echoing_shard_text_are_one_safe_line(hostile_run, tmp_path):
    rc, out, err = run_cli(["timeline", hostile_run, "-o", tmp_path / "t.json", "--ranks", "7", "--no-progress"])
    assert rc == 2
    _terminal_safe(err)
    assert all(ln.startswith("distprof: ") for ln in err.splitlines())
