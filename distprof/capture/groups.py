"""The job's process groups as torch's own registry holds them, and which gloo worker threads serve which group.

Every way of making a process group — ``init_process_group``, ``new_group``, ``new_subgroups``, ``init_device_mesh``
(which calls the ``new_group`` it imported itself), DeviceMesh flattening, ``split_group``, FSDP / TP internals — ends
in one internal call, ``torch.distributed.distributed_c10d._register_pg_in_world`` (torch 2.13), looked up as a module
global at each call. distprof wraps that one point (:func:`install`): right after a group is registered, the
``pt_gloo_runloop`` threads its gloo backend started (``_threads`` of them, 2 by default) are tied to its name, and
the default group's registration — where every rank of the job is, inside ``init_process_group`` — is announced to
the listener set by :func:`set_default_group_listener` (the capture agrees its run id and host roles there). Older
torch (2.3–2.11) has no such function; every group there is registered by
``_register_process_group(group_name, pg)``, looked up the same way, and that is wrapped instead. Only on a torch
with neither are ``init_process_group`` and ``new_group`` wrapped (groups made elsewhere, as by a DeviceMesh, are
then missed). Workers are found by their thread name, which torch 2.3 and 2.6 do not set (their workers keep the
main thread's): there no gloo collective is tied to its group's workers (docs/testing.md).

Membership, names (``pg_name``: the same on every rank), descriptions and backends are read from the registry when
asked (:func:`process_groups`), so they are complete whenever a window ends. What a framework uses a group for
(DeepSpeed's ZeRO data-parallel group: ``frameworks.py``) is added to the group's entry by :func:`tag`.
"""

from __future__ import annotations

import functools
import glob
import inspect
import logging
import threading
import time
from typing import Any, Callable

log = logging.getLogger(__name__)

GLOO_THREAD_NAME = "pt_gloo_runloop"
#: How long a registration waits for its gloo workers to name themselves (they do so as they start).
_NAME_WAIT_S = 0.5

_lock = threading.Lock()
#: OS tid of a gloo worker thread -> name of the process group it serves.
_thread_pg: dict[int, str] = {}
_installed = False
_default_listener: Callable[[Any, Any], None] | None = None


# ---- threads --------------------------------------------------------------------------------------------------
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


def _gloo_tids() -> set[int]:
    return {t for t, n in thread_names().items() if n == GLOO_THREAD_NAME}


def _unclaimed_gloo_tids() -> set[int]:
    with _lock:
        known = set(_thread_pg)
    return _gloo_tids() - known


def _wait_new_gloo_tids(expected: int, wait_s: float = _NAME_WAIT_S) -> set[int]:
    """The gloo workers no group has claimed yet, once `expected` of them are visible (or after `wait_s`)."""
    deadline = time.monotonic() + wait_s
    new = _unclaimed_gloo_tids()
    while len(new) < expected and time.monotonic() < deadline:
        time.sleep(0.002)
        new = _unclaimed_gloo_tids()
    return new


