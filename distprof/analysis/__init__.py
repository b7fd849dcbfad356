"""Cross-rank analysis of distprof runs. Never imports torch.

    import distprof
    run = distprof.load("distprof/<run-id>")       # RunSummary: every rank summarised, one aligned clock
    report = distprof.analysis.build_report(run)   # everything, as a typed Report (report.to_json(): report.json)

The packages are the pipeline's stages, each importing only the ones below it (tests/test_layers.py):

    report/     build_report, the report's schema, diff, the watch section
    findings/   one module per rule, and the verdict
    graph/      the cross-rank step graph: critical path, what-if
    cross/      cross-rank analyses on the RunSummary: comm table, imbalance, MFU, overlap, parallelism,
                pipelines, root cause, stragglers
    summarize/  map over ranks + reduce (serial or MPI: ``engine.summarize``); the merged-run path (``merged``)
    align/      the reduce: the collective rows joined (``rows``), clock model, collective and p2p matching, the
                RunSummary (``reduce.reduce_run``)
    rank/       the per-rank map: index, breakdown, measures, CPU wait, ``summary.summarize_rank``
    load/       the run's catalog of shards, and one rank's events (``rankdata.read_rank``)
    types.py    the data the stages hand on (RankSummary, RunSummary, HostClock, MergedRun, FindingRules)
    names.py    name predicates and display forms (depends on nothing)

Each rank's shards are read alone, indexed once and summarised; the summaries are joined on one clock and every
cross-rank analysis takes that ``RunSummary``. ``load_run`` instead merges every event of every rank into one
``MergedRun`` (small runs, notebooks). Heavy modules are imported on first use, so ``import distprof.analysis``
stays light (numpy only).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .types import HostClock, MergedRun

if TYPE_CHECKING:
    from .report.build import build_report
    from .summarize.engine import summarize
    from .summarize.merged import load_run
    from .types import RankSummary, RunSummary

__all__ = ["summarize", "build_report", "load_run", "RunSummary", "RankSummary", "MergedRun", "HostClock"]

_LAZY = {"summarize": ".summarize.engine", "build_report": ".report.build", "load_run": ".summarize.merged",
         "RunSummary": ".types", "RankSummary": ".types"}


def __getattr__(name: str) -> Any:
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(mod, __name__), name)
