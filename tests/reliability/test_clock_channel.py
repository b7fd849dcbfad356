"""The clock-sync channel against other processes on the node (no torchrun: the reference and a leader in one
process, real sockets on 127.0.0.1): it listens on loopback when every rank is local, closes connections that do not
prove the job's secret within the hello deadline, keeps its descriptors bounded under a flood of idle and garbage
connections, does not spin when accept() runs out of descriptors, and the leader's exchanges go on meanwhile."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest
from conftest import job_env
from reliability_helpers import flood_port

from distprof.capture import clock
from distprof.capture.clock import ClockServer, ClockSync, bind_address, roles_of

pytestmark = pytest.mark.timeout(120)

ROUNDS = 4


def _pair(timeout_s: float = 1.0):
    """A reference (rank 0) serving on 127.0.0.1 and a leader (rank 1) of another (simulated) host."""
    errors: list[BaseException] = []
    ref = ClockSync(ROUNDS, timeout_s, None, lambda stage, e: errors.append(e))
    lead = ClockSync(ROUNDS, timeout_s, None, lambda stage, e: errors.append(e))
    srv = ClockServer(bind="127.0.0.1")
    ep = srv.endpoint()
    ref.start(roles_of(["h0", "h1"], 0), 0, srv, None)
    lead.start(roles_of(["h0", "h1"], 1), 1, None, ep)
    return ref, lead, errors


def _exchange(lead: ClockSync, window: int) -> int:
    lead.mark(window, 0)
    lead.mark(window, 1)
    samples, _ = lead.take(window)
    return len(samples)


def _closed_within(sock: socket.socket, seconds: float) -> bool:
    """True when the peer closes `sock` within `seconds` (what it sends first is read and ignored)."""
    sock.settimeout(seconds)
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            if sock.recv(4096) == b"":
                return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except socket.timeout:
        return False
    return False


def test_the_server_listens_on_loopback_when_every_rank_is_local(monkeypatch):
    """Measured before: bound ("", 0), every interface. Now loopback for a one-host job, the routed interface (or,
    unknown, every interface with authentication) for several hosts."""
    assert bind_address({"WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}) == "127.0.0.1"
    assert bind_address({"WORLD_SIZE": "16", "SLURM_JOB_NUM_NODES": "1"}) == "127.0.0.1"
    assert bind_address({"WORLD_SIZE": "16", "LOCAL_WORLD_SIZE": "8", "MASTER_ADDR": "127.0.0.1"}) == ""
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    srv = ClockServer()
    try:
        assert srv.sock.getsockname()[0] == "127.0.0.1"
        assert srv.endpoint()["addrs"] == ["127.0.0.1"]
        assert "token" not in srv.endpoint() and len(bytes.fromhex(srv.endpoint()["secret"])) == 32
    finally:
        srv.close()


def test_connections_without_the_secret_are_closed():
    """An idle connection (measured before: kept for ever), garbage, and a hello with a wrong proof are closed within
    the hello deadline; the leader's own exchanges are untouched."""
    ref, lead, errors = _pair(timeout_s=1.0)
    try:
        assert _exchange(lead, 0) == 2 * ROUNDS
        host, port = ref.server_address
        idle = socket.create_connection((host, port))
        garbage = socket.create_connection((host, port))
        garbage.sendall(os.urandom(clock.HELLO_SIZE))
        forged = socket.create_connection((host, port))
        nonce = forged.recv(clock.NONCE_BYTES)
        assert len(nonce) == clock.NONCE_BYTES  # the reference greets with a nonce
        forged.sendall(clock._MSG.pack(clock.HELLO, 1, 0, 0) + clock.hello_mac(b"not the secret", nonce, 1))
        replay = socket.create_connection((host, port))  # the right proof for another nonce does not pass
        replay.recv(clock.NONCE_BYTES)
        replay.sendall(clock._MSG.pack(clock.HELLO, 1, 0, 0) + clock.hello_mac(b"x" * 32, nonce, 1))
        deadline = clock.HELLO_DEADLINE_S + 3.0
        assert _closed_within(garbage, 3.0) and _closed_within(forged, 3.0) and _closed_within(replay, 3.0)
        assert _closed_within(idle, deadline), "an idle connection was kept past the hello deadline"
        assert _exchange(lead, 1) == 2 * ROUNDS and not errors, errors
        for s in (idle, garbage, forged, replay):
            s.close()
    finally:
        lead.close(1.0)
        ref.close(1.0)


#: The reference and its leader in a process of few descriptors: exchange window 0, wait for the flood, exchange
#: windows 1-5 during it, then open 20 files (what the job's own writes need). Prints what it saw as JSON.
_JOB = r"""
import json, os, resource, sys, tempfile, time
sys.path[:0] = [sys.argv[1], os.path.dirname(sys.argv[1])]
resource.setrlimit(resource.RLIMIT_NOFILE, (64, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
from test_clock_channel import _pair, _exchange
ref, lead, errors = _pair(timeout_s=2.0)
got = [_exchange(lead, 0)]
print(json.dumps({"port": ref.server_address[1]}), flush=True)
sys.stdin.readline()  # the flood is on
t0, c0 = time.monotonic(), time.process_time()
for w in range(1, 6):
    got.append(_exchange(lead, w))
    time.sleep(0.3)
wall, cpu = time.monotonic() - t0, time.process_time() - c0
opened = 0
try:
    for _ in range(20):
        tempfile.TemporaryFile().close()
        opened += 1
except OSError as e:
    pass
print(json.dumps({"samples": got, "errors": [str(e) for e in errors], "cpu_s": cpu, "wall_s": wall,
                  "files_opened": opened, "fds": len(os.listdir("/proc/self/fd"))}), flush=True)
lead.close(1.0)
ref.close(1.0)
"""


@pytest.mark.skipif(sys.platform != "linux", reason="/proc and RLIMIT_NOFILE semantics of Linux")
def test_a_flood_costs_no_exchange_no_descriptor_and_no_cpu():
    """1,100 idle and 50 garbage connections from another process against a reference limited to 64 descriptors
    (measured before: it accepted until EMFILE, then its accept loop spun at 0.95 of a core and the process could
    not open a file). Now every exchange during the flood succeeds, the process keeps its descriptors (it opens 20
    files) and its CPU time stays a fraction of the wall time."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard < 2000:
        pytest.skip(f"this process may hold {hard} descriptors; the flood needs 1,200")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 2000), hard))
    here = os.path.dirname(os.path.abspath(__file__))
    job = subprocess.Popen([sys.executable, "-c", _JOB, here], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, cwd=here, env=job_env())
    held: list[socket.socket] = []
    try:
        port = json.loads(job.stdout.readline())["port"]
        held = flood_port(port, idle=1100, garbage=50)
        job.stdin.write("go\n")
        job.stdin.flush()
        out, err = job.communicate(timeout=90)
    finally:
        for s in held:
            s.close()
        if job.poll() is None:
            job.kill()
    res = json.loads(out.strip().splitlines()[-1])
    assert res["samples"] == [2 * ROUNDS] * 6 and not res["errors"], (res, err[-2000:])
    assert res["files_opened"] == 20 and res["fds"] < 48, res
    assert res["cpu_s"] < 0.5 * res["wall_s"], res  # no spinning accept loop
    print(f"flood: {len(held)} connections held; job cpu {res['cpu_s']:.2f} s over {res['wall_s']:.2f} s, "
          f"{res['fds']} descriptors")
