"""Clock-sync samples without ever holding up training: agreement once, ping-pongs on a side thread.

Ranks on one host share a clock, so only host leaders (the lowest rank of each host) exchange samples with the
reference rank (rank 0). Two parts:

* :func:`agree` — hostnames, host leaders and rank 0's run document (run id, job identity, where its clock server
  listens: ``setup.py`` builds it), through the default c10d store. It waits for every rank, so the capture calls it
  only where every rank of the job is: inside ``init_process_group`` (when the default group registers, see
  ``groups.py``), or when a profiler starts on a job whose process group already exists (or over MPI, ``mpi.py``).
* :class:`ClockSync` — at each window start (phase 0) and end (phase 1) the training thread only takes a local sample
  and queues a request (:meth:`ClockSync.mark`); a side thread on each non-reference leader runs the `rounds`
  NTP-style ping-pongs over a TCP connection of its own to the reference, and one side thread on the reference
  answers every leader, whenever it pings (:class:`ClockServer`). The writer collects a window's samples
  (:meth:`ClockSync.take`) before writing its shard.

Every wait is bounded by `timeout_s`, and no failure lasts: an exchange that times out or fails (a peer late, gone, or
a reference busy past the timeout) costs that phase's samples and closes that leader's connection; the next request
connects afresh. The channel is plain TCP rather than a gloo group because a gloo pair that timed out stays broken
for the rest of the job (every later exchange failed), and one leader's trouble must not touch the others'.

Raw samples are stored; the merger turns them into offsets (docs/shard-format.md, /clock).
"""

from __future__ import annotations

import logging
import os
import queue
import secrets
import selectors
import socket
import struct
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Callable

import numpy as np

from .sim import SimClock

log = logging.getLogger(__name__)

#: Message kinds. A message is four little-endian int64: kind, a, b, c (below).
HELLO, PING, PONG, BYE = 1, 2, 3, 4
#: HELLO: (HELLO, token, leader rank, 0); PING: (PING, window, phase, 0); PONG: (PONG, window, phase, remote time);
#: BYE: (BYE, 0, 0, 0).
_MSG = struct.Struct("<4q")

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
    rank: int
    world_size: int
    roles: ClockRoles
    run: dict  # rank 0's run document (setup.py): run id, job identity, clock server address, or why none
    key_prefix: str = ""  # this agreement's keys in the store

    @property
    def run_id(self) -> str | None:
        return self.run.get("run_id")


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


def agree(store, rank: int, world_size: int, host: str, rank0_run: Callable[[], dict],
          timeout: timedelta | None = None) -> Agreement:
    """Collective over all ranks (blocking): publish this rank's host, take rank 0's run document, derive the roles.

    Rank 0 calls `rank0_run()` (which claims the run directory and opens its clock server) before publishing; the
    others wait for it. `timeout` defaults to the store's own (the one torch waits for peers with).
    """
    import json

    global _agreements
    _agreements += 1
    prefix = f"distprof/{_agreements}/"
    store.set(f"{prefix}host/{rank}", host)
    if rank == 0:
        store.set(f"{prefix}run", json.dumps(rank0_run()))
    keys = [f"{prefix}host/{r}" for r in range(world_size)]
    if timeout is None:
        store.wait(keys + [f"{prefix}run"])
    else:
        store.wait(keys + [f"{prefix}run"], timeout)
    hosts = [v.decode() for v in store.multi_get(keys)]
    run = json.loads(store.get(f"{prefix}run").decode())
    return Agreement(rank, world_size, roles_of(hosts, rank), run, prefix)


