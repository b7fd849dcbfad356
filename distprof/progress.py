"""When to show a tqdm bar: the caller's choice, else only for long work on an interactive stderr."""

from __future__ import annotations

import sys


def progress_enabled(progress: bool | None, n: int = 0, minimum: int = 0) -> bool:
    """`progress` if given; otherwise True when `n` >= `minimum` and stderr is a terminal."""
    if progress is not None:
        return bool(progress)
    if n < minimum:
        return False
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False
