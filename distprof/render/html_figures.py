"""The HTML report's figures: plain plotly figure dicts (``{"data": [...], "layout": {...}}``) built from the
:class:`Report` (the memory timeline from ``report.memory``, computed by ``analysis/cross/memory_timeline.py``). Pure
functions; each returns the dict, or None when there is nothing to draw. plotly itself is never imported here — the
page's inlined plotly.js draws them. With many ranks (``html_scale.many``) the per-rank figures are distributions.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np

from ..analysis.cross.annotations import Annotation
from ..analysis.cross.stragglers import StragglerRank
from ..analysis.report.model import Report
from . import html_scale
from .html_tables import MAX_ANNOTATIONS
from .html_text import _fmt, _mean, _num, _pl

__all__ = ["fig_steps", "fig_breakdown", "fig_blame", "fig_overlap", "fig_imbalance", "fig_memory", "fig_annotations"]

_HEATMAP_TEXT_CELLS = 20_000  # above this, the step heatmap's hover shows only the step time (file size)

# Breakdown colours (compute, overlapped comm, exposed comm, memcpy, idle, other).
_COLORS = {
    "compute": "#4c78a8",
    "overlapped": "#72b7b2",
    "exposed": "#e45756",
    "memcpy": "#b279a2",
    "idle": "#bab0ac",
    "other": "#eeca3b",
}
_NAMED = "#d62728"
_PLAIN = "#6b8fb8"


# ---------------------------------------------------------------------------------------------------------------
# layout helpers


def _rank_label(r: Any) -> str:
    return f"rank {r}"


def _base_layout(height: int, **extra: Any) -> dict[str, Any]:
    layout: dict[str, Any] = {
        "height": height,
        "margin": {"l": 70, "r": 20, "t": 30, "b": 50},
        "font": {"family": "system-ui, -apple-system, Segoe UI, Roboto, sans-serif", "size": 12},
        "paper_bgcolor": "#ffffff",
        "plot_bgcolor": "#ffffff",
        "hoverlabel": {"namelength": -1},
        # below the plot, clear of the axis labels and of the modebar (top right)
        "legend": {"orientation": "h", "x": 0, "yref": "container", "y": 0, "yanchor": "bottom",
                   "traceorder": "normal"},
    }
    layout.update(extra)
    return layout


def _axis(title: str | None = None, **extra: Any) -> dict[str, Any]:
    ax: dict[str, Any] = {"gridcolor": "#e5e5e5", "zerolinecolor": "#cccccc", "automargin": True}
    if title:
        ax["title"] = {"text": title}
    ax.update(extra)
    return ax



# ---------------------------------------------------------------------------------------------------------------
# the step table, column by column (plain Python values, NaN where unknown)


def _step_columns(report: Report, *names: str) -> list[tuple[Any, ...]]:
    """One tuple per rank-step of the step table: the values of columns `names` (none without a step table)."""
    if report.steps is None:
        return []
    return list(zip(*(report.steps[c].tolist() for c in names)))


def _rank_means(report: Report, cols: tuple[str, ...]) -> tuple[list[int], dict[str, list[float]]]:
    """The ranks with steps, and per column each rank's mean per step (0.0 when no step has a value), rounded."""
    rows = _step_columns(report, "rank", *cols)
    ranks = sorted({int(r[0]) for r in rows})
    means: dict[str, list[float]] = {}
    for k, c in enumerate(cols, start=1):
        vals: dict[int, list[float | None]] = {r: [] for r in ranks}
        for row in rows:
            vals[int(row[0])].append(_num(row[k]))
        means[c] = [round(_mean(vals[r]) or 0.0, 4) for r in ranks]
    return ranks, means


# ---------------------------------------------------------------------------------------------------------------
# figures (each returns {"data": [...], "layout": {...}} or None when there is nothing to draw)


def _hover_text(row: tuple[Any, ...]) -> str:
    """A heatmap cell's breakdown (row: rank, step, step_ms, compute_ms, exposed_comm_ms, idle_ms, other_ms)."""
    return (f"compute {_fmt(row[3], '{:.2f}')} ms<br>exposed comm {_fmt(row[4], '{:.2f}')} ms<br>"
            f"idle {_fmt(row[5], '{:.2f}')} ms<br>other {_fmt(row[6], '{:.2f}')} ms")