# ---- the reference's server ---------------------------------------------------------------------------------------
def advertised_addresses() -> list[str]:
    """Addresses other hosts can reach this one at: the interface that routes to MASTER_ADDR (what the job's own
    rendezvous uses), then the hostname's address, then the hostname itself."""
    out: list[str] = []
    master = os.environ.get("MASTER_ADDR", "").strip()
    if master:
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:  # no packet is sent
                s.connect((master, int(os.environ.get("MASTER_PORT", "29500") or 29500)))
                out.append(s.getsockname()[0])
        except (OSError, ValueError):
            pass
    name = socket.gethostname()
    try:
        out.append(socket.gethostbyname(name))
    except OSError:
        pass
    out.append(name)
    return list(dict.fromkeys(out))


class ClockServer:
    """The reference's listening socket (opened at the agreement, before its address is published) and token."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("", 0))
        self.sock.listen(128)
        self.sock.setblocking(False)
        self.token = secrets.randbits(62)

    def endpoint(self) -> dict:
        return {"addrs": advertised_addresses(), "port": self.sock.getsockname()[1], "token": self.token}

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


@dataclass
class _Window:
    samples: list[tuple[int, int, int, int, int]] = field(default_factory=list)  # phase, peer, send, remote, recv
    local: list[tuple[int, int, int, int]] = field(default_factory=list)  # phase, time, mono, perf
    pending: int = 0  # requests handed to the side thread and not finished


@dataclass
class _Serving:
    """The reference's connections from leaders while it serves them."""

    server: ClockServer
    sel: selectors.BaseSelector
    remaining: set[int]  # leaders that have not said goodbye
    pending: dict[socket.socket, bytearray] = field(default_factory=dict)  # each connection's partial message
    authed: set[socket.socket] = field(default_factory=set)  # said hello with the run's token
    rank_of: dict[socket.socket, int] = field(default_factory=dict)  # the leader rank of an authed connection

    def drop(self, c: socket.socket) -> None:
        """Forget connection `c` and close it."""
        try:
            self.sel.unregister(c)
        except (KeyError, ValueError):
            pass
        self.pending.pop(c, None)
        self.authed.discard(c)
        _close(c)


class ClockSyncError(OSError):
    """A clock exchange failed; the message says with whom, where and why, and that the next one retries."""

    def __init__(self, message: str) -> None:
        super().__init__(message)


