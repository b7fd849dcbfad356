"""Scripts that start their ranks one by one with multiprocessing.Process (PyTorch's "Writing Distributed
Applications" tutorial), run as `python -m distprof.launch script.py`: a started process that makes a process group
is profiled as a rank, into the launcher's run directory (capture/spawned.py, rank_entry.run_started); a process
that makes none, and the launcher that trains itself, are as before. And a child forked while the launcher's
profiler runs (fork is Linux's default start method; DataLoader workers) drops its copy of that profiler: the copy
used to go on stepping in the child, and the tutorial with fork hung in 2 of 4 runs."""

from __future__ import annotations

import functools
import json
import os
import pickle
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import EXAMPLES, job_env, only_run_dir, require_slow

from distprof import rank_entry
from distprof.capture import spawned
from distprof.capture.profiler import RankProfiler
from distprof.config import ProfileConfig

SCRIPT = str(EXAMPLES / "dist_process.py")
PROFILE = ["--wait", "1", "--warmup", "1", "--active", "6"]


def _target(rank):  # pragma: no cover - never called here
    return rank


class _Trainer:
    def run(self, rank):  # pragma: no cover - never called here
        return rank


# -- which targets are the script's own -------------------------------------------------------------------------
def _library_targets():
    import multiprocessing.pool

    from torch.utils.data._utils import worker

    return [worker._worker_loop, multiprocessing.pool.worker, rank_entry.run_started, os.getpid]


@pytest.mark.parametrize("target, own", [
    (_target, True),  # a function of the script's (here, of a file outside the libraries)
    (functools.partial(_target, 1), True),
    (_Trainer().run, True),
    (_Trainer(), True),  # a callable object of the script's class
    *[(t, False) for t in _library_targets()],  # DataLoader workers, pools, distprof itself, a builtin
])
def test_only_the_scripts_own_targets_may_be_ranks(target, own):
    assert spawned.script_code(target) is own


# -- the run directory's hand-off -------------------------------------------------------------------------------
def test_the_first_to_take_the_run_directory_keeps_it():
    h = spawned.Handoff(("run-a", SimpleNamespace(id="job-a")))
    try:
        back = pickle.loads(pickle.dumps(h))  # as a spawned process gets it
        assert back.dir == h.dir and back.inherited[0] == "run-a"
        assert back.take("rank 0") and not h.take("launcher") and not back.take("rank 0")
        assert Path(h.dir, "owner").read_text() == "rank 0" and oct(os.stat(h.dir).st_mode & 0o777) == "0o700"
    finally:
        h.discard()
    # gone: a late group claims a directory of its own (None: the offer is over, nobody else has it)
    assert not os.path.exists(h.dir) and back.take("rank 0") is None


def test_only_the_launcher_ends_the_offer():
    h = spawned.Handoff(None)
    try:
        pid = os.fork()
        if pid == 0:  # a forked child leaving through the launcher's code
            h.discard()
            os._exit(0)
        os.waitpid(pid, 0)
        assert os.path.isdir(h.dir) and h.take("launcher") is True
    finally:
        h.discard()
    assert not os.path.exists(h.dir)


@pytest.mark.parametrize("taken_by, step_num, keeps, handed_over", [
    (None, 0, True, False),  # nobody took it: the launcher keeps it (its first step, or its close)
    ("rank 0", 0, False, True),  # a started group's rank 0 took it: the launcher leaves as one that handed over
    ("rank 0", 3, True, False),  # the launcher has stepped: it took the directory at its first step already
    ("(gone)", 0, True, False),  # the token's directory is gone: nobody else can have it
])
def test_the_launcher_keeps_its_directory_unless_started_ranks_took_it(tmp_path, taken_by, step_num, keeps,
                                                                      handed_over):
    h = spawned.Handoff(None)
    try:
        if taken_by == "(gone)":
            os.rmdir(h.dir)
        elif taken_by:
            assert h.take(taken_by)
        prof = SimpleNamespace(handoff=h, step_num=step_num, _handed_over=False, paused=None)
        prof._pause_side_threads = lambda paused: setattr(prof, "paused", paused)
        assert RankProfiler._keep_or_yield_run_dir(prof) is keeps and prof._handed_over is handed_over
        # the side threads write into the directory again once this process took it back, not before
        assert prof.paused is (False if taken_by in (None, "(gone)") and step_num == 0 else None)
        if not taken_by and step_num == 0:
            assert Path(h.dir, "owner").read_text() == "launcher"
    finally:
        h.discard()


class _Prof:
    def __init__(self, can: bool) -> None:
        self._can, self.handoff, self.offers = can, None, 0

    def can_hand_over(self) -> bool:
        return self._can

    def offer_run_dir(self, make):
        self.offers += 1
        self.handoff = make(("run-a", SimpleNamespace(id="job-a")))
        return self.handoff


