"""The launcher: argv, exit codes and exceptions pass through, options and env vars, never hurting training."""

from __future__ import annotations

import json
import shutil
import textwrap

import pytest

from conftest import EXAMPLES, job_env, only_run_dir, python, torchrun
from distprof.config import ProfileConfig, config_from_mapping
from distprof.errors import ConfigError
from distprof.launch import config_from_args, get_args_parser
from distprof.storage import find_shards, read_shard

SCHED = ["--wait", "1", "--warmup", "1", "--active", "2"]


def write(tmp_path, name, body):
    p = tmp_path / name
    p.write_text(textwrap.dedent(body))
    return p


TRAIN = textwrap.dedent("""
    import sys, torch
    model = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for i in range(int(sys.argv[1])):
        loss = model(torch.randn(4, 8)).sum()
        loss.backward(); opt.step(); opt.zero_grad()
""")


def test_script_argv_and_main(tmp_path):
    script = write(tmp_path, "show.py", """
        import sys
        print("ARGV", sys.argv, __name__)
    """)
    proc = python(["-m", "distprof.launch", "--out", "o", str(script), "--lr", "0.5", "pos"], cwd=tmp_path)
    assert f"ARGV ['{script}', '--lr', '0.5', 'pos'] __main__" in proc.stdout


@pytest.mark.slow
def test_exit_code_passes_through(tmp_path):
    script = write(tmp_path, "exit3.py", TRAIN + "sys.exit(3)\n")
    proc = python(["-m", "distprof.launch", "--out", "o", *SCHED, str(script), "6"], cwd=tmp_path, check=False)
    assert proc.returncode == 3
    # the window finished before the exit and was written
    assert len(find_shards(only_run_dir(tmp_path / "o"))) == 1


@pytest.mark.slow
def test_exception_passes_through(tmp_path):
    script = write(tmp_path, "boom.py", TRAIN + "raise ValueError('user bug 42')\n")
    proc = python(["-m", "distprof.launch", "--out", "o", *SCHED, str(script), "6"], cwd=tmp_path, check=False)
    assert proc.returncode == 1
    assert "ValueError: user bug 42" in proc.stderr
    assert proc.stderr.count("Traceback") == 1


@pytest.mark.slow
def test_worker_failure_reaches_torchrun(tmp_path):
    script = write(tmp_path, "fail.py", """
        import os, sys
        if os.environ["RANK"] == "1":
            raise RuntimeError("rank one failed on purpose")
    """)
    proc = torchrun(2, ["-m", "distprof.launch", "--out", "o", str(script)], cwd=tmp_path, check=False)
    assert proc.returncode != 0
    assert "rank one failed on purpose" in proc.stderr
    assert "ChildFailedError" in proc.stderr or "Failures:" in proc.stderr


@pytest.mark.slow
def test_short_job_writes_partial_window(tmp_path):
    # 3 iterations: steps 2 (recorded) and the in-progress step 3; window cut short at exit
    script = write(tmp_path, "short.py", TRAIN)
    proc = python(["-m", "distprof.launch", "--out", "o", "--wait", "1", "--warmup", "1", "--active", "4",
                   str(script), "3"], cwd=tmp_path)
    (shard,) = [read_shard(p) for p in find_shards(only_run_dir(tmp_path / "o"))]
    assert not shard.attrs["complete"]
    assert 2 in shard.attrs["steps_covered"]
    assert "wrote 1 shard(s)" in proc.stderr


@pytest.mark.slow
@pytest.mark.parametrize("init, watch", [("store=dist.HashStore()", []), ("init_method='tcp://127.0.0.1:0'", []),
                                         ("store=dist.HashStore()", ["--watch"])])
