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

The channel is the job's alone: the reference listens on loopback when every rank is on its host, else on the
interface that routes to MASTER_ADDR (:func:`bind_address`); each connection is greeted with a nonce and must answer
with an HMAC of it under a per-job secret that rank 0 shares through the c10d store (or MPI) — never on disk —
within :data:`HELLO_DEADLINE_S`, or it is closed. The reference keeps at most one connection per leader plus
:data:`EXTRA_AUTHED`, and :data:`PENDING_MIN` (or twice the leaders) waiting for their hello (the oldest is closed
when more come), so a flood of idle or garbage connections costs it neither descriptors nor time; when accept()
runs out of descriptors it stops listening for a moment (EMFILE_BACKOFF_S, doubling) rather than spin.

Every wait is bounded by `timeout_s`, and no failure lasts: an exchange that times out or fails (a peer late, gone, or
a reference busy past the timeout) costs that phase's samples and closes that leader's connection; the next request
connects afresh. The channel is plain TCP rather than a gloo group because a gloo pair that timed out stays broken
for the rest of the job (every later exchange failed), and one leader's trouble must not touch the others'.

Raw samples are stored; the merger turns them into offsets (docs/shard-format.md, /clock).
"""

from __future__ import annotations

import errno
import hashlib
import hmac
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
#: The reference greets each connection with NONCE_BYTES random bytes; the leader answers (HELLO, leader rank, 0, 0)
#: followed by HMAC-SHA256(the job's secret, HELLO_TAG + nonce + rank as 8 bytes): the secret (shared through the
#: c10d store or MPI, never on disk) never crosses the channel. Then PING: (PING, window, phase, 0); PONG: (PONG,
#: window, phase, remote time); BYE: (BYE, 0, 0, 0).
_MSG = struct.Struct("<4q")
NONCE_BYTES, MAC_BYTES = 16, 32
HELLO_TAG = b"distprof-clock-hello/1"
HELLO_SIZE = _MSG.size + MAC_BYTES
#: A connection that has not said a correct hello this long after it was accepted is closed (the timeout, if
#: shorter).
HELLO_DEADLINE_S = 5.0
#: Connections the reference keeps besides one per host leader: authenticated (a leader's reconnect) and waiting
#: for their hello (the oldest waiting one is closed when another arrives past the cap).
EXTRA_AUTHED, PENDING_MIN = 4, 8
#: After accept() fails for want of file descriptors, the listening socket rests this long (doubling to the max).
EMFILE_BACKOFF_S, EMFILE_BACKOFF_MAX_S = 0.05, 1.0

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

    The store can outlive the processes: torchrun's agent keeps one for the whole job, so a worker restarted after
    a failure finds every key an earlier attempt wrote, and torch's restart count cannot tell attempts apart (it is
    each agent's own: after one node fails, the others restart theirs without counting). So rank 0 opens a fresh
    *generation* (a random name every key of this agreement lives under) and acknowledges each rank's registration
    under it by that rank's own random nonce; a rank that registered under an earlier attempt's generation is sent
    on to the new one (:func:`_register`). Nothing an earlier attempt wrote can be taken for this one's.
    """
    import json

    global _agreements
    _agreements += 1
    base = f"distprof/agree/{_agreements}/"
    deadline = time.monotonic() + (timeout if timeout is not None else store.timeout).total_seconds()
    if rank == 0:
        gen = _open_generation(store, base, world_size)
        prefix = f"{base}{gen}/"
        store.set(f"{prefix}host/0", json.dumps([host, ""]))
        store.set(f"{prefix}run", json.dumps(rank0_run()))
        keys = [f"{prefix}host/{r}" for r in range(world_size)]
        _wait(store, keys, deadline)
        hellos = [json.loads(v.decode()) for v in store.multi_get(keys)]
        if world_size > 1:
            store.multi_set([f"{prefix}ack/{n}" for _, n in hellos[1:]], ["ok"] * (world_size - 1))
    else:
        prefix = _register(store, base, rank, host, deadline)
        keys = [f"{prefix}host/{r}" for r in range(world_size)]
        _wait(store, keys + [f"{prefix}run"], deadline)
        hellos = [json.loads(v.decode()) for v in store.multi_get(keys)]
    run = json.loads(store.get(f"{prefix}run").decode())
    return Agreement(rank, world_size, roles_of([h for h, _ in hellos], rank), run, prefix)


