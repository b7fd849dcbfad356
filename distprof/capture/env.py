"""Who this process is in the job when MPI or Slurm started it instead of torchrun.

`mpiexec -n 4 python -m distprof.launch train.py` and `srun python -m distprof.launch train.py` start every rank with
the launcher's own variables (PMI_RANK, OMPI_COMM_WORLD_RANK, SLURM_PROCID, ...), while training scripts expect
torchrun's: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT (what
``dist.init_process_group(init_method="env://")`` reads). :func:`prepare` sets those that are missing, from the first
launcher found, so an unchanged script runs under any of them. A variable already set is never changed; under torchrun
nothing is touched.

Launchers, in the order they are looked for (an MPI launcher wins over Slurm: `mpiexec` inside a batch job still sees
the batch step's SLURM_PROCID=0 on every rank):

- Open MPI: OMPI_COMM_WORLD_RANK / _SIZE / _LOCAL_RANK / _LOCAL_SIZE
- MVAPICH2: MV2_COMM_WORLD_RANK / _SIZE / _LOCAL_RANK / _LOCAL_SIZE
- MPICH / Intel MPI (Hydra), and PMI in general: PMI_RANK, PMI_SIZE, MPI_LOCALRANKID, MPI_LOCALNRANKS
- Slurm, a task of a job step (`srun`): SLURM_PROCID, SLURM_STEP_NUM_TASKS (else SLURM_NTASKS), SLURM_LOCALID, the
  node's count in SLURM_STEP_TASKS_PER_NODE (else SLURM_NTASKS_PER_NODE). The batch script itself is no task of a step
  (it has no SLURM_STEP_ID): a single process started there is left alone, not made rank 0 of SLURM_NTASKS.

MASTER_ADDR: the first host of the Slurm node list (the step's, else the job's: `scontrol show hostnames`) when the job
spans several nodes or runs under srun; ``localhost`` when every rank is on this node; otherwise unknown (a warning
says to set it). MASTER_PORT: derived from the job id (:func:`derived_port`) so every rank computes the same one,
else 29500, torch's default.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import shutil
import socket
import subprocess
import zlib
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass

log = logging.getLogger(__name__)

DEFAULT_PORT = 29500
#: Ports derived from a job id fall in [PORT_BASE, PORT_BASE + PORT_SPAN): below Linux's ephemeral range (32768-),
#: so they do not collide with ports the kernel hands out for outgoing connections.
PORT_BASE, PORT_SPAN = 20000, 10000
#: What torchrun sets for its workers; any of these means torchrun started us and owns the rank variables.
TORCHRUN_MARKERS = ("TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT")
#: Step ids above this are Slurm's special steps (batch script, extern, interactive, pending: SLURM_MAX_NORMAL_STEP_ID
#: in slurm.h); their processes are no task of a user's `srun`, nor are the steps Slurm names instead of numbering.
MAX_NORMAL_STEP_ID = 0xFFFFFFF0
_SPECIAL_STEP_NAMES = {"batch", "extern", "interactive", "pending"}


@dataclass(frozen=True)
class LaunchEnv:
    """This process's place in the job as its launcher describes it."""

    launcher: str  # "openmpi" | "mvapich" | "mpich" | "slurm"
    rank: int
    world_size: int
    local_rank: int | None  # None where the launcher does not say
    local_world_size: int | None
    host: str
    job_id: str | None  # the launcher's job identity, for MASTER_PORT
    nodelist: str | None  # Slurm hostlist expression of the nodes of this job or step, for MASTER_ADDR

    @property
    def single_node(self) -> bool:
        return self.local_world_size is not None and self.local_world_size == self.world_size


class LaunchEnvError(ValueError):
    """The launcher's variables are present but unusable (not integers, rank out of range)."""


def _int(environ: Mapping[str, str], name: str) -> int | None:
    v = environ.get(name)
    if v is None or v.strip() == "":
        return None
    try:
        return int(v)
    except ValueError:
        raise LaunchEnvError(f"{name}={v!r} is not an integer") from None


def _required_int(environ: Mapping[str, str], name: str) -> int:
    v = _int(environ, name)
    if v is None:
        raise LaunchEnvError(f"{name} is empty")
    return v


#: Each MPI launcher's (rank, world size, local rank, local world size) variables, in the order they are looked for.
_MPI_VARIABLES: tuple[tuple[str, tuple[str, str, str, str]], ...] = (
    ("openmpi", ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                 "OMPI_COMM_WORLD_LOCAL_SIZE")),
    ("mvapich", ("MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE", "MV2_COMM_WORLD_LOCAL_RANK",
                 "MV2_COMM_WORLD_LOCAL_SIZE")),
    ("mpich", ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS")),
)