def test_one_process_making_its_own_group_keeps_one_run_directory(tmp_path, init, watch):
    """One process (no torchrun) whose script makes a 1-rank group after distprof claimed its run directory: the
    group's agreement takes that directory, not a second one (it used to claim '<id>.2', say so, and write to
    '<id>'); run twice with one run id, the second job gets '<id>.2' and its shard. With --watch its side thread asks
    for the directory while the group forms (it used to claim a second one then)."""
    script = write(tmp_path, "own_group.py", "import torch.distributed as dist\n"
                   f"dist.init_process_group('gloo', {init}, rank=0, world_size=1)\n" + TRAIN
                   + "dist.destroy_process_group()\n")
    for n, name in ((1, "job"), (2, "job.2")):
        proc = python(["-m", "distprof.launch", "--out", "o", "--run-id", "job", *watch, *SCHED, str(script), "6"],
                      cwd=tmp_path)
        assert sorted(p.name for p in (tmp_path / "o").iterdir()) == ["job", "job.2"][:n], proc.stderr
        assert [p.parent.name for p in find_shards(tmp_path / "o" / name)] == [name]
        assert f"wrote 1 shard(s) to o/{name}" in proc.stderr.replace(str(tmp_path) + "/", ""), proc.stderr
        assert proc.stderr.count("already belongs to another job") == (n - 1) * 2, proc.stderr  # warning + closing


@pytest.mark.slow
def test_too_few_steps_says_so(tmp_path):
    script = write(tmp_path, "tiny.py", TRAIN)
    proc = python(["-m", "distprof.launch", "--out", "o", str(script), "1"], cwd=tmp_path)
    assert "no window was recorded" in proc.stderr


@pytest.mark.slow
def test_no_optimizer_is_told_to_step_manually(tmp_path):
    """step_on=optimizer on a loop without torch.optim: one line saying what to do, not "too few steps"."""
    script = write(tmp_path, "infer.py", """
        import torch
        w = torch.randn(32, 32)
        for i in range(12):
            (w @ w).sum()
    """)
    proc = python(["-m", "distprof.launch", "--out", "o", *SCHED, str(script)], cwd=tmp_path)
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("distprof:")]
    assert len(lines) == 1, proc.stderr
    assert "no optimizer step" in lines[0] and "--step-on manual" in lines[0] and "distprof.step()" in lines[0]
    assert "fewer steps" not in proc.stderr


#: The script replaces the (checked, empty) --out directory with a file once the profiler has started: creating the
#: run directory fails at the first window (--no-trigger: nothing makes it earlier). A bad --out given from the start is
#: refused before training instead (distprof.launch, capture.rundir.check_out).
BLOCK_OUT = "import os\nos.rmdir('blocked')\nopen('blocked', 'w').write('not a directory')\n"


@pytest.mark.slow
def test_profiler_failure_does_not_hurt_training(tmp_path):
    (tmp_path / "blocked").mkdir()
    script = write(tmp_path, "ok.py", BLOCK_OUT + TRAIN + "print('TRAINING DONE')\n")
    proc = python(["-m", "distprof.launch", "--out", "blocked", "--no-trigger", *SCHED, str(script), "6"],
                  cwd=tmp_path)
    assert proc.returncode == 0 and "TRAINING DONE" in proc.stdout
    warnings = [ln for ln in proc.stderr.splitlines() if "distprof: rank 0:" in ln]
    assert len(warnings) == 1 and "training goes on" in warnings[0]


@pytest.mark.slow
def test_strict_raises(tmp_path):
    (tmp_path / "blocked").mkdir()
    script = write(tmp_path, "ok.py", BLOCK_OUT + TRAIN + "print('TRAINING DONE')\n")
    proc = python(["-m", "distprof.launch", "--out", "blocked", "--no-trigger", "--strict", *SCHED, str(script), "6"],
                  cwd=tmp_path, check=False)
    assert proc.returncode != 0
    assert "distprof (strict mode)" in proc.stderr
    assert "TRAINING DONE" not in proc.stdout


