"""Argument helpers shared by several subcommands."""

from __future__ import annotations

import argparse
import bisect
import logging
import os
from dataclasses import dataclass
from typing import Iterable

from ..errors import ConfigError

_MAX_STEP = 2**31 - 1


log = logging.getLogger(__name__)


def parse_steps(text: str) -> tuple[int, int]:
    """``A:B`` (inclusive), ``A:``, ``:B`` or ``A`` -> (first, last); a last step beyond int32 is clipped to it."""
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
    if lo > _MAX_STEP:
        raise ConfigError(f"--steps {text!r}: step ids end at {_MAX_STEP}")
    if lo < 0 or hi < lo:
        raise ConfigError(f"--steps {text!r}: need 0 <= A <= B")
    return lo, min(hi, _MAX_STEP)


@dataclass(frozen=True)
class IdRanges:
    """Ids as the user typed them (``0-7``, ``0,2,5-6``): ranges, never expanded, so ``0-99999999999`` costs nothing.

    :meth:`pick` selects the ids of the run they cover: ranges are clipped to what exists; a single id is kept as
    given (the command then names it when the run lacks it: a typo should not pass silently).
    """

    flag: str
    text: str
    spans: tuple[tuple[int, int], ...]

    def pick(self, available: Iterable[int], what: str) -> list[int]:
        have = sorted({int(i) for i in available})
        out: set[int] = {lo for lo, hi in self.spans if lo == hi}
        for lo, hi in self.spans:
            out.update(have[bisect.bisect_left(have, lo):bisect.bisect_right(have, hi)])
        if not out:
            from ..analysis.names import (
                rank_ranges,  # here: `distprof --help` stays free of numpy
            )

            raise ConfigError(f"{self.flag} {self.text}: covers none of this run's {what} "
                              f"{rank_ranges(have, sep=',') or '(none)'}")
        return sorted(out)


def parse_ranks(text: str, flag: str = "--ranks", example: str = "0-7 or 0,2,5-6") -> IdRanges:
    """``0-7``, ``0,2,5-6`` -> IdRanges (not expanded; :meth:`IdRanges.pick` clips them to the run)."""
    spans: list[tuple[int, int]] = []
    try:
        for part in text.split(","):
            part = part.strip()
            if not part:
                continue
            a, sep, b = part.partition("-")
            lo, hi = (int(a), int(b)) if sep else (int(part), int(part))
            if lo < 0 or hi < lo:
                raise ValueError
            spans.append((lo, hi))
    except ValueError:
        raise ConfigError(f"{flag} {text!r}: expected a list like {example}") from None
    if not spans:
        raise ConfigError(f"{flag} {text!r}: names nothing")
    return IdRanges(flag=flag, text=text.strip(), spans=tuple(spans))


def add_steps_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--steps", metavar="A:B", type=str, help="only global steps A..B (inclusive)")


def summarize_run(run_dir: str, *, steps=None, progress=None, strict: bool = False, stored: bool = True):
    """The RunSummary of `run_dir` for a subcommand: split over MPI processes when started by ``mpiexec`` / ``srun``
    (mpi4py), else serial. Returns None on every MPI process but rank 0 (which alone writes output). `stored`: take
    the per-rank summaries capture stored in the shards where they fit (False: summarise every rank's events)."""
    from ..analysis.summarize.engine import mpi_world, summarize

    comm = mpi_world()
    if comm is None and _other_srun_task():
        return None
    return summarize(run_dir, steps=steps, progress=progress, comm=comm, strict=strict, stored=stored)


def _other_srun_task(what: str = "report") -> bool:
    """A task of ``srun -n N distprof ...`` other than task 0, with no MPI world (srun without ``--mpi=pmix``/pmi2,
    or no mpi4py): every task would write the same output; task 0 alone does the work, the others say so and stop.
    `what` names the work in the warning (a parallel report, import, ...)."""
    tasks = os.environ.get("SLURM_STEP_NUM_TASKS") or os.environ.get("SLURM_NTASKS")
    proc = os.environ.get("SLURM_PROCID")
    if not (tasks and proc and tasks.isdigit() and proc.isdigit()) or int(tasks) <= 1 or int(proc) == 0:
        return False
    log.warning("srun task %s of %s: no MPI world (start srun with --mpi=pmix or pmi2 and install mpi4py for a "
                "parallel %s); task 0 does the work alone", proc, tasks, what)
    return True


def add_strict_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--strict", action="store_true",
                   help="refuse a run with any bad or missing shard (exit 2) instead of skipping and naming it")