class ClockSync:
    """One rank's clock samples, per window."""

    def __init__(self, rounds: int, timeout_s: float, sim: SimClock | None,
                 on_error: Callable[[str, BaseException], None]) -> None:
        self.rounds = rounds
        self.timeout_s = timeout_s
        self.sim = sim
        self.roles: ClockRoles | None = None
        self.failures = 0  # exchanges that failed (each retried at the next request)
        self._on_error = on_error
        self._cond = threading.Condition()
        self._windows: dict[int, _Window] = {}
        self._early: list[tuple[int, int]] = []  # requests made before the side thread existed
        self._queue: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None
        self._server: ClockServer | None = None
        self._endpoint: dict | None = None
        self._rank = -1
        self._abort = threading.Event()  # terminating: no more waiting for exchanges
        self._stop_serving = threading.Event()
        self._wake_r, self._wake_w = -1, -1

    def now(self) -> int:
        t = time.time_ns()
        return self.sim.apply(t) if self.sim is not None else t

    # -- setup ----------------------------------------------------------------------------------------------------
    def start(self, roles: ClockRoles, rank: int, server: ClockServer | None, endpoint: dict | None) -> None:
        """Roles agreed. The reference (with its server) answers pings; a leader (with the server's endpoint)
        pings; members, and jobs on one host, exchange nothing."""
        self.roles = roles
        self._rank = rank
        several_hosts = len(roles.leaders) > 1
        if roles.role == "reference" and several_hosts and server is not None:
            self._server = server
            self._wake_r, self._wake_w = os.pipe()
            target = self._serve
        elif roles.role == "leader" and endpoint:
            self._endpoint = endpoint
            target = self._ping_loop
        else:
            if server is not None:
                server.close()
            with self._cond:
                self._early.clear()
            return
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
        """The window's samples once its exchanges are done (each is bounded by the timeout), then forgotten.
        After :meth:`abort`, what is there now."""
        deadline = time.monotonic() + 2 * self.timeout_s + 5.0
        with self._cond:
            w = self._window(window)
            while w.pending > 0 and not self._abort.is_set() and time.monotonic() < deadline:
                self._cond.wait(timeout=min(0.25, max(0.0, deadline - time.monotonic())))
            self._windows.pop(window, None)
            self._early = [(win, ph) for win, ph in self._early if win != window]
            return list(w.samples), list(w.local)

    def abort(self) -> None:
        """The process is ending on a signal: :meth:`take` stops waiting for exchanges in flight."""
        self._abort.set()
        with self._cond:
            self._cond.notify_all()

    def close(self, timeout_s: float | None = None) -> None:
        """Leader: finish the queued exchanges and say goodbye; reference: answer until every leader said goodbye.
        Both bounded by `timeout_s` (default: the sync timeout)."""
        th = self._thread
        if th is None:
            return
        wait = self.timeout_s if timeout_s is None else timeout_s
        if self.roles is not None and self.roles.role == "leader":
            self._queue.put(None)
            th.join(wait)
        else:
            th.join(wait)  # ends by itself once every leader said goodbye
            self._stop_serving.set()
            self._wake()
            th.join(1.0)
        if th.is_alive():  # a daemon blocked on a peer; it ends with the process
            log.debug("distprof: clock side thread still waiting at close (a peer did not finish)")
        else:
            self._thread = None

    # -- side threads -----------------------------------------------------------------------------------------------
    def _window(self, window: int) -> _Window:
        w = self._windows.get(window)
        if w is None:
            w = self._windows[window] = _Window()
        return w

    def _ping_loop(self) -> None:
        conn: socket.socket | None = None
        ref = self.roles.reference
        while True:
            item = self._queue.get()
            if item is None:
                if conn is not None:
                    try:
                        conn.sendall(_MSG.pack(BYE, 0, 0, 0))
                    except OSError as e:  # the reference is gone; nothing left to say
                        log.debug("distprof: clock goodbye not delivered: %s", e)
                    _close(conn)
                return
            window, phase = item
            got: list[tuple[int, int, int, int, int]] = []
            try:
                if self._abort.is_set():
                    raise ClockSyncError("the process is ending")
                if conn is None:
                    conn = self._connect()
                for _ in range(self.rounds):
                    msg = _MSG.pack(PING, window, phase, 0)
                    t_send = self.now()  # nothing but the send between the two timestamps and it
                    conn.sendall(msg)
                    kind, w, ph, t_remote = _MSG.unpack(_recv_exact(conn, _MSG.size))
                    t_recv = self.now()
                    if kind != PONG or w != window or ph != phase:
                        raise ClockSyncError(f"unexpected answer {kind, w, ph} to a ping for {window, phase}")
                    got.append((phase, ref, t_send, t_remote, t_recv))
            except (OSError, struct.error) as e:
                if conn is not None:
                    _close(conn)
                conn = None  # the next request connects afresh
                if not self._abort.is_set():
                    self.failures += 1
                    what = "timed out" if isinstance(e, (socket.timeout, TimeoutError)) else f"failed ({e})"
                    self._on_error("clock sync", ClockSyncError(
                        f"exchange with rank {ref} at window {window} {('start', 'end')[phase]} {what} after "
                           f"{len(got)} of {self.rounds} round(s) (timeout {self.timeout_s:g} s); the next window "
                           "tries again on a fresh connection"))
            with self._cond:
                w = self._windows.get(window)
                if w is not None:  # else the writer gave up waiting and wrote the window without these
                    w.samples.extend(got)
                    w.pending -= 1
                self._cond.notify_all()

    def _connect(self) -> socket.socket:
        ep = self._endpoint
        last: OSError | None = None
        for addr in ep["addrs"]:
            try:
                conn = socket.create_connection((addr, ep["port"]), timeout=self.timeout_s)
            except OSError as e:
                last = e
                continue
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn.settimeout(self.timeout_s)
            try:
                conn.sendall(_MSG.pack(HELLO, ep["token"], self._rank, 0))
            except OSError:
                _close(conn)
                raise
            return conn
        raise ClockSyncError(f"cannot connect to the clock reference at {ep['addrs']} port {ep['port']} ({last})")

    def _serve(self) -> None:
        """The reference: one thread answers every leader's connection (selectors), until each said goodbye."""
        server = self._server
        sel = selectors.DefaultSelector()
        sel.register(server.sock, selectors.EVENT_READ, "listen")
        sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        conns = _Serving(server, sel, remaining=set(self.roles.leaders) - {self._rank})
        try:
            while conns.remaining and not self._stop_serving.is_set():
                for key, _ in sel.select():
                    if key.data == "wake":
                        os.read(self._wake_r, 64)
                    elif key.data == "listen":
                        self._accept(conns)
                    else:
                        self._on_readable(conns, key.fileobj)
        except Exception as e:  # noqa: BLE001 -- never raised into anything; the leaders' exchanges fail and retry
            log.debug("distprof: clock reference stops serving: %s", e)
        finally:
            for c in list(conns.pending):
                conns.drop(c)
            sel.close()
            server.close()

    def _accept(self, conns: _Serving) -> None:
        """A leader connects: its socket joins the selector (non-blocking, no Nagle delay)."""
        try:
            c, _ = conns.server.sock.accept()
        except OSError:
            return
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        c.setblocking(False)
        conns.pending[c] = bytearray()
        conns.sel.register(c, selectors.EVENT_READ, "conn")

    def _on_readable(self, conns: _Serving, c: socket.socket) -> None:
        """A leader's bytes: a whole message is answered (a ping by a pong stamped as it came in) or ends the
        connection (goodbye, a closed socket, not one of ours)."""
        try:
            data = c.recv(_MSG.size - len(conns.pending[c]))
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:  # the leader closed (it reconnects after a failure) or is gone
            conns.drop(c)
            return
        t_remote = self.now()  # first thing once a ping is in
        buf = conns.pending[c]
        buf += data
        if len(buf) < _MSG.size:
            return
        kind, a, b, _ = _MSG.unpack(bytes(buf))
        buf.clear()
        if kind == HELLO and a == conns.server.token:
            conns.authed.add(c)
            conns.rank_of[c] = b
        elif kind == PING and c in conns.authed:
            try:
                c.send(_MSG.pack(PONG, a, b, t_remote))  # 32 bytes: the socket buffer takes them
            except OSError:
                conns.drop(c)
        elif kind == BYE and c in conns.authed:
            conns.remaining.discard(conns.rank_of.get(c, -1))
            conns.drop(c)
        else:  # not one of ours
            conns.drop(c)

    def _wake(self) -> None:
        if self._wake_w >= 0:
            try:
                os.write(self._wake_w, b"x")
            except OSError:
                pass


def _recv_exact(conn: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = conn.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("the clock reference closed the connection")
        buf += chunk
    return bytes(buf)


def _close(conn: socket.socket) -> None:
    try:
        conn.close()
    except OSError:
        pass


def samples_table(samples: list, local: list) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    s = np.array(samples, dtype=np.int64).reshape(-1, 5)
    loc = np.array(local, dtype=np.int64).reshape(-1, 4)
    return (
        {"phase": s[:, 0].astype(np.uint8), "peer": s[:, 1].astype(np.int32), "t_send_ns": s[:, 2],
         "t_remote_ns": s[:, 3], "t_recv_ns": s[:, 4]},
        {"phase": loc[:, 0].astype(np.uint8), "time_ns": loc[:, 1], "monotonic_ns": loc[:, 2],
         "perf_counter_ns": loc[:, 3]},
    )
