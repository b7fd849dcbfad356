"""The slurm/ templates on a real one-node Slurm (slurmctld + slurmd started here): each one submitted with 2 ranks of
examples/ddp_mlp.py (rank 1 made 25 ms slow), the report as the follow-up job, shards and report checked.

Needs root and apt (Debian's slurm-wlm is installed when missing); skips locally without them, fails under CI=true.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import textwrap
import time
from pathlib import Path

import pytest
from cluster import LocalSlurm, slurm_unusable, unavailable
from conftest import EXAMPLES, ROOT

from distprof.capture import env as launch_env
from distprof.storage import find_shards, read_shard

pytestmark = pytest.mark.slow

SUBMIT = ROOT / "slurm" / "submit.sh"
SCHED = {"DISTPROF_WAIT": "2", "DISTPROF_WARMUP": "2", "DISTPROF_ACTIVE": "5"}
DDP = [str(EXAMPLES / "ddp_mlp.py"), "--hidden", "64", "--steps", "12", "--slow-rank", "1", "--slow-ms", "25"]
#: examples/pkgtrain started as a module (python -m finds it on PYTHONPATH: module_env)
MODULE = ["-m", "pkgtrain.train", "--steps", "12", "--slow-rank", "1", "--slow-ms", "25"]
MODULE_PROOF = "pkgtrain: __name__=__main__ __package__=pkgtrain"


def module_env(slurm: LocalSlurm) -> dict[str, str]:
    return {"PYTHONPATH": os.pathsep.join(p for p in (str(EXAMPLES), slurm.env.get("PYTHONPATH", "")) if p)}


@pytest.fixture(scope="session")
def slurm():
    why = slurm_unusable()
    if why:
        unavailable(why)
    cluster = LocalSlurm()
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


def submit(slurm: LocalSlurm, cwd: Path, mode: str, sbatch_opts: list[str], script: list[str],
           **env: str) -> tuple[str, str, Path]:
    """slurm/submit.sh MODE OPTS -- SCRIPT; returns (training job id, report job id, run directory)."""
    e = {**slurm.env, "DISTPROF_OUT": str(cwd / "runs"), **env}
    proc = slurm.slurm(["bash", str(SUBMIT), mode, *sbatch_opts, "--", *script], env=e)
    m = re.search(r"training job (\d+) \(.*\), report job (\d+) after it", proc.stdout)
    assert m, proc.stdout + proc.stderr
    run_dir = cwd / "runs" / m.group(1)
    assert f"run directory {run_dir} " in proc.stdout, proc.stdout
    return m.group(1), m.group(2), run_dir


def read_log(run_dir: Path, name: str, job: str) -> str:
    path = run_dir / f"{name}-{job}.out"
    assert path.is_file(), f"no log {path.name} in {run_dir}: {sorted(p.name for p in run_dir.iterdir())}"
    return path.read_text(errors="replace")


def check_run(slurm: LocalSlurm, train: str, report: str, run_dir: Path, train_name: str) -> dict:
    """Both jobs completed; 2 ranks of shards in the job's directory; the report names rank 1 as the straggler."""
    states = slurm.wait([train, report])
    train_log = read_log(run_dir, train_name, train)
    report_log = read_log(run_dir, "distprof-report", report)
    assert states == {train: "COMPLETED", report: "COMPLETED"}, (states, train_log[-4000:], report_log[-3000:])
    shards = [read_shard(p) for p in find_shards(run_dir)]
    assert sorted(s.rank for s in shards) == [0, 1], train_log[-3000:]
    assert {s.attrs["world_size"] for s in shards} == {2}
    assert {s.attrs["run_id"] for s in shards} == {train}  # the run id is the Slurm job id
    rep = json.loads((run_dir / "report.json").read_text())
    named = [s["rank"] for s in rep["stragglers"] if s["named"]]
    assert named == [1], (rep["stragglers"], report_log[-3000:])
    assert (run_dir / "report.html").stat().st_size > 100_000  # self-contained: plotly.js inlined
    assert f"training job {train} ended: COMPLETED" in report_log
    assert "Straggler: rank 1" in report_log, report_log[-3000:]
    return rep