def _thread_start(tid: int) -> int:
    """Start time of a thread of this process (clock ticks since boot), for ordering; 0 when unreadable."""
    try:
        with open(f"/proc/self/task/{tid}/stat") as fh:
            return int(fh.read().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return 0


def gloo_worker_count(pg) -> int:
    """pt_gloo_runloop threads the gloo backend of `pg` runs (0 without a gloo backend)."""
    import torch

    try:
        backend = pg._get_backend(torch.device("cpu"))
    except Exception:  # noqa: BLE001 -- no CPU backend (e.g. NCCL only)
        return 0
    opts = getattr(backend, "options", None)
    if type(backend).__name__ != "ProcessGroupGloo" or opts is None:
        return 0
    return int(getattr(opts, "_threads", 2) or 0)


def gloo_thread_pg() -> dict[int, str]:
    """OS tid of each gloo worker -> the process-group name it serves, as far as known."""
    with _lock:
        return dict(_thread_pg)


def _claim_for(name: str, expected: int) -> None:
    if expected <= 0:
        return
    new = _wait_new_gloo_tids(expected)
    if len(new) > expected:  # more unclaimed threads than this group starts: keep the newest
        new = set(sorted(new, key=lambda t: (_thread_start(t), t))[-expected:])
    with _lock:
        for t in new:
            _thread_pg[t] = name


def adopt_existing_groups() -> None:
    """Groups made before distprof was watching: tie their gloo workers to them by start order, when that is exact.

    Workers start with their group, so sorted by start time they come in the registry's creation order, `_threads`
    per group. Applied only when the unclaimed workers are exactly as many as those groups run.
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return
    from torch.distributed import distributed_c10d as c10d

    with _lock:
        known_names = set(_thread_pg.values())
    todo = [(str(name), gloo_worker_count(pg)) for pg, name in list(c10d._world.pg_names.items())
            if str(name) not in known_names]
    todo = [(n, k) for n, k in todo if k > 0]
    tids = sorted(_unclaimed_gloo_tids(), key=lambda t: (_thread_start(t), t))
    if not todo or len(tids) != sum(k for _, k in todo):
        return
    with _lock:
        i = 0
        for name, k in todo:
            for t in tids[i:i + k]:
                _thread_pg[t] = name
            i += k


# ---- the registry hook ----------------------------------------------------------------------------------------
def set_default_group_listener(fn: Callable[[Any, Any], None] | None) -> None:
    """`fn(pg, store)` runs when the default group registers (every rank is inside init_process_group then)."""
    global _default_listener
    _default_listener = fn


def _on_registered(pg, store, group_name: str, is_default: bool) -> None:
    try:
        _claim_for(str(group_name), gloo_worker_count(pg))
    except Exception as e:  # noqa: BLE001 -- bookkeeping must never break the user's call
        log.debug("distprof: could not map gloo threads of group %s: %s", group_name, e)
    try:
        snapshot()
    except Exception as e:  # noqa: BLE001
        log.debug("distprof: could not read the process groups: %s", e)
    listener = _default_listener
    if is_default and listener is not None:
        listener(pg, store)  # the listener guards itself: it must never raise into init_process_group


def _wrap_register(fn):
    sig = inspect.signature(fn)

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        import torch.distributed as dist

        is_default = not dist.is_initialized()  # the default group registers before init_process_group returns
        result = fn(*args, **kwargs)
        try:
            bound = sig.bind(*args, **kwargs)
            pg, store, name = bound.arguments["pg"], bound.arguments.get("store"), bound.arguments["group_name"]
        except Exception as e:  # noqa: BLE001 -- a torch whose signature changed: nothing to record
            log.debug("distprof: unexpected _register_pg_in_world call: %s", e)
            return result
        _on_registered(pg, store, str(name), is_default)
        return result

    wrapper.__distprof_wrapped__ = fn  # type: ignore[attr-defined]
    return wrapper


def _wrap_register_name(fn):
    """torch < 2.12 (no _register_pg_in_world): ``_register_process_group(group_name, pg)``, which every way of making a
    group calls once the group is in the registry (init_process_group and new_group through their helper,
    split_group, and so DeviceMesh, which holds its own references to the public factories)."""

    @functools.wraps(fn)
    def wrapper(group_name, pg, *args, **kwargs):
        import torch.distributed as dist
        from torch.distributed import distributed_c10d as c10d

        is_default = not dist.is_initialized()  # the default group registers before init_process_group returns
        result = fn(group_name, pg, *args, **kwargs)
        try:
            store = c10d._world.pg_map.get(pg, (None, None))[1]
        except Exception:  # noqa: BLE001 -- the registry's layout changed: only the default group's listener needs it
            store = None
        _on_registered(pg, store, str(group_name), is_default)
        return result

    wrapper.__distprof_wrapped__ = fn  # type: ignore[attr-defined]
    return wrapper


def _wrap_factory(fn, returns_group: bool):
    """Fallback for a torch without _register_pg_in_world: the public factories."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        import torch.distributed as dist
        from torch.distributed import distributed_c10d as c10d

        is_default = not dist.is_initialized()
        result = fn(*args, **kwargs)
        try:
            group = result if returns_group else c10d._get_default_group()
            if group not in (None, dist.GroupMember.NON_GROUP_MEMBER):
                store = c10d._get_default_store() if is_default else None
                _on_registered(group, store, c10d._get_process_group_name(group), is_default)
        except Exception as e:  # noqa: BLE001
            log.debug("distprof: could not record group: %s", e)
        return result

    wrapper.__distprof_wrapped__ = fn  # type: ignore[attr-defined]
    return wrapper


#: How long destroy_process_group first lets gloo's workers have the GIL while a profiler runs (below).
_SETTLE_S = 0.05


def _wrap_destroy(fn):
    """``destroy_process_group`` while distprof profiles: first a short sleep (the GIL released).

    A gloo work made while torch's profiler records holds a copy of the thread-local state that includes Python
    objects, so the gloo worker that drops the last reference to a finished work needs the GIL. When a script destroys
    its groups right after its last step, DDP's reducer is freed moments later, with the GIL held, and joins those
    workers (``~ProcessGroupGloo``): if one is still waiting for the GIL to free the last allreduce, the process hangs
    for good. Measured here: 3 of 8 two-rank DDP jobs hung so at exit with the last window recording. Letting the
    workers run first removes the race; without a profiler nothing changes.
    """

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if _default_listener is not None:  # a profiler runs in this process
            time.sleep(_SETTLE_S)
        return fn(*args, **kwargs)

    wrapper.__distprof_wrapped__ = fn  # type: ignore[attr-defined]
    return wrapper


def install() -> None:
    """Watch process-group creation (idempotent); groups that already exist are adopted by thread start order."""
    global _installed
    if _installed:
        return
    import torch.distributed as dist

    if not dist.is_available():
        return
    from torch.distributed import distributed_c10d as c10d

    adopt_existing_groups()
    destroy = getattr(c10d, "destroy_process_group", None)
    if destroy is not None and not getattr(destroy, "__distprof_wrapped__", None):
        wrapped = _wrap_destroy(destroy)
        c10d.destroy_process_group = wrapped
        if getattr(dist, "destroy_process_group", None) is destroy:
            dist.destroy_process_group = wrapped
    orig = getattr(c10d, "_register_pg_in_world", None)
    by_name = getattr(c10d, "_register_process_group", None)
    if orig is not None:
        if not getattr(orig, "__distprof_wrapped__", None):
            c10d._register_pg_in_world = _wrap_register(orig)
    elif by_name is not None:
        if not getattr(by_name, "__distprof_wrapped__", None):
            c10d._register_process_group = _wrap_register_name(by_name)
    else:
        for name, returns_group in (("init_process_group", False), ("new_group", True)):
            f = getattr(c10d, name)
            if getattr(f, "__distprof_wrapped__", None):
                continue
            wrapped = _wrap_factory(f, returns_group)
            setattr(c10d, name, wrapped)
            if getattr(dist, name, None) is f:
                setattr(dist, name, wrapped)
    _installed = True


# ---- what the registry says -----------------------------------------------------------------------------------
def _device_backend_map(config: str) -> dict[str, str]:
    """``"cpu:gloo,cuda:nccl"`` -> {"cpu": "gloo", "cuda": "nccl"}."""
    out = {}
    for part in str(config).split(","):
        dev, sep, be = part.partition(":")
        if sep and dev.strip() and be.strip():
            out[dev.strip()] = be.strip()
    return out


#: The registry as last seen while the default group existed: a window that ends after the script destroyed its
#: process groups (the loop ran to the window's last step, then ``destroy_process_group``) still names them.
_last_seen: dict[str, Any] = {}
#: pg_name -> {key: value} added to that group's entry by process_groups() (tag())
_tags: dict[str, dict[str, Any]] = {}


def tag(pg: Any, key: str, value: Any) -> bool:
    """Note `value` as `key` of the group `pg` (None: the default group) in its process_groups() entry, e.g. the
    ZeRO stage a DeepSpeed engine runs on it. True when the group's name could be read."""
    import torch.distributed as dist

    if not _initialized():
        return False
    from torch.distributed import distributed_c10d as c10d

    try:
        group = pg if pg is not None else c10d._get_default_group()
        name = str(c10d._get_pg_config(group).get("pg_name"))
    except Exception as e:  # noqa: BLE001 -- private API, best effort metadata
        log.debug("distprof: cannot name a framework's process group: %s", e)
        return False
    with _lock:
        _tags.setdefault(name, {})[key] = value
    return dist.is_initialized()


def _initialized() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def snapshot() -> None:
    """Remember the groups and backends now (called at each window's start and whenever a group registers)."""
    if _initialized():
        process_groups()
        backend_config()
        for device_type in ("cpu", "cuda"):
            backend_name(device_type)


def backend_config() -> str:
    """The default group's backend per device type as torch holds it (``cpu:gloo,cuda:nccl``); ``none`` without one
    (the last value seen, when the groups are already destroyed)."""
    import torch.distributed as dist

    if not _initialized():
        return str(_last_seen.get("backend_config", "none"))
    try:
        _last_seen["backend_config"] = out = str(dist.get_backend_config())
        return out
    except Exception:  # noqa: BLE001 -- best effort metadata
        return "unknown"


def backend_name(device_type: str) -> str:
    """The backend the default group uses for `device_type` (``gloo`` on CPU, ``nccl`` on CUDA, …): never
    ``undefined`` — a group made without a backend names its backend per device type; ``none`` without a group."""
    import torch.distributed as dist

    if not _initialized():
        return str(_last_seen.get(f"backend:{device_type}", "none"))
    try:
        name = str(dist.get_backend())
    except Exception:  # noqa: BLE001
        name = "unknown"
    if name in ("undefined", "unknown", "") or ":" in name or "," in name:
        per_device = _device_backend_map(backend_config())
        name = per_device.get(device_type) or next(iter(per_device.values()), name)
    _last_seen[f"backend:{device_type}"] = name
    return name


def process_groups() -> list[dict[str, Any]]:
    """This rank's process groups as {index, name, desc, backend, ranks}; index is what /comms.pg refers to.

    ``name`` is torch's ``pg_name`` (agreed by every member), ``backend`` the group's backend per device type
    (``cpu:gloo``), ``ranks`` the global ranks in group-rank order. Groups this rank is not a member of are not in
    its registry and not listed.
    """
    import torch.distributed as dist

    if not _initialized():
        return list(_last_seen.get("process_groups", []))
    from torch.distributed import distributed_c10d as c10d

    out: list[dict[str, Any]] = []
    try:
        pgs = list(c10d._world.pg_map)
    except Exception:  # noqa: BLE001 -- private API; degrade to the default group only
        return [{"index": 0, "name": "0", "desc": "default_pg", "backend": backend_config(),
                 "ranks": list(range(dist.get_world_size()))}]
    for pg in pgs:
        try:
            cfg = c10d._get_pg_config(pg)
        except Exception as e:  # noqa: BLE001 -- one odd group must not hide the others
            log.debug("distprof: cannot read a process group's configuration: %s", e)
            continue
        out.append({"index": len(out), "name": str(cfg.get("pg_name")), "desc": str(cfg.get("pg_desc") or ""),
                    "backend": str(cfg.get("backend_config") or ""), "ranks": [int(r) for r in cfg.get("ranks", [])],
                    **_tags.get(str(cfg.get("pg_name")), {})})
    _last_seen["process_groups"] = list(out)
    return out
