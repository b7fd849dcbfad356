"""Where a rank's run goes, which job it is, and whom it syncs clocks with, settled once at a point every rank reaches.

The run id, the job identity and the host roles need every rank (:func:`clock.agree`), so they are agreed only where
every rank of the job is guaranteed to be: when the default process group registers inside ``init_process_group``
(the capture's listener in ``groups.py``), when a profiler starts on a job whose group already exists, or — a job
started by ``mpiexec`` whose script does not make a torch.distributed group first — over MPI when the profiler
starts (``mpi.py``). Never at a window boundary: a rank there may be blocked on a peer (a pipeline stage waiting in
``recv``) that cannot get to the same point.

Rank 0 decides for everyone (:meth:`RunSetup.rank0_run`): the run id (``--run-id``, else ``SLURM_JOB_ID``, else
``TORCHELASTIC_RUN_ID``, else a new one), a new job identity, the run directory it claims for the job
(``rundir.py``: a directory another job holds is never written into; the run then goes to ``<run-id>.2``, …), and
where its clock server listens. Without an agreement the run id still comes from the environment (the same on every
rank), the job from the launcher's ids, and a job of one process makes its own.
"""

from __future__ import annotations

import logging
import os
import threading
from datetime import timedelta
from pathlib import Path

from ..config import ProfileConfig
from ..runid import is_safe_run_id
from ..storage.writer import cause, remove_orphans
from . import clock, dist_info, rundir
from .sim import sim_clock, sim_host_index

log = logging.getLogger(__name__)


def env_run_id() -> str | None:
    for key in ("SLURM_JOB_ID", "TORCHELASTIC_RUN_ID"):
        v = os.environ.get(key, "").strip()
        if v and v.lower() != "none" and is_safe_run_id(v):  # else not a directory name: a run id of its own
            return v
    return None


#: Set in a process torch.multiprocessing.spawn started under the launcher (``spawned.py``): how many processes the
#: call started. They are ranks of one job whose script makes the process group itself, with no launcher's variables
#: to say so (0: not such a process).
_spawned_ranks = 0


def expect_spawned_ranks(n: int) -> None:
    """This process is one of `n` started by the script's torch.multiprocessing.spawn (``spawned.py``): a rank of a job
    of several until its process group says otherwise, so nothing is claimed before the agreement."""
    global _spawned_ranks
    _spawned_ranks = max(0, int(n))


def _env_world_size() -> int:
    if _spawned_ranks:
        return _spawned_ranks
    for key in ("WORLD_SIZE", "SLURM_NTASKS"):
        try:
            return int(os.environ[key])
        except (KeyError, ValueError):
            continue
    return 1


