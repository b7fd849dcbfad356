"""Which job a run directory belongs to: a job identity, and the directory claimed for it once.

A run directory holds one job. The job's identity (:class:`JobIdentity`: when rank 0 started, its host and pid,
torchrun's run id and restart count, Slurm's job and step) goes into every shard (attribute ``job``) and into the
directory's claim file, ``job.json``, which rank 0 creates with ``O_EXCL`` when the ranks agree (``setup.py``). A
second job with the same run id — two job steps of one Slurm allocation share ``SLURM_JOB_ID``; two jobs started with
the same ``--run-id``; a torchrun restart — finds the directory claimed and takes the next free name, ``<run-id>.2``,
``<run-id>.3``, …, which becomes its run id (the closing line says so). Nothing is ever written into another job's
directory, and a directory that holds shards but no claim file (from before claim files) counts as taken. Concurrent
jobs cannot both win a name: ``O_EXCL`` lets exactly one create the claim. A name that is a symbolic link, not a
directory, or another user's directory is never used (the next name is taken), and ``job.json`` is read only when
it is a regular file (never a FIFO: a reader is never blocked).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import stat
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from ..storage import safefs, schema
from ..storage.writer import cause

log = logging.getLogger(__name__)

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

    def note(self, job: JobIdentity | None = None) -> str:
        """For the closing line: why the run is not under the requested name ('' when it is). `job`: the claiming
        job, whose torchrun restart count says when the other job is most likely this one's earlier attempt."""
        if not self.taken:
            return ""
        restart = job.torchelastic_restart_count if job is not None else None
        whose = (f"another job (this is torchrun restart {restart}: each attempt is a run of its own)" if restart
                 else "another job")
        return (f"run id {self.taken[0]!r} already belongs to {whose}"
                + (f" (so do {', '.join(self.taken[1:])})" if len(self.taken) > 1 else "")
                + f"; this job's run id is {self.run_id!r}")


class ClaimError(OSError):
    """No run directory could be claimed; the message says which and why."""

    def __init__(self, message: str) -> None:
        super().__init__(message)


#: A claim file is never read past this size (a claim is a few hundred bytes).
MAX_CLAIM_BYTES = 64 * 1024


def owner(run_dir: Path) -> str | None:
    """The job id a directory belongs to; ``"?"`` when it holds a capture without a (readable) claim, or a claim
    that is not a regular file (a FIFO, a link: never opened blocking, never followed); None when free (empty of
    shards, status files and claim)."""
    path = run_dir / JOB_FILE
    deadline = time.monotonic() + _CLAIM_SETTLE_S
    while True:
        try:
            data = safefs.read_file(path, MAX_CLAIM_BYTES, what="claim file")
        except FileNotFoundError:
            break
        except OSError:
            return "?"
        try:
            doc = safefs.load_json(data, path)
            return str(doc["job"]["id"])
        except (safefs.FileRefused, KeyError, TypeError):
            if data.strip() or time.monotonic() > deadline:  # garbage, or a claim never finished
                return "?"
            time.sleep(0.02)  # created an instant ago by its job, not yet written
    for pattern in (schema.SHARD_GLOB, "rank*.status.json"):
        if next(run_dir.glob(pattern), None) is not None:
            return "?"
    return None


def why_taken(run_dir: Path) -> str | None:
    """Why `run_dir` can never be this job's, whoever claims it: not a directory of this user that only they can
    write to the way distprof needs (a link, another user's directory); None when it is fine."""
    try:
        st = os.lstat(run_dir)
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(st.st_mode):
        return f"{run_dir} is a symbolic link (distprof never writes a run through a link)"
    if not stat.S_ISDIR(st.st_mode):
        return f"{run_dir} is {safefs.kind_of(st.st_mode)}, not a directory"
    if hasattr(os, "geteuid") and st.st_uid != os.geteuid():
        return f"{run_dir} belongs to another user (uid {st.st_uid})"
    return None


_warned_open: set[str] = set()


def _warn_if_open(out: Path) -> None:
    """One warning per process when --out exists and every user may write to it without the sticky bit: another
    user could rename the run directories in it (docs/security.md)."""
    try:
        st = os.stat(out)
    except OSError:
        return
    if st.st_mode & stat.S_IWOTH and not st.st_mode & stat.S_ISVTX and str(out) not in _warned_open:
        _warned_open.add(str(out))
        log.warning("distprof: --out %s is writable by every user (mode %o, no sticky bit): another user can rename "
                    "or replace its run directories; make it 0700 or 0750 (docs/security.md)", out,
                    stat.S_IMODE(st.st_mode))


def check_out(out: Path | str) -> str | None:
    """Why `out` (--out) cannot hold runs, in words; None when it can, or does not exist yet (it is created)."""
    out = Path(out)
    if os.path.islink(out) and not out.exists():
        return (f"--out {out} is a symbolic link to {os.readlink(out)}, which does not exist (a dangling link); "
                "create its target or choose another --out")
    if out.exists() and not out.is_dir():
        return f"--out {out} is not a directory; choose a directory (it is created when missing)"
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
    """Claim ``out/<run_id>`` for `job`, or the first free ``out/<run_id>.<n>``. A name that is a link, not a
    directory, or another user's directory is taken (never written into). Raises ClaimError."""
    out = Path(out)
    bad_out = check_out(out)
    if bad_out:
        raise ClaimError(f"cannot create the run directory {out / run_id}: {bad_out}")
    taken: list[str] = []
    warned = False
    _warn_if_open(out)
    for n in range(1, MAX_TRIES + 1):
        name = run_dir_name(run_id, n)
        d = out / name
        try:
            out.mkdir(parents=True, exist_ok=True)
            try:
                os.mkdir(d, 0o755)
                created = True
            except FileExistsError:
                created = False
            why = None if created else why_taken(d)
            if why is not None:
                if not warned:
                    log.warning("distprof: %s; this job's run goes elsewhere", why)
                    warned = True
                taken.append(name)
                continue
            held = owner(d)
            if held == job.id:
                return Claim(d, name, tuple(taken))
            if held is None and _create_claim(d, name, job):
                return Claim(d, name, tuple(taken))
            if owner(d) == job.id:  # lost the race to another rank of this very job
                return Claim(d, name, tuple(taken))
        except safefs.FileRefused as e:  # swapped for a link after the check
            log.warning("distprof: %s; this job's run goes elsewhere", e)
        except OSError as e:
            raise ClaimError(f"cannot create the run directory {d} ({cause(e)})") from None
        taken.append(name)
    raise ClaimError(f"run ids {run_id!r} to {run_id!r}.{MAX_TRIES} in {out} all belong to other jobs; "
                     "pass another --run-id")


def _create_claim(d: Path, run_id: str, job: JobIdentity) -> bool:
    """Create the claim file with O_EXCL|O_NOFOLLOW relative to the directory (a link there is never followed): True
    when this job now owns `d`, False when another got there first."""
    dfd = safefs.open_dir(d)
    try:
        try:
            fd = os.open(JOB_FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                         safefs.default_mode(0o644), dir_fd=dfd)
        except FileExistsError:
            return False
        try:
            os.write(fd, json.dumps({"run_id": run_id, "job": job.to_dict(), "claimed_ns": time.time_ns()},
                                    indent=1).encode())
            os.fsync(fd)
        except OSError:
            os.close(fd)
            try:
                os.unlink(JOB_FILE, dir_fd=dfd)
            except OSError:
                pass
            raise
        os.close(fd)
        return True
    finally:
        os.close(dfd)