def _step_time_trace(report: Report) -> dict[str, Any] | None:
    """Step time per rank and step: the heatmap's second view (in synchronous training every rank's step is the
    same length, so its rows look alike)."""
    recs = [r for r in _step_columns(report, "rank", "step", "step_ms", "compute_ms", "exposed_comm_ms", "idle_ms",
                                     "other_ms") if _num(r[2]) is not None]
    if not recs:
        return None
    ranks = sorted({int(r[0]) for r in recs})
    steps = sorted({int(r[1]) for r in recs})
    ri = {r: i for i, r in enumerate(ranks)}
    si = {s: i for i, s in enumerate(steps)}
    z: list[list[float | None]] = [[None] * len(steps) for _ in ranks]
    with_text = len(ranks) * len(steps) <= _HEATMAP_TEXT_CELLS
    text: list[list[str]] = [[""] * len(steps) for _ in ranks] if with_text else []
    for r in recs:
        i, j = ri[int(r[0])], si[int(r[1])]
        z[i][j] = round(float(r[2]), 3)
        if with_text:
            text[i][j] = _hover_text(r)
    trace: dict[str, Any] = {
        "type": "heatmap", "name": "step time", "x": [str(s) for s in steps], "y": [_rank_label(r) for r in ranks],
        "z": z, "colorscale": "YlOrRd",
        "reversescale": True,  # plotly's YlOrRd runs red -> yellow; slow steps should be red
        "colorbar": {"title": {"text": "ms"}}, "xgap": 1, "ygap": 1, "hoverongaps": False,
    }
    if with_text:
        trace["text"] = text
        trace["hovertemplate"] = "%{y}, step %{x}: <b>%{z:.2f} ms</b><br>%{text}<extra></extra>"
    else:
        trace["hovertemplate"] = "%{y}, step %{x}: <b>%{z:.2f} ms</b><extra></extra>"
    return trace


def _lateness_trace(report: Report) -> dict[str, Any] | None:
    """Each rank's lateness per step (the stragglers' cells): red late, blue early, white on time."""
    c = report.straggler_info.cells if report.straggler_info is not None else None
    if c is None or not c.rank:
        return None
    ranks, steps = sorted(set(c.rank)), sorted(set(c.step))
    ri = {r: i for i, r in enumerate(ranks)}
    si = {s: i for i, s in enumerate(steps)}
    z: list[list[float | None]] = [[None] * len(steps) for _ in ranks]
    text: list[list[str]] = [[""] * len(steps) for _ in ranks]
    for r, s, lat, extra in zip(c.rank, c.step, c.lateness_ms, c.extra_work_ms):
        i, j = ri[r], si[s]
        z[i][j] = _num(lat)
        text[i][j] = "" if extra is None else f"extra work {_fmt(extra, '{:+.2f}')} ms"
    return html_scale.lateness_heatmap_trace(steps, [_rank_label(r) for r in ranks], z, text)


def fig_steps(report: Report) -> dict[str, Any] | None:
    """Per rank (by host or block of ranks when there are many ranks) and step: its lateness at the step's
    collectives (what differs between ranks), with step time as a second view; step time alone without collectives."""
    ranks = {int(r) for r in report.steps["rank"].tolist()} if report.steps is not None else set()
    if html_scale.many(len(ranks)):
        return html_scale.step_heatmap(report)
    step = _step_time_trace(report)
    late = _lateness_trace(report)
    if step is None and late is None:
        return None
    rows = len({t for tr in (step, late) if tr is not None for t in tr["y"]})
    height = int(min(900, max(220, 22 * rows + 110)))
    layout = _base_layout(height, xaxis=_axis("global step", type="category"),
                          yaxis=_axis(None, type="category", autorange="reversed"))
    return html_scale.two_views(late, step, layout)


