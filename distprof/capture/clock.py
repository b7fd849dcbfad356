"""Clock-sync samples without ever holding up training: agreement once, ping-pongs on a side thread.

Ranks on one host share a clock, so only host leaders (the lowest rank of each host) exchange samples with the
reference rank. Two parts:

* :func:`agree` — hostnames, host leaders and the run id, through the default c10d store. It waits for every rank,
  so the capture calls it only where every rank of the job is: inside ``init_process_group`` (when the default group
  registers, see ``groups.py``), or when a profiler starts on a job whose process group already exists.
  :func:`open_side_channel` then connects the host leaders with a gloo channel of distprof's own (a
  ``ProcessGroupGloo`` outside torch's group registry: the user's group names and counts stay what they would be).
* :class:`ClockSync` — at each window start (phase 0) and end (phase 1) the training thread only takes a local sample
  and queues a request (:meth:`ClockSync.mark`); a side thread on each non-reference leader runs the `rounds`
  NTP-style ping-pongs, and a side thread on the reference serves whichever leader pings, whenever it comes. The
  writer collects a window's samples (:meth:`ClockSync.take`) before writing its shard. Every wait is bounded by
  `timeout_s`; a failed exchange costs the samples, never the window or the training.

Raw samples are stored; the merger turns them into offsets (docs/shard-format.md, /clock).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Callable

import numpy as np

from .sim import SimClock

log = logging.getLogger(__name__)

#: Message kinds and tags on the side channel. A message is int64[4]: kind, window, phase, time.
PING, BYE = 1, 2
TAG_PING, TAG_PONG = 0, 1
#: The reference serves pings for as long as the job runs: windows may be hours apart.
_SERVE_WAIT = timedelta(days=7)

_agreements = 0  # per process: each agreement uses fresh store keys (all ranks make the same sequence of them)


@dataclass
class ClockRoles:
    hosts: list[str]  # rank -> host
    leaders: list[int]  # one rank per host, reference first
    reference: int
    leader_of_me: int
    role: str  # "reference" | "leader" | "member"


@dataclass(frozen=True)
class Agreement:
    run_id: str
    rank: int
    world_size: int
    roles: ClockRoles
    key_prefix: str = ""  # this agreement's keys in the store (its side channel's are under it)


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + uuid.uuid4().hex[:6]


def roles_of(hosts: list[str], rank: int) -> ClockRoles:
    """Host leaders (lowest rank per host), the reference (lowest leader) and this rank's role."""
    first_rank: dict[str, int] = {}
    for r, h in enumerate(hosts):
        first_rank.setdefault(h, r)
    leaders = sorted(first_rank.values())
    reference = leaders[0]
    me_leader = first_rank[hosts[rank]]
    role = "reference" if rank == reference else ("leader" if rank == me_leader else "member")
    return ClockRoles(list(hosts), leaders, reference, me_leader, role)


def local_agreement(host: str, run_id: str | None) -> Agreement:
    """A job of one process: its own reference."""
    return Agreement(run_id or new_run_id(), 0, 1, roles_of([host], 0))


def agree(store, rank: int, world_size: int, host: str, run_id: str | None,
          timeout: timedelta | None = None) -> Agreement:
    """Collective over all ranks (blocking): publish this rank's host, take rank 0's run id, derive the roles.

    `timeout` defaults to the store's own (the one torch waits for peers with).
    """
    global _agreements
    _agreements += 1
    if world_size <= 1:
        return local_agreement(host, run_id)
    prefix = f"distprof/{_agreements}/"
    store.set(f"{prefix}host/{rank}", host)
    if rank == 0:
        store.set(f"{prefix}run_id", run_id or new_run_id())
    keys = [f"{prefix}host/{r}" for r in range(world_size)]
    if timeout is None:
        store.wait(keys + [f"{prefix}run_id"])
    else:
        store.wait(keys + [f"{prefix}run_id"], timeout)
    hosts = [v.decode() for v in store.multi_get(keys)]
    agreed = store.get(f"{prefix}run_id").decode()
    return Agreement(agreed, rank, world_size, roles_of(hosts, rank), prefix)


