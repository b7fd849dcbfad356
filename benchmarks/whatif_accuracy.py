"""Accuracy of the what-if for a straggler's delay, wherever it sits in the iteration, against re-runs without it.

    python benchmarks/whatif_accuracy.py                          # the whole matrix: 45 cells x 10 pairs
    python benchmarks/whatif_accuracy.py --cells ddp:pre:20,loop:callback:* --runs 10
    python benchmarks/whatif_accuracy.py --cells 'fsdp2:*:50' --runs 4 --keep /tmp/dp-whatif --markdown table.md

A **cell** is JOB:PLACE:PCT (``*`` in any field: every value; ``all``: every cell):

* JOB — ``ddp`` (DistributedDataParallel, a plain loop), ``fsdp2`` (``fully_shard`` per block and the root),
  ``loop`` (DDP in a framework-style loop: step-begin/-end callbacks, a DataLoader, gradient clipping, an LR
  scheduler, a loss all-reduce for logging every 2 iterations);
* PLACE — where rank 1's delay sits: ``pre`` (before the forward, in the batch fetch), ``mid`` (between forward and
  backward), ``opt`` (in the optimizer, after the backward and its gradient communication), ``callback`` (an
  ``on_step_begin`` callback), ``some`` (before the forward of every third iteration only);
* PCT — the delay in % of the step (``--device-ms``): 5, 20 or 50.

The job (``benchmarks/_whatif_job.py``, 2 ranks, gloo) is accelerator-like: every rank's device time is a sleep inside
its forward and backward, so on this 2-core machine the two busy ranks stay within the cores. Per cell, ``--runs``
pairs: the job with the delay on rank 1, then the same job without it, alternating (drift in the machine's load
lands on both halves of a pair alike). By default all pairs of a cell run in one torchrun job, each run under its own
``distprof.profile`` (stepping on the optimizer, as ``distprof.launch`` does) with a fresh model — a run's process
start costs more than its iterations here; ``--fresh`` launches every run on its own under ``distprof.launch``;
``--interleave`` runs one job per cell under ``distprof.launch`` whose profiler windows alternate with and without
the delay (``_whatif_job.py --delay-cycle``), ``--gap`` idle steps before each (the capture extracting the previous
window shares the cores): a pair is two adjacent windows a few seconds apart, so the drift of a loaded host's speed
between a run and a re-run launched later mostly cancels.

Per pair: the **measured gain** is the delayed run's step time minus the re-run's (per step the mean over ranks, as
``whatif.step_time_ms``; the mean over the recorded steps); the **predicted gain** is ``whatif.Straggler(ranks=(1,))``'s
on the delayed run (rank 1 at its peers' median, replayed on the chained step graph; the mean of its per-step gains).
Steps the machine held off — a rank waited for a CPU more than 20 % of the median step (the capture's ``cpu_wait_ms``),
or the step took twice the median — are left out of both, in each run (on a shared 2-core host one such step of
150-300 ms moved a 12-step mean by 24 ms); the count is printed. Goal (issue 22): the predicted gain within 15 % or
2 ms of the measured gain in >= 9 of 10 pairs per cell. Prints each pair, a line per cell (median and worst error,
hits, the spread of the measured gains over the cell's pairs — identical jobs, so their spread is the measurement's
own noise) with the 1-minute load average sampled during the cell, and a summary table (``--markdown PATH`` writes it
as markdown). ``--reuse DIR`` analyses the runs a ``--keep DIR`` left, without running jobs.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

JOB = ROOT / "benchmarks" / "_whatif_job.py"
JOBS = ("ddp", "fsdp2", "loop")
PLACES = ("pre", "mid", "opt", "callback", "some")
PCTS = (5, 20, 50)
SLOW_RANK = 1
#: The goal: within this fraction of the measured gain, or this many ms.
GOAL_REL, GOAL_MS = 0.15, 2.0


@dataclass(frozen=True)
class Cell:
    job: str
    place: str
    pct: int

    @property
    def name(self) -> str:
        return f"{self.job}:{self.place}:{self.pct}"


#: A step counts as stalled by the machine when a rank of it waited this fraction of the run's median step for a CPU
#: (the capture's scheduler statistics, ``cpu_wait_ms``): other work on the host, not the job; or when the step took
#: STALL_STEP times the median step (the whole machine held off: no delay here makes a step twice as long).
STALL_FRAC = 0.2
STALL_STEP = 2.0


@dataclass
class Pair:
    delayed_ms: float
    rerun_ms: float
    predicted_gain: float
    stalled: int = 0  # steps left out of the pair (both runs) as stalled by the machine

    @property
    def measured_gain(self) -> float:
        return self.delayed_ms - self.rerun_ms

    @property
    def error(self) -> float:
        return self.predicted_gain - self.measured_gain

    @property
    def hit(self) -> bool:
        return abs(self.error) <= max(GOAL_MS, GOAL_REL * abs(self.measured_gain))


def parse_cells(spec: str) -> list[Cell]:
    if spec.strip() == "all":
        spec = "*:*:*"
    cells: list[Cell] = []
    for item in spec.split(","):
        parts = item.strip().split(":")
        if len(parts) != 3:
            raise SystemExit(f"--cells: {item!r} is not JOB:PLACE:PCT (e.g. ddp:pre:20, fsdp2:*:50)")
        pick = []
        for value, allowed in zip(parts, (JOBS, PLACES, tuple(map(str, PCTS)))):
            if value != "*" and value not in allowed:
                raise SystemExit(f"--cells: {value!r} in {item!r} is none of {', '.join(allowed)}")
            pick.append(allowed if value == "*" else (value,))
        cells += [Cell(j, p, int(c)) for j, p, c in itertools.product(*pick) if Cell(j, p, int(c)) not in cells]
    return cells


class LoadMeter:
    """The 1-minute load average, sampled every 2 s on a side thread while a cell runs."""

    def __init__(self) -> None:
        self.samples: list[float] = [os.getloadavg()[0]]
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self) -> None:
        while not self._stop.wait(2.0):
            self.samples.append(os.getloadavg()[0])

    def stop(self) -> tuple[float, float]:
        self._stop.set()
        self._t.join()
        return statistics.mean(self.samples), max(self.samples)


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DISTPROF_")}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    return env


def _job_args(cell: Cell, args) -> list[str]:
    return ["--job", cell.job, "--place", cell.place, "--slow-rank", str(SLOW_RANK),
            "--device-ms", f"{args.device_ms:g}", "--steps", str(args.active + 4), "--every", "3"]


def _torchrun(cmd: list[str], out: Path) -> None:
    for _ in range(3):  # the rare C++ teardown abort (tests/conftest.py) gets reruns
        p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", *cmd],
                           env=_env(), capture_output=True, text=True, timeout=1800)
        if p.returncode == 0:
            return
        shutil.rmtree(out, ignore_errors=True)
    raise SystemExit(f"job failed:\n{p.stderr[-3000:]}")


def _wait(args) -> int:
    """Idle steps before each window: with --interleave enough for the capture to finish the previous window (its
    extraction shares the host's cores: with 1, a window's first steps took 150-300 ms and the next ones 20 % more)."""
    return args.gap if args.interleave else 1


def _cycle(args) -> int:
    return _wait(args) + 1 + args.active  # wait, warm-up 1, active


def interleaved_pairs(out: Path, args) -> list[tuple[tuple[Path, tuple[int, int]], tuple[Path, tuple[int, int]]]]:
    """--interleave: each pair's (run, (first, last) step) with and without the delay: windows 2k and 2k + 1."""
    c = _cycle(args)
    win = [(k * c + _wait(args) + 1, (k + 1) * c - 1) for k in range(2 * args.runs)]
    return [((out / "r", win[2 * k]), (out / "r", win[2 * k + 1])) for k in range(args.runs)]


