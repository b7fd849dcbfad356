"""The ``distprof`` command line (also ``python -m distprof``).

    distprof report RUN_DIR [--json report.json] [--steps A:B] [--peak-tflops X] [--top N]

User errors (``DistprofError``) print one line ``distprof: error: ...`` to stderr and exit 2; no traceback.
The analysis side never imports torch.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Sequence

from ._version import __version__
from .errors import ConfigError, DistprofError

logger = logging.getLogger(__name__)

__all__ = ["main", "get_parser", "parse_steps"]

_MAX_STEP = 2**31 - 1


def parse_steps(text: str) -> tuple[int, int]:
    """``A:B`` (inclusive), ``A:``, ``:B`` or ``A`` -> (first, last)."""
    t = text.strip()
    try:
        if ":" in t:
            a, b = t.split(":", 1)
            lo = int(a) if a.strip() else 0
            hi = int(b) if b.strip() else _MAX_STEP
        else:
            lo = hi = int(t)
    except ValueError:
        raise ConfigError(f"--steps {text!r}: expected A:B (inclusive global step ids, e.g. 10:20), A: or :B") from None
    if lo < 0 or hi < lo:
        raise ConfigError(f"--steps {text!r}: need 0 <= A <= B")
    return lo, hi


def get_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="distprof", description="Profiling toolkit for distributed PyTorch training.")
    p.add_argument("--version", action="version", version=f"distprof {__version__}")
    p.add_argument("-v", "--verbose", action="count", default=0, help="more log output on stderr (-vv: debug)")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    r = sub.add_parser(
        "report",
        help="analyse a run: step breakdown, stragglers, overlap, imbalance, MFU",
        description="Merge every shard of RUN_DIR (the <out>/<run-id> folder a capture wrote) and print a summary.",
    )
    r.add_argument("run_dir", metavar="RUN_DIR", help="the <out>/<run-id> folder holding rank*.w*.h5 shards")
    r.add_argument("--json", metavar="PATH", help="also write the full report as JSON to PATH ('-' for stdout only)")
    r.add_argument("--steps", metavar="A:B", type=str, help="analyse only global steps A..B (inclusive)")
    r.add_argument("--peak-tflops", metavar="X", type=float,
                   help="device peak TFLOP/s for MFU (overrides the built-in table; needed on CPU)")
    r.add_argument("--top", metavar="N", type=int, default=3, help="root-cause analysis for up to N stragglers")
    r.add_argument("--no-progress", action="store_true", help="never show a progress bar")
    r.add_argument("--color", choices=("auto", "always", "never"), default="auto", help="colour the summary")
    r.set_defaults(func=_cmd_report)
    return p


def _setup_logging(verbose: int) -> None:
    log = logging.getLogger("distprof")
    if any(getattr(h, "_distprof_cli", False) for h in log.handlers):
        return
    h = logging.StreamHandler(sys.stderr)
    h.setFormatter(logging.Formatter("distprof: %(levelname)s: %(message)s"))
    h._distprof_cli = True  # type: ignore[attr-defined]
    log.addHandler(h)
    log.setLevel(logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG)


def _cmd_report(args: argparse.Namespace) -> int:
    from .analysis.report import build_report
    from .analysis.run import load_run
    from .render import render_console, render_json, write_json

    if args.peak_tflops is not None and not args.peak_tflops > 0:
        raise ConfigError(f"--peak-tflops {args.peak_tflops}: must be a positive number of TFLOP/s")
    if args.top < 0:
        raise ConfigError(f"--top {args.top}: must be >= 0")
    steps = parse_steps(args.steps) if args.steps else None
    run = load_run(args.run_dir, steps=steps, progress=False if args.no_progress else None)
    report = build_report(run, peak_tflops=args.peak_tflops, top=args.top)
    if args.json == "-":
        sys.stdout.write(render_json(report))
        return 0
    color = args.color == "always" or (args.color == "auto" and sys.stdout.isatty())
    sys.stdout.write(render_console(report, color=color, top=args.top))
    if args.json:
        path = write_json(report, args.json)
        sys.stdout.write(f"report written to {path}\n")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``distprof``; returns the exit status."""
    parser = get_parser()
    args = parser.parse_args(argv)
    _setup_logging(args.verbose)
    try:
        return int(args.func(args) or 0)
    except DistprofError as e:
        print(f"distprof: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # unwritable --json path and the like: a user problem, not a bug
        print(f"distprof: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("distprof: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
