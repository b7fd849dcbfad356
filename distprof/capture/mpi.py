"""The agreement over MPI, for jobs an MPI launcher started whose script makes no torch.distributed group first.

``mpiexec -n 4 python -m distprof.launch train.py``: when the profiler starts, every rank is there and no process
group exists yet, so where mpi4py is importable and its ``COMM_WORLD`` is this job (its size and this process's rank
are what the launcher said: ``WORLD_SIZE`` / ``RANK`` as ``env.py`` set them) the ranks agree over MPI — the hosts
with an allgather, rank 0's run document (run id, job identity, run directory, clock server) with a broadcast —
exactly what :func:`clock.agree` does over the c10d store. Clock ping-pongs then run on distprof's own TCP channel
(``clock.py``), which needs neither MPI nor torch.distributed. A script that calls ``init_process_group`` later
finds the agreement made and keeps it.

mpi4py initialises MPI on import (``MPI_Init_thread``) and finalises it at exit; a script that uses mpi4py itself
shares that. An MPI library started by another MPI's launcher may *abort the process* in ``MPI_Init`` (MPICH under
Open MPI's mpiexec: "unsupported PMI version PMIx", exit 16), so before importing mpi4py here its library is asked
for its name in a child process that does not initialise MPI (:func:`library_flavour`, ~0.2 s once), and mpi4py is
imported only when that library belongs to the launcher's family. Without mpi4py, with another family's library, or
when its world is not this job, nothing is agreed here (the script's own use of mpi4py is left exactly as it was) and
the ranks fall back to the launcher's ids (``setup.py``).
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from typing import Any, Callable

from . import clock
from .env import LaunchEnvError, detect

log = logging.getLogger(__name__)

MPI_LAUNCHERS = ("openmpi", "mvapich", "mpich")
#: launcher (env.detect) -> words one of the MPI libraries it can start has in MPI_Get_library_version
COMPATIBLE = {"openmpi": ("Open MPI",), "mpich": ("MPICH", "MVAPICH", "Intel(R) MPI"), "mvapich": ("MVAPICH",)}
#: asks mpi4py's library its name without initialising MPI (safe under any launcher)
_ASK = ("import mpi4py; mpi4py.rc.initialize = False; mpi4py.rc.finalize = False; from mpi4py import MPI; "
        "print(MPI.Get_library_version().splitlines()[0])")
_ASK_TIMEOUT_S = 30.0


def library_flavour() -> str | None:
    """The first line of MPI_Get_library_version of the library mpi4py loads, asked in a child process that never
    initialises MPI; None when mpi4py is not importable."""
    try:
        r = subprocess.run([sys.executable, "-c", _ASK], capture_output=True, text=True, timeout=_ASK_TIMEOUT_S,
                           check=False, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError) as e:
        log.debug("distprof: cannot ask mpi4py's library: %s", e)
        return None
    return r.stdout.strip() or None if r.returncode == 0 else None


def job_world() -> Any | None:
    """mpi4py's COMM_WORLD when an MPI launcher started this job, mpi4py is importable and its world is the job's
    (same size, this rank); else None."""
    try:
        le = detect(os.environ)
    except LaunchEnvError:
        return None
    if le is None or le.launcher not in MPI_LAUNCHERS or le.world_size < 2:
        return None
    if "mpi4py.MPI" not in sys.modules:  # not imported yet: importing it must not be what aborts the process
        lib = library_flavour()
        if lib is None:
            log.debug("distprof: no agreement over MPI (mpi4py is not importable)")
            return None
        if not any(word in lib for word in COMPATIBLE[le.launcher]):
            log.info("distprof: no agreement over MPI: mpi4py's library (%s) is not the %s launcher's MPI; "
                     "importing it here could abort the process", lib, le.launcher)
            return None
    try:
        from mpi4py import MPI
    except Exception as e:  # noqa: BLE001 -- not installed, or built for an MPI that is not here
        log.debug("distprof: no agreement over MPI (mpi4py: %s)", e)
        return None
    comm = MPI.COMM_WORLD
    want_rank = int(os.environ.get("RANK", le.rank))
    want_size = int(os.environ.get("WORLD_SIZE", le.world_size))
    if comm.Get_size() != want_size or comm.Get_rank() != want_rank:
        log.info("distprof: mpi4py's world (rank %d of %d) is not this job's (rank %d of %d); no agreement over MPI",
                 comm.Get_rank(), comm.Get_size(), want_rank, want_size)
        return None
    return comm


def agree(comm, host: str, rank0_run: Callable[[], dict]) -> clock.Agreement:
    """Collective over COMM_WORLD (blocking): what clock.agree does over the store, with an allgather and a bcast."""
    rank, size = comm.Get_rank(), comm.Get_size()
    hosts = comm.allgather(host)
    run = comm.bcast(rank0_run() if rank == 0 else None, root=0)
    return clock.Agreement(rank, size, clock.roles_of(hosts, rank), run, "mpi/")
