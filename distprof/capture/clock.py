"""Clock-sync samples: NTP-style ping-pongs between one rank per host and the reference rank.

Ranks on one host share a clock, so only host leaders (the lowest rank of each host) exchange samples, over a gloo
side channel created for distprof (works whatever the training backend is). Hostnames and the run id are agreed
through the default c10d store. Every exchange is bounded by `timeout_s`. Raw samples are stored; the merger turns
them into offsets (docs/shard-format.md, /clock).
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass, field
from datetime import timedelta

import numpy as np

from .sim import SimClock

log = logging.getLogger(__name__)

_instance_counter = 0


@dataclass
class ClockRoles:
    hosts: list[str]  # rank -> host
    leaders: list[int]  # one rank per host, reference first
    reference: int
    leader_of_me: int
    role: str  # "reference" | "leader" | "member"


@dataclass
class SyncState:
    rounds: int
    timeout_s: float
    sim: SimClock | None
    rank: int = 0
    world_size: int = 1
    roles: ClockRoles | None = None
    group: object = None
    samples: list[tuple[int, int, int, int, int]] = field(default_factory=list)  # phase, peer, send, remote, recv
    local: list[tuple[int, int, int, int]] = field(default_factory=list)  # phase, time, mono, perf

    def now(self) -> int:
        t = time.time_ns()
        return self.sim.apply(t) if self.sim is not None else t

    def local_sample(self, phase: int) -> None:
        t, m, p = time.time_ns(), time.monotonic_ns(), time.perf_counter_ns()
        if self.sim is not None:
            t = self.sim.apply(t)
        self.local.append((phase, t, m, p))

    def take_window(self) -> tuple[list, list]:
        """Samples gathered since the last call (for one shard), then cleared."""
        s, loc = self.samples, self.local
        self.samples, self.local = [], []
        return s, loc


def _dist_ready() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def setup(state: SyncState, host: str, run_id: str | None) -> str:
    """Collective (all ranks): agree hosts, leaders and the run id; create the side channel. Returns the run id."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    from . import dist_info

    global _instance_counter
    _instance_counter += 1
    if not _dist_ready():
        state.roles = ClockRoles([host], [0], 0, 0, "reference")
        return run_id or new_run_id()
    state.rank, state.world_size = dist.get_rank(), dist.get_world_size()
    store = c10d._get_default_store()
    prefix = f"distprof/{_instance_counter}/"
    timeout = timedelta(seconds=state.timeout_s)
    store.set(f"{prefix}host/{state.rank}", host)
    if state.rank == 0:
        store.set(f"{prefix}run_id", run_id or new_run_id())
    keys = [f"{prefix}host/{r}" for r in range(state.world_size)]
    store.wait(keys + [f"{prefix}run_id"], timeout)
    hosts = [v.decode() for v in store.multi_get(keys)]
    agreed = store.get(f"{prefix}run_id").decode()
    first_rank: dict[str, int] = {}
    for r, h in enumerate(hosts):
        first_rank.setdefault(h, r)
    leaders = sorted(first_rank.values())
    reference = leaders[0]
    me_leader = first_rank[hosts[state.rank]]
    role = "reference" if state.rank == reference else ("leader" if state.rank == me_leader else "member")
    state.roles = ClockRoles(hosts, leaders, reference, me_leader, role)
    if len(leaders) > 1:
        before = dist_info._gloo_tids()
        group = dist.new_group(ranks=leaders, backend="gloo", timeout=timeout, group_desc="distprof_clock")
        if group not in (None, dist.GroupMember.NON_GROUP_MEMBER):
            state.group = group
            dist_info.mark_own_pg(c10d._get_process_group_name(group), dist_info._gloo_tids() - before)
        for cfg in c10d._get_all_pg_configs():  # every rank excludes the side channel from the user's groups
            if cfg.get("pg_desc") == "distprof_clock":
                dist_info.mark_own_pg(str(cfg.get("pg_name")))
    return agreed


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + uuid.uuid4().hex[:6]


def exchange(state: SyncState, phase: int) -> None:
    """Collective over host leaders: `rounds` ping-pongs between the reference and each other leader."""
    import torch
    import torch.distributed as dist

    state.local_sample(phase)
    roles = state.roles
    if roles is None or state.group is None or roles.role == "member":
        return
    buf = torch.zeros(2, dtype=torch.int64)
    if roles.role == "reference":
        for peer in roles.leaders[1:]:
            for _ in range(state.rounds):
                dist.recv(buf, src=peer, group=state.group)
                buf[1] = state.now()
                dist.send(buf, dst=peer, group=state.group)
    else:
        ref = roles.reference
        for _ in range(state.rounds):
            t_send = state.now()
            buf[0] = t_send
            dist.send(buf, dst=ref, group=state.group)
            dist.recv(buf, src=ref, group=state.group)
            t_recv = state.now()
            state.samples.append((phase, ref, t_send, int(buf[1]), t_recv))


def samples_table(samples: list, local: list) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    s = np.array(samples, dtype=np.int64).reshape(-1, 5)
    loc = np.array(local, dtype=np.int64).reshape(-1, 4)
    return (
        {"phase": s[:, 0].astype(np.uint8), "peer": s[:, 1].astype(np.int32), "t_send_ns": s[:, 2],
         "t_remote_ns": s[:, 3], "t_recv_ns": s[:, 4]},
        {"phase": loc[:, 0].astype(np.uint8), "time_ns": loc[:, 1], "monotonic_ns": loc[:, 2],
         "perf_counter_ns": loc[:, 3]},
    )