def is_distributed() -> bool:
    """More than one rank: an initialized group of several, or a launcher that says so."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size() > 1
    return _env_world_size() > 1


class RunSetup:
    """The agreement (run id, job, roles, clock channel) and the run directory, for one profiler. Thread-safe."""

    def __init__(self, config: ProfileConfig, clock_sync: clock.ClockSync, *,
                 inherited: tuple[str, rundir.JobIdentity] | None = None) -> None:
        self.config = config
        self.clock = clock_sync
        #: the run id and job of the launching process whose run directory this job's ranks go to (the script
        #: spawned them: ``spawned.py``); rank 0 claims that directory as that job
        self.inherited = inherited
        self.agreement: clock.Agreement | None = None
        self.run_id: str | None = None
        self.run_dir: Path | None = None
        self.job: rundir.JobIdentity | None = None
        #: why the run is not under the requested run id ('' when it is), for the closing line
        self.note = ""
        #: rank 0 could not claim a run directory: why (every rank then records nothing)
        self.dir_error: str | None = None
        self._claim: rundir.Claim | None = None
        self._agreed = threading.Event()
        self._lock = threading.Lock()
        self._local_id: str | None = None

    # -- the agreement (a point every rank reaches; blocking) ------------------------------------------------------
    def agree(self, store, rank: int, world_size: int, timeout: timedelta | None = None) -> None:
        """Agree the run id, job and host roles with every rank over the c10d store, then start clock sync.

        `timeout`: how long to wait for the other ranks (default: the store's own, what torch waits for peers with).
        """
        if self.agreement is not None:
            return
        self.clock.sim = sim_clock(sim_host_index(rank))
        server: list[clock.ClockServer] = []
        agreement = clock.agree(store, rank, world_size, dist_info.host_of(rank),
                                lambda: self.rank0_run(world_size, server), timeout)
        self.adopt(agreement, server[0] if server else None)

    def rank0_run(self, world_size: int, server_out: list) -> dict:
        """Rank 0, inside the agreement: the run document every rank takes. Claims the run directory (or says why it
        cannot), opens the clock server when there are other ranks. Never raises (the others wait for it)."""
        try:
            return self._rank0_run(world_size, server_out)
        except Exception as e:  # noqa: BLE001
            return {"run_id": self.config.run_id or env_run_id() or clock.new_run_id(),
                    "error": f"rank 0 could not set the run up ({type(e).__name__}: {e})"}

    def _rank0_run(self, world_size: int, server_out: list) -> dict:
        with self._lock:  # one claim per process: a side thread's ensure_run_dir may be claiming right now
            doc = self._rank0_claim()
        if world_size > 1:
            try:
                srv = clock.ClockServer()
                server_out.append(srv)
                doc["clock"] = srv.endpoint()
            except OSError as e:  # no clock samples; the merger aligns from collectives
                log.warning("distprof: rank 0: cannot open the clock-sync server (%s); hosts will be aligned from "
                            "collectives", e)
        return doc

    def _rank0_claim(self) -> dict:
        """The run document's run id, job and directory (under the lock)."""
        if self._claim is not None and self.job is not None:
            # this process claimed its run directory before the group formed (one process that makes its own
            # group): the group's run is that directory, not a second one beside it
            return {"run_id": self._claim.run_id, "requested": self._claim.run_id, "job": self.job.to_dict(),
                    "note": self.note}
        if self.inherited is not None:  # the launching process claimed the run directory for this job
            run_id, job = self.inherited
        else:
            run_id = self.config.run_id or env_run_id() or clock.new_run_id()
            job = rundir.new_job()
        doc: dict = {"run_id": run_id, "requested": run_id, "job": job.to_dict()}
        try:
            c = rundir.claim(self.config.out, run_id, job)
            self._claim = c
            doc.update(run_id=c.run_id, note=c.note(job))
        except rundir.ClaimError as e:
            doc["error"] = str(e)
        return doc

    def adopt(self, agreement: clock.Agreement, server: clock.ClockServer | None) -> None:
        """Take the agreed run document and start the clock side thread (store or MPI agreement alike)."""
        run = agreement.run
        with self._lock:
            said = self.note  # already logged when this process claimed its directory on its own
            self.agreement = agreement
            self.run_id = run.get("run_id")
            self.job = rundir.JobIdentity(**run["job"]) if isinstance(run.get("job"), dict) else None
            self.note = run.get("note") or ""
            self.dir_error = run.get("error")
        self.clock.start(agreement.roles, agreement.rank, server, run.get("clock"))
        self._agreed.set()
        if self.note and self.note != said and agreement.rank == 0:
            log.warning("distprof: %s (nothing of the other job's is touched)", self.note)

    def agree_with_existing_group(self) -> bool:
        """The profiler starts on a job whose default group exists: agree now (every rank enters the profiler),
        waiting at most the sync timeout for the others."""
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            return False
        from torch.distributed import distributed_c10d as c10d

        self.agree(c10d._get_default_store(), dist.get_rank(), dist.get_world_size(),
                   timedelta(seconds=self.config.sync_timeout_s))
        return True

    def agree_over_mpi(self) -> bool:
        """An MPI launcher's job with no process group yet (the profiler starts before the script): agree over MPI
        when mpi4py's world is the job (mpi.py). True when agreed."""
        import torch.distributed as dist

        if self.agreement is not None or (dist.is_available() and dist.is_initialized()):
            return False
        from . import mpi

        comm = mpi.job_world()
        if comm is None:
            return False
        rank = comm.Get_rank()
        self.clock.sim = sim_clock(sim_host_index(rank))
        server: list[clock.ClockServer] = []
        agreement = mpi.agree(comm, dist_info.host_of(rank), lambda: self.rank0_run(comm.Get_size(), server))
        self.adopt(agreement, server[0] if server else None)
        return True

    def roles(self) -> clock.ClockRoles | None:
        """Host roles: agreed, or this rank alone when the job is one process; None when not (yet) known."""
        if self.agreement is not None:
            return self.agreement.roles
        if not is_distributed():
            return clock.roles_of([dist_info.host_of(0)], 0)
        return None

    # -- the run directory ------------------------------------------------------------------------------------------
    def give_up_waiting(self) -> None:
        """The profiler closes: no agreement is coming any more (the job never made a process group distprof saw);
        a writer waiting for one goes on at once without it."""
        self._agreed.set()

    def _unagreed_run(self) -> tuple[str, rundir.JobIdentity]:
        """No agreement: the run id and job from the environment, or this process's own."""
        if self.inherited is not None and not is_distributed():  # the one process the launcher spawned
            return self.inherited
        # processes the script spawned that never made a group (separate trainings) each write to their own: under
        # one run id they would all be rank 0 of one directory
        explicit = None if _spawned_ranks else (self.config.run_id or env_run_id())
        if is_distributed() and explicit:
            # every rank computes the same job: the launcher's ids, else only the run id (then a second job with this
            # run id cannot be told from this one: nothing to agree through)
            job = rundir.launcher_job() or rundir.JobIdentity(id=f"unagreed-{explicit}", started="", host="", pid=-1)
            log.warning("distprof: no run id agreed with the other ranks (the process group was made where distprof "
                        "could not see it, or there is none); the ranks write to %s/%s as job %s", self.config.out,
                        explicit, job.id)
            return explicit, job
        if _spawned_ranks:
            log.warning("distprof: this process, one of %d the script started with torch.multiprocessing, made no "
                        "process group distprof saw: it writes to a run directory of its own", _spawned_ranks)
        elif is_distributed():
            log.warning("distprof: no run id agreed with the other ranks within %.0f s (the process group was made "
                        "where distprof could not see it); this rank writes to its own run directory; pass --run-id "
                        "to keep the ranks together", self.config.sync_timeout_s)
        self._local_id = self._local_id or explicit or clock.new_run_id()
        self.job = self.job or rundir.new_job()
        return self._local_id, self.job

    def ensure_run_dir(self, rank: int, *, wait: bool) -> Path | None:
        """The run directory (created, this rank's orphans removed) once it is known; None when not yet.

        A job of several ranks learns it from the agreement; `wait` (background threads only) waits for that,
        bounded by the sync timeout (or until the profiler closes), then goes on without. Raises rundir.ClaimError
        when no directory can be had (rank 0 could not claim one, or this rank cannot create it).
        """
        if self.run_dir is not None:
            return self.run_dir
        if self.agreement is None and is_distributed():
            if not wait:
                return None
            self._agreed.wait(self.config.sync_timeout_s)
        with self._lock:
            if self.run_dir is not None:
                return self.run_dir
            if self.dir_error:
                raise rundir.ClaimError(self.dir_error)
            if self.agreement is not None:
                if self._claim is not None:
                    run_dir = self._claim.run_dir
                else:  # rank 0 claimed it for the job; here it only has to exist
                    run_dir = Path(self.config.out) / self.run_id
                    try:
                        run_dir.mkdir(parents=True, exist_ok=True)
                    except OSError as e:
                        raise rundir.ClaimError(f"cannot create the run directory {run_dir} ({cause(e)})") from None
            elif self._claim is not None:  # rank 0's agreement in progress has claimed it (adopted in a moment)
                run_dir = self._claim.run_dir
            else:
                run_id, job = self._unagreed_run()
                c = rundir.claim(self.config.out, run_id, job)
                self._claim, self.job, self.note = c, job, c.note(job)
                if self.note:
                    log.warning("distprof: rank %d: %s (nothing of the other job's is touched)", rank, self.note)
                self.run_id, run_dir = c.run_id, c.run_dir
            remove_orphans(run_dir, rank)
            self.run_dir = run_dir
            return run_dir