def fig_breakdown(report: Report) -> dict[str, Any] | None:
    """Where each rank's step time goes (mean per step), stacked; distributions over ranks when there are many."""
    cols = ("compute_ms", "overlapped_ms", "exposed_comm_ms", "memcpy_ms", "idle_ms", "other_ms")
    ranks, means = _rank_means(report, cols)
    if not ranks:
        return None
    if html_scale.many(len(ranks)):
        return html_scale.breakdown(ranks, means)
    compute, overlapped = means["compute_ms"], means["overlapped_ms"]
    series = [
        ("compute", [max(c - o, 0.0) for c, o in zip(compute, overlapped)], _COLORS["compute"]),
        ("overlapped comm", [min(o, c) for c, o in zip(compute, overlapped)], _COLORS["overlapped"]),
        ("exposed comm", means["exposed_comm_ms"], _COLORS["exposed"]),
        ("memcpy", means["memcpy_ms"], _COLORS["memcpy"]),
        ("idle", means["idle_ms"], _COLORS["idle"]),
        ("other", means["other_ms"], _COLORS["other"]),
    ]
    x = [_rank_label(r) for r in ranks]
    data = [{"type": "bar", "name": name, "x": x, "y": [round(v, 4) for v in ys], "marker": {"color": color},
             "hovertemplate": f"%{{x}}: {name} %{{y:.2f}} ms/step<extra></extra>"}
            for name, ys, color in series if name != "memcpy" or any(ys)]
    return {"data": data,
            "layout": _base_layout(360, barmode="stack", xaxis=_axis(None), yaxis=_axis("ms per step (mean)"))}


def _naming_floor(layout: dict[str, Any], thr: float) -> None:
    """The straggler rule's lateness floor as a dashed line, labelled."""
    layout["shapes"] = [{"type": "line", "xref": "paper", "x0": 0, "x1": 1, "yref": "y", "y0": thr, "y1": thr,
                         "line": {"color": "#444444", "dash": "dash", "width": 1}}]
    layout["annotations"] = [{"xref": "paper", "x": 0, "xanchor": "left", "yref": "y", "y": thr,
                              "yanchor": "bottom", "showarrow": False,
                              "text": f"naming floor {thr:.2f} ms (lateness)", "font": {"size": 11}}]


def fig_blame(report: Report) -> dict[str, Any] | None:
    """How long the others waited for each rank at collectives (bars) and its lateness, grouped by host."""
    if not report.stragglers:
        return None
    hosts = report.run.hosts

    def host_of(s: StragglerRank) -> str:
        return str(s.host or hosts.get(str(s.rank), "?"))  # a rank's host may be unknown

    info = report.straggler_info
    thr = None if info is None else _num(info.rule.threshold_ms)
    if html_scale.many(len(report.stragglers)):
        return html_scale.blame(report.stragglers, host_of, thr)
    rows = sorted(report.stragglers, key=lambda s: (host_of(s), int(s.rank)))
    x = [[_pl(host_of(s)) for s in rows], [_rank_label(s.rank) for s in rows]]
    others = max(len(report.stragglers) - 1, 1)
    data: list[dict[str, Any]] = [
        {"type": "bar", "name": "each other rank's wait for it, ms/step", "x": x,
         "y": [None if _num(s.blame_ms_per_step) is None else round(s.blame_ms_per_step / others, 4) for s in rows],
         "marker": {"color": [_NAMED if s.named else _PLAIN for s in rows]},
         "hovertemplate": "%{x}: each other rank waits %{y:.2f} ms/step for it<extra></extra>"},
        {"type": "scatter", "mode": "markers", "name": "lateness ms", "x": x,
         "y": [_num(s.lateness_ms) for s in rows],
         "marker": {"symbol": "diamond", "size": 11, "color": "#222222"},
         "hovertemplate": "%{x}: lateness %{y:.2f} ms<extra></extra>"},
    ]
    layout = _base_layout(360, xaxis=_axis(None, type="multicategory"), yaxis=_axis("ms"))
    if thr is not None:
        _naming_floor(layout, thr)
    return {"data": data, "layout": layout}


