"""``distprof diff RUN_A RUN_B``: what changed between two runs of the same job — the step-time change split into
parts that add up (phase, rank on the critical path, collective), per-op, memory and FLOPs comparisons, each with
its noise band, and a one-paragraph verdict (analysis/report/diff.py, docs/whatif.md)."""

from __future__ import annotations

import argparse
import math
import sys

from ._common import add_steps_arg, add_strict_arg, parse_steps, summarize_run


def register(sub) -> None:
    r = sub.add_parser(
        "diff",
        help="compare two runs of the same job: what got slower, where, and whether it is beyond the noise",
        description="Compare RUN_B with RUN_A (each a <out>/<run-id> folder, captured or imported; the world sizes "
                    "may differ) and print the step-time change split into parts that add up, with noise bands.",
    )
    r.add_argument("run_a", metavar="RUN_A", help="the baseline run folder")
    r.add_argument("run_b", metavar="RUN_B", help="the run compared with it")
    r.add_argument("--json", metavar="PATH", help="also write the diff as JSON to PATH ('-' for stdout only)")
    r.add_argument("--html", metavar="PATH", help="also write a self-contained HTML page of the diff to PATH")
    r.add_argument("--noise-floor", metavar="PCT", type=_pct,
                   help="least noise band, %% of A's step time: the run-to-run drift one run's steps cannot show "
                        "(default 5, DiffRules.floor_pct; more on shared hosts)")
    add_steps_arg(r)
    add_strict_arg(r)
    r.add_argument("--no-progress", action="store_true", help="never show a progress bar")
    r.add_argument("--color", choices=("auto", "always", "never"), default="auto", help="colour the summary")
    r.set_defaults(func=run)


def _pct(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        v = math.nan
    if not 0.0 <= v < 100.0:  # NaN fails too
        raise argparse.ArgumentTypeError(f"{text!r} is not a percentage in [0, 100)")
    return v


def run(args: argparse.Namespace) -> int:
    from ..analysis.report.diff import DiffRules, diff_runs
    from ..analysis.report.schema import to_jsonable
    from ..render import render_json, write_json
    from ..render.diff_console import render_diff
    from ..render.diff_html import write_diff_html
    from ..render.html import check_html_path

    steps = parse_steps(args.steps) if args.steps else None
    if args.html:
        check_html_path(args.html)
    progress = False if args.no_progress else None
    a = summarize_run(args.run_a, steps=steps, progress=progress, strict=args.strict)
    b = summarize_run(args.run_b, steps=steps, progress=progress, strict=args.strict)
    if a is None or b is None:  # an MPI process other than rank 0
        return 0
    rules = DiffRules() if args.noise_floor is None else DiffRules(floor_pct=args.noise_floor)
    d = diff_runs(a, b, rules=rules, labels=(args.run_a, args.run_b))
    doc = to_jsonable(d.to_dict())
    html_path = write_diff_html(d, args.html) if args.html else None
    if args.json == "-":
        sys.stdout.write(render_json(doc))
        if html_path is not None:
            sys.stderr.write(f"HTML diff written to {html_path}\n")
        return 0
    color = args.color == "always" or (args.color == "auto" and sys.stdout.isatty())
    sys.stdout.write(render_diff(d, color=color))
    if args.json:
        sys.stdout.write(f"diff written to {write_json(doc, args.json)}\n")
    if html_path is not None:
        sys.stdout.write(f"HTML diff written to {html_path}\n")
    return 0