class _Proc:  # what the wrapper reads of a multiprocessing.Process: its target, its class's run()
    def __init__(self, target) -> None:
        self._target = target

    run = __import__("multiprocessing").process.BaseProcess.run


class _OwnRun(_Proc):
    def run(self):  # pragma: no cover - never called here
        return self


@pytest.mark.parametrize("target, can, wrapped", [
    (_target, True, True),  # the script's function, the launcher no rank and stepless: maybe a rank
    (_target, False, False),  # the launcher is a rank, or has trained: its children are helpers
    (None, True, False),  # nothing to run
    (os.getpid, True, False),  # a library's target
])
def test_which_started_processes_run_through_the_launcher(target, can, wrapped):
    prof = _Prof(can)
    procs = [_Proc(target) for _ in range(2)]
    try:
        for p in procs:
            spawned._as_started_rank(p, prof, ProfileConfig(), _target)
        assert all(isinstance(p._target, spawned.StartedRank) == wrapped for p in procs)
        if wrapped:  # one offer of the directory, shared by every process started
            assert prof.offers == 1 and {id(p._target.handoff) for p in procs} == {id(prof.handoff)}
            assert procs[0]._target.target is _target and procs[0]._target.handoff.inherited[0] == "run-a"
            back = pickle.loads(pickle.dumps(procs[0]._target))
            assert back.target is _target and back.runner is _target
    finally:
        spawned.uninstall()


def test_a_subclass_that_overrides_run_runs_it_through_the_launcher():
    """Its own run() is the script's code: the instance's run goes through the runner, once, and crosses to a spawned
    process with the process (a reference back to it)."""
    prof = _Prof(True)
    proc = _OwnRun(None)
    try:
        spawned._as_started_rank(proc, prof, ProfileConfig(), _target)
        spawned._as_started_rank(proc, prof, ProfileConfig(), _target)  # started twice: wrapped once
        assert isinstance(proc.run, spawned.StartedRank) and proc.run.target.args == (proc,) and prof.offers == 1
        back = pickle.loads(pickle.dumps(proc))
        assert isinstance(back.run, spawned.StartedRank) and back.run.target.args[0] is back
    finally:
        spawned.uninstall()
    lib = _OwnRun(None)  # the same class, its run() a library's: left alone
    _OwnRun.run.__module__ = "os"
    try:
        spawned._as_started_rank(lib, _Prof(True), ProfileConfig(), _target)
        assert "run" not in vars(lib)
    finally:
        _OwnRun.run.__module__ = __name__
        spawned.uninstall()


def test_process_start_is_wrapped_while_the_launcher_runs_and_put_back_after():
    from multiprocessing import process

    before = process.BaseProcess.start
    spawned.install(_Prof(False), ProfileConfig(), _target, _target)
    try:
        assert process.BaseProcess.start.__wrapped__ is before
    finally:
        spawned.uninstall()
    assert process.BaseProcess.start is before


