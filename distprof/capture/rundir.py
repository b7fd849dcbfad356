"""Which job a run directory belongs to: a job identity, and the directory claimed for it once.

A run directory holds one job. The job's identity (:class:`JobIdentity`: when rank 0 started, its host and pid,
torchrun's run id and restart count, Slurm's job and step) goes into every shard (attribute ``job``) and into the
directory's claim file, ``job.json``, which rank 0 creates with ``O_EXCL`` when the ranks agree (``setup.py``). A
second job with the same run id — two job steps of one Slurm allocation share ``SLURM_JOB_ID``; two jobs started with
the same ``--run-id``; a torchrun restart — finds the directory claimed and takes the next free name, ``<run-id>.2``,
``<run-id>.3``, …, which becomes its run id (the closing line says so). Nothing is ever written into another job's
directory, and a directory that holds shards but no claim file (from before claim files) counts as taken. Concurrent
jobs cannot both win a name: ``O_EXCL`` lets exactly one create the claim.
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from ..storage import schema
from ..storage.writer import cause

#: The claim file in a run directory.
JOB_FILE = "job.json"
#: Names tried for one run id before giving up: <run-id>, <run-id>.2, ..., <run-id>.MAX_TRIES.
MAX_TRIES = 1000
#: How long a claim file that exists but is still empty (its job is writing it now) is re-read before it counts as
#: another job's.
_CLAIM_SETTLE_S = 1.0


@dataclass(frozen=True)
class JobIdentity:
    """Who wrote a run: unique per job (``id``), plus what a user recognises it by."""

    id: str
    started: str  # UTC, ISO 8601, when rank 0 agreed the run
    host: str  # rank 0's host
    pid: int  # rank 0's pid
    torchelastic_run_id: str | None = None
    torchelastic_restart_count: int | None = None
    slurm_job_id: str | None = None
    slurm_step_id: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def _env(name: str) -> str | None:
    v = os.environ.get(name, "").strip()
    return v if v and v.lower() != "none" else None


def _env_int(name: str) -> int | None:
    v = _env(name)
    try:
        return int(v) if v is not None else None
    except ValueError:
        return None


def new_job(host: str | None = None) -> JobIdentity:
    """This process as rank 0 of a new job: the identity every rank's shards will carry."""
    now = time.time_ns()
    started = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now / 1e9)) + f".{now // 1_000_000 % 1000:03d}Z"
    host = host or socket.gethostname()
    pid = os.getpid()
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(now / 1e9)) + f".{now // 1000 % 1_000_000:06d}Z"
    return JobIdentity(id=f"{stamp}-{host}-{pid}", started=started, host=host, pid=pid, **_launcher_ids())


def _launcher_ids() -> dict:
    return {"torchelastic_run_id": _env("TORCHELASTIC_RUN_ID"),
            "torchelastic_restart_count": _env_int("TORCHELASTIC_RESTART_COUNT"),
            "slurm_job_id": _env("SLURM_JOB_ID"), "slurm_step_id": _env("SLURM_STEP_ID")}


def launcher_job() -> JobIdentity | None:
    """The job as its launcher names it, the same on every rank without any exchange (torchrun's run id and restart
    count, or Slurm's job and step); None when there is none. For ranks that could not agree with each other."""
    ids = _launcher_ids()
    if ids["torchelastic_run_id"]:
        key = f"torchelastic-{ids['torchelastic_run_id']}-{ids['torchelastic_restart_count'] or 0}"
    elif ids["slurm_job_id"] and ids["slurm_step_id"]:
        key = f"slurm-{ids['slurm_job_id']}.{ids['slurm_step_id']}"
    else:
        return None
    return JobIdentity(id=key, started="", host="", pid=-1, **ids)


@dataclass(frozen=True)
class Claim:
    """The directory a job's run goes to, its run id (the directory's name), and the names other jobs held."""

    run_dir: Path
    run_id: str
    taken: tuple[str, ...] = ()  # names tried first and found to be another job's

    def note(self) -> str:
        """For the closing line: why the run is not under the requested name ('' when it is)."""
        if not self.taken:
            return ""
        return (f"run id {self.taken[0]!r} already belongs to another job"
                + (f" (so do {', '.join(self.taken[1:])})" if len(self.taken) > 1 else "")
                + f"; this job's run id is {self.run_id!r}")


class ClaimError(OSError):
    """No run directory could be claimed; the message says which and why."""

    def __init__(self, message: str) -> None:
        super().__init__(message)


def owner(run_dir: Path) -> str | None:
    """The job id a directory belongs to; ``"?"`` when it holds a capture without a (readable) claim; None when
    free (empty of shards, status files and claim)."""
    path = run_dir / JOB_FILE
    deadline = time.monotonic() + _CLAIM_SETTLE_S
    while True:
        try:
            text = path.read_text()
        except FileNotFoundError:
            break
        except OSError:
            return "?"
        try:
            doc = json.loads(text)
            return str(doc["job"]["id"])
        except (ValueError, KeyError, TypeError):
            if text.strip() or time.monotonic() > deadline:  # garbage, or a claim never finished
                return "?"
            time.sleep(0.02)  # created an instant ago by its job, not yet written
    for pattern in (schema.SHARD_GLOB, "rank*.status.json"):
        if next(run_dir.glob(pattern), None) is not None:
            return "?"
    return None


def run_dir_name(run_id: str, n: int) -> str:
    """The n-th job's directory name for `run_id` (n = 1: the run id itself; then ``<run-id>.<n>``)."""
    return run_id if n == 1 else f"{run_id}.{n}"


def latest_run_dir(out: Path | str, run_id: str) -> Path:
    """The directory of the latest job that took `run_id` (the highest ``<run-id>.<n>`` that exists, else
    ``out/<run-id>``): where ``distprof trigger --job ID`` finds a job step that is not the allocation's first."""
    out = Path(out)
    latest = out / run_id
    for n in range(2, MAX_TRIES + 1):
        d = out / run_dir_name(run_id, n)
        if not d.is_dir():
            break
        latest = d
    return latest


def claim(out: Path | str, run_id: str, job: JobIdentity) -> Claim:
    """Claim ``out/<run_id>`` for `job`, or the first free ``out/<run_id>.<n>``. Raises ClaimError."""
    out = Path(out)
    taken: list[str] = []
    for n in range(1, MAX_TRIES + 1):
        name = run_dir_name(run_id, n)
        d = out / name
        try:
            d.mkdir(parents=True, exist_ok=True)
            held = owner(d)
            if held == job.id:
                return Claim(d, name, tuple(taken))
            if held is None and _create_claim(d, name, job):
                return Claim(d, name, tuple(taken))
            if owner(d) == job.id:  # lost the race to another rank of this very job
                return Claim(d, name, tuple(taken))
        except OSError as e:
            raise ClaimError(f"cannot create the run directory {d} ({cause(e)})") from None
        taken.append(name)
    raise ClaimError(f"run ids {run_id!r} to {run_id!r}.{MAX_TRIES} in {out} all belong to other jobs; "
                     "pass another --run-id")


def _create_claim(d: Path, run_id: str, job: JobIdentity) -> bool:
    """Create the claim file with O_EXCL: True when this job now owns `d`, False when another got there first."""
    path = d / JOB_FILE
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    try:
        os.write(fd, json.dumps({"run_id": run_id, "job": job.to_dict(), "claimed_ns": time.time_ns()},
                                indent=1).encode())
        os.fsync(fd)
    except OSError:
        os.close(fd)
        try:
            path.unlink()
        except OSError:
            pass
        raise
    os.close(fd)
    return True
