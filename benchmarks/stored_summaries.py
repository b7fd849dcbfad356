"""What a per-rank summary stored where the data is born costs there, and what it saves the report.

    python benchmarks/stored_summaries.py --ranks 64 --events 100000        # ~1 min to generate, ~1 min to measure

A synthetic GPU-like run (benchmarks/synth.py, one window per rank) is written with each shard's summary stored in
it, as a capture's writer thread and ``distprof import`` store it. Then, in this one process, alternating so that a
load change hits both sides alike:

* at the source: for `--sample` ranks, the CPU time of building the shard (``writer.building`` on the rank's
  tables) against that of summarising it and adding the summary (``summarize_image`` +
  ``ImageBuilder.with_summary``, as capture does), per event, and the shard's size with and without the summary;
* at the report: the map phase (``summarize``) reading the stored summaries against summarising every rank's events
  (``--from-events``), CPU and wall time; and whether the two reports are identical (they must be).

``--capture``: also a real 2-rank torchrun DDP job (examples/ddp_mlp.py, one window of `--active` steps): each
rank's writer-thread CPU for the shard (extraction, tables, file) against that for its summary, from the status
files (``shard_cpu_s``, ``summary_cpu_s``). The issue's bar: the summary costs less than writing the events.

Printed: medians of `--repeat` alternations and their ratios. No absolute time is a goal; the ratios are.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
for p in (str(ROOT), str(HERE)):
    if p not in sys.path:
        sys.path.insert(0, p)

import shard_write  # noqa: E402
import synth  # noqa: E402


def generate(ranks: int, events: int, out: Path) -> Path:
    run = out / f"r{ranks}-e{events}"
    if not (run / "rank00000.w0000.h5").exists():
        args = synth.parse_args(["--ranks", str(ranks), "--events", str(events), "--windows", "1", "--summaries",
                                 "-o", str(run)])
        synth.generate(synth.spec_from(args), run, progress=True, summaries=True)
    return run


def _tables(shard_path: Path):
    """The shard's tables, strings and attributes as its writer had them (shard_write.py's loader), and its events."""
    tables, strings, attrs = shard_write._load(str(shard_path))
    return tables, strings, attrs, len(tables["events"]["ts_ns"])


def source_cost(run: Path, sample: int, repeat: int) -> dict:
    """CPU seconds per event: building the shard image, and summarising it + adding the summary."""
    from distprof.analysis.rank.stored import summarize_image
    from distprof.storage.writer import building

    shards = sorted(run.glob("rank*.w0000.h5"))
    step = max(len(shards) // sample, 1)
    build, summ, plain_b, with_b, n_ev = [], [], 0, 0, 0
    for path in shards[::step][:sample]:
        tables, strings, attrs, n = _tables(path)
        n_ev += n
        for _ in range(repeat):
            t = time.process_time()
            with building(tables, strings, attrs) as b:  # as capture's writer and `distprof import` do
                image = b.image()
                t1 = time.process_time()
                full = b.with_summary(summarize_image(image, path))
                t2 = time.process_time()
            build.append((t1 - t) / n)
            summ.append((t2 - t1) / n)
        plain_b += len(image)
        with_b += len(full)
    return {"events": n_ev, "build_s_per_Mev": statistics.median(build) * 1e6,
            "summary_s_per_Mev": statistics.median(summ) * 1e6,
            "cpu_ratio": statistics.median(s / b for s, b in zip(summ, build)), "size_ratio": with_b / plain_b}


def report_cost(run: Path, repeat: int) -> dict:
    from distprof.analysis.report.build import build_report
    from distprof.analysis.summarize.engine import summarize

    times = {True: [], False: []}
    reports = {}
    for _ in range(repeat):
        for stored in (True, False):
            c, w = time.process_time(), time.perf_counter()
            summary = summarize(run, stored=stored, progress=False)
            times[stored].append((time.process_time() - c, time.perf_counter() - w))
            if stored not in reports:
                reports[stored] = json.dumps(build_report(summary).to_json(), sort_keys=True)
    med = {k: (statistics.median(c for c, _ in v), statistics.median(w for _, w in v)) for k, v in times.items()}
    return {"stored_cpu_s": med[True][0], "stored_wall_s": med[True][1], "events_cpu_s": med[False][0],
            "events_wall_s": med[False][1], "cpu_ratio": med[True][0] / med[False][0],
            "wall_ratio": med[True][1] / med[False][1], "identical": reports[True] == reports[False]}


def capture_cost(active: int) -> list[dict]:
    """A real 2-rank capture of one window: each rank's writer-thread CPU for its shard and for its summary."""
    with tempfile.TemporaryDirectory() as tmp:
        env = {k: v for k, v in os.environ.items() if not k.startswith("DISTPROF_")}
        env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m",
               "distprof.launch", "--out", tmp, "--run-id", "c", "--wait", "2", "--warmup", "2", "--active",
               str(active), str(ROOT / "examples" / "ddp_mlp.py"), "--hidden", "256", "--steps", str(active + 6)]
        subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, check=True, timeout=600)
        rows = []
        for r in (0, 1):
            w = json.loads((Path(tmp) / "c" / f"rank{r:05d}.status.json").read_text())["windows"][0]
            rows.append({"rank": r, "events": w["n_events"], "shard_cpu_s": w["shard_cpu_s"],
                         "summary_cpu_s": w["summary_cpu_s"], "ratio": w["summary_cpu_s"] / w["shard_cpu_s"]})
        return rows


def main(argv=None) -> int:
    import logging

    logging.basicConfig(level=logging.ERROR)  # the synthetic run's own capture warnings are not the subject
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--events", type=int, default=100_000, help="events per rank")
    ap.add_argument("--sample", type=int, default=4, help="ranks whose source cost is measured")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--data", default="/tmp/distprof-stored", help="where the synthetic run is kept (reused)")
    ap.add_argument("--capture", type=int, metavar="ACTIVE", default=0,
                    help="also a real 2-rank capture of one window of ACTIVE steps (0: not)")
    args = ap.parse_args(argv)
    for _ in range(args.repeat if args.capture else 0):
        for row in capture_cost(args.capture):
            print(f"capture: rank {row['rank']}, {row['events']:,} events: writer CPU for the shard "
                  f"{row['shard_cpu_s']:.3f} s, for the summary {row['summary_cpu_s']:.3f} s: "
                  f"summary/shard {row['ratio']:.2f}")
    run = generate(args.ranks, args.events, Path(args.data))
    src = source_cost(run, args.sample, args.repeat)
    print(f"source: {src['events']:,} events on {args.sample} ranks; shard build {src['build_s_per_Mev']:.2f} s/M "
          f"events, summary {src['summary_s_per_Mev']:.2f} s/M events (CPU): summary/build {src['cpu_ratio']:.2f}; "
          f"shard size with/without summary {src['size_ratio']:.3f}")
    rep = report_cost(run, args.repeat)
    print(f"report map phase, {args.ranks} ranks x {args.events:,} events: stored {rep['stored_cpu_s']:.2f} s CPU "
          f"({rep['stored_wall_s']:.2f} s wall), from events {rep['events_cpu_s']:.2f} s CPU "
          f"({rep['events_wall_s']:.2f} s wall): stored/events CPU {rep['cpu_ratio']:.3f}, wall "
          f"{rep['wall_ratio']:.3f}; reports identical: {rep['identical']}")
    return 0 if rep["identical"] else 1


if __name__ == "__main__":
    sys.exit(main())
