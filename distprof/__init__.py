"""distprof: profiling for distributed PyTorch training.

Capture (needs torch):
    torchrun --nproc_per_node=N -m distprof.launch [options] train.py [args]
    with distprof.profile(out="prof", step_on="manual") as p:
        for batch in data: ...; p.step()

Analysis (no torch needed):
    run = distprof.load("prof/<run-id>")           # RunSummary: every rank summarised, one clock
"""

from __future__ import annotations

from typing import Any

from ._version import __version__
from .errors import ConfigError, DistprofError, IncompleteRunError, ShardFormatError

__all__ = [
    "__version__",
    "profile",
    "step",
    "load",
    "DistprofError",
    "ConfigError",
    "ShardFormatError",
    "IncompleteRunError",
]


def profile(**options: Any):
    """A profiler for this rank, used as a context manager (`with distprof.profile(...) as p: ... p.step()`).

    Options are the fields of `distprof.config.ProfileConfig` plus the schedule fields (wait, warmup, active, repeat,
    skip_first); unset options fall back to DISTPROF_* environment variables, then defaults. `step_on` defaults to
    "manual" here: call `p.step()` once per iteration (or pass step_on="optimizer").
    """
    from .capture.profiler import RankProfiler
    from .config import config_from_mapping
    from .source_summary import summarize_shard

    options.setdefault("step_on", "manual")
    cfg = config_from_mapping(options)
    return RankProfiler(cfg, summarizer=summarize_shard)


def step() -> None:
    """Advance the running profiler by one iteration (for loops without an optimizer). No-op when none runs."""
    from .capture.profiler import active

    prof = active()
    if prof is not None:
        prof.step()


def load(run_dir, **kwargs: Any):
    """Summarise every rank of a run on one clock (``distprof.analysis.summarize.engine.summarize``): what every
    analysis in ``distprof.analysis`` and ``build_report`` take. Bounded memory: one rank's events at a time. Keywords: ``steps``
    (lo, hi), ``progress``, ``rules`` (FindingRules), ``comm`` (an mpi4py communicator)."""
    from .analysis.summarize.engine import summarize

    return summarize(run_dir, **kwargs)
