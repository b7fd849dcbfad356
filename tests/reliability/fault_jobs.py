"""Helpers of the capture-fault tests: run fault_train.py under torchrun + distprof.launch and read what it left.

(Not named conftest.py: a second conftest module would shadow tests/conftest.py for the modules importing it.)
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from conftest import job_env, require_slow

from distprof.errors import BadShardError
from distprof.storage import find_shards, schema
from distprof.storage.validate import check_shard, job_id

FAULT_SCRIPT = Path(__file__).with_name("fault_train.py")
#: Windows of two steps back to back: window w records steps 2w and 2w + 1 and ends at the forward of step 2w + 2.
SCHEDULE = ["--wait", "0", "--warmup", "0", "--active", "2", "--repeat", "0"]
#: A job that does not end within this is hung (each job here takes ~10 s; torchrun's own grace is 30 s).
JOB_TIMEOUT_S = 150


@dataclass
class Job:
    rc: int
    stdout: str
    stderr: str
    seconds: float
    out: Path

    def run_dirs(self) -> list[Path]:
        return sorted(p for p in self.out.iterdir() if p.is_dir()) if self.out.is_dir() else []

    def run_dir(self) -> Path:
        (d,) = self.run_dirs()
        return d


def torchrun_job(cwd: Path, fault: list[str], *, nproc: int = 2, steps: int = 12, out: str = "out",
                 launch: list[str] | None = None, env: dict[str, str] | None = None, distprof: bool = True,
                 preexec_fn=None, start: bool = False):
    """fault_train.py under torchrun (with distprof.launch unless `distprof` is False). `start`: return the Popen
    and its start time instead of waiting."""
    require_slow("a torchrun job")
    target = (["-m", "distprof.launch", "--out", out, *SCHEDULE, *(launch or [])] if distprof else [])
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", *target,
           str(FAULT_SCRIPT), "--steps", str(steps), *fault]
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env or job_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, preexec_fn=preexec_fn)
    if start:
        return proc, t0
    return finish(proc, t0, cwd / out)


def finish(proc: subprocess.Popen, t0: float, out: Path) -> Job:
    try:
        stdout, stderr = proc.communicate(timeout=JOB_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        stdout, stderr = proc.communicate()
        raise AssertionError(f"job hung for {JOB_TIMEOUT_S} s:\n{stdout[-2000:]}\n{stderr[-6000:]}") from None
    return Job(proc.returncode, stdout, stderr, time.monotonic() - t0, out)


def launcher_job(cwd: Path, args: list[str], *, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """A single-process job: python -m distprof.launch ARGS (fast: no torchrun)."""
    return subprocess.run([sys.executable, "-m", "distprof.launch", *args], cwd=cwd, env=env or job_env(),
                          capture_output=True, text=True, timeout=JOB_TIMEOUT_S)


def status(run_dir: Path, rank: int) -> dict | None:
    p = run_dir / schema.STATUS_TEMPLATE.format(rank=rank)
    return json.loads(p.read_text()) if p.exists() else None


def shards_by_rank(run_dir: Path) -> dict[int, dict[int, object]]:
    """rank -> window -> checked Shard. Every file under a final name must pass the checks (no partial file)."""
    out: dict[int, dict[int, object]] = {}
    for p in find_shards(run_dir):
        try:
            s = check_shard(p)
        except BadShardError as e:
            raise AssertionError(f"a file under a final name is not a whole shard: {e}") from None
        out.setdefault(s.rank, {})[s.window] = s
    return out


def job_ids(run_dir: Path) -> set[str | None]:
    return {job_id(s.attrs) for ws in shards_by_rank(run_dir).values() for s in ws.values()}


def tmp_files(run_dir: Path, rank: int | None = None) -> list[Path]:
    pat = f"rank{rank:05d}.*{schema.TMP_SUFFIX}" if rank is not None else f"*{schema.TMP_SUFFIX}"
    return sorted(run_dir.glob(pat))


def distprof_traceback(stderr: str) -> str | None:
    """A traceback through distprof's code or an exception escaping one of its threads, if any. The script's own
    exception (a collective failing when a peer died) passes through the launcher's frames (``distprof/launch.py``
    runs the script like ``runpy``, ``distprof/rank_entry.py`` calls it under the rank's profiler) exactly as it
    would pass through ``python train.py``: those frames alone do not make it distprof's. torchrun's ChildFailedError
    summary is what a failed job prints without distprof too."""
    m = re.search(r"Exception in thread distprof", stderr)
    if m:
        return m.group(0)
    for frame in re.finditer(r'File "([^"]*/distprof/[^"]*)"', stderr):
        if not frame.group(1).endswith(LAUNCHER_FRAMES):
            return frame.group(0)
    return None


#: The files of the frames every exception of the script passes through under distprof.launch.
LAUNCHER_FRAMES = ("/distprof/launch.py", "/distprof/rank_entry.py")


def exit_codes(stderr: str) -> dict[int, int]:
    """rank -> exit code from torchrun's failure summary ('rank : 1 (local_rank: 1)' ... 'exitcode : -15')."""
    out = {}
    for m in re.finditer(r"rank\s*:\s*(\d+) \(local_rank: \d+\)\s*\n\s*exitcode\s*:\s*(-?\d+)", stderr):
        out[int(m.group(1))] = int(m.group(2))
    return out


