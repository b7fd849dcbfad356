"""Cross-rank analysis of distprof runs. Never imports torch.

    import distprof
    run = distprof.load("distprof/<run-id>")       # RunSummary: every rank summarised, one aligned clock
    report = distprof.analysis.build_report(run)   # everything, as a JSON-ready dict

Map over ranks, reduce across ranks (``engine``): each rank's shards are read alone (``rankdata.read_rank``),
indexed once (``index.RankIndex``) and summarised (``summary.summarize_rank``); the summaries are joined on one clock
(``runsummary.reduce_run``) and every cross-rank analysis takes that ``RunSummary``. ``load_run`` instead merges every
event of every rank into one ``MergedRun`` (small runs, notebooks). Heavy modules are imported on first use, so
``import distprof.analysis`` stays light (numpy only).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .model import HostClock, MergedRun

if TYPE_CHECKING:
    from .engine import summarize
    from .report import build_report
    from .run import load_run
    from .runsummary import RunSummary
    from .summary import RankSummary

__all__ = ["summarize", "build_report", "load_run", "RunSummary", "RankSummary", "MergedRun", "HostClock"]

_LAZY = {"summarize": ".engine", "build_report": ".report", "load_run": ".run", "RunSummary": ".runsummary",
         "RankSummary": ".summary"}


def __getattr__(name: str) -> Any:
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(mod, __name__), name)