@pytest.mark.slow
def test_env_vars_configure_and_flags_win(tmp_path):
    script = write(tmp_path, "t.py", TRAIN)
    env = job_env(DISTPROF_OUT="envout", DISTPROF_ACTIVE="3", DISTPROF_WAIT="0", DISTPROF_WARMUP="1",
                  DISTPROF_RUN_ID="fromenv", DISTPROF_FLOPS="0", DISTPROF_CODEC="gzip")
    python(["-m", "distprof.launch", "--active", "2", str(script), "6"], cwd=tmp_path, env=env)
    (shard,) = [read_shard(p) for p in find_shards(tmp_path / "envout" / "fromenv")]
    cfg = shard.attrs["config"]
    assert cfg["schedule"]["active"] == 2 and cfg["schedule"]["wait"] == 0
    assert cfg["flops"] is False and cfg["codec"] == "gzip"
    assert shard.attrs["steps_covered"] == [1, 2]
    assert shard.attrs["codec"] == "gzip"


def test_help_documents_every_option():
    text = get_args_parser().format_help()
    for flag in ("--out", "--run-id", "--wait", "--warmup", "--active", "--repeat", "--skip-first", "--flops",
                 "--no-flops", "--memory", "--no-memory", "--shapes", "--stack", "--step-on", "--strict", "--codec",
                 "DISTPROF_"):
        assert flag in text, flag


def test_bad_option_is_one_line(tmp_path):
    script = write(tmp_path, "t.py", TRAIN)
    proc = python(["-m", "distprof.launch", "--active", "0", str(script), "6"], cwd=tmp_path, check=False)
    assert proc.returncode == 2
    assert "active=0 (need >= 1)" in proc.stderr and "Traceback" not in proc.stderr
    env = job_env(DISTPROF_FLOPS="maybe")
    proc = python(["-m", "distprof.launch", str(script), "6"], cwd=tmp_path, env=env, check=False)
    assert proc.returncode == 2 and "DISTPROF_FLOPS='maybe'" in proc.stderr


def test_config_precedence_unit():
    args = get_args_parser().parse_args(["--warmup", "4", "train.py", "--warmup", "9"])
    cfg = config_from_args(args)
    assert cfg.schedule.warmup == 4 and args.script_args == ["--warmup", "9"]
    cfg = config_from_mapping({"active": None}, environ={"DISTPROF_ACTIVE": "7", "DISTPROF_STEP_ON": "manual"})
    assert cfg.schedule.active == 7 and cfg.step_on == "manual"
    assert config_from_mapping({}, environ={}) == ProfileConfig()
    with pytest.raises(ConfigError, match="step_on='sometimes'"):
        config_from_mapping({"step_on": "sometimes"}, environ={})


@pytest.mark.slow
def test_status_file_records_windows(tmp_path):
    script = write(tmp_path, "t.py", TRAIN)
    python(["-m", "distprof.launch", "--out", "o", "--wait", "0", "--warmup", "1", "--active", "2", "--repeat", "2",
            str(script), "8"], cwd=tmp_path)
    run = only_run_dir(tmp_path / "o")
    status = json.loads((run / "rank00000.status.json").read_text())
    assert [w["steps"] for w in status["windows"]] == [[1, 2], [4, 5]]
    assert [read_shard(p).attrs["window"] for p in find_shards(run)] == [0, 1]


@pytest.mark.slow
def test_manual_steps_under_the_launcher(tmp_path):
    script = write(tmp_path, "manual.py", """
        import torch, distprof
        w = torch.randn(32, 32)
        for i in range(6):
            (w @ w).sum()
            distprof.step()
    """)
    python(["-m", "distprof.launch", "--out", "o", "--step-on", "manual", *SCHED, str(script)], cwd=tmp_path)
    (shard,) = [read_shard(p) for p in find_shards(only_run_dir(tmp_path / "o"))]
    assert shard.attrs["steps_covered"] == [2, 3]
    names = set(shard.names[shard.table("events", ["name_id"])["name_id"]])
    assert "aten::mm" in names


def test_api_rejects_unknown_options():
    import distprof

    with pytest.raises(ConfigError, match="unknown option.*actve"):
        distprof.profile(actve=3)


