"""Real launchers for the tests: a one-node Slurm cluster on this host (slurmctld + slurmd), and MPICH's mpiexec.

Where one cannot be had (not root, no apt, no mpiexec) the tests skip with the reason; under CI=true they fail
instead, so CI never passes by skipping them.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from conftest import job_env

#: Job states after which a job will not run again (squeue/scontrol spelling).
FINAL_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED",
                "DEADLINE", "BOOT_FAIL"}
SLURM_BINARIES = ("slurmctld", "slurmd", "sbatch", "srun", "scontrol", "squeue", "scancel", "sinfo")


def unavailable(reason: str) -> None:
    """Skip with `reason`; under CI=true fail with it (CI must run these tests)."""
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"required in CI: {reason}", pytrace=False)
    pytest.skip(reason)


def find_mpiexec(kind: str) -> str | None:
    """An mpiexec of `kind`: "mpich" (pip's mpich puts it beside this Python; else an MPICH/Hydra one on PATH) or
    "openmpi" (Debian's openmpi-bin: mpiexec.openmpi)."""
    candidates = [Path(sys.executable).parent / "mpiexec", shutil.which("mpiexec"), shutil.which("mpiexec.mpich")] \
        if kind == "mpich" else [shutil.which("mpiexec.openmpi")]
    for exe in candidates:
        if exe and Path(exe).is_file() and mpi_flavour(str(exe)) == kind:
            return str(exe)
    return None


def mpi_flavour(mpiexec: str) -> str:
    """ "openmpi", "mpich" (Hydra: MPICH, Intel MPI, MVAPICH2) or "unknown", from `mpiexec --version`."""
    try:
        out = subprocess.run([mpiexec, "--version"], capture_output=True, text=True, timeout=30,
                             check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    if "Open MPI" in out or "OpenRTE" in out:
        return "openmpi"
    return "mpich" if "HYDRA" in out.upper() else "unknown"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(cmd: list[str], *, env: dict[str, str] | None = None, timeout: float = 60,
         check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n"
                             f"{proc.stderr[-2000:]}")
    return proc


def install_slurm() -> str | None:
    """Install Debian's slurm-wlm when its daemons are missing; None when installed, else why it cannot be."""
    if all(shutil.which(b) for b in SLURM_BINARIES):
        return None
    if os.geteuid() != 0:
        return "Slurm is not installed and installing it needs root"
    if not shutil.which("apt-get"):
        return "Slurm is not installed and there is no apt-get to install slurm-wlm"
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for cmd in (["apt-get", "update", "-qq"],
                ["apt-get", "install", "-y", "-qq", "--no-install-recommends", "slurm-wlm"]):
        try:
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=250, check=False)
        except subprocess.TimeoutExpired:
            return f"{' '.join(cmd)} did not finish within 250 s"
        if proc.returncode != 0:
            return f"{' '.join(cmd)} failed: {proc.stderr.strip()[-300:]}"
    missing = [b for b in SLURM_BINARIES if not shutil.which(b)]
    return f"slurm-wlm installed but {', '.join(missing)} missing" if missing else None


def slurm_unusable() -> str | None:
    """Why a local Slurm cannot be started here (installing it first when missing), or None."""
    why = install_slurm()
    if why:
        return why
    if os.geteuid() != 0:
        return "starting slurmctld and slurmd needs root"
    cpus = os.cpu_count() or 1
    if cpus < 2:
        return f"the Slurm tests run 2 ranks on one node; this host has {cpus} CPU"
    return None


def node_line(hostname: str) -> str:
    """slurm.conf's NodeName line for this host with its real CPUs and memory (as slurmd itself detects them)."""
    out = _run(["slurmd", "-C"]).stdout.splitlines()[0]
    if not out.startswith("NodeName="):
        raise AssertionError(f"slurmd -C printed {out!r}")
    return re.sub(r"^NodeName=\S+", f"NodeName={hostname}", out)


class LocalSlurm:
    """slurmctld and slurmd for this host, configured and kept in one temporary directory, stopped by their pid."""

    def __init__(self) -> None:
        # Short path: slurmstepd puts Unix sockets under the spool directory (108-byte limit).
        self.root = Path(tempfile.mkdtemp(prefix="distprof-slurm-", dir="/tmp"))
        self.conf = self.root / "slurm.conf"
        self.host = socket.gethostname().split(".")[0]
        self.daemons: list[subprocess.Popen] = []
        self._daemon_logs: list = []
        self.started_s = 0.0

    @property
    def env(self) -> dict[str, str]:
        """A job environment for this cluster: no Slurm variables of an enclosing job, SLURM_CONF set."""
        env = {k: v for k, v in job_env().items() if not k.startswith("SLURM_")}
        env["SLURM_CONF"] = str(self.conf)
        env["PYTHON"] = sys.executable
        return env

    def write_conf(self) -> None:
        for d in ("state", "spool", "log"):
            (self.root / d).mkdir()
        r = self.root
        lines = [
            f"ClusterName=distprof{os.getpid()}",
            f"SlurmctldHost={self.host}(127.0.0.1)",  # no name lookup between the daemons
            f"SlurmctldPort={_free_port()}",
            f"SlurmdPort={_free_port()}",
            "AuthType=auth/none",
            "CredType=cred/none",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "MpiDefault=none",
            "SlurmUser=root",
            "SlurmdUser=root",
            f"StateSaveLocation={r / 'state'}",
            f"SlurmdSpoolDir={r / 'spool'}",
            f"SlurmctldPidFile={r / 'slurmctld.pid'}",
            f"SlurmdPidFile={r / 'slurmd.pid'}",
            f"SlurmctldLogFile={r / 'log' / 'slurmctld.log'}",
            f"SlurmdLogFile={r / 'log' / 'slurmd.log'}",
            "ReturnToService=2",
            "AccountingStorageType=accounting_storage/none",
            "JobAcctGatherType=jobacct_gather/none",
            "JobCompType=jobcomp/none",
            "SchedulerType=sched/backfill",
            "KillWait=5",
            "MinJobAge=600",
            f"{node_line(self.host)} NodeAddr=127.0.0.1 State=UNKNOWN",
            f"PartitionName=test Nodes={self.host} Default=YES MaxTime=INFINITE State=UP",
        ]
        self.conf.write_text("\n".join(lines) + "\n")

    def start(self, timeout_s: float = 60) -> None:
        t0 = time.monotonic()
        self.write_conf()
        for daemon in ("slurmctld", "slurmd"):
            log = open(self.root / "log" / f"{daemon}.stderr", "w")  # noqa: SIM115 -- open while the daemon runs
            self._daemon_logs.append(log)
            self.daemons.append(subprocess.Popen([daemon, "-D", "-f", str(self.conf)], stdout=log, stderr=log,
                                                 env=self.env, start_new_session=True))
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            dead = [p for p in self.daemons if p.poll() is not None]
            if dead:
                raise AssertionError(f"{dead[0].args[0]} exited ({dead[0].returncode}):\n{self.logs()}")
            state = self.slurm(["sinfo", "-h", "-N", "-o", "%T"], check=False).stdout.strip()
            if state == "idle":
                self.started_s = time.monotonic() - t0
                return
            time.sleep(0.5)
        raise AssertionError(f"node not idle within {timeout_s:.0f} s (state {state!r}):\n{self.logs()}")

    def slurm(self, cmd: list[str], *, env: dict[str, str] | None = None, check: bool = True,
              timeout: float = 60) -> subprocess.CompletedProcess:
        return _run(cmd, env=env or self.env, check=check, timeout=timeout)

    def job_state(self, job_id: str) -> str:
        out = self.slurm(["scontrol", "show", "job", "-o", job_id], check=False).stdout
        m = re.search(r"JobState=(\S+)", out)
        return m.group(1) if m else "UNKNOWN"

    def wait(self, job_ids: list[str], timeout_s: float = 300) -> dict[str, str]:
        """Final state of each job; cancels them and fails with the logs when they are not done in time."""
        deadline = time.monotonic() + timeout_s
        while True:
            states = {j: self.job_state(j) for j in job_ids}
            if all(s in FINAL_STATES for s in states.values()):
                return states
            if time.monotonic() > deadline:
                self.slurm(["scancel", *job_ids], check=False)
                raise AssertionError(f"jobs not done within {timeout_s:.0f} s: {states}\n{self.logs()}")
            time.sleep(1)

    def logs(self, tail: int = 3000) -> str:
        parts = []
        for p in sorted((self.root / "log").glob("*")):
            parts.append(f"--- {p.name}\n{p.read_text(errors='replace')[-tail:]}")
        return "\n".join(parts)

    def stop(self) -> None:
        """Cancel what is left, then stop both daemons by their pid and remove the directory."""
        if self.daemons and all(p.poll() is None for p in self.daemons):
            left = self.slurm(["squeue", "-h", "-o", "%i"], check=False).stdout.split()
            if left:
                self.slurm(["scancel", *left], check=False)
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline and self.slurm(["squeue", "-h"], check=False).stdout.strip():
                    time.sleep(0.5)
        for p in reversed(self.daemons):  # slurmd first, then slurmctld
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(timeout=15)
        for log in self._daemon_logs:
            log.close()
        shutil.rmtree(self.root, ignore_errors=True)
