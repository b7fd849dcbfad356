"""Helpers of the reliability suite: run the CLI in this process and capture what a user would see.

(No conftest.py here: a second module named conftest would shadow tests/conftest.py, which other test modules
import by name.)
"""

from __future__ import annotations

import contextlib
import io
import os
import socket
import time
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


def flood_port(port: int, idle: int, garbage: int, seconds: float = 20.0) -> list[socket.socket]:
    """`idle` connections that say nothing and `garbage` ones that send random bytes, all held open (bounded: at
    most `seconds` of connecting)."""
    held = []
    deadline = time.monotonic() + seconds
    for i in range(idle + garbage):
        if time.monotonic() > deadline:
            break
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=0.2)
        except OSError:
            continue
        if i >= idle:
            try:
                s.sendall(os.urandom(200))
            except OSError:
                pass
        held.append(s)
    return held