# ---- module launch (-m), as python -m and torchrun -m run a module ---------------------------------------------------
SHOW = """
import sys
from . import helper
print("SHOW", __name__, __package__, sys.argv[1:], helper.VALUE, sys.argv[0].endswith({file!r}))
"""


def make_package(tmp_path):
    """tmp_path/showpkg: a package whose modules import each other relatively, with a __main__."""
    pkg = tmp_path / "showpkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "helper.py").write_text("VALUE = 'relative-import-ok'\n")
    (pkg / "__main__.py").write_text(SHOW.format(file="__main__.py"))
    (pkg / "show.py").write_text(SHOW.format(file="show.py"))
    return pkg


@pytest.mark.parametrize("module", ["showpkg", "showpkg.show"])
def test_module_runs_as_python_m_runs_it(tmp_path, module):
    """-m pkg / -m pkg.mod: what the module sees (__name__, __package__, argv, relative imports) is what python -m
    gives it."""
    make_package(tmp_path)
    plain = python(["-m", module, "--lr", "0.5", "pos"], cwd=tmp_path, env=job_env(PYTHONPATH=""))
    proc = python(["-m", "distprof.launch", "--out", "o", "--no-trigger", "-m", module, "--lr", "0.5", "pos"],
                  cwd=tmp_path)
    shown = [ln for ln in proc.stdout.splitlines() if ln.startswith("SHOW")]
    assert shown == [ln for ln in plain.stdout.splitlines() if ln.startswith("SHOW")], (proc.stdout, plain.stdout)
    assert shown == ["SHOW __main__ showpkg ['--lr', '0.5', 'pos'] relative-import-ok True"], shown


@pytest.mark.parametrize("args, message", [
    (["-m", "nosuchpkg.train"], "no module named 'nosuchpkg': looked on sys.path (the current directory"),
    (["-m", "showpkg.nosuch"], "no module named 'showpkg.nosuch': looked in the package showpkg ("),
    (["-m", "showpkg.helper.x"], "'showpkg.helper' ("),
    (["-m", "emptypkg"], "'emptypkg' is a package without a __main__.py"),
    (["-m", "bad-name"], "module name 'bad-name' is not a dotted Python name"),
    (["showpkg.show"], "to run the module showpkg.show, put -m before it"),
    (["missing.py"], "script 'missing.py' not found (looked for the file "),
])
def test_wrong_target_is_one_line(tmp_path, args, message):
    make_package(tmp_path)
    (tmp_path / "emptypkg").mkdir()
    (tmp_path / "emptypkg" / "__init__.py").write_text("raise SystemExit('the package must not be imported')\n")
    proc = python(["-m", "distprof.launch", "--out", "o", *args], cwd=tmp_path, check=False)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], proc.stderr
    assert not (tmp_path / "o").exists()


def test_help_shows_both_forms_and_one_default_per_option():
    text = get_args_parser().format_help()
    assert "[distprof options] train.py [script args]" in text
    assert "[distprof options] -m pkg.module [script args]" in text
    assert "(default:" not in text
    assert "[zstd]" in text and "[5]" in text  # the defaults, once each, in brackets


def test_module_flag_after_the_target_belongs_to_the_script():
    args = get_args_parser().parse_args(["--active", "3", "-m", "pkg.train", "-m", "x", "--out", "y"])
    assert (args.module, args.script, args.script_args) == (True, "pkg.train", ["-m", "x", "--out", "y"])
    assert config_from_args(args).out == "distprof"  # --out after the target is the script's


