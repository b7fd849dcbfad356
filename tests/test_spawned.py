"""Scripts that start their ranks with torch.multiprocessing.spawn (PyTorch's DDP tutorial), run as
`python -m distprof.launch script.py`: every spawned process is profiled as a rank, into one run directory the
launcher's process hands over (capture/spawned.py). Before, nothing was recorded and the closing line blamed the
missing optimizer."""

from __future__ import annotations

import json
import pickle
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import EXAMPLES, job_env, only_run_dir, require_slow

from distprof.capture import setup as run_setup
from distprof.capture import spawned
from distprof.config import ProfileConfig, config_from_mapping

SCRIPT = str(EXAMPLES / "ddp_spawn.py")
PROFILE = ["--wait", "1", "--warmup", "1", "--active", "6"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(tmp_path: Path, *script_args: str, options: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    require_slow("a spawned job")
    return subprocess.run([sys.executable, "-m", "distprof.launch", "--out", "out", *PROFILE, *options, SCRIPT,
                           "--port", str(_free_port()), *script_args], cwd=tmp_path, env=job_env(),
                          capture_output=True, text=True, timeout=240)


def statuses(run: Path) -> dict[int, dict]:
    return {int(p.name[4:9]): json.loads(p.read_text()) for p in sorted(run.glob("rank*.status.json"))}


def report(run: Path) -> dict:
    proc = subprocess.run([sys.executable, "-m", "distprof", "report", str(run), "--json", "-"], env=job_env(),
                          capture_output=True, text=True, timeout=180, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


# -- which calls are wrapped (a table of the launcher's states) ----------------------------------------------------
class _Prof:
    def __init__(self, handed_over: bool, can: bool) -> None:
        self.handed_over, self._can, self.calls = handed_over, can, 0

    def can_hand_over(self) -> bool:
        return self._can

    def hand_over(self):
        self.calls += 1
        return "run-a", SimpleNamespace(id="job-a")


def _fn(i):  # pragma: no cover - never called here
    return i


@pytest.mark.parametrize("handed_over, can, nprocs, wrapped, inherited, hand_overs", [
    (False, True, 2, True, "run-a", 1),  # the first spawn: the launcher steps aside, its run goes to the ranks
    (True, False, 2, True, None, 0),  # a later spawn: a job of its own (its rank 0 claims a directory)
    (False, False, 2, False, None, 0),  # the launcher is a rank itself, or has trained: the processes run as they are
    (False, True, 0, False, None, 0),  # nothing to start: torch says so
    (False, True, "x", False, None, 0),
])
def test_which_spawns_are_profiled(handed_over, can, nprocs, wrapped, inherited, hand_overs):
    prof = _Prof(handed_over, can)
    got = spawned._ranks(_fn, nprocs, prof, ProfileConfig(), _fn)
    assert isinstance(got, spawned.SpawnedRank) == wrapped and prof.calls == hand_overs
    if wrapped:
        assert got.fn is _fn and got.nprocs == nprocs and (got.inherited[0] if got.inherited else None) == inherited
        assert spawned._ranks(got, nprocs, prof, ProfileConfig(), _fn) is got  # never wrapped twice
    else:
        assert got is _fn


def test_the_wrapper_crosses_to_the_spawned_process_and_is_removed_after():
    """It is pickled as torch pickles `fn` (by reference) with the launcher's options; install/uninstall leave
    torch.multiprocessing as it was."""
    import torch.multiprocessing as tmp

    tsp = sys.modules["torch.multiprocessing.spawn"]  # the package's attribute `spawn` is the function

    rank = spawned.SpawnedRank(_fn, config_from_mapping({"active": 3}), 2, None, _fn)
    back = pickle.loads(pickle.dumps(rank))
    assert back.fn is _fn and back.runner is _fn and back.config.schedule.active == 3 and back.nprocs == 2
    before = (tmp.start_processes, tsp.start_processes)
    spawned.install(_Prof(False, False), ProfileConfig(), _fn)
    try:
        assert tmp.start_processes is not before[0] and tsp.start_processes.__wrapped__ is before[1]
    finally:
        spawned.uninstall()
    assert (tmp.start_processes, tsp.start_processes) == before


def test_a_spawned_process_is_a_rank_of_several_until_its_group_says(monkeypatch):
    for k in ("WORLD_SIZE", "SLURM_NTASKS"):
        monkeypatch.delenv(k, raising=False)
    assert not run_setup.is_distributed()
    monkeypatch.setattr(run_setup, "_spawned_ranks", 0)
    run_setup.expect_spawned_ranks(4)
    assert run_setup.is_distributed()
    run_setup.expect_spawned_ranks(1)  # the only process spawned: a job of one
    assert not run_setup.is_distributed()


# -- real jobs ----------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_the_tutorials_spawned_ranks_are_profiled_into_one_run(tmp_path):
    """mp.spawn as the DDP tutorial calls it, rank 1 sleeping 30 ms more per forward: one run directory with both
    ranks' shards and statuses (the job the launcher claimed it as), rank 1 named, the job's output and exit code
    its own, one closing line."""
    proc = launch(tmp_path, "--slow-rank", "1", "--slow-ms", "30")
    assert proc.returncode == 0 and "ddp_spawn: 12 steps on 2 rank(s)" in proc.stdout, proc.stderr[-3000:]
    run = only_run_dir(tmp_path / "out")
    st = statuses(run)
    assert sorted(st) == [0, 1] and [len(s["windows"]) for s in st.values()] == [1, 1]
    assert all(s["steps_seen"] == 12 and s["errors"] == [] for s in st.values()), st
    claimed = json.loads((run / "job.json").read_text())["job"]["id"]
    assert {s["job"]["id"] for s in st.values()} == {claimed}
    assert proc.stderr.count("distprof: rank 0 wrote 1 shard(s)") == 1 and "no optimizer step" not in proc.stderr
    rep = report(run)
    assert rep["run"]["ranks_present"] == [0, 1]
    assert [s["rank"] for s in rep["stragglers"] if s["named"]] == [1], rep["stragglers"]


@pytest.mark.slow
def test_a_spawned_rank_that_fails_fails_the_job_as_torch_reports_it(tmp_path):
    proc = launch(tmp_path, "--fail-rank", "1", "--fail-step", "5")
    assert proc.returncode == 1 and "rank 1 failed at step 5 (--fail-rank)" in proc.stderr, proc.stderr[-3000:]
    st = statuses(only_run_dir(tmp_path / "out"))
    assert "rank 1 failed at step 5" in st[1]["script_error"] and st[1]["steps_seen"] == 5


@pytest.mark.slow
def test_forked_ranks_and_a_second_spawn_each_make_a_run_of_their_own(tmp_path):
    """mp.start_processes with fork: the same; a script that spawns twice (two jobs) gets two run directories."""
    proc = launch(tmp_path, "--start-method", "fork", "--steps", "8")
    assert proc.returncode == 0, proc.stderr[-3000:]
    st = statuses(only_run_dir(tmp_path / "out"))
    assert sorted(st) == [0, 1] and all(s["steps_seen"] == 8 and s["windows"] for s in st.values())
    twice = tmp_path / "twice"
    twice.mkdir()
    src = (EXAMPLES / "ddp_spawn.py").read_text()
    main = src[src.index('if __name__ == "__main__":'):]
    (twice / "twice.py").write_text(src.replace(main, 'if __name__ == "__main__":\n    import socket\n\n'
                                                "    args = parse_args()\n"
                                                "    for _ in range(2):\n"
                                                "        with socket.socket() as s:\n"
                                                "            s.bind(('127.0.0.1', 0))\n"
                                                "            args.port = s.getsockname()[1]\n"
                                                "        mp.spawn(demo_basic, args=(2, args), nprocs=2)\n"))
    proc = subprocess.run([sys.executable, "-m", "distprof.launch", "--out", "out", *PROFILE, "twice.py", "--port",
                           str(_free_port()), "--steps", "8"], cwd=twice, env=job_env(), capture_output=True,
                          text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = sorted(p for p in (twice / "out").iterdir() if p.is_dir())
    assert len(runs) == 2 and all(sorted(statuses(r)) == [0, 1] for r in runs), runs
    assert len({json.loads((r / "job.json").read_text())["job"]["id"] for r in runs}) == 2


def test_spawned_processes_without_a_group_never_share_a_directory(monkeypatch):
    """No agreement came (the processes made no group): the one process spawned takes the launcher's run; several
    each take a run of their own, even under --run-id (under one id they would all write as rank 0 of one
    directory)."""
    from distprof.capture import rundir
    from distprof.capture.setup import RunSetup

    for k in ("WORLD_SIZE", "SLURM_NTASKS", "SLURM_JOB_ID", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setattr(run_setup, "_spawned_ranks", 0)
    job = rundir.new_job()
    cfg = config_from_mapping({"run_id": "mine"})
    run_setup.expect_spawned_ranks(1)
    assert RunSetup(cfg, None, inherited=("launcher-run", job))._unagreed_run() == ("launcher-run", job)
    run_setup.expect_spawned_ranks(3)
    ids = {RunSetup(cfg, None, inherited=("launcher-run", job))._unagreed_run()[0] for _ in range(3)}
    assert len(ids) == 3 and not ids & {"mine", "launcher-run"}
    monkeypatch.setattr(run_setup, "_spawned_ranks", 0)  # not spawned: --run-id as before
    assert RunSetup(cfg, None)._unagreed_run()[0] == "mine"