def _open_generation(store, base: str, world_size: int) -> str:
    """Rank 0: a new generation, published; the one it replaces (an earlier attempt's) is marked superseded, and
    every rank registered there by then is sent on. A rank registering there later sees the mark (the store orders
    the two: :func:`_register`)."""
    import json

    gen = uuid.uuid4().hex
    old = store.get(f"{base}gen").decode() if store.check([f"{base}gen"]) else None
    store.set(f"{base}gen", gen)
    if old is not None:
        store.set(f"{base}{old}/superseded", gen)
        there = [f"{base}{old}/host/{r}" for r in range(1, world_size) if store.check([f"{base}{old}/host/{r}"])]
        nonces = [json.loads(v.decode())[1] for v in store.multi_get(there)] if there else []
        if nonces:
            store.multi_set([f"{base}{old}/ack/{n}" for n in nonces], [f"moved:{gen}"] * len(nonces))
    return gen


def _register(store, base: str, rank: int, host: str, deadline: float) -> str:
    """A rank other than 0: register under rank 0's generation and wait for its acknowledgement. The generation
    read may be an earlier attempt's: then either this rank sees it marked superseded right after registering, or
    rank 0 saw the registration when it marked it and acknowledges it with the new generation's name. Returns the
    generation's key prefix."""
    import json

    nonce = uuid.uuid4().hex
    _wait(store, [f"{base}gen"], deadline)
    gen = store.get(f"{base}gen").decode()
    while True:
        prefix = f"{base}{gen}/"
        store.set(f"{prefix}host/{rank}", json.dumps([host, nonce]))
        if store.check([f"{prefix}superseded"]):
            gen = store.get(f"{prefix}superseded").decode()
            continue
        _wait(store, [f"{prefix}ack/{nonce}"], deadline)
        answer = store.get(f"{prefix}ack/{nonce}").decode()
        if answer == "ok":
            return prefix
        gen = answer.removeprefix("moved:")


def _wait(store, keys: list[str], deadline: float) -> None:
    store.wait(keys, timedelta(seconds=max(deadline - time.monotonic(), 0.001)))


# ---- the reference's server ---------------------------------------------------------------------------------------
def advertised_addresses() -> list[str]:
    """Addresses other hosts can reach this one at: the interface that routes to MASTER_ADDR (what the job's own
    rendezvous uses), then the hostname's address, then the hostname itself."""
    out: list[str] = []
    routed = _routed_address(os.environ.get("MASTER_ADDR", "").strip(), os.environ.get("MASTER_PORT", ""))
    if routed:
        out.append(routed)
    name = socket.gethostname()
    try:
        out.append(socket.gethostbyname(name))
    except OSError:
        pass
    out.append(name)
    return list(dict.fromkeys(out))


def bind_address(environ: dict | None = None) -> str:
    """Where the reference's clock server listens: loopback when every rank of the job is on this host (the
    launcher's LOCAL_WORLD_SIZE equals WORLD_SIZE, or Slurm runs one node), else the address of the interface that
    routes to MASTER_ADDR (what the other hosts use to reach this one); all interfaces only when neither is known
    (each connection must still authenticate)."""
    env = os.environ if environ is None else environ

    def num(key: str) -> int | None:
        try:
            return int(env.get(key, ""))
        except ValueError:
            return None

    ws, lws = num("WORLD_SIZE"), num("LOCAL_WORLD_SIZE")
    if (ws is not None and ws == lws) or num("SLURM_JOB_NUM_NODES") == 1 or num("SLURM_NNODES") == 1:
        return "127.0.0.1"
    routed = _routed_address(env.get("MASTER_ADDR", "").strip(), env.get("MASTER_PORT", ""))
    return routed if routed and not routed.startswith("127.") else ""


def _routed_address(master: str, port: str) -> str | None:
    if not master:
        return None
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:  # no packet is sent
            s.connect((master, int(port or 29500)))
            return s.getsockname()[0]
    except (OSError, ValueError):
        return None


class ClockServer:
    """The reference's listening socket (opened at the agreement, before its address is published), bound to
    :func:`bind_address`, and the job's secret (32 random bytes) that every connection must prove it knows."""

    def __init__(self, bind: str | None = None) -> None:
        self.address = bind_address() if bind is None else bind
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.sock.bind((self.address, 0))
            self.sock.listen(128)
            self.sock.setblocking(False)
        except OSError:
            self.sock.close()
            raise
        self.secret = secrets.token_bytes(32)

    @property
    def port(self) -> int:
        return self.sock.getsockname()[1]

    def endpoint(self) -> dict:
        addrs = [self.address] if self.address else advertised_addresses()
        return {"addrs": addrs, "port": self.port, "secret": self.secret.hex()}

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


