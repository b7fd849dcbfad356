"""Cross-rank analysis of distprof runs. Never imports torch.

    from distprof.analysis import load_run
    run = load_run("distprof/<run-id>")      # MergedRun: merged, clock-aligned column tables

``load_run`` is imported on first use, so ``import distprof.analysis`` (and its model) stays light (numpy only).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .model import HostClock, MergedRun

if TYPE_CHECKING:
    from .run import load_run

__all__ = ["load_run", "MergedRun", "HostClock"]


def __getattr__(name: str) -> Any:
    if name == "load_run":
        from .run import load_run

        return load_run
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
