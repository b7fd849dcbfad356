"""What the on-demand trigger costs an idle job, and how long a trigger takes to reach the steps.

    python benchmarks/trigger_cost.py [--steps 20000] [--rounds 5] [--triggers 3] [--poll 1.0]

1. Per-step cost while idle: a loop of `p.step()` alone (`distprof.profile(step_on="manual", schedule="none")`, so
   each iteration is the profiler's step and nothing else), with the trigger on and off, interleaved `--rounds`
   times; the median microseconds per step of each and their difference (noisy on a loaded machine: it is a few
   hundred nanoseconds). Then that part alone: the in-box test and the plan's lookups per step against the schedule's
   lookups before triggers existed. And rank 0's side thread's CPU time per second of wall time (its own CPU clock)
   in a process stepping every 10 ms.
2. Latency: a 2-rank DDP job (tests/trigger_job.py under torchrun + distprof.launch, `--schedule none`, default
   `--trigger-poll` unless --poll) takes `--triggers` requests of `distprof trigger --steps 3 --wait`; for each, the
   time from writing the request to rank 0's answer, and to the first recorded step (its start in the shard), and
   how many steps ahead rank 0 placed the window.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))


def per_step_us(steps: int, trigger: bool, out: str) -> float:
    """Microseconds per `p.step()`."""
    import distprof

    with distprof.profile(out=out, schedule="none", trigger=trigger) as p:
        for _ in range(200):
            p.step()
        wall0 = time.perf_counter()
        for _ in range(steps):
            p.step()
        return (time.perf_counter() - wall0) / steps * 1e6


def hook_ns(n: int = 200_000) -> tuple[float, float]:
    """Nanoseconds of the profiler's per-step schedule work with the trigger (the in-box test and the plan's two
    lookups) and without it (the schedule's two lookups, as before the trigger)."""
    from distprof.capture.schedule import WindowPlan, action_at
    from distprof.config import ScheduleConfig

    cfg = ScheduleConfig(kind="none")
    plan = WindowPlan(cfg)

    class _T:
        inbox = None

    trig = _T()
    t0 = time.perf_counter_ns()
    for step in range(n):
        if trig is not None and trig.inbox is not None:
            pass
        plan.action(step), plan.action(step + 1)
    t1 = time.perf_counter_ns()
    for step in range(n):
        action_at(cfg, step), action_at(cfg, step + 1)
    t2 = time.perf_counter_ns()
    return (t1 - t0) / n, (t2 - t1) / n


def side_thread_cpu(seconds: float, out: str) -> float:
    """CPU seconds per wall second of rank 0's trigger side thread in a job stepping every 10 ms."""
    import distprof

    with distprof.profile(out=out, schedule="none") as p:
        p.step()
        th = next(t for t in threading.enumerate() if t.name == "distprof-trigger")
        clk = time.pthread_getcpuclockid(th.ident)
        cpu0, wall0 = time.clock_gettime(clk), time.perf_counter()
        while time.perf_counter() - wall0 < seconds:
            time.sleep(0.01)
            p.step()
        return (time.clock_gettime(clk) - cpu0) / (time.perf_counter() - wall0)


def idle_cost(steps: int, rounds: int) -> None:
    on, off = [], []
    with tempfile.TemporaryDirectory() as d:
        for i in range(rounds):
            for trig in ((True, False) if i % 2 == 0 else (False, True)):
                us = per_step_us(steps, trig, os.path.join(d, f"r{i}{trig}"))
                (on if trig else off).append(us)
    m_on, m_off = statistics.median(on), statistics.median(off)
    print(f"idle per-step cost ({steps} steps x {rounds} rounds, p.step() only): trigger on {m_on:.2f} us, "
          f"off {m_off:.2f} us, difference {m_on - m_off:+.2f} us/step (min on {min(on):.2f}, off {min(off):.2f})")
    on_ns, off_ns = zip(*(hook_ns() for _ in range(5)))
    print(f"the schedule work per step: with the trigger {min(on_ns):.0f} ns, without {min(off_ns):.0f} ns "
          f"(fastest of 5 x 200,000)")
    with tempfile.TemporaryDirectory() as d:
        print(f"trigger side thread (rank 0, one process, stepping every 10 ms for 10 s): "
              f"{side_thread_cpu(10.0, d) * 1e3:.3f} ms CPU per s of wall time")


def latency(triggers: int, poll: float | None) -> None:
    from distprof.capture import trigger_files as tf
    from distprof.storage import find_shards, read_shard

    env = {k: v for k, v in os.environ.items() if not k.startswith("DISTPROF_")}
    env.update(PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    if poll is not None:
        env["DISTPROF_TRIGGER_POLL_S"] = str(poll)
    with tempfile.TemporaryDirectory() as d:
        stop = Path(d) / "stop"
        job = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                                "-m", "distprof.launch", "--out", "out", "--schedule", "none",
                                str(ROOT / "tests" / "trigger_job.py"), "--stop", str(stop), "--max-s", "300"],
                               cwd=d, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            run_dir = None
            deadline = time.monotonic() + 120
            while run_dir is None and time.monotonic() < deadline:
                runs = list((Path(d) / "out").glob(f"*/{tf.LIVE_NAME}"))
                run_dir = runs[0].parent if runs else None
                time.sleep(0.2)
            if run_dir is None:
                raise SystemExit("the job never came up")
            time.sleep(3.0)  # past its first steps
            rows = []
            for _ in range(triggers):
                t0 = time.time_ns()
                proc = subprocess.run([sys.executable, "-m", "distprof", "trigger", str(run_dir), "--steps", "3",
                                       "--wait", "--timeout", "120"], cwd=d, env=env, capture_output=True, text=True)
                if proc.returncode != 0:
                    print(f"trigger failed: {proc.stdout}{proc.stderr}")
                    continue
                a = tf.read_answer(run_dir / tf.ANSWER_NAME)
                shard = next(p for p in find_shards(run_dir) if read_shard(p).rank == 0 and read_shard(p).window == a.window)
                first_ns = int(read_shard(shard).table("steps")["start_ns"][0])
                doc = json.loads((run_dir / tf.LIVE_NAME).read_text())
                rows.append(((first_ns - t0) / 1e9, a.begin - a.step, a.ranks_recorded, doc["heartbeat_s"]))
                time.sleep(1.0)
        finally:
            stop.touch()
            job.wait(120)
    for lat, ahead, ranks, _ in rows:
        print(f"trigger -> first recorded step {lat:.2f} s (window placed {ahead} steps ahead; recorded on {ranks} "
              "rank(s))")
    if rows:
        print(f"median trigger -> first recorded step: {statistics.median(r[0] for r in rows):.2f} s "
              f"(--trigger-poll {poll if poll is not None else 'default'})")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=20000)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--triggers", type=int, default=3)
    p.add_argument("--poll", type=float, default=None, help="the job's --trigger-poll [its default]")
    p.add_argument("--skip-latency", action="store_true")
    args = p.parse_args()
    idle_cost(args.steps, args.rounds)
    if not args.skip_latency:
        latency(args.triggers, args.poll)


if __name__ == "__main__":
    main()