def hello_mac(secret: bytes, nonce: bytes, rank: int) -> bytes:
    """What a leader answers the reference's `nonce` with: proof it knows the job's secret."""
    return hmac.new(secret, HELLO_TAG + nonce + struct.pack("<q", rank), hashlib.sha256).digest()


@dataclass
class _Window:
    samples: list[tuple[int, int, int, int, int]] = field(default_factory=list)  # phase, peer, send, remote, recv
    local: list[tuple[int, int, int, int]] = field(default_factory=list)  # phase, time, mono, perf
    pending: int = 0  # requests handed to the side thread and not finished


@dataclass
class _Pending:
    """An accepted connection that has not said its hello yet."""

    nonce: bytes
    deadline: float  # time.monotonic() by which its hello must be in
    buf: bytearray = field(default_factory=bytearray)


@dataclass
class _Serving:
    """The reference's connections while it serves: those waiting for their hello (at most `max_pending`, oldest
    first) and the leaders' (at most `max_authed`), and when the listening socket may accept again."""

    server: ClockServer
    sel: selectors.BaseSelector
    remaining: set[int]  # leaders that have not said goodbye
    leaders: set[int]  # the ranks allowed to say hello
    max_authed: int
    max_pending: int
    hello_s: float
    waiting: dict[socket.socket, _Pending] = field(default_factory=dict)  # insertion order: oldest first
    rank_of: dict[socket.socket, int] = field(default_factory=dict)  # authenticated connections -> leader rank
    buf: dict[socket.socket, bytearray] = field(default_factory=dict)  # their partial messages
    resume_at: float = 0.0  # accept() failed for want of descriptors: the listening socket rests until then
    backoff_s: float = 0.0
    refused: int = 0  # connections closed unauthenticated (no hello in time, a wrong one, past the cap)

    def drop(self, c: socket.socket) -> None:
        """Forget connection `c` and close it."""
        try:
            self.sel.unregister(c)
        except (KeyError, ValueError):
            pass
        if self.waiting.pop(c, None) is not None:
            self.refused += 1
        self.rank_of.pop(c, None)
        self.buf.pop(c, None)
        _close(c)

    def expire(self, now: float) -> float | None:
        """Close the waiting connections past their deadline; seconds until the next deadline (None: none)."""
        for c in [c for c, p in self.waiting.items() if p.deadline <= now]:
            self.drop(c)
        nxt = min((p.deadline for p in self.waiting.values()), default=None)
        if self.resume_at:
            nxt = self.resume_at if nxt is None else min(nxt, self.resume_at)
        return None if nxt is None else max(0.0, nxt - now)


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

    @property
    def server_address(self) -> tuple[str, int] | None:
        """(address, port) the reference's clock server listens on while it serves; None on other ranks."""
        srv = self._server
        try:
            return None if srv is None else (srv.address or "0.0.0.0", srv.port)
        except OSError:  # closed
            return None

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
        """A connection to the reference, authenticated: its nonce answered with this rank's proof of the secret."""
        ep = self._endpoint
        secret = bytes.fromhex(ep["secret"])
        last: OSError | None = None
        for addr in ep["addrs"]:
            try:
                conn = socket.create_connection((addr, ep["port"]), timeout=self.timeout_s)
            except OSError as e:
                last = e
                continue
            try:
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                conn.settimeout(self.timeout_s)
                nonce = _recv_exact(conn, NONCE_BYTES)
                conn.sendall(_MSG.pack(HELLO, self._rank, 0, 0) + hello_mac(secret, nonce, self._rank))
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
        others = set(self.roles.leaders) - {self._rank}
        conns = _Serving(server, sel, remaining=set(others), leaders=others, max_authed=len(others) + EXTRA_AUTHED,
                         max_pending=max(PENDING_MIN, 2 * len(others)),
                         hello_s=min(HELLO_DEADLINE_S, max(self.timeout_s, 0.5)))
        try:
            while conns.remaining and not self._stop_serving.is_set():
                timeout = conns.expire(time.monotonic())
                if conns.resume_at and time.monotonic() >= conns.resume_at:
                    conns.resume_at = 0.0
                    sel.register(server.sock, selectors.EVENT_READ, "listen")
                for key, _ in sel.select(timeout):
                    if key.data == "wake":
                        os.read(self._wake_r, 64)
                    elif key.data == "listen":
                        self._accept(conns)
                    elif key.fileobj in conns.waiting:
                        self._on_hello(conns, key.fileobj)
                    elif key.fileobj in conns.rank_of:
                        self._on_readable(conns, key.fileobj)
        except Exception as e:  # noqa: BLE001 -- never raised into anything; the leaders' exchanges fail and retry
            log.debug("distprof: clock reference stops serving: %s", e)
        finally:
            for c in list(conns.waiting) + list(conns.rank_of):
                conns.drop(c)
            sel.close()
            server.close()
            if conns.refused:
                log.info("distprof: clock reference closed %d connection(s) that did not authenticate",
                         conns.refused)

    def _accept(self, conns: _Serving) -> None:
        """A connection: greeted with a fresh nonce and given `hello_s` to answer. Past the cap the oldest waiting
        one is closed; out of descriptors, the listening socket rests (backing off) instead of spinning."""
        try:
            c, _ = conns.server.sock.accept()
        except (BlockingIOError, InterruptedError):
            return
        except OSError as e:
            if e.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                self._rest(conns, e)
            return
        conns.backoff_s = 0.0
        if len(conns.waiting) >= conns.max_pending:
            conns.drop(next(iter(conns.waiting)))
        nonce = secrets.token_bytes(NONCE_BYTES)
        try:
            c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            c.setblocking(False)
            c.send(nonce)  # 16 bytes into a fresh socket's buffer
        except OSError:
            _close(c)
            return
        conns.waiting[c] = _Pending(nonce, time.monotonic() + conns.hello_s)
        conns.sel.register(c, selectors.EVENT_READ, "conn")

    @staticmethod
    def _rest(conns: _Serving, e: OSError) -> None:
        """accept() failed for want of descriptors: free the oldest waiting connection, and stop listening for a
        while (EMFILE_BACKOFF_S, doubling) rather than spin on a socket that stays readable."""
        if conns.waiting:
            conns.drop(next(iter(conns.waiting)))
        conns.backoff_s = min(EMFILE_BACKOFF_MAX_S, max(EMFILE_BACKOFF_S, 2 * conns.backoff_s))
        conns.resume_at = time.monotonic() + conns.backoff_s
        try:
            conns.sel.unregister(conns.server.sock)
        except (KeyError, ValueError):
            pass
        log.debug("distprof: clock reference: accept failed (%s); resting %.2f s", e, conns.backoff_s)

    def _on_hello(self, conns: _Serving, c: socket.socket) -> None:
        """A waiting connection's bytes: once HELLO_SIZE are in, a leader's correct hello makes it one of the
        leaders' connections (replacing that leader's older one); anything else closes it."""
        p = conns.waiting[c]
        try:
            data = c.recv(HELLO_SIZE - len(p.buf))
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            conns.drop(c)
            return
        p.buf += data
        if len(p.buf) < HELLO_SIZE:
            return
        kind, rank, _, _ = _MSG.unpack_from(p.buf)
        mac = bytes(p.buf[_MSG.size:])
        ok = (kind == HELLO and rank in conns.leaders
              and hmac.compare_digest(mac, hello_mac(conns.server.secret, p.nonce, rank)))
        if not ok:
            conns.drop(c)
            return
        for old in [o for o, r in conns.rank_of.items() if r == rank]:  # the leader reconnected
            conns.drop(old)
        if len(conns.rank_of) >= conns.max_authed:
            conns.drop(c)
            return
        del conns.waiting[c]
        conns.rank_of[c] = rank
        conns.buf[c] = bytearray()

    def _on_readable(self, conns: _Serving, c: socket.socket) -> None:
        """A leader's bytes: a whole message is answered (a ping by a pong stamped as it came in) or ends the
        connection (goodbye, a closed socket, anything else)."""
        buf = conns.buf[c]
        try:
            data = c.recv(_MSG.size - len(buf))
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:  # the leader closed (it reconnects after a failure) or is gone
            conns.drop(c)
            return
        t_remote = self.now()  # first thing once a ping is in
        buf += data
        if len(buf) < _MSG.size:
            return
        kind, a, b, _ = _MSG.unpack(bytes(buf))
        buf.clear()
        if kind == PING:
            try:
                c.send(_MSG.pack(PONG, a, b, t_remote))  # 32 bytes: the socket buffer takes them
            except OSError:
                conns.drop(c)
        elif kind == BYE:
            conns.remaining.discard(conns.rank_of.get(c, -1))
            conns.drop(c)
        else:
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
