"""Pinned outputs on fixed runs (tests/golden_cases.py): report.json, the terminal summary, the timeline and the
Kineto export must not change unless a change means them to.

The expected files were first written by distprof before the per-rank rewrite (every event of every rank merged
into one table) and are what the map-over-ranks / reduce-across-ranks path reproduces: floats to 1e-6 relative,
everything else exactly. Runs with simulated clock drift are not among them: there the rewrite corrects durations for
the drift (see test_breakdown's drift test), which the merged path did not.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import math
import os
from contextlib import redirect_stdout
from pathlib import Path

import pytest
from golden_cases import CASES, EXPECTED

import distprof
from distprof.analysis.report.build import build_report
from distprof.analysis.report.model import Report
from distprof.cli import main
from distprof.render import render_console

UPDATE = os.environ.get("DISTPROF_UPDATE_GOLDEN") == "1"
RTOL = 1e-6


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    return {name: build(tmp_path_factory.mktemp(name)) for name, build in CASES.items()}


def _diff(a, b, path="") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = [f"{path}: keys {sorted(set(a) ^ set(b))}"] if set(a) != set(b) else []
        for k in sorted(set(a) & set(b)):
            out += _diff(a[k], b[k], f"{path}/{k}")
        return out
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{path}: {len(a)} items, expected {len(b)}"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in _diff(x, y, f"{path}[{i}]")]
    if isinstance(a, float) or isinstance(b, float):
        ok = isinstance(a, (int, float)) and isinstance(b, (int, float)) and math.isclose(a, b, rel_tol=RTOL,
                                                                                         abs_tol=1e-9)
        return [] if ok else [f"{path}: {a!r}, expected {b!r}"]
    return [] if a == b else [f"{path}: {a!r}, expected {b!r}"]


def _events_digest(path: Path) -> str:
    """sha256 of a trace's ``traceEvents`` (the header carries the version and the time of writing)."""
    raw = path.read_bytes()
    doc = json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
    return f"{len(doc['traceEvents'])} " + hashlib.sha256(json.dumps(doc["traceEvents"], sort_keys=True).encode()
                                                          ).hexdigest()


def _check(path: Path, got: str) -> None:
    if UPDATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(got)
        return
    assert got == path.read_text(), f"{path.name} differs from {path} (DISTPROF_UPDATE_GOLDEN=1 rewrites it)"


@pytest.mark.parametrize("name", sorted(CASES))
def test_report_and_summary(built, name):
    report = build_report(distprof.load(built[name], progress=False))
    rep = json.loads(json.dumps(report.to_json()))
    assert Report.from_json(rep).to_json() == rep, "Report.from_json(report.json) writes back something else"
    rep.pop("distprof_version")
    path = EXPECTED / name / "report.json"
    if UPDATE:
        _check(path, json.dumps(rep, indent=1, sort_keys=True) + "\n")
    else:
        want = json.loads(path.read_text())
        want.pop("distprof_version", None)
        problems = _diff(rep, want)
        assert not problems, f"{name}: {len(problems)} difference(s):\n" + "\n".join(problems[:40])
    _check(EXPECTED / name / "console.txt", render_console(report))
    if not UPDATE:  # a report read back from its JSON prints the same
        assert render_console(Report.from_json(json.loads(json.dumps(report.to_json())))) == render_console(report)


@pytest.mark.parametrize("name", sorted(CASES))
def test_timeline_and_export(built, name, tmp_path):
    with redirect_stdout(io.StringIO()):
        assert main(["timeline", str(built[name]), "-o", str(tmp_path / "t.json.gz"), "--no-progress"]) == 0
        assert main(["export", str(built[name]), "-o", str(tmp_path / "k"), "--no-progress"]) == 0
    lines = [f"timeline {_events_digest(tmp_path / 't.json.gz')}"]
    lines += [f"{p.name} {_events_digest(p)}" for p in sorted((tmp_path / "k").iterdir())]
    _check(EXPECTED / name / "outputs.sha", "\n".join(lines) + "\n")
