"""Who this rank is: rank, host, device, process groups, and which threads serve which gloo group."""

from __future__ import annotations

import functools
import glob
import logging
import os
import platform
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any

from .sim import SimClock, sim_clock, sim_host_index

log = logging.getLogger(__name__)

GLOO_THREAD_NAME = "pt_gloo_runloop"

#: OS tid of a gloo worker thread -> process-group name, filled in as groups are created.
_gloo_thread_pg: dict[int, str] = {}
#: process-group names distprof created for itself (excluded from the user's groups).
_own_pgs: set[str] = set()
_lock = threading.Lock()


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


def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default


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
    host = f"sim-host{h}" if h is not None else real_host
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


def backend_name() -> str:
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return "none"
    try:
        return str(dist.get_backend())
    except Exception:  # noqa: BLE001 -- best effort metadata
        return "unknown"


def process_groups() -> list[dict[str, Any]]:
    """The user's process groups as {index, name, desc, backend, ranks}; index is what /comms.pg refers to."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return []
    try:
        from torch.distributed import distributed_c10d as c10d

        configs = c10d._get_all_pg_configs()
    except Exception:  # noqa: BLE001 -- private API; degrade to the default group only
        return [{"index": 0, "name": "0", "desc": "default_pg", "backend": backend_name(),
                 "ranks": list(range(dist.get_world_size()))}]
    out = []
    for cfg in configs:
        name = str(cfg.get("pg_name"))
        if name in _own_pgs:
            continue
        out.append({"index": len(out), "name": name, "desc": cfg.get("pg_desc", ""),
                    "backend": cfg.get("backend_config", ""), "ranks": list(cfg.get("ranks", []))})
    return out


def thread_names() -> dict[int, str]:
    """OS tid -> thread name for every thread of this process."""
    out = {}
    for p in glob.glob("/proc/self/task/*/comm"):
        try:
            with open(p) as fh:
                out[int(p.split("/")[4])] = fh.read().strip()
        except (OSError, ValueError):
            continue
    return out


def gloo_thread_pg() -> dict[int, str]:
    """OS tid of each gloo worker -> the process-group name it serves, as far as known."""
    with _lock:
        return dict(_gloo_thread_pg)


def mark_own_pg(name: str, tids: set[int] | None = None) -> None:
    with _lock:
        _own_pgs.add(name)
        for t in tids or ():
            _gloo_thread_pg[t] = name


def _gloo_tids() -> set[int]:
    return {t for t, n in thread_names().items() if n == GLOO_THREAD_NAME}


def _is_gloo_member(group) -> bool:
    import torch.distributed as dist

    if group is None or group == dist.GroupMember.NON_GROUP_MEMBER:
        return False
    try:
        return "gloo" in str(dist.get_backend(group))
    except Exception:  # noqa: BLE001
        return False


def _record_new_gloo_threads(before: set[int], group, wait_s: float = 0.5) -> set[int]:
    """Tids of the gloo workers `group` just started (they name themselves asynchronously, so poll briefly)."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    if not _is_gloo_member(group):
        return set()
    deadline = time.monotonic() + wait_s
    new: set[int] = set()
    while time.monotonic() < deadline:
        new = _gloo_tids() - before - set(_gloo_thread_pg)
        if len(new) >= 2:  # ProcessGroupGloo starts 2 workers by default
            break
        time.sleep(0.005)
    try:
        name = c10d._get_process_group_name(group if group is not None else dist.group.WORLD)
    except Exception:  # noqa: BLE001
        return new
    with _lock:
        for t in new:
            _gloo_thread_pg[t] = name
    return new


def _wrap_group_factory(fn, returns_group: bool):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        before = _gloo_tids()
        result = fn(*args, **kwargs)
        try:
            import torch.distributed as dist

            group = result if returns_group else dist.group.WORLD
            _record_new_gloo_threads(before, group)
        except Exception as e:  # noqa: BLE001 -- bookkeeping must never break the user's call
            log.debug("distprof: could not map gloo threads to their group: %s", e)
        return result

    wrapper.__distprof_wrapped__ = fn  # type: ignore[attr-defined]
    return wrapper


_teardown_callbacks: list = []


def add_teardown_callback(fn) -> None:
    """Call `fn()` just before the user destroys the default process group (while peers can still talk)."""
    if fn not in _teardown_callbacks:
        _teardown_callbacks.append(fn)


def _wrap_destroy(fn):
    @functools.wraps(fn)
    def wrapper(group=None, *args, **kwargs):
        import torch.distributed as dist

        if group is None or group is dist.group.WORLD:
            for cb in list(_teardown_callbacks):
                try:
                    cb()
                except Exception as e:  # noqa: BLE001 -- never break the user's teardown
                    log.debug("distprof: teardown callback failed: %s", e)
        return fn(group, *args, **kwargs)

    wrapper.__distprof_wrapped__ = fn  # type: ignore[attr-defined]
    return wrapper


_installed = False


def install_group_tracking() -> None:
    """Wrap init_process_group/new_group so gloo worker threads can be tied to their process group."""
    global _installed
    if _installed:
        return
    import torch.distributed as dist

    if not dist.is_available():
        return
    from torch.distributed import distributed_c10d as c10d

    for name, make in (
        ("init_process_group", lambda f: _wrap_group_factory(f, False)),
        ("new_group", lambda f: _wrap_group_factory(f, True)),
        ("destroy_process_group", _wrap_destroy),
    ):
        orig = getattr(c10d, name)
        if getattr(orig, "__distprof_wrapped__", None):
            continue
        wrapped = make(orig)
        setattr(c10d, name, wrapped)
        if getattr(dist, name, None) is orig:
            setattr(dist, name, wrapped)
    _installed = True
