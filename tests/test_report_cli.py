"""report.json (build_report), the console summary and the ``distprof report`` command."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_breakdown import ddp_run

from distprof.analysis.summarize.engine import summarize_merged
from distprof.analysis.report.build import build_report
from distprof.cli import main, parse_steps
from distprof.errors import ConfigError
from distprof.render import render_console, render_json

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
    assert REQUIRED <= set(rep)
    assert rep["run"]["id"] == "test-run" and rep["run"]["world_size"] == 4
    assert rep["run"]["ranks_present"] == [0, 1, 2, 3] and rep["run"]["ranks_missing"] == []
    json.loads(render_json(rep))  # strict JSON (no NaN), plain types only
    assert len(rep["steps"]) == 12
    assert {"rank", "step", "step_ms", "compute_ms", "comm_ms", "exposed_comm_ms", "memcpy_ms", "idle_ms",
            "other_ms", "overlap_pct"} <= set(rep["steps"][0])
    top = rep["stragglers"][0]
    assert {"rank", "host", "blame_ms", "mean_lateness_ms", "late_fraction"} <= set(top)
    assert top["rank"] == 1 and top["named"]
    assert rep["straggler_info"]["named"] == [1]
    assert "threshold_ms" in rep["straggler_info"]["rule"] and rep["straggler_info"]["rule"]["text"]
    assert [rc["rank"] for rc in rep["root_cause"]] == [1]
    assert rep["root_cause"][0]["ops"][0]["name"] == "[idle]"
    assert {"rank", "comm_ms", "exposed_comm_ms", "overlap_pct"} <= set(rep["overlap"][0])
    for m in ("compute_ms", "flops", "tflops", "peak_mem_bytes", "step_ms"):
        assert {"min", "mean", "max", "max_rank", "lambda", "cv", "lb"} <= set(rep["imbalance"]["metrics"][m])
    assert rep["mfu"] == [] and "peak-tflops" in rep["mfu_note"]
    assert build_report(summarize_merged(ddp_run(2, n_steps=1)), peak_tflops=2.0)["mfu"][0]["peak_tflops"] == 2.0


def test_no_straggler_no_root_cause():
    rep = build_report(summarize_merged(ddp_run(4, n_steps=2)))
    assert rep["straggler_info"]["named"] == [] and rep["root_cause"] == []
    text = render_console(rep)
    assert "no straggler" in text


def test_console_colour_only_when_asked():
    rep = build_report(summarize_merged(ddp_run(4, n_steps=2, late_rank=3, late_ms=10)))
    plain = render_console(rep)
    assert "\x1b[" not in plain and "STRAGGLER" in plain
    assert "\x1b[" in render_console(rep, color=True)


def test_cli_report_and_json(synth_dir, tmp_path, capsys):
    out = tmp_path / "report.json"
    assert main(["report", str(synth_dir), "--json", str(out), "--no-progress"]) == 0
    text = capsys.readouterr().out
    assert "STRAGGLER" in text and "\x1b[" not in text  # captured stdout is not a TTY
    rep = json.loads(out.read_text())
    assert REQUIRED <= set(rep)
    assert rep["stragglers"][0]["rank"] == 2
    assert rep["stragglers"][0]["mean_lateness_ms"] == pytest.approx(30, rel=0.05)
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
    assert max(len(ln) for ln in lines) <= 130
    assert len(rep["overlap"]) == 1024 and len(rep["stragglers"]) == 1024


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