def fig_overlap(report: Report) -> dict[str, Any] | None:
    """Per rank: the share of its communication hidden under compute, and exposed communication's share of a step."""
    rows = sorted(report.overlap or [], key=lambda o: int(o.rank))
    if not rows:
        return None
    if html_scale.many(len(rows)):
        return html_scale.overlap(rows)
    x = [_rank_label(o.rank) for o in rows]
    data = [
        {"type": "bar", "name": "overlapped, % of comm", "x": x,
         "y": [_num(o.overlap_pct) for o in rows], "marker": {"color": _COLORS["overlapped"]},
         "hovertemplate": "%{x}: %{y:.1f} % of communication hidden<extra></extra>"},
        {"type": "bar", "name": "exposed comm, % of step", "x": x,
         "y": [_num(o.exposed_pct) for o in rows], "marker": {"color": _COLORS["exposed"]},
         "hovertemplate": "%{x}: exposed comm %{y:.1f} % of step time<extra></extra>"},
    ]
    return {"data": data,
            "layout": _base_layout(320, barmode="group", xaxis=_axis(None), yaxis=_axis("%", range=[0, 100]))}


#: The imbalance panels: title, ``ImbalanceRank`` field, divisor of its value.
IMBALANCE_PANELS = (("compute ms / step", "compute_ms", 1.0), ("GFLOP / step", "flops", 1e9),
                    ("achieved TFLOP/s", "tflops", 1.0), ("peak memory MiB", "peak_mem_bytes", 2**20))


def _imbalance_panel(k: int, title: str, x: list[str], ys: list[float | None], layout: dict[str, Any], width: float,
                     gap: float) -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]:
    """Panel `k` of the imbalance figure: its axes (set in `layout`), its bar trace, its mean line and labels."""
    sfx = "" if k == 0 else str(k + 1)
    x0 = k * (width + gap)
    layout[f"xaxis{sfx}"] = _axis(None, domain=[x0, x0 + width], anchor=f"y{sfx}")
    layout[f"yaxis{sfx}"] = _axis(None, anchor=f"x{sfx}", rangemode="tozero")
    trace = {"type": "bar", "x": x, "y": ys, "xaxis": f"x{sfx}", "yaxis": f"y{sfx}", "name": title,
             "marker": {"color": _PLAIN}, "hovertemplate": f"%{{x}}: %{{y}} ({_pl(title)})<extra></extra>"}
    shapes: list[dict[str, Any]] = []
    annotations = [{"xref": f"x{sfx} domain", "x": 0.5, "yref": "paper", "y": 1.0, "yanchor": "bottom",
                    "showarrow": False, "text": f"<b>{_pl(title)}</b>", "font": {"size": 12}}]
    mean = _mean(ys)
    if mean is not None:
        shapes.append({"type": "line", "xref": f"x{sfx} domain", "x0": 0, "x1": 1, "yref": f"y{sfx}",
                       "y0": mean, "y1": mean, "line": {"color": "#d62728", "dash": "dash", "width": 1.5}})
        annotations.append({"xref": f"x{sfx} domain", "x": 0.02, "xanchor": "left", "yref": f"y{sfx}",
                            "y": mean, "yanchor": "bottom", "showarrow": False, "bgcolor": "rgba(255,255,255,0.85)",
                            "font": {"size": 11, "color": "#d62728"}, "text": "mean " + "{:.4g}".format(mean)})
    return trace, shapes, annotations


def fig_imbalance(report: Report) -> dict[str, Any] | None:
    """Four panels of per-rank means per step (compute, GFLOP, TFLOP/s, peak memory), each with its mean marked."""
    rows = sorted(report.imbalance.per_rank if report.imbalance is not None else [], key=lambda r: int(r.rank))
    if not rows:
        return None
    if html_scale.many(len(rows)):
        return html_scale.imbalance(rows, IMBALANCE_PANELS)
    x = [_rank_label(r.rank) for r in rows]
    gap = 0.05
    width = (1 - gap * (len(IMBALANCE_PANELS) - 1)) / len(IMBALANCE_PANELS)
    layout = _base_layout(320, showlegend=False, margin={"l": 60, "r": 20, "t": 40, "b": 50})
    data: list[dict[str, Any]] = []
    shapes: list[dict[str, Any]] = []
    annotations: list[dict[str, Any]] = []
    for k, (title, field, div) in enumerate(IMBALANCE_PANELS):
        ys = [None if _num(getattr(r, field)) is None else _num(getattr(r, field)) / div for r in rows]
        trace, sh, an = _imbalance_panel(k, title, x, ys, layout, width, gap)
        data.append(trace)
        shapes += sh
        annotations += an
    layout["shapes"] = shapes
    layout["annotations"] = annotations
    return {"data": data, "layout": layout}


