"""``mpiexec -n 2 distprof report|timeline|export`` on real MPI (mpi4py + MPICH's mpiexec): the same outputs as a serial
run, output from MPI rank 0 only, and one clear error (no hang) when a process fails.

Skips where mpiexec or mpi4py is missing, except under CI (CI=true), where they must be there (launch/setup.sh
installs them).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import bench_module, job_env
from shard_edit import set_attr

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]


def _mpiexec() -> str | None:
    exe = shutil.which("mpiexec")
    if exe is None or importlib.util.find_spec("mpi4py") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("CI: mpiexec and mpi4py must be installed (launch/setup.sh installs mpi4py and mpich)")
        pytest.skip("mpiexec or mpi4py not installed (pip install mpi4py mpich)")
    return exe


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    synth = bench_module("synth")
    out = tmp_path_factory.mktemp("mpi") / "run"
    spec = synth.spec_from(synth.parse_args(["--ranks", "6", "--events", "6000", "--hosts", "3", "--tp", "2",
                                             "--slow-rank", "4", "--slow-ms", "8", "-o", str(out)]))
    synth.generate(spec, out)
    return out


def _distprof(args, *, mpi: str | None = None, n: int = 2, cwd: Path) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "distprof", *map(str, args)]
    if mpi:
        cmd = [mpi, "-n", str(n), *cmd]
    return subprocess.run(cmd, cwd=cwd, env=job_env(), capture_output=True, text=True, timeout=240)


def test_report_equals_serial_and_prints_once(run_dir, tmp_path):
    mpi = _mpiexec()
    serial = _distprof(["report", run_dir, "--json", tmp_path / "serial.json", "--no-progress"], cwd=tmp_path)
    par = _distprof(["report", run_dir, "--json", tmp_path / "mpi.json", "--no-progress"], mpi=mpi, cwd=tmp_path)
    assert serial.returncode == 0 and par.returncode == 0, par.stderr[-3000:]
    a = json.loads((tmp_path / "serial.json").read_text())
    b = json.loads((tmp_path / "mpi.json").read_text())
    assert a == b
    assert a["straggler_info"]["named"] == [4]
    # the summary is printed once (MPI rank 0), and is the serial one
    assert par.stdout.count("distprof report: run") == 1
    assert par.stdout.replace("mpi.json", "X") == serial.stdout.replace("serial.json", "X")


def test_three_processes_give_the_serial_report(run_dir, tmp_path):
    """With three processes, rank 0 appends two other processes' joined collective rows to its own (the ranks dealt
    out by event count, so the joined table must be put back in rank order): the report is the serial one."""
    mpi = _mpiexec()
    serial = _distprof(["report", run_dir, "--json", tmp_path / "serial.json", "--no-progress"], cwd=tmp_path)
    par = _distprof(["report", run_dir, "--json", tmp_path / "mpi3.json", "--no-progress"], mpi=mpi, n=3,
                    cwd=tmp_path)
    assert serial.returncode == 0 and par.returncode == 0, par.stderr[-3000:]
    assert json.loads((tmp_path / "mpi3.json").read_text()) == json.loads((tmp_path / "serial.json").read_text())


def test_timeline_and_export_equal_serial(run_dir, tmp_path):
    mpi = _mpiexec()
    for tag, how in (("serial", None), ("mpi", mpi)):
        p = _distprof(["timeline", run_dir, "-o", tmp_path / f"{tag}.json", "--no-progress"], mpi=how, cwd=tmp_path)
        assert p.returncode == 0, p.stderr[-3000:]
        p = _distprof(["export", run_dir, "-o", tmp_path / f"k-{tag}", "--no-gzip", "--no-progress"], mpi=how,
                      cwd=tmp_path)
        assert p.returncode == 0, p.stderr[-3000:]
    assert (tmp_path / "serial.json").read_bytes() == (tmp_path / "mpi.json").read_bytes()
    names = sorted(f.name for f in (tmp_path / "k-serial").iterdir())
    assert names == sorted(f.name for f in (tmp_path / "k-mpi").iterdir()) and len(names) == 6
    for n in names:
        assert (tmp_path / "k-serial" / n).read_bytes() == (tmp_path / "k-mpi" / n).read_bytes()


def test_a_failing_process_gives_one_error_and_no_hang(run_dir, tmp_path):
    mpi = _mpiexec()
    broken = tmp_path / "broken"
    shutil.copytree(run_dir, broken)
    import h5py

    victim = broken / "rank00005.w0001.h5"  # rank 5 is summarised by MPI process 1 (of 2)
    with h5py.File(victim, "r+") as f:  # readable attributes, a table pointing outside its events
        rec = f["comms"][()]
        rec["row"][0] = 10**9
        f["comms"][...] = rec
    serial = _distprof(["report", broken, "--no-progress"], cwd=tmp_path)
    par = _distprof(["report", broken, "--no-progress"], mpi=mpi, cwd=tmp_path)
    assert "Traceback" not in par.stderr and "Traceback" not in serial.stderr
    assert (par.returncode == 0) == (serial.returncode == 0), (serial.stderr[-2000:], par.stderr[-2000:])
    errors = [ln for ln in par.stderr.splitlines() if ln.startswith("distprof: error:")]
    if serial.returncode:
        assert len(errors) == 1 and "rank00005.w0001.h5" in errors[0], par.stderr[-2000:]
    else:  # the bad shard is skipped with a warning naming it, and the report carries on
        assert "rank00005.w0001.h5" in par.stderr and par.stdout.count("distprof report: run") == 1


def test_shards_checked_in_parallel_are_skipped_as_serially(run_dir, tmp_path):
    """The shards are checked by every MPI process (each a share), not by rank 0 alone: a damaged file found by
    process 1 and a forged attribute found by process 0 are skipped and named exactly as a serial run does."""
    mpi = _mpiexec()
    bad = tmp_path / "bad"
    shutil.copytree(run_dir, bad)
    import h5py

    victim = bad / "rank00000.w0001.h5"  # second of the sorted shards: checked by MPI process 1
    victim.write_bytes(victim.read_bytes()[:4096])
    with h5py.File(bad / "rank00003.w0000.h5", "r+") as f:  # seventh: MPI process 0
        set_attr(f, "world_size", -3)
    outs = {}
    for tag, how in (("serial", None), ("mpi", mpi)):
        p = _distprof(["report", bad, "--json", tmp_path / f"{tag}.json", "--no-progress"], mpi=how, cwd=tmp_path)
        assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr[-3000:]
        outs[tag] = json.loads((tmp_path / f"{tag}.json").read_text())
    assert outs["serial"] == outs["mpi"]
    skipped = {Path(s["path"]).name for s in outs["mpi"]["skipped_shards"]}
    assert skipped == {"rank00000.w0001.h5", "rank00003.w0000.h5"}


#: Runs ``distprof report`` under MPI with one part broken or slowed on one process (argv: run dir, JSON path, what
#: breaks or is slow). Each process says on stderr when it builds the pipelines.
_BROKEN_PART = r"""
import sys, time
from mpi4py import MPI
import distprof.analysis.report.parallel as parallel
import distprof.analysis.report.build as build
from distprof.cli import main

