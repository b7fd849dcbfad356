"""``distprof report RUN_DIR``: merge a run's shards, print the summary, optionally write report.json and a
self-contained report.html."""

from __future__ import annotations

import argparse
import math
import sys

from ..errors import ConfigError
from ._common import add_steps_arg, add_strict_arg, parse_steps, summarize_run


def register(sub) -> None:
    r = sub.add_parser(
        "report",
        help="analyse a run: step breakdown, stragglers, overlap, imbalance, MFU",
        description="Merge every shard of RUN_DIR (the <out>/<run-id> folder a capture wrote) and print a summary.",
    )
    r.add_argument("run_dir", metavar="RUN_DIR", help="the <out>/<run-id> folder holding rank*.w*.h5 shards")
    r.add_argument("--json", metavar="PATH", help="also write the full report as JSON to PATH ('-' for stdout only)")
    r.add_argument("--html", metavar="PATH",
                   help="also write a self-contained HTML report with charts to PATH (one file, works offline)")
    add_steps_arg(r)
    r.add_argument("--peak-tflops", metavar="X", type=float,
                   help="device peak TFLOP/s for MFU (overrides the built-in table; needed on CPU)")
    r.add_argument("--top", metavar="N", type=int, default=3, help="root-cause analysis for up to N stragglers")
    add_strict_arg(r)
    r.add_argument("--from-events", action="store_true",
                   help="summarise every rank from its events, ignoring the summaries capture stored in the shards "
                        "(the same report, slower; for checking them)")
    r.add_argument("--no-progress", action="store_true", help="never show a progress bar")
    r.add_argument("--color", choices=("auto", "always", "never"), default="auto", help="colour the summary")
    r.set_defaults(func=run)


def _analysed(args: argparse.Namespace, steps: tuple[int, int] | None):
    """The run's Report (None on an MPI process other than rank 0). The summaries it was built from are released
    on return, before any renderer runs: at 16k ranks they are a gigabyte the renderers never read."""
    from ..analysis.report.build import build_report
    from ..analysis.report.parallel import Offload
    from ..analysis.summarize.engine import mpi_world
    from ..analysis.summarize.heap import long_lived

    # the summaries live until the report is built: the collector's full passes skip them (heap.long_lived)
    with long_lived(), Offload(mpi_world()) as offload:  # MPI: process 1 helps (report/parallel.py)
        run_ = summarize_run(args.run_dir, steps=steps, progress=False if args.no_progress else None,
                             strict=args.strict, stored=not args.from_events)
        if run_ is None:
            offload.serve()
            return None
        return build_report(run_, peak_tflops=args.peak_tflops, top=args.top, watch_dir=args.run_dir,
                            helped=offload.offer(run_), release=True)


def run(args: argparse.Namespace) -> int:
    from ..analysis.report.build import watch_only_report
    from ..analysis.summarize.heap import release_free_heap
    from ..render import render_console, render_json, write_html, write_json
    from ..render.html import check_html_path

    if args.peak_tflops is not None and not (args.peak_tflops > 0 and math.isfinite(args.peak_tflops)):
        raise ConfigError(f"--peak-tflops {args.peak_tflops}: must be a positive number of TFLOP/s")
    if args.top < 0:
        raise ConfigError(f"--top {args.top}: must be >= 0")
    steps = parse_steps(args.steps) if args.steps else None
    if args.html:
        check_html_path(args.html)  # fail before the (long) merge, not after
    report = watch_only_report(args.run_dir)  # a --watch run that recorded no window: its series alone
    if report is None:
        report = _analysed(args, steps)
        if report is None:  # an MPI process other than rank 0: its share is summarised, rank 0 reports
            return 0
        release_free_heap()  # the summaries hold reference cycles: freed now, not at some later collection
        # (1,024 ranks: 77 MB still held after the return, 5 MB after this), and their pages given back
    html_path = write_html(report, args.html) if args.html else None  # every renderer takes the Report alone
    if args.json == "-":
        sys.stdout.write(render_json(report))
        if html_path is not None:  # stdout carries only the JSON
            sys.stderr.write(f"HTML report written to {html_path}\n")
        return 0
    color = args.color == "always" or (args.color == "auto" and sys.stdout.isatty())
    sys.stdout.write(render_console(report, color=color, top=args.top))
    if args.json:
        path = write_json(report, args.json)
        sys.stdout.write(f"report written to {path}\n")
    if html_path is not None:
        sys.stdout.write(f"HTML report written to {html_path}\n")
    return 0