def fig_memory(report: Report) -> tuple[dict[str, Any] | None, str]:
    """The memory timeline per rank (``report.memory``: one device per rank, on the aligned clock) and its note;
    no figure, and a note that says why, when there is none."""
    mem = report.memory
    if mem is None:
        if not report.has_analyses:
            return None, "No profile window was recorded, so there is no memory timeline."
        return None, ("The memory timeline is not in report.json: render the report from the run directory "
                      "(distprof report RUN_DIR --html PATH) to draw it.")
    if not mem.curves:
        return None, "No allocator events were recorded (capture with profile_memory on to get a memory timeline)."
    data = [{"type": "scatter", "mode": "lines", "line": {"shape": "hv", "width": 1.2},
             "name": _rank_label(c.rank) + ("" if c.device < 0 else f" (cuda:{c.device})"), "x": c.x_s, "y": c.y_mib,
             "hovertemplate": "%{fullData.name}: %{y:.2f} MiB at %{x:.4f} s<extra></extra>"} for c in mem.curves]
    note = "Allocated memory over time (min/max kept per bucket, at most %d points per rank)." % mem.points_per_rank
    if len(mem.curves) < mem.n_ranks:
        note += (f" {mem.n_ranks} ranks: drawn are the {len(mem.curves)} ranks with the highest, the median and the "
                 "lowest memory peak.")
    if mem.cpu_relative and any(c.device < 0 for c in mem.curves):
        note += (" CPU totals are relative to each window's start: torch exposes no CPU allocator total, so the"
                 " curve shows growth within the window.")
    layout = _base_layout(340, xaxis=_axis("seconds since the first recorded step"), yaxis=_axis("MiB allocated"))
    return {"data": data, "layout": layout}, note


def _annotation_z(ann: list[Annotation], ranks: list[int]) -> list[list[float | None]]:
    """Per annotation and rank its ms per step (None where the rank did not record it)."""
    z = []
    for a in ann:
        per = [a.ranks.get(str(r)) for r in ranks]  # an annotation is on the ranks that recorded it
        z.append([None if v is None else _num(v.ms_per_step) for v in per])
    return z


def _unique_labels(names: list[str]) -> list[str]:
    """Category labels (entity-escaped for plotly), made unique: a repeated one gets its count."""
    y = []
    seen: Counter[str] = Counter()
    for name in names:
        label = _pl(name)
        seen[label] += 1
        y.append(label if seen[label] == 1 else f"{label} ({seen[label]})")
    return y


def fig_annotations(report: Report) -> dict[str, Any] | None:
    """Milliseconds per step inside each user annotation, per rank (min / median / max with many ranks)."""
    ann = [a for a in report.annotations or [] if a.name is not None][:MAX_ANNOTATIONS]
    ranks = sorted({int(k) for a in ann for k in a.ranks})
    if not ranks:
        return None
    z = _annotation_z(ann, ranks)
    x_labels = [_rank_label(r) for r in ranks]
    if html_scale.many(len(ranks)):  # min / median / max over ranks instead of one column per rank
        z = [[float(np.min(v)), float(np.median(v)), float(np.max(v))]
             for v in (np.array([x or 0.0 for x in row]) for row in z)]
        x_labels = ["min over ranks", "median", "max over ranks"]
    trace = {"type": "heatmap", "x": x_labels, "y": _unique_labels([a.name for a in ann]), "z": z,
             "colorscale": "Blues", "reversescale": True,  # plotly's Blues runs dark -> light; more time = darker
             "colorbar": {"title": {"text": "ms/step"}}, "xgap": 1, "ygap": 1, "hoverongaps": False,
             "hovertemplate": "%{y}<br>%{x}: %{z:.3f} ms/step<extra></extra>"}
    if len(x_labels) * len(ann) <= 400:
        trace["texttemplate"] = "%{z:.2f}"
    height = int(min(900, max(200, 26 * len(ann) + 110)))
    return {"data": [trace], "layout": _base_layout(
        height, xaxis=_axis(None, type="category", side="top"),
        yaxis=_axis(None, type="category", autorange="reversed"), margin={"l": 70, "r": 20, "t": 40, "b": 20})}