# -- a child forked while the profiler runs -----------------------------------------------------------------------
def test_a_forked_child_drops_its_copy_of_the_running_profiler(tmp_path, monkeypatch):
    """The copy is CLOSED at once in the child: no longer the active profiler, its optimizer hook gone (a step in
    the child advances nothing), no listener for a group the child makes; the parent's runs on."""
    import torch

    from distprof.capture import groups, profiler
    from distprof.config import config_from_mapping

    for k in ("WORLD_SIZE", "RANK", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE"):
        monkeypatch.delenv(k, raising=False)
    prof = RankProfiler(config_from_mapping({"out": str(tmp_path), "wait": 1, "warmup": 1, "active": 2}))
    prof.start()
    try:
        model = torch.nn.Linear(4, 4)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: report, then leave without any cleanup of the parent's
            try:
                for _ in range(3):
                    model(torch.randn(2, 4)).sum().backward()
                    opt.step()
                got = [profiler.active() is None, prof._state is profiler.ProfilerState.CLOSED, prof.step_num,
                       groups._default_listener is None]
                os.write(w, json.dumps(got).encode())
            finally:
                os._exit(0)
        os.close(w)
        with os.fdopen(r) as fh:
            got = json.loads(fh.read() or "null")
        os.waitpid(pid, 0)
        assert got == [True, True, 0, True], got
        assert profiler.active() is prof and prof._state is profiler.ProfilerState.RUNNING
    finally:
        prof.close()


# -- real jobs ----------------------------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(cwd: Path, script: str, *script_args: str, options: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    require_slow("a job whose script starts its ranks")
    return subprocess.run([sys.executable, "-m", "distprof.launch", "--out", "out", *PROFILE, *options, script,
                           *script_args], cwd=cwd, env=job_env(), capture_output=True, text=True, timeout=240)


def statuses(run: Path) -> dict[int, dict]:
    return {int(p.name[4:9]): json.loads(p.read_text()) for p in sorted(run.glob("rank*.status.json"))}


@pytest.mark.slow
@pytest.mark.parametrize("start_method, subclass", [("spawn", False), ("fork", False), ("spawn", True)])
def test_the_tutorials_started_ranks_are_profiled_into_one_run(tmp_path, start_method, subclass):
    """The tutorial's shape, with a helper process beside the ranks and rank 1 sleeping 30 ms more per step: one run
    directory (the one the launcher claimed) with both ranks' shards, the helper in none, one closing line and no
    word about a missing optimizer step; rank 1 named. With fork this job hung before. Under --watch (fork) the live
    file and the watch series are the ranks' — the launcher's side threads, paused, wrote none of theirs there. The
    ranks as a Process subclass whose run() trains: the same."""
    proc = launch(tmp_path, SCRIPT, "--start-method", start_method, "--helper", "--slow-rank", "1", "--slow-ms", "30",
                  "--port", str(_free_port()), *(["--subclass"] if subclass else []),
                  options=("--watch",) if start_method == "fork" else ())
    assert proc.returncode == 0 and "dist_process: 12 steps on 2 rank(s)" in proc.stdout, proc.stderr[-3000:]
    run = only_run_dir(tmp_path / "out")
    st = statuses(run)
    assert sorted(st) == [0, 1] and all(len(s["windows"]) == 1 and s["errors"] == [] for s in st.values()), st
    claimed = json.loads((run / "job.json").read_text())["job"]["id"]
    assert {s["job"]["id"] for s in st.values()} == {claimed}
    assert proc.stderr.count("distprof: rank 0 wrote 1 shard(s)") == 1 and "no optimizer step" not in proc.stderr
    rep = subprocess.run([sys.executable, "-m", "distprof", "report", str(run), "--json", "-"], env=job_env(),
                         capture_output=True, text=True, timeout=180)
    assert rep.returncode == 0, rep.stderr[-3000:]
    named = [s["rank"] for s in json.loads(rep.stdout)["stragglers"] if s["named"]]
    assert named == [1], rep.stdout[-3000:]
    if start_method == "fork":
        import numpy as np

        live = json.loads((run / "distprof.live.json").read_text())
        assert (live["world_size"], live["state"], live["step"]) == (2, "closed", 12), live
        assert [len(np.load(run / "watch" / f"rank{r:05d}.s00000.npy")) for r in (0, 1)] == [12, 12]


@pytest.mark.slow
@pytest.mark.parametrize("start_method", ["spawn", "fork"])
def test_a_launcher_that_trains_beside_a_helper_and_workers_keeps_its_run(tmp_path, start_method):
    """One process that starts a helper of its own (no group) and trains with DataLoader workers: it is the rank, as
    before — its run directory, its window — and the job ends."""
    (tmp_path / "solo.py").write_text(
        "import sys, time, multiprocessing as mp\n"
        "import torch, torch.nn as nn\n"
        "def helper(s):\n    time.sleep(s)\n"
        "if __name__ == '__main__':\n"
        "    mp.set_start_method(sys.argv[1])\n"
        "    h = mp.Process(target=helper, args=(0.3,)); h.start()\n"
        "    m = nn.Linear(8, 8); opt = torch.optim.SGD(m.parameters(), lr=0.1)\n"
        "    data = torch.utils.data.TensorDataset(torch.randn(192, 8))\n"
        "    for (x,) in torch.utils.data.DataLoader(data, batch_size=16, num_workers=2):\n"
        "        opt.zero_grad(); m(x).sum().backward(); opt.step(); time.sleep(0.005)\n"
        "    h.join(); print('solo done')\n")
    proc = launch(tmp_path, "solo.py", start_method)
    assert proc.returncode == 0 and "solo done" in proc.stdout, proc.stderr[-3000:]
    st = statuses(only_run_dir(tmp_path / "out"))
    assert sorted(st) == [0] and len(st[0]["windows"]) == 1 and st[0]["steps_seen"] == 12, st
    assert "distprof: rank 0 wrote 1 shard(s)" in proc.stderr


def test_a_started_process_that_makes_no_group_runs_as_it_is():
    """No group: nothing is profiled, the target's value and exceptions pass through, and no listener is left."""
    from distprof.capture import groups

    h = spawned.Handoff(None)
    try:
        assert rank_entry.run_started(ProfileConfig(), h, lambda: 42) == 42
        with pytest.raises(ValueError, match="boom"):
            rank_entry.run_started(ProfileConfig(), h, lambda: (_ for _ in ()).throw(ValueError("boom")))
        assert groups._default_listener is None and not os.listdir(h.dir)  # nobody took the run directory
    finally:
        h.discard()
