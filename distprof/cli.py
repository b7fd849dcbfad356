"""The ``distprof`` command line (also ``python -m distprof``).

    distprof report RUN_DIR [--json report.json] [--steps A:B] [--peak-tflops X] [--top N]

Each subcommand lives in ``distprof/commands/<name>.py``.

User errors (``DistprofError``) print one line ``distprof: error: ...`` to stderr and exit 2; no traceback. Every
line echoing names from traces or shards (errors, log warnings) is terminal-safe (render.console.terminal_text).
The analysis side never imports torch.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Sequence

from ._version import __version__
from .commands import register_all
from .commands._common import parse_ranks, parse_steps
from .errors import DistprofError

logger = logging.getLogger(__name__)

__all__ = ["main", "get_parser", "parse_steps", "parse_ranks"]

def get_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="distprof", description="Profiling toolkit for distributed PyTorch training.")
    p.add_argument("--version", action="version", version=f"distprof {__version__}")
    p.add_argument("-v", "--verbose", action="count", default=0, help="more log output on stderr (-vv: debug)")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    register_all(sub)
    return p


class _StderrHandler(logging.Handler):
    """Log records as ``distprof: LEVEL: message`` lines on whatever ``sys.stderr`` is when they are emitted (so
    ``main()`` called with a redirected stderr logs there too). Messages echo names from traces and shards: they are
    made terminal-safe (one line, no control characters)."""

    _distprof_cli = True

    def emit(self, record: logging.LogRecord) -> None:
        from .render.console import terminal_text  # here: `distprof --help` stays free of numpy/h5py

        try:
            safe = logging.makeLogRecord({**record.__dict__, "msg": terminal_text(record.getMessage()), "args": None})
            sys.stderr.write(self.format(safe) + "\n")
        except Exception:  # noqa: BLE001 -- logging must never raise (a closed or broken stderr)
            self.handleError(record)


def _setup_logging(verbose: int) -> None:
    log = logging.getLogger("distprof")
    log.setLevel(logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG)
    if any(getattr(h, "_distprof_cli", False) for h in log.handlers):
        return
    h = _StderrHandler()
    h.setFormatter(logging.Formatter("distprof: %(levelname)s: %(message)s"))
    log.addHandler(h)


def _terminal_text(e: BaseException) -> str:
    from .render.console import terminal_text

    return terminal_text(e)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``distprof``; returns the exit status."""
    parser = get_parser()
    args = parser.parse_args(argv)
    _setup_logging(args.verbose)
    from .analysis.summarize.heap import keep_freed_memory, small_pages  # no numpy import: --help stays light

    small_pages()
    keep_freed_memory()
    try:
        return int(args.func(args) or 0)
    except DistprofError as e:
        print(f"distprof: error: {_terminal_text(e)}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `distprof report RUN | head`: the reader left; no error, no traceback
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except OSError as e:  # unwritable --json path and the like: a user problem, not a bug
        print(f"distprof: error: {_terminal_text(e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("distprof: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
