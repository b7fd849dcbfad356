"""Does profiling stall a job? Loop wall time of pipeline and DDP jobs with and without distprof.launch.

    python benchmarks/stall.py [--steps 200] [--rounds 3] [--sim-hosts] [--jobs sendrecv,gpipe,ddp]

Runs each job (2 ranks, gloo, CPU) under torchrun plain and under `distprof.launch` with the default schedule (one
window of 5 recorded steps), interleaved `--rounds` times, and prints the median training-loop time of each (as the
script itself reports it, so process start-up is left out), their ratio, and the ratio of the fastest runs (less
sensitive to other load on the machine). Jobs:

  sendrecv   examples/pipeline.py --schedule sendrecv   (2 stages, plain dist.send / dist.recv)
  gpipe      examples/pipeline.py --schedule gpipe      (torch.distributed.pipelining ScheduleGPipe)
  ddp        examples/ddp_mlp.py --hidden 256           (DistributedDataParallel)

`--sim-hosts` puts the two ranks on two simulated hosts, so every window start and end also runs the clock-sync
ping-pongs. A profiler step that waited for a peer showed up here as a ratio of 100 or more (30 s store timeout).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
JOBS = {
    "sendrecv": ["pipeline.py", "--schedule", "sendrecv"],
    "gpipe": ["pipeline.py", "--schedule", "gpipe"],
    "ddp": ["ddp_mlp.py", "--hidden", "256"],
}


def loop_seconds(tmp: Path, job: str, steps: int, profiled: bool, sim_hosts: bool) -> float:
    script, *args = JOBS[job]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    if profiled:
        cmd += ["-m", "distprof.launch", "--out", str(tmp / "runs")]
        if sim_hosts:
            env.update(DISTPROF_SIM_HOSTS="0,1", DISTPROF_SIM_CLOCKS="0,2.5@30")
    cmd += [str(ROOT / "examples" / script), *args, "--steps", str(steps)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True, timeout=900)
    m = re.search(r" in ([0-9.]+) s", proc.stdout)
    if not m:
        raise SystemExit(f"{job}: no loop time in its output:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return float(m.group(1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=200, help="training iterations per job")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--jobs", default=",".join(JOBS), help=f"comma-separated subset of {', '.join(JOBS)}")
    ap.add_argument("--sim-hosts", action="store_true", help="profiled runs on 2 simulated hosts (clock sync)")
    args = ap.parse_args()
    jobs = [j for j in args.jobs.split(",") if j]
    unknown = sorted(set(jobs) - set(JOBS))
    if unknown:
        ap.error(f"unknown job(s) {', '.join(unknown)}; choose from {', '.join(JOBS)}")
    times: dict[tuple[str, bool], list[float]] = {(j, p): [] for j in jobs for p in (False, True)}
    with tempfile.TemporaryDirectory() as d:
        for r in range(args.rounds):
            for j in jobs:
                order = (False, True) if r % 2 == 0 else (True, False)  # alternate to cancel drift in load
                for profiled in order:
                    times[(j, profiled)].append(loop_seconds(Path(d), j, args.steps, profiled, args.sim_hosts))
    med = statistics.median
    hosts = "2 simulated hosts" if args.sim_hosts else "1 host"
    print(f"loop wall time, median of {args.rounds} interleaved rounds, {args.steps} steps, 2 ranks, {hosts}:")
    for j in jobs:
        plain, prof = med(times[(j, False)]), med(times[(j, True)])
        best = min(times[(j, True)]) / min(times[(j, False)])
        runs = "; ".join(", ".join(f"{t:.2f}" for t in times[(j, p)]) for p in (False, True))
        print(f"  {j:9s} unprofiled {plain:7.3f} s   profiled {prof:7.3f} s   ratio {prof / plain:.3f}   "
              f"(fastest runs: {best:.3f}; runs unprofiled; profiled: {runs})")


if __name__ == "__main__":
    main()
