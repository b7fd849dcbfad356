"""The HTML report's watch section (``--watch`` runs): step time per rank over every step of the run as a heatmap,
a line per drifting rank against the other ranks' median, and a table of drifts and the windows they triggered.
Pure functions over the report's :class:`WatchSection` (docs/report-format.md), returning plotly figure dicts / HTML
text."""

from __future__ import annotations

from typing import Any, Callable

from ..analysis.report.model import Report
from ..analysis.report.watch_section import WatchDrift, WatchSection, WatchTrigger
from .html_scale import _axis, _layout
from .html_text import _e, _fmt, _num

__all__ = ["heatmap", "lines", "section"]

_PALETTE = ("#d62728", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#1f77b4")


def _cap(values) -> float | None:
    """A colour / axis top that one outlier cannot take over: the 99th percentile x 1.2 (the first step of a job
    runs from the profiler's start, start-up included, and is often 100x the others)."""
    vals = sorted(v for v in map(_num, values) if v is not None)
    if not vals:
        return None
    return vals[min(len(vals) - 1, int(0.99 * len(vals)))] * 1.2


def _drift_lines(drifts: list[WatchDrift], x: list[str], first_bin: int, width: int) -> list[dict[str, Any]]:
    """Where each drift began: a dashed line at the column of its first step (the first 20 drifts)."""
    shapes = []
    for d in drifts[:20]:
        col = x[min(len(x) - 1, max(0, (int(d.first_step) - first_bin) // width))]
        shapes.append({"type": "line", "xref": "x", "yref": "paper", "y0": 0, "y1": 1, "x0": col, "x1": col,
                       "line": {"color": "#1f77b4", "width": 1, "dash": "dash"}})
    return shapes


def heatmap(watch: WatchSection, key: str = "step_ms") -> dict[str, Any] | None:
    """`key` "step_ms" (step time) or "own_ms" (own work: step time minus time blocked)."""
    hm = watch.heatmap
    z, bins = (hm.step_ms if key == "step_ms" else hm.own_ms), hm.bin_first_steps
    if not z or not bins:
        return None
    width = int(hm.bin_steps or 1)
    x = [str(b) if width == 1 else f"{b}-{b + width - 1}" for b in bins]
    trace = {"type": "heatmap", "x": x, "y": hm.rows, "z": z, "colorscale": "YlOrRd",
             "reversescale": True, "colorbar": {"title": {"text": "ms"}}, "hoverongaps": False,
             "hovertemplate": "%{y}, step %{x}: <b>%{z:.2f} ms</b> per step<extra></extra>"}
    top = _cap(v for row in z for v in row)
    if top is not None:  # both ends set, or plotly computes its own; hover still shows every cell's value
        trace["zmin"] = min(v for row in z for v in map(_num, row) if v is not None)
        trace["zmax"] = max(top, trace["zmin"] + 1e-3)
    shapes = _drift_lines(watch.drifts, x, bins[0], width)
    height = int(min(900, max(220, 14 * len(z) + 110)))
    return {"data": [trace], "layout": _layout(height, shapes=shapes, xaxis=_axis("global step", type="category"),
                                               yaxis=_axis(None, type="category", autorange="reversed"))}


def lines(watch: WatchSection) -> dict[str, Any] | None:
    ln = watch.lines
    bins, ranks = ln.bin_first_steps, ln.ranks
    if not bins or not ranks:
        return None
    data = [{"type": "scatter", "mode": "lines", "name": "median of all ranks (own work)", "x": bins,
             "y": ln.peers_own_ms, "line": {"color": "#7f7f7f", "dash": "dash"}}]
    for i, r in enumerate(ranks):
        c = _PALETTE[i % len(_PALETTE)]
        data.append({"type": "scatter", "mode": "lines", "name": f"rank {r.rank} own work", "x": bins,
                     "y": r.own_ms, "line": {"color": c}})
        data.append({"type": "scatter", "mode": "lines", "name": f"rank {r.rank} step time", "x": bins,
                     "y": r.step_ms, "line": {"color": c, "dash": "dot", "width": 1}})
    top = _cap(v for tr in data for v in tr["y"])
    yaxis = _axis("ms per step", range=[0, top]) if top else _axis("ms per step")
    return {"data": data, "layout": _layout(340, xaxis=_axis("global step"), yaxis=yaxis)}


def _window(t: WatchTrigger | None) -> str:
    """The window a drift triggered, or what became of its request ("-": none asked)."""
    if t is None:
        return "-"
    if t.window is not None:
        return f"window {t.window} (steps {t.window_first_step}-{t.window_last_step})"
    return _e(t.state or "asked")


def _table(watch: WatchSection) -> str:
    trig = {(t.rank, None if t.drift is None else t.drift.first_step): t for t in watch.triggers}
    rows = []
    for d in watch.drifts[:50]:
        win = _window(trig.get((d.rank, d.first_step)))  # a drift triggered a window, or not
        rows.append("<tr>" + "".join(f"<td>{c}</td>" for c in (
            d.rank, d.first_step, f"{d.last_step}{' (to the end)' if d.open else ''}",
            d.flagged_steps, _fmt(d.own_ms, "{:.1f}"), _fmt(d.peers_ms, "{:.1f}"),
            _fmt(d.excess_ms, "{:+.1f}"), _fmt(d.excess_pct, "{:+.0f} %"), win)) + "</tr>")
    if not rows:
        return "<p class=\"muted\">No rank drifted: " + _e(watch.rule.text) + ".</p>"
    head = "".join(f"<th>{h}</th>" for h in ("rank", "from step", "to step", "steps", "own ms", "others' ms",
                                              "excess ms", "excess", "window"))
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def section(report: Report, figs: dict[str, Any], chart: Callable[..., str]) -> str:
    """The watch part of the page ('' when the run has no watch series); `chart` is html.py's figure section."""
    watch = report.watch
    if watch is None:
        return ""
    rule = watch.rule.text
    parts = [
        chart("fig-watch-heatmap", "Whole run (--watch): step time per rank and step", heatmap(watch), figs,
              f"Every step of steps {watch.first_step}-{watch.last_step} from the watch series "
              f"({watch.heatmap.bin_steps} step(s) per column, mean; rows of many ranks "
              "show their slowest). Dashed lines: where a drift began."),
        chart("fig-watch-own", "Whole run: own work per rank and step", heatmap(watch, "own_ms"), figs,
              "Step time minus time blocked waiting for communication: a rank that makes the others wait stands out "
              "here, while in step time its victims look as slow as it."),
        chart("fig-watch-lines", "Drifting ranks: own work against the others", lines(watch), figs,
              "Own work = step time minus time blocked waiting for communication; a rank drifts when " + rule + ".",
              "No rank drifted."),
        f"<section id=\"watch-drifts\"><h2>Drifts and the windows they triggered</h2>{_table(watch)}</section>",
    ]
    return "\n".join(parts)
