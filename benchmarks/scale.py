"""How `distprof report` scales with the rank count: time and peak memory per process, serial and under MPI.

    python benchmarks/scale.py                                   # 64, 256, 1024 ranks x 100k events, 1 and 2 procs
    python benchmarks/scale.py --ranks 64,256 --events 20000 --data /tmp/dp-scale
    python benchmarks/scale.py --ranks 64 --events 150000 --shape llm    # hundreds of collectives per step
    python benchmarks/scale.py --ranks 1024 --events 150000 --shape llm --summaries --rounds 5   # paired ratios

For each rank count, a synthetic GPU-like run (benchmarks/synth.py: thousands of op names, two streams, NCCL
collectives on TP/DP groups, 8 ranks per host with drifting clocks, one slow rank) is written once into --data (kept
for later runs; generated under `mpiexec -n P` when --gen-procs > 1), then `distprof report RUN --json` runs serially
and under `mpiexec -n P` for each P in --procs. Each measurement is a fresh process tree; its wall time and the peak
RSS of every process (ru_maxrss, read by a thin wrapper around distprof's main) are recorded. The table prints time,
µs per event, the largest per-process peak RSS, and each figure's ratio to the smallest rank count of the same P;
the reports of the serial and MPI runs are compared (they must be equal).

After the table it prints each goal the measured rows can judge, met or not and by how much (issue 25; earlier
goals in docs/scaling.md): 1,024 ranks at >= 150k events per rank, serial <= 30 s and <= 500 MB, `mpiexec -n 2`
<= 0.6 x serial; the 1,024-rank peak <= 1.5 x the 64-rank peak; 16,384 ranks <= 120 s under `mpiexec -n 2` and
<= 2 GB per process. With two or more rank counts per process count it fits time and peak RSS as a + b x ranks
and projects them to 100,000 ranks.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

#: Runs distprof's CLI, then writes its own peak RSS (KiB) and MPI rank to $DP_RSS_DIR.
_CHILD = r"""
import os, resource, sys
from distprof.cli import main
rc = main(sys.argv[1:])
rank = next((os.environ[k] for k in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK") if k in os.environ), "0")
with open(os.path.join(os.environ["DP_RSS_DIR"], f"rss.{rank}"), "w") as fh:
    fh.write(str(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss))
sys.exit(rc)
"""


def env() -> dict[str, str]:
    e = dict(os.environ)
    e["PYTHONPATH"] = str(ROOT) + os.pathsep + e.get("PYTHONPATH", "")
    e["OMP_NUM_THREADS"] = "1"
    return e


def generate(ranks: int, events: int, data: Path, gen_procs: int, shape: str = "default",
             summaries: bool = False) -> Path:
    out = data / (f"r{ranks}-e{events}" if shape == "default" else f"r{ranks}-e{events}-{shape}")
    if summaries:  # one window per rank, its summary stored as a capture stores it
        out = out.with_name(out.name + "-s")
    if (out / ".done").exists():
        return out
    shutil.rmtree(out, ignore_errors=True)
    mesh = ["--tp", "8" if ranks >= 16 else "1"] if shape == "default" else ["--shape", shape]  # a shape has its mesh
    args = [str(HERE / "synth.py"), "--ranks", str(ranks), "--events", str(events), "--hosts", str(max(ranks // 8, 1)),
            *mesh, "--slow-rank", str(ranks * 2 // 3), "--slow-ms", "10", "--run-id", f"scale{ranks}", "-o", str(out)]
    if summaries:
        args[1:1] = ["--windows", "1", "--summaries"]
    t0 = time.perf_counter()
    if gen_procs > 1:
        cmd = ["mpiexec", "-n", str(gen_procs), sys.executable, str(HERE / "_synth_mpi.py"), *args[1:]]
    else:
        cmd = [sys.executable, *args]
    subprocess.run(cmd, check=True, env=env())
    (out / ".done").write_text("ok")
    print(f"  generated {ranks} ranks in {time.perf_counter() - t0:.0f} s -> {out}", file=sys.stderr)
    return out


def measure(run_dir: Path, procs: int, out_json: Path, *, from_events: bool = False) -> tuple[float, int]:
    """Wall seconds and the largest per-process peak RSS (bytes) of one `distprof report --json`."""
    with tempfile.TemporaryDirectory() as td:
        e = env()
        e["DP_RSS_DIR"] = td
        cmd = [sys.executable, "-c", _CHILD, "report", str(run_dir), "--json", str(out_json), "--no-progress"]
        if from_events:
            cmd.append("--from-events")
        if procs > 1:
            cmd = ["mpiexec", "-n", str(procs), *cmd]
        t0 = time.perf_counter()
        p = subprocess.run(cmd, env=e, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        if p.returncode != 0:
            raise SystemExit(f"report failed ({p.returncode}):\n{(p.stdout + p.stderr)[-3000:]}")
        rss = max(int(Path(td, f).read_text()) for f in os.listdir(td)) * 1024
    return wall, rss


def n_events(run_dir: Path) -> int:
    sys.path.insert(0, str(ROOT))
    from distprof.analysis.load.catalog import scan_run

    cat = scan_run(run_dir)
    return sum(int((s.attrs.get("timings") or {}).get("n_events", 0)) for s in cat.shards)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", default="64,256,1024", help="comma-separated rank counts")
    ap.add_argument("--events", type=int, default=100_000, help="events per rank")
    ap.add_argument("--procs", default="1,2", help="comma-separated process counts (1 = serial)")
    ap.add_argument("--data", default="/tmp/distprof-scale", help="where the synthetic runs are kept")
    ap.add_argument("--gen-procs", type=int, default=2, help="MPI processes generating a run")
    ap.add_argument("--shape", default="default", choices=("default", "fsdp", "tp", "pp", "ep", "llm"),
                    help="synth.py --shape: default (TP/DP groups, 8 all-reduces per step), or an LLM shape with "
                         "per-layer collectives (docs/scaling.md, Synthetic shapes)")
    ap.add_argument("--summaries", action="store_true",
                    help="runs of one window per rank with their summaries stored (as a capture writes them); the "
                         "report reads the summaries")
    ap.add_argument("--from-events", action="store_true", help="with --summaries: the report ignores them")
    ap.add_argument("--rounds", type=int, default=1,
                    help="measure each process count this many times, in turns (serial, MPI, serial, ...): the "
                         "times are medians and the MPI / serial ratio is the median of each round's own ratio, "
                         "which a machine's slow and fast minutes do not move")
    args = ap.parse_args()
    data = Path(args.data)
    data.mkdir(parents=True, exist_ok=True)
    rank_counts = [int(x) for x in args.ranks.split(",")]
    procs = [int(x) for x in args.procs.split(",")]
    rows = []
    suffix = "" if args.shape == "default" else f"-{args.shape}"  # a shape's files beside the default run's
    suffix += ("-s" if args.summaries else "") + ("-ev" if args.from_events else "")
    for n in rank_counts:
        run_dir = generate(n, args.events, data, args.gen_procs, args.shape, args.summaries)
        ev = n_events(run_dir)
        reports = {}
        walls: dict[int, list[float]] = {p: [] for p in procs}
        rss_max: dict[int, int] = {p: 0 for p in procs}
        for k in range(max(args.rounds, 1)):
            for p in procs:
                out = data / f"report-r{n}-p{p}{suffix}.json"
                wall, rss = measure(run_dir, p, out, from_events=args.from_events)
                reports[p] = json.loads(out.read_text())
                walls[p].append(wall)
                rss_max[p] = max(rss_max[p], rss)
                print(f"  {n} ranks, {p} proc(s), round {k + 1}: {wall:.1f} s, {rss / 1e6:.0f} MB", file=sys.stderr,
                      flush=True)
        for p in procs:
            wall = statistics.median(walls[p])
            row = {"ranks": n, "procs": p, "events": ev, "seconds": wall, "us_per_event": wall / ev * 1e6,
                   "peak_rss_mb": rss_max[p] / 1e6, "seconds_per_round": walls[p]}
            if p != 1 and 1 in walls:  # each round's own ratio against the serial run just before it
                row["ratio_per_round"] = [a / b for a, b in zip(walls[p], walls[1])]
            rows.append(row)
        base = reports[procs[0]]
        for p, rep in reports.items():
            if rep != base:
                print(f"  WARNING: the {p}-process report differs from the {procs[0]}-process one", file=sys.stderr)
    print(f"\n{'ranks':>6} {'procs':>5} {'events':>12} {'time s':>8} {'us/event':>9} {'peak RSS MB':>12} "
          f"{'time x':>7} {'us/ev x':>8} {'RSS x':>6}")
    for p in procs:
        mine = [r for r in rows if r["procs"] == p]
        first = mine[0]
        for r in mine:
            print(f"{r['ranks']:>6} {p:>5} {r['events']:>12,} {r['seconds']:>8.1f} {r['us_per_event']:>9.3f} "
                  f"{r['peak_rss_mb']:>12.0f} {r['seconds'] / first['seconds']:>7.2f} "
                  f"{r['us_per_event'] / first['us_per_event']:>8.2f} {r['peak_rss_mb'] / first['peak_rss_mb']:>6.2f}")
    print()
    for line in goal_lines(rows) + projection_lines(rows):
        print(line)
    (data / f"scale{suffix}.json").write_text(json.dumps(rows, indent=1))


def _verdict(name: str, value: float, goal: float, unit: str) -> str:
    met = value <= goal
    return (f"goal {name}: {value:,.2f} {unit} against <= {goal:,.2f} {unit}: "
            f"{'met' if met else 'NOT met'} ({value / goal:.2f} x the goal)")


def _ratio_verdict(mpi: dict, serial: dict) -> str:
    """The MPI / serial goal: the median of the rounds' own ratios where there are several, else the one ratio."""
    per = mpi.get("ratio_per_round") or []
    if len(per) < 2:
        return _verdict("1,024 x 150k mpiexec -n 2 / serial", mpi["seconds"] / serial["seconds"], 0.6, "x")
    line = _verdict("1,024 x 150k mpiexec -n 2 / serial", statistics.median(per), 0.6, "x")
    return f"{line}; median of {len(per)} rounds' ratios, {min(per):.2f}-{max(per):.2f}"


def goal_lines(rows: list[dict]) -> list[str]:
    """Each goal of the scaling issue that `rows` can judge."""
    at = {(r["ranks"], r["procs"]): r for r in rows}
    out = []
    for n, p in sorted(at):
        r = at[(n, p)]
        if n == 1024 and r["events"] >= 150_000 * n * 0.9 and p == 1:
            out.append(_verdict("1,024 x 150k serial time", r["seconds"], 30.0, "s"))
            out.append(_verdict("1,024 x 150k serial peak RSS", r["peak_rss_mb"], 500.0, "MB"))
            if (n, 2) in at:
                out.append(_ratio_verdict(at[(n, 2)], r))
        if n == 1024 and (64, p) in at:
            out.append(_verdict(f"peak RSS 1,024 / 64 ranks ({p} proc)", r["peak_rss_mb"] / at[(64, p)]["peak_rss_mb"],
                                1.5, "x"))
        if n == 16384 and p == 2:
            out.append(_verdict("16,384 ranks mpiexec -n 2 time", r["seconds"], 120.0, "s"))
            out.append(_verdict("16,384 ranks peak RSS per process", r["peak_rss_mb"], 2000.0, "MB"))
    return out


def fit_line(x: list[float], y: list[float]) -> tuple[float, float]:
    """Least squares a + b x."""
    n = len(x)
    mx, my = sum(x) / n, sum(y) / n
    sxx = sum((v - mx) ** 2 for v in x)
    b = sum((u - mx) * (v - my) for u, v in zip(x, y)) / sxx if sxx else 0.0
    return my - b * mx, b


def projection_lines(rows: list[dict], ranks: int = 100_000) -> list[str]:
    """Time and peak RSS at `ranks`, from a + b x ranks fitted per process count (two or more rank counts)."""
    out = []
    for p in sorted({r["procs"] for r in rows}):
        mine = [r for r in rows if r["procs"] == p]
        if len({r["ranks"] for r in mine}) < 2:
            continue
        x = [float(r["ranks"]) for r in mine]
        ta, tb = fit_line(x, [r["seconds"] for r in mine])
        ma, mb = fit_line(x, [r["peak_rss_mb"] for r in mine])
        out.append(f"projection to {ranks:,} ranks, {p} proc(s): {ta + tb * ranks:,.0f} s "
                   f"({tb * 1e3:.1f} ms per rank), {ma + mb * ranks:,.0f} MB peak ({mb * 1e3:.0f} KB per rank), "
                   f"at the measured events per rank and on this machine")
    return out


if __name__ == "__main__":
    main()