def run_cell(cell: Cell, args, out: Path) -> list:
    """The cell's (delayed, re-run) runs: run directories, or with --interleave (run, steps) of one run."""
    delay_ms = cell.pct / 100.0 * args.device_ms
    ids = [(f"p{k}-d", f"p{k}-r") for k in range(args.runs)]
    if args.interleave:
        c = _cycle(args)
        _torchrun(["-m", "distprof.launch", "--out", str(out), "--run-id", "r", "--wait", str(_wait(args)),
                   "--warmup", "1", "--active", str(args.active), "--repeat", str(2 * args.runs), str(JOB), *_job_args(cell, args),
                   "--delay-ms", f"{delay_ms:g}", "--delay-cycle", str(c), "--steps", str(2 * args.runs * c + 2)],
                  out)
        return interleaved_pairs(out, args)
    if args.fresh:
        for d, r in ids:
            for run_id, ms in ((d, delay_ms), (r, 0.0)):
                _torchrun(["-m", "distprof.launch", "--out", str(out), "--run-id", run_id, "--wait", "1",
                           "--warmup", "1", "--active", str(args.active), str(JOB), *_job_args(cell, args),
                           "--delay-ms", f"{ms:g}"], out)
    else:
        sessions = ",".join(x for pair in ids for x in pair)
        _torchrun([str(JOB), *_job_args(cell, args), "--delay-ms", f"{delay_ms:g}", "--sessions", sessions,
                   "--out", str(out), "--schedule", f"1,1,{args.active}"], out)
    return [(out / d, out / r) for d, r in ids]


