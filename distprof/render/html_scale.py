"""The HTML report's figures when a run has many ranks (more than ``MANY_RANKS``): distributions over ranks with the
outliers that matter named, instead of one bar or line per rank; the step heatmap by host (or by block of ranks).

Every per-rank figure stays in report.json; these keep the page legible and its size bounded (a box plot per part
carries the ranks' values, but no per-rank category axis, legend or per-rank trace). Pure functions over the
:class:`Report`'s sections, each returning a plotly figure dict or None. (The memory timeline picks its curves itself:
``analysis/cross/memory_timeline.py``.)
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import numpy as np

from ..analysis.cross.imbalance import ImbalanceRank
from ..analysis.cross.overlap import OverlapRow
from ..analysis.cross.stragglers import StragglerRank
from ..analysis.report.model import Report
from .html_text import _num, _pl

__all__ = ["MANY_RANKS", "many", "step_heatmap", "breakdown", "blame", "overlap", "imbalance", "HEATMAP_ROWS",
           "TOP_BLAME", "LABELLED", "BOX_SAMPLES", "BOX_OUTLIERS", "lateness_heatmap_trace", "two_views"]

#: Above this many ranks, per-rank figures become distributions.
MANY_RANKS = 64
#: Rows of the step heatmap at most (hosts, or blocks of consecutive ranks).
HEATMAP_ROWS = 128
#: Ranks shown in the blame chart (the largest blame, named stragglers always).
TOP_BLAME = 24
#: Outliers labelled per distribution.
LABELLED = 3
#: Above this many values a box carries its statistics, not every rank's value ...
BOX_SAMPLES = 2048
#: ... and draws at most this many points beyond its fences.
BOX_OUTLIERS = 256

_COMPUTE, _EXPOSED, _IDLE, _OTHER, _OVERL = "#4c78a8", "#e45756", "#bab0ac", "#eeca3b", "#72b7b2"
_NAMED, _PLAIN = "#d62728", "#6b8fb8"


def many(n_ranks: int) -> bool:
    return n_ranks > MANY_RANKS


def _layout(height: int, **extra: Any) -> dict[str, Any]:
    out: dict[str, Any] = {
        "height": height, "margin": {"l": 70, "r": 20, "t": 30, "b": 50},
        "font": {"family": "system-ui, -apple-system, Segoe UI, Roboto, sans-serif", "size": 12},
        "paper_bgcolor": "#ffffff", "plot_bgcolor": "#ffffff", "hoverlabel": {"namelength": -1},
        "legend": {"orientation": "h", "x": 0, "yref": "container", "y": 0, "yanchor": "bottom"},
    }
    out.update(extra)
    return out


def _axis(title: str | None = None, **extra: Any) -> dict[str, Any]:
    ax: dict[str, Any] = {"gridcolor": "#e5e5e5", "zerolinecolor": "#cccccc", "automargin": True}
    if title:
        ax["title"] = {"text": title}
    ax.update(extra)
    return ax


def _box(name: str, values: Sequence[float | None], ranks: Sequence[int], color: str, **extra: Any) -> list[dict]:
    """A box of the ranks' values (hover names the rank of each point shown) and the `LABELLED` most extreme ranks,
    labelled. Ranks without a value are left out. Above `BOX_SAMPLES` values the box carries its statistics
    (quartiles, Tukey's fences) instead of every rank's value, and only the `BOX_OUTLIERS` farthest points beyond the
    fences are drawn: the page's size stays bounded at any number of ranks."""
    pairs = [(float(v), int(r)) for v, r in zip(values, ranks) if _num(v) is not None]
    if not pairs:
        return []
    v = np.array([p[0] for p in pairs])
    r = [p[1] for p in pairs]
    med = float(np.median(v))
    far = np.argsort(-np.abs(v - med), kind="stable")[:LABELLED]
    far = [int(i) for i in far if abs(v[i] - med) > 1e-12]
    hover = "%{text}: %{y:.3f}<extra>" + _pl(name) + "</extra>"
    if len(v) <= BOX_SAMPLES:
        out = [{"type": "box", "name": name, "y": [round(float(x), 4) for x in v], "text": [f"rank {x}" for x in r],
                "boxpoints": "suspectedoutliers", "marker": {"color": color}, "line": {"color": color},
                "hovertemplate": hover, **extra}]
    else:
        out = _box_stats(name, v, r, color, hover, extra)
    if far:
        out.append({"type": "scatter", "mode": "markers+text", "x": [name] * len(far),
                    "y": [round(float(v[i]), 4) for i in far], "text": [f"rank {r[i]}" for i in far],
                    "textposition": "middle right", "showlegend": False, "cliponaxis": False,
                    "marker": {"color": "#222222", "size": 7, "symbol": "diamond"},
                    "hovertemplate": "%{text}: %{y:.3f}<extra>outlier</extra>", **extra})
    return out


def _box_stats(name: str, v: np.ndarray, r: list[int], color: str, hover: str, extra: dict[str, Any]) -> list[dict]:
    """A box drawn from its statistics (plotly's precomputed q1/median/q3/fences) and a scatter of the farthest
    points beyond the fences (at most `BOX_OUTLIERS`)."""
    q1, med, q3 = (float(x) for x in np.percentile(v, [25, 50, 75]))
    iqr = q3 - q1
    inside = v[(v >= q1 - 1.5 * iqr) & (v <= q3 + 1.5 * iqr)]
    lo, hi = float(inside.min()), float(inside.max())
    box = {"type": "box", "name": name, "x": [name], "q1": [round(q1, 4)], "median": [round(med, 4)],
           "q3": [round(q3, 4)], "lowerfence": [round(lo, 4)], "upperfence": [round(hi, 4)],
           "mean": [round(float(v.mean()), 4)], "boxpoints": False, "marker": {"color": color},
           "line": {"color": color}, "hoverinfo": "y", **extra}
    out_idx = np.flatnonzero((v < lo) | (v > hi))
    if len(out_idx) > BOX_OUTLIERS:
        out_idx = out_idx[np.argsort(-np.abs(v[out_idx] - med), kind="stable")[:BOX_OUTLIERS]]
    out = [box]
    if len(out_idx):
        out.append({"type": "scatter", "mode": "markers", "x": [name] * len(out_idx),
                    "y": [round(float(v[i]), 4) for i in out_idx], "text": [f"rank {r[i]}" for i in out_idx],
                    "showlegend": False, "marker": {"color": color, "size": 4, "opacity": 0.6},
                    "hovertemplate": hover, **extra})
    return out


def _groups(report: Report, ranks: list[int]) -> tuple[list[str], Callable[[int], int]]:
    """Rows for rank aggregates: hosts when there are at most HEATMAP_ROWS of them, else blocks of ranks."""
    hosts_of = {int(k): str(v) for k, v in report.run.hosts.items()}
    first_rank: dict[str | None, int] = {}  # each host's lowest rank, in one pass (a pass per host: hosts x ranks)
    for r in ranks:
        h = hosts_of.get(r)
        first_rank[h] = min(r, first_rank.get(h, r))
    hosts = sorted({hosts_of.get(r, "?") for r in ranks}, key=lambda h: first_rank.get(h, 0))
    if 1 < len(hosts) <= HEATMAP_ROWS:
        pos = {h: i for i, h in enumerate(hosts)}
        return [_pl(h) for h in hosts], lambda r: pos[hosts_of.get(r, "?")]
    block = max(1, math.ceil(len(ranks) / HEATMAP_ROWS))
    order = {r: i for i, r in enumerate(ranks)}
    labels = [f"ranks {ranks[i]}-{ranks[min(i + block, len(ranks)) - 1]}" for i in range(0, len(ranks), block)]
    return labels, lambda r: order[r] // block


def lateness_heatmap_trace(steps: Sequence[int], labels: list[str], z: list[list[float | None]],
                           text: list[list[str]]) -> dict[str, Any]:
    """A heatmap of lateness (ms): red late, blue early, white on time (centred on 0)."""
    vals = [abs(v) for row in z for v in row if v is not None]
    top = max(max(vals, default=1.0), 1e-3)
    return {"type": "heatmap", "name": "lateness", "x": [str(s) for s in steps], "y": labels, "z": z, "text": text,
            "colorscale": "RdBu", "reversescale": True, "zmid": 0, "zmin": -top, "zmax": top,
            "colorbar": {"title": {"text": "late ms"}}, "xgap": 1, "ygap": 1, "hoverongaps": False,
            "hovertemplate": "%{y}, step %{x}: <b>%{z:+.2f} ms</b> late<br>%{text}<extra></extra>"}


def two_views(late: dict[str, Any] | None, step: dict[str, Any] | None, layout: dict[str, Any]) -> dict[str, Any]:
    """The heatmap figure: lateness shown, step time a second view behind a toggle (either alone when the other is
    missing)."""
    traces = [t for t in (late, step) if t is not None]
    if len(traces) == 2:
        late["visible"], step["visible"] = True, False
        layout["updatemenus"] = [{
            "type": "buttons", "direction": "right", "x": 0, "xanchor": "left", "y": 1.02, "yanchor": "bottom",
            "showactive": True, "pad": {"t": 0, "r": 4},
            "buttons": [{"label": "lateness", "method": "restyle", "args": [{"visible": [True, False]}]},
                        {"label": "step time", "method": "restyle", "args": [{"visible": [False, True]}]}]}]
        layout["margin"] = {**layout.get("margin", {}), "t": 44}
    return {"data": traces, "layout": layout}


def _row_cells(recs: list[tuple[int, int, float]], labels: list[str], row_of: Callable[[int], int],
               steps: list[int]) -> tuple[list[list[float | None]], list[list[str]]]:
    """Per row (host or block) and step: the largest value of its ranks, and which rank it was."""
    si = {s: i for i, s in enumerate(steps)}
    z: list[list[float | None]] = [[None] * len(steps) for _ in labels]
    who: list[list[str]] = [[""] * len(steps) for _ in labels]
    for rank, step, ms in recs:
        i, j = row_of(rank), si[step]
        v = round(float(ms), 3)
        if z[i][j] is None or v > z[i][j]:
            z[i][j] = v
            who[i][j] = f"rank {rank}"
    return z, who


def step_heatmap(report: Report) -> dict[str, Any] | None:
    """By host (or block of ranks) and step: each cell the latest rank of the row (its lateness), with the slowest
    rank's step time as a second view."""
    step_recs: list[tuple[int, int, float]] = []
    if report.steps is not None:
        cols = (report.steps[c].tolist() for c in ("rank", "step", "step_ms"))
        step_recs = [(int(rank), int(step), ms) for rank, step, ms in zip(*cols) if _num(ms) is not None]
    c = report.straggler_info.cells if report.straggler_info is not None else None
    late_recs = [] if c is None else [(r, s, v) for r, s, v in zip(c.rank, c.step, c.lateness_ms)
                                      if _num(v) is not None]
    if not step_recs and not late_recs:
        return None
    ranks = sorted({r[0] for r in step_recs + late_recs})
    steps = sorted({r[1] for r in step_recs + late_recs})
    labels, row_of = _groups(report, ranks)
    late = step = None
    if late_recs:
        z, who = _row_cells(late_recs, labels, row_of, steps)
        late = lateness_heatmap_trace(steps, labels, z, [[f"latest: {w}" if w else "" for w in row] for row in who])
    if step_recs:
        z, who = _row_cells(step_recs, labels, row_of, steps)
        step = {"type": "heatmap", "name": "step time", "x": [str(s) for s in steps], "y": labels, "z": z,
                "text": who, "colorscale": "YlOrRd", "reversescale": True, "colorbar": {"title": {"text": "ms"}},
                "xgap": 1, "ygap": 1, "hoverongaps": False,
                "hovertemplate": "%{y}, step %{x}: slowest %{text} <b>%{z:.2f} ms</b><extra></extra>"}
    height = int(min(900, max(220, 14 * len(labels) + 110)))
    return two_views(late, step, _layout(height, xaxis=_axis("global step", type="category"),
                                         yaxis=_axis(None, type="category", autorange="reversed")))


def breakdown(ranks: list[int], means: dict[str, list[float]]) -> dict[str, Any] | None:
    """Per part of the step (compute, exposed comm, idle, other): the distribution of the ranks' ms per step
    (`means`: per column of the step table, each rank's mean, in the order of `ranks`)."""
    if not ranks:
        return None
    data: list[dict] = []
    for name, key, color in (("compute", "compute_ms", _COMPUTE), ("exposed comm", "exposed_comm_ms", _EXPOSED),
                             ("idle", "idle_ms", _IDLE), ("other", "other_ms", _OTHER),
                             ("memcpy", "memcpy_ms", "#b279a2")):
        vals = means[key]
        if key == "memcpy_ms" and not any(vals):
            continue
        data += _box(name, vals, ranks, color)
    return {"data": data, "layout": _layout(360, showlegend=False, xaxis=_axis(None),
                                            yaxis=_axis("ms per step (mean over steps)", rangemode="tozero"))}


def blame(rows: list[StragglerRank], host_of: Callable[[StragglerRank], str], thr: float | None
          ) -> dict[str, Any] | None:
    """The ranks that cost the others most (and every named straggler), grouped by host."""
    keep = sorted(rows, key=lambda s: -(_num(s.blame_ms_per_step) or 0.0))[:TOP_BLAME]
    keep += [s for s in rows if s.named and s not in keep]
    if not keep:
        return None
    keep.sort(key=lambda s: (host_of(s), int(s.rank)))
    x = [[_pl(host_of(s)) for s in keep], [f"rank {s.rank}" for s in keep]]
    others = max(len(rows) - 1, 1)
    data = [{"type": "bar", "name": "each other rank's wait for it, ms/step", "x": x,
             "y": [None if _num(s.blame_ms_per_step) is None else round(s.blame_ms_per_step / others, 4)
                   for s in keep],
             "marker": {"color": [_NAMED if s.named else _PLAIN for s in keep]},
             "hovertemplate": "%{x}: each other rank waits %{y:.2f} ms/step for it<extra></extra>"},
            {"type": "scatter", "mode": "markers", "name": "lateness ms", "x": x,
             "y": [_num(s.lateness_ms) for s in keep],
             "marker": {"symbol": "diamond", "size": 10, "color": "#222222"},
             "hovertemplate": "%{x}: lateness %{y:.2f} ms<extra></extra>"}]
    layout = _layout(380, xaxis=_axis(None, type="multicategory"), yaxis=_axis("ms"))
    if thr is not None:
        layout["shapes"] = [{"type": "line", "xref": "paper", "x0": 0, "x1": 1, "yref": "y", "y0": thr, "y1": thr,
                             "line": {"color": "#444444", "dash": "dash", "width": 1}}]
    return {"data": data, "layout": layout}


def overlap(rows: list[OverlapRow]) -> dict[str, Any] | None:
    if not rows:
        return None
    ranks = [int(o.rank) for o in rows]
    data = (_box("overlapped, % of comm", [o.overlap_pct for o in rows], ranks, _OVERL)
            + _box("exposed comm, % of step", [o.exposed_pct for o in rows], ranks, _EXPOSED))
    return {"data": data, "layout": _layout(320, showlegend=False, xaxis=_axis(None),
                                            yaxis=_axis("%", range=[0, 100]))}


def imbalance(rows: list[ImbalanceRank], panels: Sequence[tuple[str, str, float]]) -> dict[str, Any] | None:
    """A panel per (title, ``ImbalanceRank`` field, divisor) of `panels`, each the distribution over ranks."""
    if not rows:
        return None
    ranks = [int(r.rank) for r in rows]
    n, gap = len(panels), 0.06
    width = (1 - gap * (n - 1)) / n
    layout = _layout(320, showlegend=False, margin={"l": 60, "r": 20, "t": 40, "b": 50})
    data: list[dict] = []
    for k, (title, key, div) in enumerate(panels):
        sfx = "" if k == 0 else str(k + 1)
        x0 = k * (width + gap)
        layout[f"xaxis{sfx}"] = _axis(None, domain=[x0, x0 + width], anchor=f"y{sfx}")
        layout[f"yaxis{sfx}"] = _axis(None, anchor=f"x{sfx}", rangemode="tozero")
        vals = [None if _num(getattr(r, key)) is None else _num(getattr(r, key)) / div for r in rows]
        data += _box(_pl(title), vals, ranks, _PLAIN, xaxis=f"x{sfx}", yaxis=f"y{sfx}")
    return {"data": data, "layout": layout}

