"""Accuracy of the what-if for a removed straggler delay against the measured re-run without it, on real jobs.

    python benchmarks/whatif_accuracy.py                       # 10 trials: delays 10-50 ms, 2-4 ranks
    python benchmarks/whatif_accuracy.py --trials 2:10,4:30 --keep /tmp/dp-whatif

Each trial runs `examples/ddp_mlp.py` under `distprof.launch` (gloo, CPU) twice, back to back: once with
``--slow-rank R --slow-ms X`` and once without. From the delayed run it predicts, with
``whatif.Straggler(ranks=(R,))`` (the rank at its peers' median, replayed on the cross-rank step graph), the step
time without the delay, and compares it with the re-run's measured step time (``whatif.step_time_ms``: per step the
mean over ranks, the median over steps). Goal (issue "Beyond the anchors"): within 15 % or 2 ms in >= 9 of 10 trials.
Prints one line per trial (with the 1-minute load average: on a host whose cores the ranks share with other work the
re-run's steps wait for CPU in ways the delayed run, whose peers idled while the straggler slept, never shows) and
the count within the goal.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

DEFAULT_TRIALS = "2:10,2:20,2:30,2:40,2:50,3:15,3:35,4:10,4:25,4:50"


def run_job(out: Path, ranks: int, slow_rank: int, slow_ms: float, args) -> Path:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    for k in list(env):
        if k.startswith("DISTPROF_"):
            del env[k]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}",
           "-m", "distprof.launch", "--out", str(out), "--run-id", "r", "--wait", "2", "--warmup", "1",
           "--active", str(args.active), str(ROOT / "examples" / "ddp_mlp.py"), "--hidden", str(args.hidden),
           "--batch", str(args.batch), "--base-ms", f"{args.base_ms:g}", "--steps", str(args.active + 5)]
    if slow_ms > 0:
        cmd += ["--slow-rank", str(slow_rank), "--slow-ms", f"{slow_ms:g}"]
    for _ in range(3):  # the rare C++ teardown abort (tests/conftest.py) gets reruns
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
        if p.returncode == 0:
            return out / "r"
        shutil.rmtree(out, ignore_errors=True)
    raise SystemExit(f"job failed:\n{p.stderr[-3000:]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", default=DEFAULT_TRIALS, help="comma-separated RANKS:DELAY_MS pairs")
    ap.add_argument("--hidden", type=int, default=32, help="ddp_mlp's hidden width")
    ap.add_argument("--batch", type=int, default=8, help="ddp_mlp's per-rank batch")
    ap.add_argument("--active", type=int, default=30,
                    help="recorded steps (the measured step is a median over them: with 8, re-runs of the unchanged "
                         "job differed by 18-48 %% on 2 cores, the step time being bimodal)")
    ap.add_argument("--base-ms", type=float, default=0.0,
                    help="ms every rank sleeps per step (ddp_mlp --base-ms: work that does not use the CPU, as an "
                         "accelerator's; 0: a CPU-only step)")
    ap.add_argument("--reruns", type=int, default=3,
                    help="re-runs without the delay per trial (the measured step: the median of theirs; with two or "
                         "more, the spread between them — the job's own run-to-run noise — is printed too)")
    ap.add_argument("--keep", help="keep the run directories here")
    args = ap.parse_args()

    import distprof
    from distprof.analysis.graph import whatif

    base = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="dp-whatif-"))
    base.mkdir(parents=True, exist_ok=True)
    ok = 0
    spreads: list[float] = []
    trials = [(int(a), float(b)) for a, b in (t.split(":") for t in args.trials.split(","))]
    print(f"{'ranks':>5} {'delay':>6} {'slow':>4} {'delayed':>8} {'predicted':>9} {'re-run':>7} {'error':>7} "
          f"{'error%':>6}  goal  load  re-runs")
    for i, (ranks, delay) in enumerate(trials):
        slow = 1 + i % (ranks - 1)
        d_run = distprof.load(run_job(base / f"t{i}-delayed", ranks, slow, delay, args))
        reruns = [whatif.step_time_ms(distprof.load(run_job(base / f"t{i}-rerun{k or ''}", ranks, -1, 0.0, args)))
                  for k in range(max(args.reruns, 1))]
        w = whatif.estimate(d_run, whatif.Straggler(ranks=(slow,)))
        rerun = statistics.median(reruns)
        err = w.predicted_step_ms - rerun
        good = abs(err) <= max(2.0, 0.15 * rerun)
        ok += good
        print(f"{ranks:>5} {delay:>6.0f} {slow:>4} {w.measured_step_ms:>8.2f} {w.predicted_step_ms:>9.2f} "
              f"{rerun:>7.2f} {err:>+7.2f} {100 * err / rerun:>+6.1f}  {'yes' if good else 'NO ':<4} {os.getloadavg()[0]:>4.1f}  "
              + " ".join(f"{x:.2f}" for x in reruns), flush=True)
        spreads.append((max(reruns) - min(reruns)) / rerun if len(reruns) > 1 and rerun > 0 else 0.0)
        if not args.keep:
            for p in base.glob(f"t{i}-*"):
                shutil.rmtree(p, ignore_errors=True)
    print(f"within 15 % or 2 ms: {ok} of {len(trials)} (goal: >= 9 of 10)")
    if args.reruns > 1:
        print(f"re-runs of the same job without the delay differ by {100 * statistics.median(spreads):.0f} % of their "
              f"median (median over trials; largest {100 * max(spreads):.0f} %)")


if __name__ == "__main__":
    main()
