"""``distprof timeline RUN_DIR -o merged.json.gz``: every rank on one clock, as a Chrome trace for Perfetto UI.

Layout and budget: distprof/export/timeline.py and docs/timeline.md.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from ..errors import ConfigError
from ._common import (
    IdRanges,
    add_steps_arg,
    add_strict_arg,
    parse_ranks,
    parse_steps,
    summarize_run,
)

DEFAULT_OUT = "timeline.json.gz"


def register(sub) -> None:
    p = sub.add_parser(
        "timeline",
        help="write one merged, clock-aligned Chrome/Perfetto trace of every rank",
        description="Merge every shard of RUN_DIR onto the aligned clock and write a Chrome trace-event JSON "
                    "(gzipped when the name ends in .gz) that https://ui.perfetto.dev and chrome://tracing open: "
                    "one process per rank, threads and streams as tracks, steps, memory counters, arrows "
                    "linking each collective across ranks and from its enqueue to its execution. Big runs are cut to --max-events (whole steps first); "
                    "what was cut and the flags for the rest are printed.",
    )
    p.add_argument("run_dir", metavar="RUN_DIR", help="the <out>/<run-id> folder holding rank*.w*.h5 shards")
    p.add_argument("-o", "--output", metavar="PATH", default=DEFAULT_OUT,
                   help=f"trace file to write (default {DEFAULT_OUT}; .gz = gzip)")
    p.add_argument("--window", metavar="K", help="only profiling window(s) K (e.g. 1 or 0,2 or 0-1)")
    p.add_argument("--ranks", metavar="LIST", help="only these ranks (e.g. 0-7 or 0,2,5-6)")
    add_steps_arg(p)
    p.add_argument("--max-events", metavar="N", type=int, default=None,
                   help="budget of trace events (default 1,000,000 ≈ 200 MB of JSON, under chrome://tracing's "
                        "≈256 MB; Perfetto UI takes ≈10x more); 0 = no limit")
    p.add_argument("--launch-flows", action="store_true",
                   help="also draw an arrow from every kernel launch (cudaLaunchKernel ...) to its kernel, as Kineto "
                        "does; costs 2 trace events per kernel, counted in --max-events")
    add_strict_arg(p)
    p.add_argument("--no-progress", action="store_true", help="never show a progress bar")
    p.set_defaults(func=run)


def parse_windows(text: str) -> IdRanges:
    """``1``, ``0,2``, ``0-1`` -> window ranges (clipped to the run's windows by IdRanges.pick)."""
    return parse_ranks(text, flag="--window", example="1, 0,2 or 0-1")


def run(args: argparse.Namespace) -> int:
    from ..export.timeline import (
        BYTES_PER_EVENT,
        DEFAULT_MAX_EVENTS,
        plan_timeline,
        write_timeline,
    )

    if args.max_events is not None and args.max_events < 0:
        raise ConfigError(f"--max-events {args.max_events}: must be >= 0 (0 = no limit)")
    max_events = DEFAULT_MAX_EVENTS if args.max_events is None else args.max_events
    ranks = parse_ranks(args.ranks) if args.ranks else None
    windows = parse_windows(args.window) if args.window else None
    steps = parse_steps(args.steps) if args.steps else None
    out = Path(args.output)
    if not out.parent.is_dir():
        raise ConfigError(f"-o {out}: directory {out.parent} does not exist; create it or pick another path")
    if out.is_dir():
        raise ConfigError(f"-o {out}: is a directory; name a file such as {out / DEFAULT_OUT}")
    progress = False if args.no_progress else None

    if windows is not None:
        windows, load_steps = _window_steps(args.run_dir, windows, steps)
    else:
        load_steps = steps
    run_ = summarize_run(args.run_dir, steps=load_steps, progress=progress, strict=args.strict)
    if run_ is None:  # an MPI process other than rank 0: rank 0 writes the one file
        return 0
    if ranks is not None:
        ranks = ranks.pick(run_.ranks_present, "rank(s)")
    plan = plan_timeline(run_, ranks=ranks, windows=windows, steps=steps, max_events=max_events,
                         launch_flows=args.launch_flows, progress=progress)
    res = write_timeline(run_, plan, out, progress=progress)
    sys.stdout.write(f"timeline written to {res.path} ({res.n_events:,} trace events, {_mb(res.n_bytes)}"
                     + (f", {_mb(res.json_bytes)} of JSON" if res.json_bytes != res.n_bytes else "")
                     + f", {res.seconds:.1f} s): open it in https://ui.perfetto.dev or chrome://tracing\n")
    cut = plan.cut
    if cut.happened:
        err = sys.stderr
        rest, everything = cut.flags(plan.selection)
        err.write(f"distprof: timeline cut: {cut.describe()}.\n")
        if rest:
            err.write(f"  {out.name} is part 1; the rest:\n")
        for i, flags in enumerate(rest[:4], start=2):
            err.write(f"  part {i}: {_command(args.run_dir, _part_name(out, i), flags)}\n")
        if len(rest) > 4:
            err.write(f"  ... and {len(rest) - 4} more part(s) like these (all listed in the file's "
                      "otherData.distprof.cut.rest_flags)\n")
        need = cut.needed
        err.write(f"  everything in one file: {_command(args.run_dir, out, everything)}"
                  f"  (~{_mb(need * BYTES_PER_EVENT)} of JSON"
                  + ("; too big for chrome://tracing, Perfetto UI may cope" if need * BYTES_PER_EVENT > 2.5e8 else "")
                  + ")\n")
    return 0


def _window_steps(run_dir: str, spec: IdRanges, steps) -> tuple[list[int] | None, tuple[int, int] | None]:
    """The run's windows `spec` picks, and the global step range they cover (read from shard attributes), so that
    only their shards are read."""
    from ..errors import BadShardError
    from ..export.timeline import format_ranges
    from ..storage.reader import find_shards, read_shard

    all_spans = {}
    for p in find_shards(run_dir) if Path(run_dir).is_dir() else []:
        try:
            s = read_shard(p)
        except BadShardError:
            continue  # load_run names it (or refuses it under --strict)
        all_spans.setdefault(s.window, (int(s.attrs["first_step"]), int(s.attrs["last_step"])))
    if not all_spans:
        return None, steps  # load_run names the problem (no shards)
    windows = spec.pick(all_spans, "window(s)")
    spans = {w: all_spans[w] for w in windows if w in all_spans}
    if len(spans) < len(windows):
        return windows, steps  # plan_timeline names the window the run lacks
    lo = min(a for a, _ in spans.values())
    hi = max(b for _, b in spans.values())
    if steps is not None:
        lo, hi = max(lo, steps[0]), min(hi, steps[1])
        if lo > hi:
            raise ConfigError(f"--steps {steps[0]}:{steps[1]} lies outside --window {format_ranges(windows)} "
                              f"(steps {min(a for a, _ in spans.values())}..{max(b for _, b in spans.values())})")
    return windows, (lo, hi)


def _part_name(out: Path, part: int) -> Path:
    stem, dot, ext = out.name.partition(".")
    return out.with_name(f"{stem}.part{part}{dot}{ext}")


def _command(run_dir: str, out: Path, flags: str) -> str:
    return " ".join(shlex.quote(c) for c in ["distprof", "timeline", str(run_dir), "-o", str(out)]) + " " + flags


def _mb(n: float) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 1e5 else f"{n / 1e3:.1f} kB"