def steady_steps(run):
    """(steps, step time of each, those not stalled by the machine): a step is stalled when one of its ranks waited
    for a CPU longer than STALL_FRAC of the run's median step (all steps count when that would leave fewer than
    half)."""
    import numpy as np

    from distprof.analysis.graph import whatif
    from distprof.analysis.groupstats import rank_step_values

    steps, t = whatif.per_step_time_ms(run)
    st = run.steps
    cw = np.nan_to_num(rank_step_values(st, "cpu_wait_ms", np.asarray(st["rank"]), np.asarray(st["step"])), nan=0.0)
    worst = np.zeros(steps.size)
    np.maximum.at(worst, np.searchsorted(steps, np.asarray(st["step"])), cw)
    med = float(np.median(t))
    ok = (worst <= STALL_FRAC * med) & (t <= STALL_STEP * med)
    return steps, t, ok if 2 * ok.sum() >= ok.size else np.ones(ok.size, bool)


def _load(where):
    import distprof

    if isinstance(where, tuple):
        return distprof.load(where[0], steps=where[1], progress=False)
    return distprof.load(where, progress=False)


def analyse(delayed, rerun) -> Pair:
    """One pair: the step times (mean over the steps not stalled by the machine) and the predicted gain (the mean
    of the what-if's per-step gains over the delayed run's steps not stalled)."""
    import numpy as np

    from distprof.analysis.graph import whatif

    d, r = _load(delayed), _load(rerun)
    d_steps, d_t, d_ok = steady_steps(d)
    _, r_t, r_ok = steady_steps(r)
    est = whatif.Estimator(d)
    w = est.estimate(whatif.Straggler(ranks=(SLOW_RANK,)))
    use = d_ok[np.searchsorted(d_steps, est.steps)]
    gain = float(np.mean(w.per_step_gain_ms[use])) if use.any() else w.gain_ms_per_step
    return Pair(float(np.mean(d_t[d_ok])), float(np.mean(r_t[r_ok])), gain,
                int((~d_ok).sum() + (~r_ok).sum()))


@dataclass
class CellResult:
    cell: Cell
    delay_ms: float
    pairs: list[Pair]
    load_mean: float
    load_max: float

    @property
    def hits(self) -> int:
        return sum(p.hit for p in self.pairs)

    def row(self) -> list[str]:
        errs = [p.error for p in self.pairs]
        gains = [p.measured_gain for p in self.pairs]
        rel = [100 * abs(p.error) / abs(p.measured_gain) for p in self.pairs if abs(p.measured_gain) > 0]
        worst = max(errs, key=abs)
        return [self.cell.job, self.cell.place, f"{self.cell.pct}", f"{self.delay_ms:.0f}",
                f"{statistics.median(p.rerun_ms for p in self.pairs):.1f}",
                f"{statistics.median(gains):.1f}", f"{statistics.stdev(gains):.1f}" if len(gains) > 1 else "-",
                f"{statistics.median(p.predicted_gain for p in self.pairs):.1f}",
                f"{statistics.median(abs(e) for e in errs):.2f}",
                f"{statistics.median(rel):.1f}" if rel else "-", f"{worst:+.2f}",
                f"{self.hits}/{len(self.pairs)}", f"{sum(p.stalled for p in self.pairs)}",
                f"{self.load_mean:.1f} ({self.load_max:.1f})"]


HEADER = ["job", "place", "delay %", "delay ms", "re-run step ms", "measured gain ms", "its spread (sd) ms",
          "predicted gain ms",
          "median abs error ms", "median abs error %", "worst error ms", "hits", "stalled steps", "load mean (max)"]


