"""The HTML report's critical-path view (one step, its segments per rank, as a Gantt chart) and what-if table
(the report's ``critical_path`` and ``whatif`` sections). The figure is a plain plotly dict; strings go through
``_pl`` / ``_e``.
"""

from __future__ import annotations

from typing import Any

from ..analysis.graph.critical_path import PathSegment
from ..analysis.report.model import Report
from .html_text import _e, _fmt, _num, _pl

__all__ = ["fig_critical_path", "critical_path_caption", "whatif_table"]

_KIND_COLORS = {"work": "#4c78a8", "transfer": "#e45756"}


def _hover(s: PathSegment) -> str:
    group = "" if s.pg is None else f" (group {s.pg})"
    return _pl(f"rank {s.rank}: {s.name}{group}, {s.ms:.2f} ms")


def fig_critical_path(report: Report) -> dict[str, Any] | None:
    """Bars: the critical path of one step (the median-length one), a row per rank it runs through."""
    view = None if report.critical_path is None else report.critical_path.view
    if view is None or not view.segments:
        return None
    segs = view.segments
    ranks = sorted({int(s.rank) for s in segs})
    data = []
    for kind in ("work", "transfer"):
        part = [s for s in segs if s.kind == kind]
        if not part:
            continue
        data.append({
            "type": "bar", "orientation": "h", "name": kind,
            "y": [f"rank {s.rank}" for s in part], "x": [s.ms for s in part],
            "base": [s.start_ms for s in part], "marker": {"color": _KIND_COLORS[kind]},
            "hovertext": [_hover(s) for s in part], "hoverinfo": "text"})
    return {"data": data, "layout": {
        "barmode": "overlay", "height": 120 + 28 * len(ranks), "margin": {"l": 80, "r": 20, "t": 10, "b": 40},
        "xaxis": {"title": {"text": f"ms into step {view.step}"}},
        "yaxis": {"categoryorder": "array", "categoryarray": [f"rank {r}" for r in reversed(ranks)]},
        "legend": {"orientation": "h"}}}


def critical_path_caption(report: Report) -> str:
    cp = report.critical_path
    ranks = [] if cp is None else cp.ranks
    who = ", ".join(f"rank {r.rank} {_fmt(r.ms_per_step)} ms ({_fmt(r.share_pct, '{:.0f}')} %)" for r in ranks[:5])
    return ("The chain of work (blue) and transfers (red) that set the step's length, across ranks: it follows each "
            "collective back to the member that arrived last and a receive back to its sender; waiting is never on "
            f"it. Per step on average (median length {_fmt(None if cp is None else cp.length_ms_median)} ms): "
            f"{who or 'no rank'}.")


def whatif_table(report: Report) -> str:
    rows = [w for w in report.whatif or [] if _num(w.predicted_step_ms) is not None]
    if not rows:
        return ""
    body = "".join(f"<tr><td>{_e(w.description)}</td><td>{_fmt(w.measured_step_ms, '{:.2f}')}</td>"
                   f"<td>{_fmt(w.predicted_step_ms, '{:.2f}')}</td><td>{_fmt(w.gain_ms_per_step, '{:.2f}')}</td>"
                   f"<td>{_fmt(w.gain_pct, '{:.0f} %')}</td></tr>" for w in rows)
    return ("<table class=\"num\"><thead><tr><th>change</th><th>step now ms</th><th>predicted ms</th>"
            "<th>gain ms/step</th><th>gain</th></tr></thead><tbody>" + body + "</tbody></table>")