@pytest.mark.slow
def test_module_under_torchrun_keeps_exit_code_and_records(tmp_path):
    """torchrun -m distprof.launch -m pkgtrain.train: the package's relative imports work on every rank, its exit code
    reaches torchrun, and both ranks' shards are written."""
    shutil.copytree(EXAMPLES / "pkgtrain", tmp_path / "pkgtrain")
    proc = torchrun(2, ["-m", "distprof.launch", "--out", "o", *SCHED, "-m", "pkgtrain.train", "--steps", "6",
                        "--exit-code", "3"], cwd=tmp_path, check=False)
    assert proc.returncode != 0 and "exitcode  : 3" in proc.stderr, proc.stderr[-3000:]
    assert "pkgtrain: __name__=__main__ __package__=pkgtrain" in proc.stdout, proc.stdout
    shards = [read_shard(p) for p in find_shards(only_run_dir(tmp_path / "o"))]
    assert sorted(s.rank for s in shards) == [0, 1]


# ---- a script that fails before training ----------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("body, why", [("raise RuntimeError('broken before training')\n", "RuntimeError"),
                                       ("import no_such_module_here\n", "ModuleNotFoundError"),
                                       ("import sys\nsys.exit(5)\n", "exit code 5")])
def test_script_failing_before_training_gets_no_step_hint(tmp_path, body, why):
    """No "no optimizer step" guess before the traceback: one line that the script failed, and the run directory the
    single process made is marked failed (its status file holds why)."""
    script = write(tmp_path, "fails.py", body)
    proc = python(["-m", "distprof.launch", "--out", "o", str(script)], cwd=tmp_path, check=False)
    assert proc.returncode == (5 if "exit" in why else 1), proc.stderr
    assert "optimizer" not in proc.stderr and "--step-on" not in proc.stderr, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("distprof:")]
    assert lines == [f"distprof: nothing was recorded: the script failed before its first step ({why})"], proc.stderr
    run = only_run_dir(tmp_path / "o")
    assert not find_shards(run)
    status = json.loads((run / "rank00000.status.json").read_text())
    assert status["script_error"].startswith(why) and status["iterations"] == 0, status


@pytest.mark.slow
def test_script_failing_after_init_under_torchrun(tmp_path):
    """Both ranks fail after init_process_group (the run directory exists): no step hint on any rank, and every
    rank's status file is marked."""
    script = write(tmp_path, "fails.py", """
        import torch.distributed as dist
        dist.init_process_group("gloo")
        raise RuntimeError("model build failed")
    """)
    proc = torchrun(2, ["-m", "distprof.launch", "--out", "o", str(script)], cwd=tmp_path, check=False)
    assert proc.returncode != 0 and "model build failed" in proc.stderr
    assert "optimizer step" not in proc.stderr, proc.stderr
    run = only_run_dir(tmp_path / "o")
    for r in (0, 1):
        status = json.loads((run / f"rank{r:05d}.status.json").read_text())
        assert status["script_error"] == "RuntimeError: model build failed", status
    rep = python(["-m", "distprof", "report", str(run)], cwd=tmp_path, check=False)
    assert rep.returncode != 0 and "Traceback" not in rep.stderr, rep.stderr
    assert rep.stderr.strip().splitlines() == [
        f"distprof: error: {run}: no shard: the job failed before a window was recorded (rank 0: the script ended "
        "with RuntimeError: model build failed after 0 step(s)); nothing to analyse"], rep.stderr


# ---- the profiler's lifecycle (ProfilerState) -----------------------------------------------------------------------
@pytest.mark.slow
def test_profiler_states_and_steps_outside_the_run(tmp_path, caplog):
    """NEW -> RUNNING -> DISABLED (a step that fails stops profiling, training goes on) -> CLOSING -> CLOSED; a step()
    before start() or after close() is ignored with one warning, and is no failure."""
    import torch

    from distprof.capture.profiler import ProfilerState, RankProfiler
    from distprof.config import ScheduleConfig, TriggerConfig

    cfg = ProfileConfig(out=str(tmp_path), run_id="states", step_on="manual", trigger=TriggerConfig(enabled=False),
                        schedule=ScheduleConfig(wait=0, warmup=1, active=3))
    p = RankProfiler(cfg)
    p.step()
    p.step()
    assert (p._state, p.step_num, p.errors) == (ProfilerState.NEW, 0, [])
    assert [r.getMessage() for r in caplog.records].count(
        "distprof: rank 0: step() called before the profiler started (start() or `with`); ignored") == 1
    p.start()
    assert p._state is ProfilerState.RUNNING
    torch.ones(4).sum()
    p.step()
    assert p.step_num == 1

    def broken_step():
        raise RuntimeError("torch profiler broke")

    p._prof.step = broken_step
    p.step()  # training goes on: one warning, profiling stops
    assert p._state is ProfilerState.DISABLED and p.errors[0]["stage"] == "step", p.errors
    p.step()
    assert p.step_num == 2 and len(p.errors) == 1  # the failed step counted; later ones ignored
    p.close()
    assert p._state is ProfilerState.CLOSED
    p.step()
    p.close()
    assert p._state is ProfilerState.CLOSED and len(p.errors) == 1
    assert "profiling stops" in caplog.text and "torch profiler broke" in p.closing_line()