def _is_slurm_task(environ: Mapping[str, str]) -> bool:
    """A task of an `srun` step (the batch script has SLURM_PROCID but no step id; special steps have ids above
    MAX_NORMAL_STEP_ID)."""
    step = (environ.get("SLURM_STEP_ID") or environ.get("SLURM_STEPID") or "").strip().lower()
    if environ.get("SLURM_PROCID") is None or not step or step in _SPECIAL_STEP_NAMES:
        return False
    return not step.isdigit() or int(step) <= MAX_NORMAL_STEP_ID


def tasks_per_node(spec: str) -> list[int]:
    """Slurm's compressed per-node task counts ("2(x3),1" -> [2, 2, 2, 1]), at most 1,000,000 nodes."""
    out: list[int] = []
    for part in spec.split(","):
        m = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if not m:
            raise LaunchEnvError(f"tasks per node {spec!r}: expected counts like 2(x3),1")
        reps = int(m.group(2) or 1)
        if len(out) + reps > 1_000_000:
            raise LaunchEnvError(f"tasks per node {spec!r}: more than 1,000,000 nodes")
        out.extend([int(m.group(1))] * reps)
    return out


def _slurm_local_world(environ: Mapping[str, str]) -> int | None:
    """Tasks of this step on this node; None when Slurm's variables do not say (LOCAL_WORLD_SIZE is then left unset)."""
    spec = environ.get("SLURM_STEP_TASKS_PER_NODE") or environ.get("SLURM_TASKS_PER_NODE")
    try:
        if spec:
            counts = tasks_per_node(spec)
            if len(set(counts)) == 1:
                return counts[0]
            node = _int(environ, "SLURM_NODEID")
            return counts[node] if node is not None and 0 <= node < len(counts) else None
        return _int(environ, "SLURM_NTASKS_PER_NODE")
    except LaunchEnvError as e:
        log.debug("distprof: local world size unknown: %s", e)
        return None


def detect(environ: Mapping[str, str]) -> LaunchEnv | None:
    """The launcher that started this process, or None (torchrun, a plain `python`, or a Slurm batch script).

    Pure: reads only `environ`. Raises LaunchEnvError when a launcher's variables are present but unusable.
    """
    if any(environ.get(k) for k in TORCHRUN_MARKERS):
        return None
    mpi = _from_mpi(environ)
    slurm = None
    if _is_slurm_task(environ):
        try:
            slurm = _from_slurm(environ)
        except LaunchEnvError:
            if mpi is None:
                raise
    # srun starting MPI ranks itself (--mpi=pmi2/pmix) gives both views of the same ranks: Slurm's is the fuller one.
    le = mpi if mpi is not None and not _same_ranks(mpi, slurm) else slurm
    if le is None:
        return None
    if le.local_rank is not None and le.local_world_size is not None \
            and not 0 <= le.local_rank < le.local_world_size:
        le = dataclasses.replace(le, local_rank=None, local_world_size=None)  # inconsistent: leave LOCAL_* alone
    return le


def _check_rank(rank_var: str, rank: int, world_var: str, world: int) -> None:
    if world < 1 or not 0 <= rank < world:
        raise LaunchEnvError(f"{rank_var}={rank} is no rank of a world of {world_var}={world}")


def _same_ranks(a: LaunchEnv, b: LaunchEnv | None) -> bool:
    return b is not None and (a.rank, a.world_size) == (b.rank, b.world_size)


