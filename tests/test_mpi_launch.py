"""Capture without torchrun: distprof.launch under mpiexec / srun sets the torchrun-style variables a script expects.

The environments below are the variables each launcher really sets (Slurm's from a job on the local test cluster,
MPICH's from its mpiexec; Open MPI's and MVAPICH2's as documented). The last tests run a real 2-rank job under
MPICH's mpiexec (`pip install mpich`): skipped without mpiexec locally, failed under CI=true.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import subprocess
import sys

import pytest
from cluster import find_mpiexec, mpi_flavour, unavailable
from conftest import EXAMPLES, ROOT, job_env, only_run_dir, rerun_once_if_aborted

from distprof.capture import env as launch_env
from distprof.capture.env import (
    LaunchEnv,
    derived_port,
    detect,
    first_host_of,
    prepare,
    tasks_per_node,
)

#: A task of `srun --ntasks-per-node=2` in batch job 1234 on nodes gpu[07-08] (what a task sees, trimmed).
SRUN_TASK = {
    "SLURM_JOB_ID": "1234", "SLURM_JOBID": "1234", "SLURM_JOB_NODELIST": "gpu[07-08]", "SLURM_NODELIST": "gpu[07-08]",
    "SLURM_NTASKS": "4", "SLURM_NTASKS_PER_NODE": "2", "SLURM_TASKS_PER_NODE": "2(x2)", "SLURM_NODEID": "1",
    "SLURM_PROCID": "3", "SLURM_LOCALID": "1", "SLURM_STEP_ID": "0", "SLURM_STEPID": "0",
    "SLURM_STEP_NODELIST": "gpu[07-08]", "SLURM_STEP_NUM_NODES": "2", "SLURM_STEP_NUM_TASKS": "4",
    "SLURM_STEP_TASKS_PER_NODE": "2(x2)", "SLURMD_NODENAME": "gpu08",
}
#: The batch script of the same job: SLURM_PROCID=0 and SLURM_NTASKS=4, but no step.
BATCH_SCRIPT = {k: v for k, v in SRUN_TASK.items() if not k.startswith("SLURM_STEP")} | {
    "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0"}
MPICH_RANK = {"PMI_RANK": "1", "PMI_SIZE": "2", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2", "PMI_FD": "9",
              "PMI_HOSTNAME": "vm"}
OPENMPI_RANK = {"OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_SIZE": "8", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
                "OMPI_COMM_WORLD_LOCAL_SIZE": "4", "PMIX_NAMESPACE": "prterun-login1-4242@1"}
MVAPICH_RANK = {"MV2_COMM_WORLD_RANK": "2", "MV2_COMM_WORLD_SIZE": "4", "MV2_COMM_WORLD_LOCAL_RANK": "0",
                "MV2_COMM_WORLD_LOCAL_SIZE": "2"}
#: torchrun inside template (a)'s srun task: torchrun's variables plus the srun task's (node rank 0 of 1 task).
TORCHRUN_IN_SRUN = SRUN_TASK | {"SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "2", "TORCHELASTIC_RUN_ID": "1234",
                                "RANK": "2", "WORLD_SIZE": "16", "LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "8",
                                "MASTER_ADDR": "gpu07", "MASTER_PORT": "29400"}


def first(hostlist: str) -> str | None:
    return first_host_of(hostlist)  # the parser, so these tests need no scontrol


def test_srun_task_gets_rank_world_local_and_master():
    env = dict(SRUN_TASK)
    le = detect(env)
    assert le == LaunchEnv("slurm", 3, 4, 1, 2, "gpu08", "1234", "gpu[07-08]")
    assert launch_env.torch_variables(le, first) == {
        "RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "gpu07",
        "MASTER_PORT": str(20000 + 1234)}


def test_step_smaller_than_the_job_uses_the_step():
    env = SRUN_TASK | {"SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_NODELIST": "gpu08", "SLURM_STEP_TASKS_PER_NODE": "2",
                       "SLURM_PROCID": "1"}
    added = launch_env.torch_variables(detect(env), first)
    assert added["WORLD_SIZE"] == "2" and added["MASTER_ADDR"] == "gpu08" and added["LOCAL_WORLD_SIZE"] == "2"


def test_uneven_tasks_per_node_takes_this_nodes_count():
    assert tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    assert tasks_per_node("8") == [8]
    env = SRUN_TASK | {"SLURM_STEP_TASKS_PER_NODE": "3,1", "SLURM_NODEID": "1", "SLURM_STEP_NUM_TASKS": "4",
                       "SLURM_LOCALID": "0"}
    assert detect(env).local_world_size == 1
    env["SLURM_NODEID"] = "0"
    assert detect(env).local_world_size == 3


def test_batch_script_and_torchrun_are_left_alone():
    interactive = BATCH_SCRIPT | {"SLURM_STEP_ID": str(0xFFFFFFFA)}  # salloc's shell as the interactive step
    for env in (BATCH_SCRIPT, interactive, BATCH_SCRIPT | {"SLURM_STEP_ID": "batch"}, TORCHRUN_IN_SRUN, {},
                {"SLURM_JOB_ID": "7"}):
        before = dict(env)
        assert detect(env) is None
        assert prepare(env) == {} and env == before


def test_mpich_single_node():
    env = dict(MPICH_RANK)
    assert prepare(env) == {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
                            "MASTER_ADDR": "localhost", "MASTER_PORT": "29500"}  # Hydra names no job: torch's port


def test_openmpi_port_from_its_job_and_the_same_on_every_rank():
    a = launch_env.torch_variables(detect(OPENMPI_RANK), first)
    b = launch_env.torch_variables(detect(OPENMPI_RANK | {"OMPI_COMM_WORLD_RANK": "0",
                                                          "OMPI_COMM_WORLD_LOCAL_RANK": "0"}), first)
    assert a["RANK"] == "5" and a["WORLD_SIZE"] == "8" and a["LOCAL_RANK"] == "1" and a["LOCAL_WORLD_SIZE"] == "4"
    assert a["MASTER_PORT"] == b["MASTER_PORT"] and 20000 <= int(a["MASTER_PORT"]) < 30000
    other = derived_port("prterun-login1-4243@1")
    assert other != int(a["MASTER_PORT"])  # another mpirun, another port
    assert "MASTER_ADDR" not in a  # 2 nodes, no node list: rank 0's host is unknown


def test_mvapich():
    le = detect(MVAPICH_RANK)
    assert (le.launcher, le.rank, le.world_size, le.local_rank, le.local_world_size) == ("mvapich", 2, 4, 0, 2)


def test_mpiexec_inside_a_batch_job_is_mpi_not_the_batch_step():
    """mpiexec in a batch script: every rank inherits the batch step's SLURM_PROCID=0; the MPI rank wins, rank 0 is
    on the first node of the job."""
    env = BATCH_SCRIPT | {"PMI_RANK": "3", "PMI_SIZE": "4", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"}
    v = launch_env.torch_variables(detect(env), first)
    assert v["RANK"] == "3" and v["WORLD_SIZE"] == "4" and v["MASTER_ADDR"] == "gpu07"
    assert v["MASTER_PORT"] == str(20000 + 1234)


def test_srun_pmi2_gives_both_views_slurm_fills_the_local_ranks():
    env = SRUN_TASK | {"PMI_RANK": "3", "PMI_SIZE": "4"}  # srun --mpi=pmi2: no MPI_LOCALRANKID
    le = detect(env)
    assert (le.launcher, le.rank, le.local_rank, le.local_world_size) == ("slurm", 3, 1, 2)


def test_variables_the_user_set_are_never_changed():
    env = SRUN_TASK | {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "1234", "LOCAL_RANK": "0"}
    added = prepare(env)
    assert env["MASTER_ADDR"] == "10.0.0.1" and env["MASTER_PORT"] == "1234" and env["LOCAL_RANK"] == "0"
    assert set(added) == {"RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"}


@pytest.mark.parametrize("bad", [{"PMI_RANK": "one"}, {"PMI_RANK": "2"}, {"PMI_SIZE": "0"}, {"PMI_RANK": ""}])
def test_unusable_launcher_variables_warn_once_and_change_nothing(bad, caplog):
    env = MPICH_RANK | bad
    before = dict(env)
    with caplog.at_level(logging.WARNING, logger="distprof.capture.env"):
        assert prepare(env) == {}
    assert env == before
    msgs = [r.getMessage() for r in caplog.records]
    assert len(msgs) == 1 and "ignoring the launcher's variables" in msgs[0] and "PMI_" in msgs[0], msgs


def test_inconsistent_local_rank_leaves_local_variables_alone():
    le = detect(MPICH_RANK | {"MPI_LOCALRANKID": "5"})
    assert le.rank == 1 and le.local_rank is None and le.local_world_size is None


def test_multi_node_mpi_without_node_list_warns_on_rank_0(caplog):
    env = OPENMPI_RANK | {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_LOCAL_RANK": "0"}
    with caplog.at_level(logging.WARNING, logger="distprof.capture.env"):
        added = prepare(env)
    assert "MASTER_ADDR" not in added and "RANK" in added
    assert any("set MASTER_ADDR" in r.getMessage() for r in caplog.records)


def test_derived_port():
    assert derived_port("1234") == 21234 and derived_port("987654321") == 20000 + 987654321 % 10000
    assert derived_port(None) == 29500 and derived_port("") == 29500
    assert derived_port("kvs_77") == derived_port("kvs_77") and 20000 <= derived_port("kvs_77") < 30000


def test_first_host_of_hostlists():
    assert first_host_of("gpu[003-010,12],cpu1") == "gpu003"
    assert first_host_of("rack[1-2]-node[01-04]") == "rack1-node01"
    assert first_host_of("a,b") == "a" and first_host_of("n[7]") == "n7"
    assert first_host_of("") is None and first_host_of("x[") is None


def test_first_host_without_scontrol_parses(tmp_path):
    fake = tmp_path / "scontrol"
    fake.write_text("#!/bin/sh\nexit 1\n")
    fake.chmod(0o755)
    assert launch_env.first_host("node[5-6]", scontrol=str(fake)) == "node5"


# ---- real mpiexec ----------------------------------------------------------------------------------------------

#: How each flavour is installed for these tests (launch/setup.sh does both).
INSTALL = {"mpich": "pip install mpich", "openmpi": "apt-get install openmpi-bin"}


@pytest.fixture(scope="module", params=["mpich", "openmpi"])
def mpiexec(request):
    exe = find_mpiexec(request.param)
    if exe is None:
        unavailable(f"no {request.param} mpiexec: {INSTALL[request.param]}")
    return exe


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def mpirun(mpiexec: str, np: int, args: list[str], *, cwd, env: dict[str, str], timeout: float = 240):
    """launch/mpirun.sh with `mpiexec` (Open MPI's refuses root and more ranks than cores unless told)."""
    e = {**env, "MPIEXEC": mpiexec, "NP": str(np)}
    if mpi_flavour(mpiexec) == "openmpi":
        e["MPIEXEC_ARGS"] = "--oversubscribe" + (" --allow-run-as-root" if os.geteuid() == 0 else "")
    return rerun_once_if_aborted(lambda: subprocess.run(["bash", str(ROOT / "launch" / "mpirun.sh"), *args], cwd=cwd,
                                                        env=e, capture_output=True, text=True, timeout=timeout,
                                                        check=False), cwd)


@pytest.mark.slow
def test_mpiexec_two_ranks_report_names_the_slow_rank(mpiexec, tmp_path):
    """The issue's acceptance: `mpiexec -n 2 python -m distprof.launch examples/ddp_mlp.py --slow-rank 1 --slow-ms 25`
    (through launch/mpirun.sh) leaves shards of both ranks in one run whose report names rank 1."""
    env = job_env(DISTPROF_OUT="o", DISTPROF_WAIT="2", DISTPROF_WARMUP="2", DISTPROF_ACTIVE="5")
    if not _port_free(29500):  # another job on this machine holds torch's default port: take a free one
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            env["MASTER_PORT"] = str(s.getsockname()[1])
    proc = mpirun(mpiexec, 2, [str(EXAMPLES / "ddp_mlp.py"), "--hidden", "64", "--steps", "12", "--slow-rank", "1",
                               "--slow-ms", "25"], cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "ddp_mlp: 12 steps on 2 rank(s)" in proc.stdout
    run = only_run_dir(tmp_path / "o")
    rep = subprocess.run([sys.executable, "-m", "distprof", "report", str(run), "--json", "-"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert rep.returncode == 0, rep.stderr
    report = json.loads(rep.stdout)
    assert report["run"]["ranks_present"] == [0, 1] and report["run"]["world_size"] == 2
    assert [s["rank"] for s in report["stragglers"] if s["named"]] == [1], report["stragglers"]


ENV_DUMP = """
import json, os, sys
json.dump({k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                                          "MASTER_PORT")}, open(sys.argv[1] + os.environ["RANK"], "w"))
"""


@pytest.mark.slow
def test_mpiexec_sets_variables_and_keeps_the_users(mpiexec, tmp_path):
    script = tmp_path / "dump.py"
    script.write_text(ENV_DUMP)
    proc = mpirun(mpiexec, 2, [str(script), str(tmp_path / "env")], cwd=tmp_path,
                  env=job_env(DISTPROF_OUT="o", MASTER_PORT="23456"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    for r in (0, 1):
        seen = json.loads((tmp_path / f"env{r}").read_text())
        assert seen == {"RANK": str(r), "WORLD_SIZE": "2", "LOCAL_RANK": str(r), "LOCAL_WORLD_SIZE": "2",
                        "MASTER_ADDR": "localhost", "MASTER_PORT": "23456"}, seen


NO_COLLECTIVES = """
import torch
m = torch.nn.Linear(32, 32)
o = torch.optim.SGD(m.parameters(), lr=0.01)
for i in range(8):
    m(torch.randn(8, 32)).sum().backward(); o.step(); o.zero_grad()
"""


@pytest.mark.slow
def test_mpiexec_script_without_torch_distributed_agrees_over_mpi(mpiexec, tmp_path):
    """A script that never makes a torch.distributed group (MPI-only, or no collectives) under mpiexec: the ranks agree
    the run and the job over MPI (mpi4py) and sync clocks on distprof's own channel -- one run directory, one job,
    and the host leader's samples for both phases of each window (simulated hosts 0,1). Where mpi4py's library is not
    the launcher's MPI (pip's MPICH under Open MPI's mpiexec, whose MPI_Init aborts the process), the job runs as
    without distprof's agreement: exit 0, every rank's shards."""
    pytest.importorskip("mpi4py")
    from distprof.capture.mpi import COMPATIBLE, library_flavour
    from distprof.storage import find_shards
    from distprof.storage.validate import check_shard, job_id

    script = tmp_path / "train.py"
    script.write_text(NO_COLLECTIVES)
    proc = mpirun(mpiexec, 2, [str(script)], cwd=tmp_path,
                  env=job_env(DISTPROF_OUT="o", DISTPROF_WAIT="0", DISTPROF_WARMUP="1", DISTPROF_ACTIVE="2",
                              DISTPROF_REPEAT="2", DISTPROF_SIM_HOSTS="0,1"))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]  # before: exit 16 under Open MPI
    shards = [check_shard(p) for p in sorted((tmp_path / "o").glob("*/*.h5"))]
    assert sorted((s.rank, s.window) for s in shards) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    if not any(w in (library_flavour() or "") for w in COMPATIBLE.get(mpi_flavour(mpiexec), ())):
        return  # no agreement possible over this MPI; the ranks fell back to their own run ids
    run = only_run_dir(tmp_path / "o")  # before: every rank made a run directory of its own
    shards = [check_shard(p) for p in find_shards(run)]
    assert len({job_id(s.attrs) for s in shards}) == 1 and job_id(shards[0].attrs) is not None
    roles = {s.rank: s.attrs["clock_role"] for s in shards}
    assert roles == {0: "reference", 1: "leader"}
    for s in shards:
        if s.rank == 1:
            assert sorted(set(s.table("clock/samples")["phase"].tolist())) == [0, 1], s.path


@pytest.mark.slow
def test_mpiexec_runs_a_module(mpiexec, tmp_path):
    """launch/mpirun.sh -m pkgtrain.train: the package found from the current directory on every rank, relative
    imports working, both ranks' shards in one run."""
    shutil.copytree(EXAMPLES / "pkgtrain", tmp_path / "pkgtrain")
    env = job_env(DISTPROF_OUT="o", DISTPROF_WAIT="1", DISTPROF_WARMUP="1", DISTPROF_ACTIVE="2")
    if not _port_free(29500):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            env["MASTER_PORT"] = str(s.getsockname()[1])
    proc = mpirun(mpiexec, 2, ["-m", "pkgtrain.train", "--steps", "6"], cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "pkgtrain: __name__=__main__ __package__=pkgtrain" in proc.stdout, proc.stdout
    assert "pkgtrain: 6 steps on 2 rank(s)" in proc.stdout
    shards = sorted((tmp_path / "o").glob("*/*.h5"))
    assert sorted(p.name[:9] for p in shards) == ["rank00000", "rank00001"], shards