def markdown(results: list[CellResult]) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(r.row()) + " |" for r in results]
    return "\n".join(lines) + "\n"


def machine() -> str:
    import torch

    return (f"{time.strftime('%Y-%m-%d')}, {platform.node() or 'host'}: {os.cpu_count()} cores, "
            f"Python {platform.python_version()}, torch {torch.__version__}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cells", default="all", help="comma-separated JOB:PLACE:PCT, '*' for any field, or 'all'")
    ap.add_argument("--runs", type=int, default=10, help="pairs (delayed, re-run) per cell")
    ap.add_argument("--device-ms", type=float, default=40.0, help="ms every rank sleeps per iteration (its step)")
    ap.add_argument("--active", type=int, default=24,
                    help="recorded steps per run (with 12, steps held off the CPU by other work on a 2-core host "
                         "moved a pair's measured gain by +-3 ms)")
    ap.add_argument("--fresh", action="store_true", help="launch every run on its own under distprof.launch")
    ap.add_argument("--interleave", action="store_true",
                    help="one job per cell under distprof.launch, windows with and without the delay alternating "
                         "(each pair a few s apart: drift in the host's load mostly cancels)")
    ap.add_argument("--gap", type=int, default=30,
                    help="--interleave: idle steps before each window, for the capture to finish the previous one")
    ap.add_argument("--keep", help="keep the run directories here")
    ap.add_argument("--reuse", help="analyse the runs an earlier --keep left here instead of running jobs")
    ap.add_argument("--markdown", help="write the summary table here")
    args = ap.parse_args()
    cells = parse_cells(args.cells)
    base = Path(args.reuse or args.keep or tempfile.mkdtemp(prefix="dp-whatif-"))
    mode = "interleaved windows" if args.interleave else "a launch per run" if args.fresh else "runs in one job"
    print(f"# {machine()}; {len(cells)} cell(s) x {args.runs} pair(s) ({mode}), step {args.device_ms:g} ms of "
          f"device sleep, {args.active} recorded steps", flush=True)
    results: list[CellResult] = []
    for cell in cells:
        t0 = time.monotonic()
        out = base / cell.name.replace(":", "-")
        if args.reuse:
            load_mean, load_max = json.loads((out / "load.json").read_text())
            dirs = interleaved_pairs(out, args) if args.interleave else \
                [(out / f"p{k}-d", out / f"p{k}-r") for k in range(args.runs)]
        else:
            meter = LoadMeter()
            dirs = run_cell(cell, args, out)
            load_mean, load_max = meter.stop()
            (out / "load.json").write_text(json.dumps([load_mean, load_max]))
        pairs = [analyse(d, r) for d, r in dirs]
        res = CellResult(cell, cell.pct / 100.0 * args.device_ms, pairs, load_mean, load_max)
        results.append(res)
        for k, p in enumerate(pairs):
            print(f"  {cell.name:<18} pair {k}: step {p.delayed_ms:6.2f} -> re-run {p.rerun_ms:6.2f}, gain measured "
                  f"{p.measured_gain:6.2f} predicted {p.predicted_gain:6.2f}, error {p.error:+6.2f} "
                  f"{'yes' if p.hit else 'NO '} ({p.stalled} stalled step(s) left out)")
        row = dict(zip(HEADER, res.row()))
        print(f"{cell.name:<18} hits {row['hits']}, median abs error {row['median abs error ms']} ms, worst "
              f"{row['worst error ms']} ms, measured gains' spread {row['its spread (sd) ms']} ms, load "
              f"{load_mean:.1f} (max {load_max:.1f}), {time.monotonic() - t0:.0f} s", flush=True)
        if not args.keep and not args.reuse:
            shutil.rmtree(out, ignore_errors=True)
    table = markdown(results)
    print("\n" + table)
    met = sum(r.hits >= 0.9 * len(r.pairs) for r in results)
    print(f"cells meeting the goal (>= 9 of 10 within {GOAL_REL:.0%} or {GOAL_MS:g} ms): {met} of {len(results)}")
    if args.markdown:
        Path(args.markdown).write_text(f"{machine()}; {mode}, {args.active} recorded steps\n\n{table}")


if __name__ == "__main__":
    main()