run_dir, out, part = sys.argv[1:4]
me = MPI.COMM_WORLD.Get_rank()

def boom(*a, **k):
    raise RuntimeError(f"{part} broken on process {me}")

def slowed(f):
    def g(*a, **k):
        time.sleep(3)  # the other process finishes its share first, by far more than any load moves it
        return f(*a, **k)
    return g

def said(module):
    f = module.pipelines
    def g(*a, **k):
        sys.stderr.write(f"pipelines built on process {me}\n")
        return f(*a, **k)
    module.pipelines = g

said(build)
said(parallel)
def slowed_after(f):
    def g(*a, **k):
        out = f(*a, **k)
        time.sleep(3)
        return out
    return g

if part in ("rank-0-slow", "helper-pipelines") and me == 0:
    # rank 0 slow once it handed process 1 all it gets: process 1 is free first, and builds the pipelines
    parallel.Handover.send_replays = slowed_after(parallel.Handover.send_replays)
if part == "helper-slow" and me == 1:
    parallel.comm_table = slowed(parallel.comm_table)  # rank 0 is free first: it builds them
if part == "helper-pipelines" and me == 1:
    parallel.pipelines = boom  # process 1 claims them and fails: rank 0 builds them after all
if part == "helper" and me == 1:
    parallel.find_stragglers = boom  # the helper's analysis fails: rank 0 runs it itself
elif part == "offer" and me == 0:
    parallel.straggler_inputs = boom  # rank 0 fails before it hands anything over: the helper is released
elif part == "graph" and me == 0:
    build.step_graph = boom  # rank 0 fails after handing over, before it sends process 1 the step graph
elif part == "report" and me == 0:
    build.estimator = boom  # rank 0 fails after handing over the graph too, before it asks for the result
elif part == "helper-path" and me == 1:
    parallel.path_of = boom  # the helper's critical path fails: rank 0 replays the graph itself
elif part == "helper-gains" and me == 1:
    parallel.Estimator = boom  # the helper's what-if estimates fail: rank 0 estimates them itself
