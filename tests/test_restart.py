"""A job restarted by torchrun (``--max-restarts``): each attempt is a run of its own, and no attempt's shards are
overwritten or mixed with another's.

torchrun's agent keeps one c10d store for the whole job, so a restarted worker finds every key the failed attempt
wrote. The run agreement once took the failed attempt's run document from there: the restarted rank 1 wrote into
the failed attempt's run directory, over that attempt's rank-1 shard, and the restarted attempt's run lacked rank 1.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest

from distprof.storage.reader import find_shards, read_shard

ROOT = Path(__file__).resolve().parents[1]

# -- the agreement on a store an earlier attempt used (real TCPStore, one process per rank) ----------------------

_RANK = """
import json, sys, datetime
from torch.distributed import TCPStore
from distprof.capture import clock
port, rank, tag = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
store = TCPStore("127.0.0.1", port, 2, False, timeout=datetime.timedelta(seconds=60))
a = clock.agree(store, rank, 2, f"host{rank}", lambda: {"run_id": tag})
print(json.dumps({"run_id": a.run_id, "hosts": a.roles.hosts}))
"""


def _rank(port: int, rank: int, tag: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-c", _RANK, str(port), str(rank), tag], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _result(p: subprocess.Popen) -> dict:
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])


def test_a_restarted_rank_never_takes_the_earlier_attempts_run():
    from torch.distributed import TCPStore

    server = TCPStore("127.0.0.1", 0, 1, True, timeout=timedelta(seconds=60))  # outlives the "attempts", as torchrun's
    first = [_rank(server.port, r, "attempt0") for r in (0, 1)]
    assert [_result(p) for p in first] == [{"run_id": "attempt0", "hosts": ["host0", "host1"]}] * 2
    # the restart: rank 1 comes back first and finds attempt 0's keys complete; rank 0 only after it has looked
    late = _rank(server.port, 1, "attempt1")
    time.sleep(2.0)
    assert late.poll() is None, f"rank 1 took a run document before rank 0 of its attempt existed: {late.stdout.read()}"
    early = _rank(server.port, 0, "attempt1")
    assert [_result(p) for p in (early, late)] == [{"run_id": "attempt1", "hosts": ["host0", "host1"]}] * 2
    # a second restart, rank 0 first this time: its generation is already there when rank 1 reads it
    again = [_rank(server.port, 0, "attempt2")]
    time.sleep(2.0)
    again.append(_rank(server.port, 1, "attempt2"))
    assert [_result(p) for p in again] == [{"run_id": "attempt2", "hosts": ["host0", "host1"]}] * 2


# -- a real torchrun job that fails once and is restarted ------------------------------------------------------------

_JOB = """
import os, time, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group("gloo")
rank, attempt = dist.get_rank(), int(os.environ["TORCHELASTIC_RESTART_COUNT"])
model = DDP(torch.nn.Linear(32, 32))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(12):
    model(torch.randn(16, 32)).sum().backward()
    opt.step(); opt.zero_grad()
    time.sleep(0.01)
    if attempt == 0 and rank == 1 and step == 7:
        raise RuntimeError("simulated failure on rank 1")
dist.destroy_process_group()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _jobs(run_dir: Path) -> dict[int, tuple[str, int]]:
    """rank -> (job id, torchrun restart count), from each shard's attributes."""
    out = {}
    for p in find_shards(run_dir):
        a = read_shard(p).attrs
        job = a["job"] if isinstance(a["job"], dict) else json.loads(a["job"])
        out[int(a["rank"])] = (job["id"], job["torchelastic_restart_count"])
    return out


@pytest.mark.slow
def test_torchrun_restart_gives_each_attempt_its_own_complete_run(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(_JOB)
    # c10d rendezvous: the store the agent shares with the workers across attempts. TORCH_GLOO_LAZY_INIT: torch's
    # own eager gloo connect reads the failed attempt's addresses from that store about half the time and the
    # restart then dies in init_process_group (without distprof too); lazily, gloo connects once both have written
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TORCH_GLOO_LAZY_INIT": "1", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2",
           "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{_free_port()}", "--rdzv-id", "job7",
           "--max-restarts", "1", "-m", "distprof.launch", "--out", str(tmp_path / "out"), str(script)]
    r = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    first, second = tmp_path / "out" / "job7", tmp_path / "out" / "job7.2"
    a0, a1 = _jobs(first), _jobs(second)
    assert sorted(a0) == [0, 1] and sorted(a1) == [0, 1], (a0, a1)
    assert {c for _, c in a0.values()} == {0} and {c for _, c in a1.values()} == {1}
    assert len({j for j, _ in a0.values()}) == 1 and len({j for j, _ in a1.values()}) == 1
    assert a0[0][0] != a1[0][0]
    assert "torchrun restart 1" in r.stderr and "'job7.2'" in r.stderr
    for run in (first, second):
        rep = subprocess.run([sys.executable, "-m", "distprof", "report", str(run), "--json", str(run / "r.json"),
                              "--no-progress"], env=env, capture_output=True, text=True, timeout=300)
        assert rep.returncode == 0, rep.stderr[-2000:]
        doc = json.loads((run / "r.json").read_text())["run"]
        assert doc["id"] == run.name and doc["ranks_present"] == [0, 1] and not doc["ranks_missing"]