@pytest.mark.parametrize("args, message", [
    ([], "usage: slurm/submit.sh"),
    (["bogus", "train.py"], "usage: slurm/submit.sh"),
    (["tasks", "--nodes=2", "train.py"], "end the sbatch options with --"),
    (["tasks", "--", "missing.py"], "training script missing.py not found"),
])
def test_submit_usage_errors(tmp_path, args, message):
    proc = subprocess.run(["bash", str(SUBMIT), *args], cwd=tmp_path, capture_output=True, text=True, timeout=30,
                          check=False)
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert not list(tmp_path.iterdir())  # nothing submitted, nothing created


@pytest.mark.parametrize("template", ["torchrun.sbatch", "tasks.sbatch"])
def test_templates_outside_a_job_say_how_to_submit(tmp_path, template):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    proc = subprocess.run(["bash", str(ROOT / "slurm" / template), "train.py"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=30, check=False)
    assert proc.returncode != 0 and "submit this script with sbatch" in proc.stderr, proc.stderr


def test_local_cluster_is_real(slurm):
    """The fixture's node is this host, with its real CPUs, idle and registered with slurmctld."""
    out = slurm.slurm(["scontrol", "show", "node", slurm.host]).stdout
    assert "State=IDLE" in out
    cpus = int(re.search(r"CPUTot=(\d+)", out).group(1))
    assert cpus >= 2, f"the Slurm tests run 2 ranks on one node; this host has {cpus} CPU(s)"
    print(f"slurm: daemons up and node idle in {slurm.started_s:.1f} s")


HOSTLISTS = ("vm", "gpu[003-010,12],cpu1", "rack[1-2]-node[01-04]", "n[7],m[1-3]", "a-b[09-11]", "x1.y[2-3]")


def test_hostlist_parser_agrees_with_scontrol(slurm, monkeypatch):
    """The fallback parser (no scontrol) gives scontrol's first host; with scontrol, first_host asks it."""
    for expr in HOSTLISTS:
        listed = slurm.slurm(["scontrol", "show", "hostnames", expr]).stdout.split()
        assert launch_env.first_host_of(expr) == listed[0], expr
    monkeypatch.setenv("SLURM_CONF", str(slurm.conf))
    monkeypatch.setattr(launch_env, "first_host_of", lambda expr: None)  # only scontrol can answer now
    assert [launch_env.first_host(e) for e in HOSTLISTS] == ["vm", "gpu003", "rack1-node01", "n7", "a-b09", "x1.y2"]


def test_torchrun_template_and_report(slurm, tmp_path):
    """(a): one srun task per node running torchrun (c10d rendezvous on the head node), 2 workers."""
    t0 = time.monotonic()
    train, report, run_dir = submit(slurm, tmp_path, "torchrun", [], DDP, NPROC_PER_NODE="2", **SCHED)
    check_run(slurm, train, report, run_dir, "distprof-torchrun")
    log = read_log(run_dir, "distprof-torchrun", train)
    port = 20000 + int(train) % 10000
    assert f"1 node(s) x 2 worker(s), rendezvous {slurm.host}:{port}" in log
    print(f"slurm: torchrun template + report {time.monotonic() - t0:.1f} s")


def test_tasks_template_and_report(slurm, tmp_path):
    """(b): one srun task per rank, no torchrun: ranks from SLURM_PROCID / SLURM_STEP_NUM_TASKS / SLURM_LOCALID."""
    t0 = time.monotonic()
    train, report, run_dir = submit(slurm, tmp_path, "tasks", ["--ntasks-per-node=2"], DDP,
                                    DISTPROF_REPORT_LAUNCHER="srun --ntasks=1 --label", **SCHED)
    check_run(slurm, train, report, run_dir, "distprof-tasks")
    assert "\n0: Verdict: " in read_log(run_dir, "distprof-report", report)  # the report ran as task 0 of an srun
    assert "1 node(s) x 2 rank(s)" in read_log(run_dir, "distprof-tasks", train)
    print(f"slurm: tasks template + report {time.monotonic() - t0:.1f} s")


ENV_DUMP = textwrap.dedent("""
    import json, os, sys
    import torch.distributed as dist
    keys = ["RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"]
    seen = {k: os.environ.get(k) for k in keys}
    dist.init_process_group("gloo")  # env:// from what distprof.launch set
    got = [None] * dist.get_world_size()
    dist.all_gather_object(got, seen["RANK"])
    seen["gathered"] = got
    dist.destroy_process_group()
    with open(os.path.join(sys.argv[1], f"env{seen['RANK']}.json"), "w") as fh:
        json.dump(seen, fh)
""")


def test_srun_launcher_sets_torch_variables(slurm, tmp_path):
    """launch/srun.sh from outside any allocation (srun makes one): each task gets RANK ... MASTER_PORT; a variable the
    user set (MASTER_ADDR here) passes through unchanged."""
    script = tmp_path / "dump.py"
    script.write_text(ENV_DUMP)
    e = {**slurm.env, "NTASKS": "2", "MASTER_ADDR": "127.0.0.1", "DISTPROF_OUT": str(tmp_path / "o")}
    proc = slurm.slurm(["bash", str(ROOT / "launch" / "srun.sh"), str(script), str(tmp_path)], env=e, timeout=240)
    seen = {r: json.loads((tmp_path / f"env{r}.json").read_text()) for r in (0, 1)}
    for r, s in seen.items():
        assert s["RANK"] == str(r) and s["WORLD_SIZE"] == "2" and s["LOCAL_RANK"] == str(r), s
        assert s["LOCAL_WORLD_SIZE"] == "2" and s["MASTER_ADDR"] == "127.0.0.1", s
        assert s["gathered"] == ["0", "1"], s
    assert seen[0]["MASTER_PORT"] == seen[1]["MASTER_PORT"]
    assert 20000 <= int(seen[0]["MASTER_PORT"]) < 30000, (seen[0], proc.stderr[-2000:])


FAILING = textwrap.dedent("""
    import sys, torch
    model = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for i in range(8):
        model(torch.randn(4, 8)).sum().backward()
        opt.step(); opt.zero_grad()
    sys.exit(3)
""")


def test_report_follows_a_failed_training_job(slurm, tmp_path):
    """afterany: the report runs after a training job that failed, on the windows it wrote."""
    script = tmp_path / "fails.py"
    script.write_text(FAILING)
    train, report, run_dir = submit(slurm, tmp_path, "tasks", ["--ntasks-per-node=1"], [str(script)],
                                    DISTPROF_WAIT="1", DISTPROF_WARMUP="1", DISTPROF_ACTIVE="3")
    states = slurm.wait([train, report])
    report_log = read_log(run_dir, "distprof-report", report)
    assert states == {train: "FAILED", report: "COMPLETED"}, (states, report_log[-3000:])
    assert f"training job {train} ended: FAILED" in report_log
    run = json.loads((run_dir / "report.json").read_text())["run"]
    assert run["id"] == train and run["ranks_present"] == [0] and run["n_steps"] == 3, run


def test_batch_script_process_is_not_made_a_rank(slurm, tmp_path):
    """A single `python -m distprof.launch` in the batch script of a 2-task job is no task of a step: it must not be
    told it is rank 0 of 2 (its init_process_group would wait for a second rank forever)."""
    dump = tmp_path / "dump.py"
    dump.write_text("import json, os, sys\njson.dump({k: os.environ.get(k) for k in ('RANK', 'WORLD_SIZE', "
                    "'MASTER_PORT')}, open(sys.argv[1], 'w'))\n")
    batch = tmp_path / "batch.sh"
    batch.write_text(f"#!/bin/bash\n#SBATCH --ntasks=2\n#SBATCH --output={tmp_path}/%j.out\n"
                     f"\"$PYTHON\" -m distprof.launch {dump} {tmp_path}/seen.json\n")
    job = slurm.slurm(["sbatch", "--parsable", str(batch)], env={**slurm.env, "DISTPROF_OUT": str(tmp_path)})
    job_id = job.stdout.strip().split(";")[0]
    assert slurm.wait([job_id]) == {job_id: "COMPLETED"}, (tmp_path / f"{job_id}.out").read_text()
    assert json.loads((tmp_path / "seen.json").read_text()) == {"RANK": None, "WORLD_SIZE": None, "MASTER_PORT": None}


SLEEPS = FAILING.replace("sys.exit(3)", "import time; time.sleep(3600)")


def test_report_follows_a_timed_out_training_job(slurm, tmp_path):
    """afterany: Slurm kills the training job at its 1-minute limit (after one window reached the disk); the report
    still runs on that window. The slowest Slurm test (~1.5 min: Slurm's limit is whole minutes)."""
    script = tmp_path / "sleeps.py"
    script.write_text(SLEEPS)
    t0 = time.monotonic()
    train, report, run_dir = submit(slurm, tmp_path, "tasks", ["--ntasks-per-node=1", "--time=1"], [str(script)],
                                    DISTPROF_WAIT="1", DISTPROF_WARMUP="1", DISTPROF_ACTIVE="3")
    states = slurm.wait([train, report], timeout_s=300)
    report_log = read_log(run_dir, "distprof-report", report)
    assert states == {train: "TIMEOUT", report: "COMPLETED"}, (states, report_log[-3000:])
    assert f"training job {train} ended: TIMEOUT" in report_log
    run = json.loads((run_dir / "report.json").read_text())["run"]
    assert run["id"] == train and run["ranks_present"] == [0] and run["n_steps"] == 3, run
    print(f"slurm: timed-out training + report {time.monotonic() - t0:.1f} s")


@pytest.mark.parametrize("mode, opts, name", [("tasks", ["--ntasks-per-node=2"], "distprof-tasks"),
                                              ("torchrun", [], "distprof-torchrun")])
def test_templates_run_a_module(slurm, tmp_path, mode, opts, name):
    """slurm/submit.sh MODE -- -m pkgtrain.train: the template starts the module on every rank as python -m would
    (relative imports, __name__), and the report names the slowed rank."""
    train, report, run_dir = submit(slurm, tmp_path, mode, opts, MODULE, NPROC_PER_NODE="2", **module_env(slurm),
                                    **SCHED)
    check_run(slurm, train, report, run_dir, name)
    assert MODULE_PROOF in read_log(run_dir, name, train)


def test_srun_launcher_runs_a_module(slurm, tmp_path):
    """launch/srun.sh -m pkgtrain.train with 2 tasks: the module runs on both, each writes its shard."""
    e = {**slurm.env, **module_env(slurm), "NTASKS": "2", "DISTPROF_OUT": str(tmp_path / "o"), **SCHED}
    proc = slurm.slurm(["bash", str(ROOT / "launch" / "srun.sh"), *MODULE[:4]], env=e, timeout=240)
    assert MODULE_PROOF in proc.stdout and "pkgtrain: 12 steps on 2 rank(s)" in proc.stdout, proc.stdout
    shards = [read_shard(p) for p in find_shards(next((tmp_path / "o").iterdir()))]
    assert sorted(s.rank for s in shards) == [0, 1]


def test_submit_needs_a_module_name_after_m(tmp_path):
    proc = subprocess.run(["bash", str(SUBMIT), "tasks", "-m"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=30, check=False)
    assert proc.returncode == 2 and "-m needs a module name" in proc.stderr, proc.stderr