sys.exit(main(["report", run_dir, "--json", out, "--no-progress"]))
"""


def _broken(mpi: str, run_dir: Path, tmp_path: Path, part: str) -> subprocess.CompletedProcess:
    script = tmp_path / "broken_part.py"
    script.write_text(_BROKEN_PART)
    return subprocess.run([mpi, "-n", "2", sys.executable, str(script), str(run_dir), str(tmp_path / f"{part}.json"),
                           part], cwd=tmp_path, env=job_env(), capture_output=True, text=True, timeout=240)


def _broken_and_serial(run_dir: Path, tmp_path: Path, part: str) -> tuple[dict, dict, str]:
    """The report of `run_dir` with `part` broken or slowed under MPI, the serial report, and the MPI job's stderr
    (both runs must succeed)."""
    mpi = _mpiexec()
    serial = _distprof(["report", run_dir, "--json", tmp_path / "serial.json", "--no-progress"], cwd=tmp_path)
    par = _broken(mpi, run_dir, tmp_path, part)
    assert serial.returncode == 0 and par.returncode == 0, par.stderr[-3000:]
    return (json.loads((tmp_path / f"{part}.json").read_text()), json.loads((tmp_path / "serial.json").read_text()),
            par.stderr)


def test_the_straggler_analysis_on_process_1_gives_the_serial_report_even_when_it_fails(run_dir, tmp_path):
    """Under MPI the straggler analysis runs on process 1 (analysis/report/parallel.py); when it fails there, rank
    0 says so once and runs it itself: the report is the serial one."""
    report, serial, stderr = _broken_and_serial(run_dir, tmp_path, "helper")
    assert stderr.count("could not run the straggler analysis and the collectives table "
                        "(RuntimeError: helper broken on process 1)") == 1
    assert report == serial


@pytest.mark.parametrize("part, said, section", [
    ("helper-path", "could not find the critical path (RuntimeError: helper-path broken on process 1): rank 0 finds "
                    "it", "critical_path"),
    ("helper-gains", "could not estimate its what-ifs (RuntimeError: helper-gains broken on process 1): rank 0 "
                     "estimates them", "whatif")])
def test_the_graphs_analyses_on_process_1_give_the_serial_report_even_when_they_fail(run_dir, tmp_path, part, said,
                                                                                      section):
    """Under MPI process 1 finds the critical path in the step graph rank 0 sends it, and estimates the what-ifs
    that read the graph alone from rank 0's replay; when either fails there, rank 0 says so once and does it
    itself: the report is the serial one."""
    report, serial, stderr = _broken_and_serial(run_dir, tmp_path, part)
    assert stderr.count(said) == 1
    assert report[section] and report == serial


@pytest.mark.parametrize("part", ["offer", "graph", "report"])
def test_rank_0_failing_around_the_hand_over_leaves_no_process_waiting(run_dir, tmp_path, part):
    """Rank 0 fails before it hands the straggler analysis over, after it (before the step graph process 1 waits
    for is built), or after both, before it reads the answer: the job ends (no process waits for a message that
    never comes), with rank 0's error and no report."""
    mpi = _mpiexec()
    par = _broken(mpi, run_dir, tmp_path, part)  # a hang would end in subprocess.TimeoutExpired
    assert par.returncode != 0
    assert f"{part} broken on process 0" in par.stderr
    assert not (tmp_path / f"{part}.json").exists()


@pytest.fixture(scope="module")
def pp_run_dir(tmp_path_factory) -> Path:
    """A pipeline-parallel run (2 stages, 4 micro-batches, DDP across): its report has pipelines to build."""
    synth = bench_module("synth")
    out = tmp_path_factory.mktemp("mpi_pp") / "run"
    spec = synth.spec_from(synth.parse_args(["--ranks", "4", "--events", "4000", "--shape", "pp", "--pp", "2",
                                             "--micro-batches", "4", "-o", str(out)]))
    synth.generate(spec, out)
    return out


@pytest.mark.parametrize("part, builder", [("rank-0-slow", 1), ("helper-slow", 0)])
def test_the_process_free_first_builds_the_pipelines(pp_run_dir, tmp_path, part, builder):
    """Whichever of rank 0 and process 1 finishes its own share first builds the pipelines, and only it; the
    report is the serial one either way."""
    report, serial, stderr = _broken_and_serial(pp_run_dir, tmp_path, part)
    assert report == serial
    assert len(report["pipelines"]) == 2  # 4 ranks, 2 stages: two pipelines, built and sent back
    assert stderr.count("pipelines built on process") == 1
    assert f"pipelines built on process {builder}" in stderr


def test_pipelines_failing_on_process_1_are_built_on_rank_0(pp_run_dir, tmp_path):
    """Process 1 claims the pipelines and fails to build them: rank 0 says so once and builds them; the report is
    the serial one."""
    report, serial, stderr = _broken_and_serial(pp_run_dir, tmp_path, "helper-pipelines")
    assert stderr.count("could not build the pipelines (RuntimeError: helper-pipelines broken on process 1): "
                        "rank 0 builds them") == 1
    assert "pipelines built on process 0" in stderr
    assert report == serial
