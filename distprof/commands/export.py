"""``distprof export RUN_DIR --format kineto -o DIR``: one Kineto chrome trace per rank, clock-aligned."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from ..errors import ConfigError
from ._common import (
    add_steps_arg,
    add_strict_arg,
    parse_ranks,
    parse_steps,
    summarize_run,
)

FORMATS = ("kineto",)


def register(sub) -> None:
    p = sub.add_parser(
        "export",
        help="write a run in another tool's format (kineto: per-rank chrome traces for HTA, Perfetto, TensorBoard)",
        description="Merge every shard of RUN_DIR and write one Kineto chrome-trace JSON per rank "
                    "(rank-N.json.gz) with all ranks on one aligned clock. Format: docs/export.md.",
    )
    p.add_argument("run_dir", metavar="RUN_DIR", help="the <out>/<run-id> folder holding rank*.w*.h5 shards")
    p.add_argument("--format", choices=FORMATS, default="kineto", help="output format (default: kineto)")
    p.add_argument("-o", "--out", metavar="DIR",
                   help="directory for the rank files (default: RUN_DIR/kineto); use an empty one for HTA, "
                        "which loads every .json/.gz file it finds")
    p.add_argument("--ranks", metavar="LIST", help="only these ranks, e.g. 0-7 or 0,2,5-6 (default: all)")
    add_steps_arg(p)
    p.add_argument("--no-gzip", action="store_true", help="write plain rank-N.json instead of rank-N.json.gz")
    add_strict_arg(p)
    p.add_argument("--no-progress", action="store_true", help="never show a progress bar")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..export.kineto import export_kineto

    ranks = parse_ranks(args.ranks) if args.ranks else None
    steps = parse_steps(args.steps) if args.steps else None
    out = Path(args.out) if args.out else Path(args.run_dir) / "kineto"
    if out.exists() and not out.is_dir():
        raise ConfigError(f"-o {out}: exists and is not a directory; name a directory for the rank files")
    progress = False if args.no_progress else None
    t0 = time.perf_counter()
    run_ = summarize_run(args.run_dir, steps=steps, progress=progress, strict=args.strict)
    if run_ is None:  # an MPI process other than rank 0
        return 0
    if ranks is not None:
        ranks = ranks.pick(run_.ranks_present, "rank(s)")
    files = export_kineto(run_, out, ranks=ranks, gzip=not args.no_gzip, progress=progress)
    total = sum(f.bytes for f in files)
    for f in files:
        sys.stdout.write(f"rank {f.rank}: {f.path} ({f.n_x:,} events, {_size(f.bytes)})\n")
    sys.stdout.write(f"{len(files)} Kineto trace(s), {_size(total)}, in {time.perf_counter() - t0:.1f} s -> {out}\n"
                     f"HTA: TraceAnalysis(trace_dir={str(out)!r})\n")
    return 0


def _size(n: int) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 1e6 else f"{n / 1e3:.0f} kB"
