"""Argument helpers shared by several subcommands."""

from __future__ import annotations

import argparse

from ..errors import ConfigError

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


def parse_ranks(text: str) -> list[int]:
    """``0-7``, ``0,2,5-6`` -> sorted list of ranks."""
    out: set[int] = set()
    try:
        for part in text.split(","):
            part = part.strip()
            if not part:
                continue
            if "-" in part:
                a, b = part.split("-", 1)
                lo, hi = int(a), int(b)
                if lo < 0 or hi < lo:
                    raise ValueError
                out.update(range(lo, hi + 1))
            else:
                r = int(part)
                if r < 0:
                    raise ValueError
                out.add(r)
    except ValueError:
        raise ConfigError(f"--ranks {text!r}: expected a list like 0-7 or 0,2,5-6") from None
    if not out:
        raise ConfigError(f"--ranks {text!r}: names no rank")
    return sorted(out)


def add_steps_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--steps", metavar="A:B", type=str, help="only global steps A..B (inclusive)")


def add_strict_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--strict", action="store_true",
                   help="refuse a run with any bad or missing shard (exit 2) instead of skipping and naming it")