def open_side_channel(store, agreement: Agreement, timeout: timedelta):
    """Collective over the host leaders: a gloo channel between them (None for members and one-host jobs).

    Not registered with torch.distributed, so it is no user group; its worker thread is claimed as distprof's own.
    """
    import torch.distributed as dist

    from . import groups

    roles = agreement.roles
    if len(roles.leaders) < 2 or agreement.rank not in roles.leaders:
        return None
    opts = dist.ProcessGroupGloo._Options()
    opts._timeout = timeout
    opts._threads = 1
    opts._devices = [dist.ProcessGroupGloo.create_default_device()]
    prefix = dist.PrefixStore(f"{agreement.key_prefix}clock/", store)
    channel = dist.ProcessGroupGloo(prefix, roles.leaders.index(agreement.rank), len(roles.leaders), opts)
    groups.claim_own_threads(opts._threads)
    return channel


@dataclass
class _Window:
    samples: list[tuple[int, int, int, int, int]] = field(default_factory=list)  # phase, peer, send, remote, recv
    local: list[tuple[int, int, int, int]] = field(default_factory=list)  # phase, time, mono, perf
    pending: int = 0  # requests handed to the side thread and not finished


class ClockSync:
    """One rank's clock samples, per window."""

    def __init__(self, rounds: int, timeout_s: float, sim: SimClock | None,
                 on_error: Callable[[str, BaseException], None]) -> None:
        self.rounds = rounds
        self.timeout_s = timeout_s
        self.sim = sim
        self.roles: ClockRoles | None = None
        self._on_error = on_error
        self._cond = threading.Condition()
        self._windows: dict[int, _Window] = {}
        self._early: list[tuple[int, int]] = []  # requests made before the side thread existed
        self._queue: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None
        self._channel = None

    def now(self) -> int:
        t = time.time_ns()
        return self.sim.apply(t) if self.sim is not None else t

    # -- setup ----------------------------------------------------------------------------------------------------
    def start(self, roles: ClockRoles, channel) -> None:
        """Roles agreed; with a channel, start the side thread (a leader pings, the reference serves)."""
        self.roles = roles
        if channel is None or roles.role == "member":
            with self._cond:
                self._early.clear()
            return
        self._channel = channel
        target = self._serve if roles.role == "reference" else self._ping_loop
        self._thread = threading.Thread(target=target, name="distprof-clock", daemon=True)
        with self._cond:
            early, self._early = self._early, []
            if roles.role == "leader":
                for window, phase in early:
                    self._window(window).pending += 1
                    self._queue.put((window, phase))
        self._thread.start()

    # -- training thread --------------------------------------------------------------------------------------------
    def mark(self, window: int, phase: int) -> None:
        """Window `window` starts (phase 0) or ends (phase 1): a local sample now, ping-pongs on the side thread."""
        t, m, p = time.time_ns(), time.monotonic_ns(), time.perf_counter_ns()
        if self.sim is not None:
            t = self.sim.apply(t)
        with self._cond:
            self._window(window).local.append((phase, t, m, p))
            if self.roles is None:
                self._early.append((window, phase))
            elif self.roles.role == "leader" and self._thread is not None:
                self._window(window).pending += 1
                self._queue.put((window, phase))

    # -- writer thread ----------------------------------------------------------------------------------------------
    def take(self, window: int) -> tuple[list, list]:
        """The window's samples once its exchanges are done (each is bounded by the timeout), then forgotten."""
        deadline = time.monotonic() + 2 * self.timeout_s + 5.0
        with self._cond:
            w = self._window(window)
            while w.pending > 0 and time.monotonic() < deadline:
                self._cond.wait(timeout=max(0.0, deadline - time.monotonic()))
            self._windows.pop(window, None)
            self._early = [(win, ph) for win, ph in self._early if win != window]
        return w.samples, w.local

    def close(self, timeout_s: float | None = None) -> None:
        """Leader: finish the queued exchanges and say goodbye; reference: serve until every leader said goodbye."""
        th = self._thread
        if th is None:
            return
        if self.roles is not None and self.roles.role == "leader":
            self._queue.put(None)
        th.join(self.timeout_s if timeout_s is None else timeout_s)
        if th.is_alive():  # keep the channel: the thread still uses it (a daemon; it ends with the process)
            log.debug("distprof: clock side thread still waiting at close (a peer did not finish)")
        else:
            # destroyed now, while the interpreter is whole, rather than during its finalisation
            self._thread = self._channel = None

    # -- side thread ------------------------------------------------------------------------------------------------
    def _window(self, window: int) -> _Window:
        w = self._windows.get(window)
        if w is None:
            w = self._windows[window] = _Window()
        return w

    def _ping_loop(self) -> None:
        ok = True
        msg, buf = _message()
        wait = timedelta(seconds=self.timeout_s)
        ref = 0  # the reference is the first host leader
        while True:
            item = self._queue.get()
            if item is None:
                if ok:
                    try:
                        msg[0] = BYE
                        self._channel.send([buf], ref, TAG_PING).wait(wait)
                    except Exception as e:  # noqa: BLE001 -- the reference is gone; nothing left to say
                        log.debug("distprof: clock goodbye not delivered: %s", e)
                return
            window, phase = item
            got: list[tuple[int, int, int, int, int]] = []
            try:
                if ok:
                    for _ in range(self.rounds):
                        msg[0], msg[1], msg[2] = PING, window, phase
                        t_send = msg[3] = self.now()  # nothing but the send between the two timestamps and it
                        self._channel.send([buf], ref, TAG_PING).wait(wait)
                        self._channel.recv([buf], ref, TAG_PONG).wait(wait)
                        t_recv = self.now()
                        got.append((phase, self.roles.reference, t_send, int(msg[3]), t_recv))
            except Exception as e:  # noqa: BLE001 -- a failed channel stays failed (gloo closes it)
                ok = False
                self._on_error("clock sync", e)
            with self._cond:
                w = self._windows.get(window)
                if w is not None:  # else the writer gave up waiting and wrote the window without these
                    w.samples.extend(got)
                    w.pending -= 1
                self._cond.notify_all()

    def _serve(self) -> None:
        msg, buf = _message()
        wait = timedelta(seconds=self.timeout_s)
        remaining = len(self.roles.leaders) - 1
        try:
            while remaining > 0:
                work = self._channel.recv_anysource([buf], TAG_PING)
                work.wait(_SERVE_WAIT)
                t_remote = self.now()  # first thing once the ping is in
                if msg[0] == BYE:
                    remaining -= 1
                    continue
                msg[3] = t_remote
                self._channel.send([buf], work._source_rank(), TAG_PONG).wait(wait)
        except Exception as e:  # noqa: BLE001 -- a leader vanished: its samples are its loss; stop serving
            log.debug("distprof: clock reference stops serving: %s", e)


def _message():
    """A side-channel message: int64[4] as numpy (cheap to fill) and the tensor sharing its memory (to send)."""
    import torch

    msg = np.zeros(4, dtype=np.int64)
    return msg, torch.from_numpy(msg)


def samples_table(samples: list, local: list) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    s = np.array(samples, dtype=np.int64).reshape(-1, 5)
    loc = np.array(local, dtype=np.int64).reshape(-1, 4)
    return (
        {"phase": s[:, 0].astype(np.uint8), "peer": s[:, 1].astype(np.int32), "t_send_ns": s[:, 2],
         "t_remote_ns": s[:, 3], "t_recv_ns": s[:, 4]},
        {"phase": loc[:, 0].astype(np.uint8), "time_ns": loc[:, 1], "monotonic_ns": loc[:, 2],
         "perf_counter_ns": loc[:, 3]},
    )
