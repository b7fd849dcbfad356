"""Time and size of distprof's outputs for one run, each against loading the run in the same invocation.

    python benchmarks/outputs.py [--ranks 8] [--steps 50] [--windows 2] [--layers 3] [--repeat 3]
    python benchmarks/outputs.py --run /tmp/dp-demo/demo4

Without --run it builds a synthetic run (tests/synth.py make_run: --ranks ranks, --steps recorded steps split over
--windows windows, rank 1 arriving late at the collectives so the straggler analyses have work). The run directory is
only read; every output goes to a temp dir. Each measurement is a fresh process (interpreter start and imports
included, as a user sees it; a warm-up load runs first, untimed): the baseline is `load_run(RUN_DIR)` alone, then
`distprof report --json`, `report --html`, `timeline` (.json and .json.gz) and `export --format kineto`; each is
printed as a multiple of the load time (also net of the interpreter start, measured alone), with the size of
what it wrote.
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

_LOAD_CHILD = """
import sys
from distprof.analysis.summarize.merged import load_run
run = load_run(sys.argv[1], progress=False)
print(len(run.events["ts_ns"]), len(run.steps["step"]))
"""


def timed(cmd: list[str], cwd: Path) -> tuple[float, str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    t0 = time.perf_counter()
    p = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[1:5])} ... failed ({p.returncode}):\n{(p.stdout + p.stderr)[-2000:]}")
    return wall, p.stdout


def size_of(path: Path) -> int:
    if path.is_dir():
        return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
    return path.stat().st_size


def human(n: float) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 1e6 else f"{n / 1e3:.0f} kB"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", metavar="RUN_DIR", help="an existing run directory (only read)")
    ap.add_argument("--ranks", type=int, default=8, help="synthetic run: ranks (default 8)")
    ap.add_argument("--steps", type=int, default=50, help="synthetic run: recorded steps in all (default 50)")
    ap.add_argument("--windows", type=int, default=2, help="synthetic run: profiling windows (default 2)")
    ap.add_argument("--layers", type=int, default=3, help="synthetic run: layers per step (events; default 3)")
    ap.add_argument("--repeat", type=int, default=3, help="runs per measurement, best time kept (default 3)")
    args = ap.parse_args()
    if args.repeat < 1 or args.windows < 1 or args.steps < args.windows or args.ranks < 2:
        ap.error("need --repeat >= 1, --windows >= 1, --steps >= --windows, --ranks >= 2")

    with tempfile.TemporaryDirectory(prefix="dp-outputs-bench-") as d:
        tmp = Path(d)
        if args.run:
            run_dir = Path(args.run).resolve()
            if not any(run_dir.glob("rank*.h5")):
                raise SystemExit(f"--run {run_dir}: no rank*.h5 shards there")
            print(f"run {run_dir}")
        else:
            sys.path.insert(0, str(ROOT / "tests"))
            from synth import make_run

            active = math.ceil(args.steps / args.windows)
            t0 = time.perf_counter()
            make_run(tmp / "runs", run_id="bench", world_size=args.ranks, n_layers=args.layers,
                     schedule={"wait": 1, "warmup": 1, "active": active, "repeat": args.windows},
                     late_rank=1, late_ms=5.0)
            run_dir = tmp / "runs" / "bench"
            print(f"synthetic run {args.ranks} ranks x {active * args.windows} steps ({args.windows} windows, "
                  f"{args.layers} layers) built in {time.perf_counter() - t0:.1f} s")
        shards = sorted(run_dir.glob("rank*.h5"))
        print(f"  {len(shards)} shards, {human(sum(p.stat().st_size for p in shards))}")

        out = tmp / "out"
        py = sys.executable
        dp = [py, "-m", "distprof"]
        rd = str(run_dir)
        jobs = [
            ("load_run (baseline)", [py, "-c", _LOAD_CHILD, rd], None),
            ("report --json", [*dp, "report", rd, "--no-progress", "--color", "never", "--json",
                               str(out / "report.json")], out / "report.json"),
            ("report --html", [*dp, "report", rd, "--no-progress", "--color", "never", "--html",
                               str(out / "report.html")], out / "report.html"),
            ("timeline (.json)", [*dp, "timeline", rd, "--no-progress", "-o", str(out / "timeline.json")],
             out / "timeline.json"),
            ("timeline (.json.gz)", [*dp, "timeline", rd, "--no-progress", "-o", str(out / "timeline.json.gz")],
             out / "timeline.json.gz"),
            ("export kineto (gz)", [*dp, "export", rd, "--format", "kineto", "--no-progress", "-o",
                                    str(out / "kineto")], out / "kineto"),
        ]
        n_events, n_rank_steps = map(int, timed(jobs[0][1], tmp)[1].split())  # warm-up, untimed: page cache, .pyc
        print(f"  {n_events:,} events, {n_rank_steps:,} rank-steps")
        startup = min(timed([py, "-c", "import distprof.analysis.summarize.merged"], tmp)[0]
                      for _ in range(args.repeat))
        base = None
        for name, cmd, product in jobs:
            best = math.inf
            for _ in range(args.repeat):
                out.mkdir(exist_ok=True)
                if product is not None and product.is_dir():
                    for f in product.iterdir():
                        f.unlink()
                best = min(best, timed(cmd, tmp)[0])
            if base is None:
                base = best
                print(f"  {name:22s} {best:6.2f} s")
                continue
            size = f"  -> {human(size_of(product))}" if product is not None else ""
            net = f" ({(best - startup) / (base - startup):.2f}x net of start)" if base - startup > 0.05 else ""
            print(f"  {name:22s} {best:6.2f} s  = {best / base:.2f}x load{net}{size}")
        print(f"  start = interpreter + importing distprof.analysis.summarize.merged: {startup:.2f} s, "
              "inside every figure")


if __name__ == "__main__":
    main()