@pytest.mark.slow
def test_shell_launcher_runs_a_module(tmp_path):
    """NPROC=2 launch/torchrun.sh -m pkgtrain: the package's __main__ on both ranks, options from DISTPROF_*."""
    import subprocess

    from conftest import ROOT, require_slow

    require_slow("a torchrun job")
    shutil.copytree(EXAMPLES / "pkgtrain", tmp_path / "pkgtrain")
    env = job_env(NPROC="2", DISTPROF_OUT="o", DISTPROF_WAIT="1", DISTPROF_WARMUP="1", DISTPROF_ACTIVE="2")
    proc = subprocess.run(["bash", str(ROOT / "launch" / "torchrun.sh"), "-m", "pkgtrain", "--steps", "6"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "pkgtrain: 6 steps on 2 rank(s)" in proc.stdout, proc.stdout
    shards = [read_shard(p) for p in find_shards(only_run_dir(tmp_path / "o"))]
    assert sorted(s.rank for s in shards) == [0, 1]


def test_config_sections_keep_the_flat_shard_format():
    """TriggerConfig / WatchConfig nest in ProfileConfig; the shard's config attribute keeps its flat keys and order
    (schedule nested as before), and from_dict reads it back, older shards without the newer keys included."""
    from distprof.config import ScheduleConfig, TriggerConfig, WatchConfig

    assert list(ProfileConfig().to_dict()) == [
        "out", "run_id", "schedule", "flops", "memory", "shapes", "stack", "step_on", "strict", "codec", "sync_rounds",
        "sync_timeout_s", "memory_history", "memory_history_entries", "trigger", "trigger_poll_s", "trigger_margin",
        "cpu_sample_ms", "watch", "watch_interval_s", "watch_threshold", "watch_steps", "watch_cooldown_s", "summaries"]
    cfg = config_from_mapping({"watch": True, "watch_threshold": 0.5, "trigger_margin": 9, "active": 7}, environ={})
    assert cfg.watch == WatchConfig(enabled=True, threshold=0.5) and cfg.trigger == TriggerConfig(margin=9)
    d = cfg.to_dict()
    assert (d["watch"], d["watch_threshold"], d["trigger"], d["trigger_margin"]) == (True, 0.5, True, 9)
    assert d["schedule"] == {"wait": 3, "warmup": 2, "active": 7, "repeat": 1, "skip_first": 0, "kind": "steps"}
    assert ProfileConfig.from_dict(d) == cfg
    old = {k: v for k, v in ProfileConfig().to_dict().items()
           if not k.startswith("watch") and k not in ("cpu_sample_ms", "summaries")}
    assert ProfileConfig.from_dict(old) == ProfileConfig()
    assert ProfileConfig(schedule=ScheduleConfig(kind="none")).trigger.enabled
    with pytest.raises(ConfigError, match="nothing would be recorded"):
        ProfileConfig(schedule=ScheduleConfig(kind="none"), trigger=TriggerConfig(enabled=False))
    with pytest.raises(ConfigError, match="need a WatchConfig"):
        ProfileConfig(watch=True)
