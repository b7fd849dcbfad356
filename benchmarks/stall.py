"""Does profiling stall a job? Loop wall time of pipeline and DDP jobs with and without distprof.launch.

    python benchmarks/stall.py [--steps 200] [--rounds 3] [--sim-hosts] [--jobs sendrecv,gpipe,ddp]

Runs each job (2 ranks, gloo, CPU) three ways — plain torchrun, under `distprof.launch` with no window within the
job's steps (what distprof costs outside windows: hooks, the agreement, the side thread), and under `distprof.launch`
with the default schedule (one window of 5 recorded steps) — interleaved `--rounds` times, and prints the median
training-loop time of each (as the script itself reports it, so process start-up is left out), its ratio to the
plain run, the ratio of the fastest runs (less sensitive to other load on the machine), and the window's own costs
from the status files (torch's stop on the training thread, the background extraction). Jobs:

  sendrecv   examples/pipeline.py --schedule sendrecv   (2 stages, plain dist.send / dist.recv)
  gpipe      examples/pipeline.py --schedule gpipe      (torch.distributed.pipelining ScheduleGPipe)
  ddp        examples/ddp_mlp.py --hidden 256           (DistributedDataParallel)

`--sim-hosts` puts the two ranks on two simulated hosts, so every window start and end also runs the clock-sync
ping-pongs. A profiler step that waited for a peer showed up here as a ratio of 100 or more (30 s store timeout).
"""

from __future__ import annotations

import argparse
import json
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


MODES = ("unprofiled", "no window", "profiled")


def run_job(tmp: Path, job: str, steps: int, mode: str, sim_hosts: bool) -> float:
    """The job's training-loop seconds in `mode`: plain torchrun, the launcher with no window in reach, or profiled."""
    script, *args = JOBS[job]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    if mode != "unprofiled":
        cmd += ["-m", "distprof.launch", "--out", str(tmp / "runs")]
        if mode == "no window":
            cmd += ["--wait", str(steps + 10)]
        if sim_hosts:
            env.update(DISTPROF_SIM_HOSTS="0,1", DISTPROF_SIM_CLOCKS="0,2.5@30")
    cmd += [str(ROOT / "examples" / script), *args, "--steps", str(steps)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True, timeout=900)
    m = re.search(r" in ([0-9.]+) s", proc.stdout)
    if not m:
        raise SystemExit(f"{job}: no loop time in its output:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return float(m.group(1))


def window_costs(runs: Path) -> dict[str, list[float]]:
    """Per rank and window: torch's stop on the training thread and the background extraction (status files)."""
    out: dict[str, list[float]] = {"stop_s": [], "extract_s": []}
    for st in runs.glob("*/rank*.status.json"):
        for w in json.loads(st.read_text())["windows"]:
            for k in out:
                if w.get(k):
                    out[k].append(float(w[k]))
    return out


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
    times: dict[tuple[str, str], list[float]] = {(j, m): [] for j in jobs for m in MODES}
    costs: dict[str, dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory() as d:
        for r in range(args.rounds):
            for j in jobs:
                order = MODES if r % 2 == 0 else MODES[::-1]  # alternate to cancel drift in load
                for mode in order:
                    times[(j, mode)].append(run_job(Path(d) / j, j, args.steps, mode, args.sim_hosts))
        for j in jobs:
            costs[j] = window_costs(Path(d) / j / "runs")
    med = statistics.median
    hosts = "2 simulated hosts" if args.sim_hosts else "1 host"
    print(f"training-loop wall time, median of {args.rounds} interleaved rounds, {args.steps} steps, 2 ranks, {hosts}; "
          "profiled = one window of 5 recorded steps (the default schedule)")
    for j in jobs:
        base = med(times[(j, "unprofiled")])
        cells = [f"{m} {med(times[(j, m)]):6.3f} s" + ("" if m == "unprofiled" else
                                                       f" ({med(times[(j, m)]) / base:.3f}x)") for m in MODES]
        best = min(times[(j, "profiled")]) / min(times[(j, "unprofiled")])
        c = costs[j]
        print(f"  {j:9s} " + "   ".join(cells) + f"   fastest runs profiled/unprofiled {best:.3f}x")
        if c["stop_s"]:
            print(f"            per window and rank: torch's stop {med(c['stop_s']) * 1e3:.0f} ms (training thread), "
                  f"extraction {med(c['extract_s']) * 1e3:.0f} ms (background)")
        print("            runs: " + "; ".join(f"{m} " + ", ".join(f"{t:.2f}" for t in times[(j, m)]) for m in MODES))


if __name__ == "__main__":
    main()
