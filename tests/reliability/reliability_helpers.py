"""Helpers of the reliability suite: run the CLI in this process and capture what a user would see.

(No conftest.py here: a second module named conftest would shadow tests/conftest.py, which other test modules
import by name.)
"""

from __future__ import annotations

import contextlib
import io
from typing import Sequence

from distprof.cli import main


def run_cli(argv: Sequence[object]) -> tuple[int, str, str]:
    """``distprof ARGV`` in this process: (exit status, stdout, stderr). Any exception escaping main() -- a
    traceback for a user -- fails the calling test."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main([str(a) for a in argv])
    return rc, out.getvalue(), err.getvalue()


def one_error_line(err: str) -> str:
    """The single ``distprof: error: ...`` line of `err` (asserting there is exactly one line)."""
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("distprof: error: "), err
    return lines[0]