def _from_mpi(environ: Mapping[str, str]) -> LaunchEnv | None:
    for launcher, (r, w, lr, lw) in _MPI_VARIABLES:
        if environ.get(r) is not None and environ.get(w) is not None:
            break
    else:
        return None
    rank, world = _required_int(environ, r), _required_int(environ, w)
    _check_rank(r, rank, w, world)
    local_rank, local_world = _int(environ, lr), _int(environ, lw)
    job_id = (environ.get("PMIX_NAMESPACE") or environ.get("OMPI_MCA_ess_base_jobid") or environ.get("MPIRUN_ID")
              or environ.get("SLURM_JOB_ID") or environ.get("SLURM_JOBID"))
    return LaunchEnv(launcher, rank, world, local_rank, local_world,
                     environ.get("PMI_HOSTNAME") or socket.gethostname(), job_id,
                     environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST"))


def _from_slurm(environ: Mapping[str, str]) -> LaunchEnv:
    rank = _required_int(environ, "SLURM_PROCID")
    world_var = "SLURM_STEP_NUM_TASKS" if environ.get("SLURM_STEP_NUM_TASKS") else "SLURM_NTASKS"
    world = _required_int(environ, world_var)
    _check_rank("SLURM_PROCID", rank, world_var, world)
    return LaunchEnv("slurm", rank, world, _int(environ, "SLURM_LOCALID"),
                     _slurm_local_world(environ), environ.get("SLURMD_NODENAME") or socket.gethostname(),
                     environ.get("SLURM_JOB_ID") or environ.get("SLURM_JOBID"),
                     environ.get("SLURM_STEP_NODELIST") or environ.get("SLURM_JOB_NODELIST")
                     or environ.get("SLURM_NODELIST"))


def derived_port(job_id: str | None) -> int:
    """MASTER_PORT for a job: PORT_BASE + id mod PORT_SPAN for a numeric id (a Slurm job id), a CRC-32 of the id
    otherwise (the same on every rank, unlike Python's salted hash); DEFAULT_PORT without an id."""
    if not job_id:
        return DEFAULT_PORT
    key = int(job_id) if job_id.isdigit() else zlib.crc32(job_id.encode())
    return PORT_BASE + key % PORT_SPAN


_BRACKET = re.compile(r"\[([^\]]*)\]")


def first_host_of(hostlist: str) -> str | None:
    """First host of a Slurm hostlist expression ("gpu[003-010,12],cpu1" -> "gpu003"), as `scontrol show
    hostnames` would list it; None when the expression is empty or malformed."""
    depth, end = 0, len(hostlist)
    for i, c in enumerate(hostlist):
        depth += c == "["
        depth -= c == "]"
        if c == "," and depth == 0:
            end = i
            break
    first = hostlist[:end].strip()

    def lowest(m: re.Match) -> str:
        return m.group(1).split(",")[0].split("-")[0].strip()

    host = _BRACKET.sub(lowest, first)
    return host if host and not any(c in host for c in "[],") else None


def first_host(hostlist: str, scontrol: str | None = None) -> str | None:
    """First host of `hostlist` by `scontrol show hostnames` when scontrol is installed, else parsed here."""
    scontrol = scontrol or shutil.which("scontrol")
    if scontrol:
        try:
            out = subprocess.run([scontrol, "show", "hostnames", hostlist], capture_output=True, text=True,
                                 timeout=10, check=True).stdout.split()
            if out:
                return out[0]
        except (OSError, subprocess.SubprocessError) as e:
            log.debug("distprof: scontrol show hostnames %s failed (%s); parsing it instead", hostlist, e)
    return first_host_of(hostlist)


def torch_variables(le: LaunchEnv, resolve_first_host: Callable[[str], str | None] = first_host) -> dict[str, str]:
    """The torchrun-style variables `le` implies (LOCAL_* only where known, MASTER_ADDR only where it can be told)."""
    out = {"RANK": str(le.rank), "WORLD_SIZE": str(le.world_size)}
    if le.local_rank is not None:
        out["LOCAL_RANK"] = str(le.local_rank)
    if le.local_world_size is not None:
        out["LOCAL_WORLD_SIZE"] = str(le.local_world_size)
    addr = None
    if le.launcher == "slurm" and le.nodelist:
        addr = resolve_first_host(le.nodelist)
    elif le.single_node or le.world_size == 1:
        addr = "localhost"
    elif le.nodelist:
        addr = resolve_first_host(le.nodelist)  # mpiexec inside a Slurm job: rank 0 runs on the first node
    if addr:
        out["MASTER_ADDR"] = addr
    out["MASTER_PORT"] = str(derived_port(le.job_id))
    return out


def _already_set(_hostlist: str) -> None:
    return None


def prepare(environ: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """Set the torchrun-style variables missing from `environ` (os.environ by default); returns what was set.

    Never raises: unusable launcher variables leave everything as it is, with one warning.
    """
    environ = os.environ if environ is None else environ
    try:
        le = detect(environ)
    except LaunchEnvError as e:
        log.warning("distprof: ignoring the launcher's variables (%s); set RANK, WORLD_SIZE, LOCAL_RANK, "
                    "MASTER_ADDR and MASTER_PORT yourself if the script needs them", e)
        return {}
    if le is None:
        return {}
    wanted = torch_variables(le, first_host if "MASTER_ADDR" not in environ else _already_set)
    added = {k: v for k, v in wanted.items() if k not in environ}
    environ.update(added)
    if "MASTER_ADDR" not in environ and le.world_size > 1 and le.rank == 0:
        log.warning("distprof: %s job on several nodes without a Slurm node list: cannot tell rank 0's host; "
                    "set MASTER_ADDR (e.g. mpiexec -genv MASTER_ADDR=<host of rank 0>) if the script uses "
                    "torch.distributed", le.launcher)
    log.debug("distprof: %s rank %d/%d on %s: set %s", le.launcher, le.rank, le.world_size, le.host,
              ", ".join(f"{k}={v}" for k, v in added.items()) or "nothing")
    return added