def sigterm_sent_at(stderr: str) -> float | None:
    """When torchrun sent the first SIGTERM to a worker ('W1201 11:52:15.247000 ... closing signal SIGTERM'), as
    seconds since midnight (its log's clock)."""
    m = re.search(r"^[WIE]\d{4} (\d\d):(\d\d):(\d\d\.\d+) .*closing signal SIGTERM", stderr, re.M)
    if not m:
        return None
    return int(m.group(1)) * 3600 + int(m.group(2)) * 60 + float(m.group(3))


def seconds_since_log_time(sent: float, now: float | None = None) -> float:
    """Seconds from a log clock reading `sent` (seconds since local midnight, as sigterm_sent_at gives) to `now`
    (epoch seconds; the present when None), signed and across midnight. The local time of day and its fraction come
    from one clock reading: two readings straddle a second boundary now and then and read a whole second early."""
    now = time.time() if now is None else now
    t = time.localtime(now)
    now_s = t.tm_hour * 3600 + t.tm_min * 60 + t.tm_sec + (now % 1)
    return (now_s - sent + 43200) % 86400 - 43200


def can_mount_tmpfs(where: Path, size_kb: int, *options: str) -> bool:
    """Mount a tmpfs of `size_kb` at `where` (root only); False when that is not possible here."""
    if os.geteuid() != 0:
        return False
    where.mkdir(parents=True, exist_ok=True)
    opts = ",".join([f"size={size_kb}k", *options])
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(where)], capture_output=True, text=True)
    return r.returncode == 0


def unmount(where: Path) -> None:
    subprocess.run(["umount", "-l", str(where)], capture_output=True)


def listening_ports(pid: int) -> list[int]:
    """TCP ports process `pid` listens on (IPv4), from /proc: its socket inodes matched to /proc/net/tcp."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    ports = []
    with open(f"/proc/{pid}/net/tcp") as fh:
        for line in fh.readlines()[1:]:
            f = line.split()
            if f[3] == "0A" and f[9] in inodes:  # LISTEN
                ports.append(int(f[1].split(":")[1], 16))
    return ports


def clock_port(pid: int, timeout_s: float = 1.0) -> int | None:
    """The port of the clock reference's server in process `pid`: the listening port that greets a connection with
    its 16-byte nonce (gloo's and the store's wait for the client to speak first)."""
    import socket

    for port in listening_ports(pid):
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as s:
                s.settimeout(timeout_s)
                if len(s.recv(64)) == 16:
                    return port
        except OSError:
            continue
    return None


def remount(where: Path, *options: str) -> None:
    subprocess.run(["mount", "-o", ",".join(["remount", *options]), str(where)], check=True, capture_output=True)


def step_times(stdout: str, rank: int) -> dict[int, float]:
    """step -> seconds since the process started, of `rank` (fault_train.py --times)."""
    out = {}
    for m in re.finditer(rf"\bt {rank} (\d+) (\d+\.\d{{4}})", stdout):  # two ranks' lines may interleave
        out[int(m.group(1))] = float(m.group(2))
    return out
