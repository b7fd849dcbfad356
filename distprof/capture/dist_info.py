"""Who this rank is: rank, host (real or simulated), device and its properties. Process groups: ``groups.py``."""

from __future__ import annotations

import logging
import os
import platform
import socket
from dataclasses import dataclass
from typing import Any

from .sim import SimClock, sim_clock, sim_host_index

log = logging.getLogger(__name__)


@dataclass
class RankInfo:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    host: str
    real_host: str
    sim_host: int | None
    sim_clock: SimClock | None
    device: str
    device_type: str
    device_index: int
    device_properties: list[dict[str, Any]] | None = None  # Kineto-style, the rank's device; None on CPU

    def attrs(self) -> dict[str, Any]:
        import torch

        from .._version import __version__

        return {
            "rank": self.rank,
            "world_size": self.world_size,
            "local_rank": self.local_rank,
            "local_world_size": self.local_world_size,
            "host": self.host,
            "real_host": self.real_host,
            "pid": os.getpid(),
            "device": self.device,
            "device_type": self.device_type,
            "torch_version": torch.__version__,
            "distprof_version": __version__,
            "python_version": platform.python_version(),
            "sim_clock": self.sim_clock.to_dict() if self.sim_clock else None,
            **({"device_properties": self.device_properties} if self.device_properties is not None else {}),
        }


def cpu_budget() -> dict[str, int]:
    """The calling thread's CPU budget, as a shard's attributes record it: the CPUs this process may run on
    (``cpu_affinity``: taskset, numactl, a cgroup's cpuset), the host's CPUs (``host_cpus``) and torch's intra-op
    threads (``intra_op_threads``: what ``torch.set_num_threads`` set on this thread). The report compares a host's
    busy threads with its cores (analysis/findings/cpu.py). Read on the training thread at each window's end."""
    import torch

    try:
        affinity = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        affinity = os.cpu_count() or 0
    out = {"cpu_affinity": affinity, "host_cpus": os.cpu_count() or 0, "intra_op_threads": torch.get_num_threads()}
    return {k: int(v) for k, v in out.items() if int(v) > 0}


def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default


def store_prefix(kind: str) -> str:
    """Where distprof's `kind` of keys (``trigger``, ``watch``) live in the job's c10d store, for this attempt of the
    job: torchrun's agent keeps one store for the whole job, and a worker restarted after a failure
    (``--max-restarts``) must not take its predecessors' keys for its own. torch's restart count is each agent's
    own, so across nodes it tells attempts apart only when every node's workers failed; the run agreement, which
    must never mix attempts, uses a generation of its own instead (``clock.agree``)."""
    return f"distprof/{kind}/a{max(_env_int('TORCHELASTIC_RESTART_COUNT', 0), 0)}/"


def host_of(rank: int) -> str:
    """The host `rank` runs on: the hostname, or ``sim-host<h>`` under DISTPROF_SIM_HOSTS."""
    h = sim_host_index(rank)
    return f"sim-host{h}" if h is not None else socket.gethostname()


def rank_info() -> RankInfo:
    """Rank identity from torch.distributed when initialized, else torchrun/Slurm environment, else 0 of 1."""
    import torch
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        rank, world = dist.get_rank(), dist.get_world_size()
    else:
        rank = _env_int("RANK", _env_int("SLURM_PROCID", 0))
        world = _env_int("WORLD_SIZE", _env_int("SLURM_NTASKS", 1))
    local_rank = _env_int("LOCAL_RANK", _env_int("SLURM_LOCALID", 0))
    local_world = _env_int("LOCAL_WORLD_SIZE", 1)
    real_host = socket.gethostname()
    h = sim_host_index(rank)
    host = host_of(rank)
    clock = sim_clock(h)
    props = None
    if torch.cuda.is_available():
        idx = torch.cuda.current_device()
        device, dtype, didx = torch.cuda.get_device_name(idx), "cuda", idx
        try:
            props = [kineto_device_properties(torch.cuda.get_device_properties(idx), idx,
                                              rocm=bool(getattr(torch.version, "hip", None)))]
        except Exception as e:  # noqa: BLE001 -- the properties are informative; never fail the capture on them
            log.warning("distprof: cannot read the properties of cuda:%d (%s); shards go without device_properties",
                        idx, e)
    else:
        device, dtype, didx = "cpu", "cpu", -1
    return RankInfo(rank, world, local_rank, local_world, host, real_host, h, clock, device, dtype, didx, props)


#: Kineto's ``deviceProperties`` keys (CUDA) and the attribute of torch's device-properties object holding each
#: value, in Kineto's order. Attributes a torch build lacks are left out (as Kineto leaves out what it cannot read).
_KINETO_PROPS: tuple[tuple[str, str], ...] = (
    ("totalGlobalMem", "total_memory"),
    ("computeMajor", "major"),
    ("computeMinor", "minor"),
    ("maxThreadsPerBlock", "max_threads_per_block"),
    ("maxThreadsPerMultiprocessor", "max_threads_per_multi_processor"),
    ("regsPerBlock", "regs_per_block"),
    ("regsPerMultiprocessor", "regs_per_multiprocessor"),
    ("warpSize", "warp_size"),
    ("sharedMemPerBlock", "shared_memory_per_block"),
    ("sharedMemPerMultiprocessor", "shared_memory_per_multiprocessor"),
    ("numSms", "multi_processor_count"),
    ("sharedMemPerBlockOptin", "shared_memory_per_block_optin"),
)
#: Kineto's ROCm traces name the shared memory per multiprocessor differently.
_ROCM_RENAME = {"sharedMemPerMultiprocessor": "maxSharedMemoryPerMultiProcessor"}


def kineto_device_properties(props: Any, index: int, *, rocm: bool = False) -> dict[str, Any]:
    """One ``deviceProperties`` entry as Kineto writes it, from a ``torch.cuda.get_device_properties`` object.

    Pure (any object with the attributes will do). Keys: ``id``, ``name``, then those of :data:`_KINETO_PROPS` whose
    attribute exists and is an integer; on ROCm ``maxSharedMemoryPerMultiProcessor`` replaces
    ``sharedMemPerMultiprocessor`` (Kineto's spelling there) and ``gcnArchName`` (e.g. ``gfx90a``) is added, the
    only way to tell AMD parts apart when the name is the generic ``AMD Radeon Graphics``.
    """
    out: dict[str, Any] = {"id": int(index), "name": str(getattr(props, "name", "") or "")}
    for key, attr in _KINETO_PROPS:
        v = getattr(props, attr, None)
        if isinstance(v, bool) or not isinstance(v, int):
            continue
        out[_ROCM_RENAME.get(key, key) if rocm else key] = int(v)
    arch = getattr(props, "gcnArchName", None)
    if rocm and isinstance(arch, str) and arch:
        out["gcnArchName"] = arch
    return out
