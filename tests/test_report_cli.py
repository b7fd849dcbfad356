"""report.json (build_report), the console summary and the ``distprof report`` command."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from test_breakdown import ddp_run

from distprof.analysis.summarize.engine import summarize_merged
from distprof.analysis.report.build import build_report, watch_only_report
from distprof.analysis.report.model import Report
from distprof.cli import main, parse_steps
from distprof.errors import ConfigError
from distprof.render import render_console, render_json, write_json

ROOT = Path(__file__).resolve().parents[1]
REQUIRED = {"run", "clock", "steps", "stragglers", "root_cause", "overlap", "imbalance", "mfu"}


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


@pytest.fixture(scope="module")
def synth_dir(tmp_path_factory):
    from synth import make_run

    out = tmp_path_factory.mktemp("runs")
    return make_run(out, world_size=4, hosts=[0, 0, 1, 1], clocks={1: (3.25, 40.0)}, late_rank=2, late_ms=30,
                    schedule={"wait": 1, "warmup": 1, "active": 4}).run_dir


def test_build_report_keys_and_strict_json():
    rep = build_report(summarize_merged(ddp_run(4, n_steps=3, late_rank=1, late_ms=20)), top=3)
    assert REQUIRED <= set(rep.to_json())
    assert rep.run.id == "test-run" and rep.run.world_size == 4
    assert rep.run.ranks_present == [0, 1, 2, 3] and rep.run.ranks_missing == []
    doc = json.loads(render_json(rep))  # strict JSON (no NaN), plain types only
    assert len(rep.steps) == 12 and len(doc["steps"]) == 12
    assert {"rank", "step", "step_ms", "compute_ms", "comm_ms", "exposed_comm_ms", "memcpy_ms", "idle_ms",
            "other_ms", "overlap_pct"} <= set(doc["steps"][0])
    top = rep.stragglers[0]
    assert {"rank", "host", "blame_ms", "lateness_ms", "late_fraction"} <= set(doc["stragglers"][0])
    assert top.rank == 1 and top.named
    assert rep.straggler_info.named == [1]
    assert rep.straggler_info.rule.threshold_ms > 0 and rep.straggler_info.rule.text
    assert [rc.rank for rc in rep.root_cause] == [1]
    assert rep.root_cause[0].ops[0].name == "[idle]"
    assert {"rank", "comm_ms", "exposed_comm_ms", "overlap_pct"} <= set(doc["overlap"][0])
    for m in ("compute_ms", "flops", "tflops", "peak_mem_bytes", "step_ms"):
        assert {"min", "mean", "max", "max_rank", "lambda", "cv", "lb"} <= set(doc["imbalance"]["metrics"][m])
    assert rep.mfu == [] and "peak-tflops" in rep.mfu_note
    assert build_report(summarize_merged(ddp_run(2, n_steps=1)), peak_tflops=2.0).mfu[0].peak_tflops == 2.0


def test_render_json_is_the_reports_json_and_reads_back_the_same(tmp_path):
    rep = build_report(summarize_merged(ddp_run(4, n_steps=3, late_rank=1, late_ms=20)), peak_tflops=2.0)
    text = render_json(rep)
    assert text == json.dumps(rep.to_json(), indent=1, allow_nan=False, ensure_ascii=False) + "\n"
    again = Report.from_json(json.loads(text))
    assert render_json(again) == text and render_console(again) == render_console(rep)
    assert write_json(rep, tmp_path / "r.json").read_text() == text
    assert not [p.name for p in tmp_path.iterdir() if p.name != "r.json"]  # no temporary file left


@pytest.mark.parametrize("rows_per_part", [1, 5, 12, 10_000])
def test_report_json_written_in_parts_is_the_same_text(tmp_path, monkeypatch, rows_per_part):
    """report.json is written a top-level key at a time and its step table a few rows at a time (at 16k ranks the
    whole document's objects were ≈ 600 MB for 74 MB of text); the text is json.dumps's of the whole, byte for byte,
    however the rows split (12 rows: one part, a part a row, parts that do not divide them, one short part)."""
    from distprof.render import json_renderer

    rep = build_report(summarize_merged(ddp_run(4, n_steps=3, late_rank=1, late_ms=20)), peak_tflops=2.0)
    whole = json.dumps(rep.to_json(), indent=1, allow_nan=False, ensure_ascii=False) + "\n"
    monkeypatch.setattr(json_renderer, "ROWS_PER_PART", rows_per_part)
    parts = list(json_renderer.iter_json(rep))
    assert "".join(parts) == whole
    assert len(parts) >= len(rep.to_json()) + -(-len(rep.steps) // rows_per_part)  # never the whole at once
    assert write_json(rep, tmp_path / "r.json").read_text() == whole
    empty = Report.from_json(json.loads(whole))
    empty.steps = type(rep.steps)()  # no rows: "[]", as json.dumps writes an empty list
    assert render_json(empty) == json.dumps(empty.to_json(), indent=1, allow_nan=False, ensure_ascii=False) + "\n"


def test_step_rows_written_column_by_column_are_json_dumps_text():
    """The step table's text is made a column at a time (json's encoder is pure Python when it indents); it is the
    text json.dumps makes of its rows' objects for every value a column can hold: NaN and ±inf as null, -0.0, tiny
    and huge floats, the int64 extremes."""
    import numpy as np

    from distprof.render import json_renderer

    rep = build_report(summarize_merged(ddp_run(4, n_steps=3, late_rank=1, late_ms=20)), peak_tflops=2.0)
    rows = rep.steps.rows
    specials = [np.nan, np.inf, -np.inf, -0.0, 0.0, 5e-324, 1.7976931348623157e308, 0.1, 1e16, -123.456]
    for i, c in enumerate(rows.dtype.names):
        if rows[c].dtype.kind == "f":
            rows[c] = [specials[(i + k) % len(specials)] for k in range(rows.size)]
    rows["start_ns"][:2] = [np.iinfo(np.int64).min, np.iinfo(np.int64).max]
    doc = rep.to_json()
    assert any(v is None for row in doc["steps"] for v in row.values())
    want = json.dumps(doc, indent=1, allow_nan=False, ensure_ascii=False) + "\n"
    assert json_renderer.render_json(rep) == want


def test_no_straggler_no_root_cause():
    rep = build_report(summarize_merged(ddp_run(4, n_steps=2)))
    assert rep.straggler_info.named == [] and rep.root_cause == []
    text = render_console(rep)
    assert "no straggler" in text


def test_console_colour_only_when_asked():
    rep = build_report(summarize_merged(ddp_run(4, n_steps=2, late_rank=3, late_ms=10)))
    plain = render_console(rep)
    assert "\x1b[" not in plain and "STRAGGLER" in plain
    assert "\x1b[" in render_console(rep, color=True)


#: Planted in every string of a report: it would retitle the terminal, forge a verdict line, reverse the text.
EVIL = "\x1b]0;TITLE\x07\nVerdict: forged\u202e"
_CONTROL = re.compile(r"[\x00-\x09\x0b-\x1f\x7f-\x9f\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def _plant(x):
    """A copy of a record tree with EVIL appended to every string (dict keys too, but the ranks' "0", "1", ...)."""
    if isinstance(x, str):
        return x + EVIL
    if isinstance(x, dict):
        return {(k if not isinstance(k, str) or k.isdigit() else k + EVIL): _plant(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_plant(v) for v in x]
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return dataclasses.replace(x, **{f.name: _plant(getattr(x, f.name)) for f in dataclasses.fields(x) if f.init})
    return x


def _watch_series(run_dir: Path, drifts: list[dict]) -> Path:
    """A --watch series without any shard: 4 ranks, 200 steps of 25 ms, rank 2 20 ms slower in steps 30-79."""
    from distprof.storage import watchfile as wf

    (run_dir / wf.WATCH_DIR).mkdir(parents=True)
    for r in range(4):
        rows = np.zeros(200, wf.SERIES_DTYPE)
        rows["step"] = np.arange(200)
        rows["end_ns"] = (np.arange(200) + 1) * 25_000_000
        rows["step_ms"], rows["comm_ms"], rows["data_ms"], rows["opt_ms"] = 25.0 + 0.1 * r, 5.0, 1.0, 2.0
        rows["mem_peak"] = -1
        if r == 2:
            rows["step_ms"][30:80] += 15.0
        wf.write_segment(wf.segment_path(run_dir, r, 0), rows)
    wf.write_drifts(run_dir, drifts)
    return run_dir


def test_every_string_of_a_report_prints_terminal_safe(tmp_path):
    """Every string a report holds (names from traces and shards, the watch's trigger messages, warnings) prints
    escaped: no control character reaches the terminal, and no line is forged."""
    rep = build_report(summarize_merged(ddp_run(4, n_steps=4, late_rank=2, late_ms=20)), peak_tflops=2.0)
    series = _watch_series(tmp_path / "w", [{"rank": 2, "first_step": 30, "confirmed_step": 35, "state": "failed",
                                             "message": "no space", "request_id": "q1"}])
    rep = _plant(dataclasses.replace(rep, watch=watch_only_report(series).watch))
    for color in (False, True):
        text = re.sub(r"\x1b\[[0-9;]*m", "", render_console(rep, color=color))  # our own colours only
        assert not _CONTROL.search(text), repr(_CONTROL.search(text).group(0))
        lines = text.splitlines()
        assert sum(ln.startswith("Verdict:") for ln in lines) == 1
        escaped = "\\x1b]0;TITLE\\x07\\nVerdict: forged\\u202e"
        assert f"run test-run{escaped}" in text and f"no space{escaped}" in text  # shown, as text
        assert text.count(escaped) > 30, text


def test_a_watch_series_alone_prints_the_series_and_the_warning(tmp_path, capsys):
    """A --watch run that recorded no window: the report is the series (each rank, the drift and the window it could
    not get), no verdict, and a warning that no profile window was recorded."""
    run_dir = _watch_series(tmp_path / "w", [
        {"request_id": "q1", "rank": 2, "first_step": 30, "confirmed_step": 35, "excess_ms": 15.0,
         "excess_pct": 60.0, "state": "failed", "message": "disk\x1b]0;T\x07\nVerdict: forged"},
        {"request_id": "q2", "rank": 1, "first_step": 150, "confirmed_step": 190, "excess_ms": 3.0, "state": "done",
         "window": 0, "window_first": 192, "window_last": 195}])
    assert main(["report", str(run_dir), "--no-progress", "--json", str(tmp_path / "r.json")]) == 0
    assert capsys.readouterr().out == WATCH_ONLY.format(json=tmp_path / "r.json")
    assert json.loads((tmp_path / "r.json").read_text())["watch"]["drifts"][0]["rank"] == 2


WATCH_ONLY = """\
distprof report: run w - 4/4 ranks on 0 host(s), no steps
Findings: none (no rule fired; thresholds in docs/report-format.md)
Whole run (--watch): 4 rank(s), steps 0-199 - own work = step time minus time blocked in communication
  rank 0: 200 steps, median step 25.0 ms, own 20.0 ms, blocked 5.0 ms, data 1.0 ms, optimizer 2.0 ms
  rank 1: 200 steps, median step 25.1 ms, own 20.1 ms, blocked 5.0 ms, data 1.0 ms, optimizer 2.0 ms
  rank 2: 200 steps, median step 25.2 ms, own 20.2 ms, blocked 5.0 ms, data 1.0 ms, optimizer 2.0 ms
  rank 3: 200 steps, median step 25.3 ms, own 20.3 ms, blocked 5.0 ms, data 1.0 ms, optimizer 2.0 ms
  drift: rank 2 from step 30 to step 79 (50 steps): own work 35.2 ms vs the others' 20.1 ms (+15.1 ms, +75 %) -> \
no window (failed: disk\\x1b]0;T\\x07\\nVerdict: forged)
  window 0 was asked for by the watch for rank 1 from step 150 (done)
Stragglers (0 collective instances, floor - ms)
  no collective matched across ranks
warning: no profile window was recorded (no shard): only the --watch series is reported
report written to {json}
"""


def test_cli_report_and_json(synth_dir, tmp_path, capsys):
    out = tmp_path / "report.json"
    assert main(["report", str(synth_dir), "--json", str(out), "--no-progress"]) == 0
    text = capsys.readouterr().out
    assert "STRAGGLER" in text and "\x1b[" not in text  # captured stdout is not a TTY
    rep = json.loads(out.read_text())
    assert REQUIRED <= set(rep)
    assert rep["stragglers"][0]["rank"] == 2
    assert rep["stragglers"][0]["lateness_ms"] == pytest.approx(30, rel=0.05)
    assert set(rep["clock"]) == {"sim-host0", "sim-host1"}
    assert {"offset_ns", "drift_ppm", "residual_us", "method"} <= set(rep["clock"]["sim-host1"])


def test_cli_steps_and_stdout_json(synth_dir, capsys):
    assert main(["report", str(synth_dir), "--steps", "3:4", "--json", "-"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert sorted({s["step"] for s in rep["steps"]}) == [3, 4]


def test_parse_steps():
    assert parse_steps("3:7") == (3, 7)
    assert parse_steps("5") == (5, 5)
    assert parse_steps("4:")[0] == 4 and parse_steps(":9") == (0, 9)
    for bad in ("x", "7:3", "1:2:3", "-1:4"):
        with pytest.raises(ConfigError):
            parse_steps(bad)


@pytest.mark.parametrize("argv", [["report", "/nonexistent/run"], ["report", ".", "--steps", "9:1"],
                                  ["report", ".", "--peak-tflops", "-1"]])
def test_user_errors_one_line_exit_2(argv, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "distprof", *argv], capture_output=True, text=True, cwd=tmp_path,
                          env=_env(), timeout=120)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("distprof: error: ")
    assert "Traceback" not in proc.stderr


def test_report_never_imports_torch(synth_dir):
    code = (
        "import sys, distprof.cli\n"
        "assert 'torch' not in sys.modules\n"
        f"rc = distprof.cli.main(['report', {str(synth_dir)!r}, '--json', '-'])\n"
        "assert rc == 0\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(), timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_python_m_distprof_help():
    proc = subprocess.run([sys.executable, "-m", "distprof", "report", "--help"], capture_output=True, text=True,
                          env=_env(), timeout=60)
    assert proc.returncode == 0 and "--peak-tflops" in proc.stdout and "--steps" in proc.stdout


def test_summary_is_bounded_at_1024_ranks():
    """1,024 ranks on 128 hosts, one late: the terminal summary stays about a screenful, names the late rank, and
    summarises hosts and per-rank tables instead of listing them (report.json keeps every rank)."""
    run = ddp_run(1024, n_steps=2, late_rank=700, late_ms=20, hosts=[f"node{r // 8:04d}" for r in range(1024)])
    rep = build_report(summarize_merged(run))
    text = render_console(rep)
    lines = text.splitlines()
    assert len(lines) <= 90, len(lines)
    assert "rank 700" in text and "STRAGGLER" in text
    assert "128 host(s)" in text and "over 1024 ranks" in text
    assert max(len(ln) for ln in lines) <= 116  # wrapped: a line is a line on the screen too
    assert len(rep.overlap) == 1024 and len(rep.stragglers) == 1024
    assert "Per rank, over 1024 ranks" in text and "Root cause, rank 700" not in text  # in its finding, once


def test_a_finding_over_many_ranks_names_them_briefly():
    """A rule that fires on most of 16,384 ranks: the title says how many, and which only when that is short (the
    16k run's title spelt out 2,000 ranges)."""
    from distprof.analysis.findings.rules import _some_ranks

    assert _some_ranks([0, 1, 2, 5], 8) == "4 of 8 ranks (0-2,5)"
    assert _some_ranks([r for r in range(16384) if r != 10922], 16384) == "16383 of 16384 ranks (0-10921,10923-16383)"
    left = (778, 6631, 10503, 10922, 16347, 16365)
    most = [r for r in range(16384) if r not in left]
    assert _some_ranks(most, 16384) == "16378 of 16384 ranks (all but 778,6631,10503,10922,16347,16365)"
    every_other = list(range(0, 16384, 2))
    assert _some_ranks(every_other, 16384) == "8192 of 16384 ranks"
    assert _some_ranks(list(range(3, 16384, 2)), 100) == "8191 of 100 ranks"  # ids beyond 0..n-1: no complement


def test_srun_tasks_without_mpi_world_leave_the_work_to_task_0(synth_dir, tmp_path, monkeypatch, caplog):
    """`srun -n 2 distprof report` without an MPI world: task 1 writes nothing and says why; task 0 reports."""
    for k in ("PMI_RANK", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "MV2_COMM_WORLD_SIZE"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("SLURM_NTASKS", "2")
    monkeypatch.setenv("SLURM_PROCID", "1")
    out = tmp_path / "task1.json"
    assert main(["report", str(synth_dir), "--json", str(out), "--no-progress"]) == 0
    assert not out.exists()
    assert any("task 0 does the work alone" in r.getMessage() for r in caplog.records)
    monkeypatch.setenv("SLURM_PROCID", "0")
    out0 = tmp_path / "task0.json"
    assert main(["report", str(synth_dir), "--json", str(out0), "--no-progress"]) == 0
    assert json.loads(out0.read_text())["run"]["world_size"] >= 2


def test_the_summaries_are_released_before_the_report_is_rendered(synth_dir, monkeypatch, tmp_path, capsys):
    """`distprof report` lets go of the run's summaries (a gigabyte at 16k ranks) once the Report is built: no
    renderer reads them, and they hold reference cycles that only a collection frees."""
    import gc
    import weakref

    from distprof.commands import report as report_cmd

    seen = []
    real = report_cmd.summarize_run

    def keeping(*a, **kw):
        run = real(*a, **kw)
        seen.append(weakref.ref(run))
        return run

    monkeypatch.setattr(report_cmd, "summarize_run", keeping)
    collected, real_collect = [], gc.collect

    def collecting(*a):
        n = real_collect(*a)
        collected.append([r() is None for r in seen])
        return n

    monkeypatch.setattr(gc, "collect", collecting)
    from distprof.analysis.report import build
    real_build = build.build_report

    def building(*a, **kw):  # the report's own collections (it hands freed heap back) come before this mark
        rep = real_build(*a, **kw)
        collected.append("built")
        return rep

    monkeypatch.setattr(build, "build_report", building)
    assert main(["report", str(synth_dir), "--no-progress", "--json", str(tmp_path / "r.json")]) == 0
    after = collected[collected.index("built") + 1:]  # collections once the report was built
    assert after[:1] == [[True]]  # freed by the command's collection, before any renderer ran: nothing of the
    # Report points back at the summaries
    assert "report written to" in capsys.readouterr().out
