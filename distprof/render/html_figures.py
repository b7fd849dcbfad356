"""The HTML report's figures: plain plotly figure dicts (``{"data": [...], "layout": {...}}``) built from the report
(and, for the memory timeline, from the MergedRun's ``memory`` table). Pure functions; each returns the dict, or None
when there is nothing to draw. plotly itself is never imported here — the page's inlined plotly.js draws them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..analysis.rank.summary import MEMORY_POINTS
from ..analysis.rank.summary import downsample_minmax as _downsample_minmax
from . import html_scale
from .html_text import _fmt, _mean, _num, _pl

#: Memory-timeline points kept per rank (min/max per bucket, so peaks survive); fewer when there are many ranks.
MEMORY_POINTS_PER_RANK = 2000
_MEMORY_POINTS_TOTAL = 120_000
_HEATMAP_TEXT_CELLS = 20_000  # above this, the step heatmap's hover shows only the step time (file size)
_MAX_ANNOTATIONS = 30

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
# figures (each returns {"data": [...], "layout": {...}} or None when there is nothing to draw)


def _steps_by_rank(report: dict[str, Any]) -> dict[int, list[dict[str, Any]]]:
    out: dict[int, list[dict[str, Any]]] = {}
    for rec in report.get("steps") or []:
        if "rank" in rec:
            out.setdefault(int(rec["rank"]), []).append(rec)
    return out


def _fig_step_heatmap(report: dict[str, Any]) -> dict[str, Any] | None:
    recs = [r for r in report.get("steps") or [] if _num(r.get("step_ms")) is not None]
    if not recs:
        return None
    ranks = sorted({int(r["rank"]) for r in recs})
    if html_scale.many(len(ranks)):
        return html_scale.step_heatmap(report)
    steps = sorted({int(r["step"]) for r in recs})
    ri = {r: i for i, r in enumerate(ranks)}
    si = {s: i for i, s in enumerate(steps)}
    z: list[list[float | None]] = [[None] * len(steps) for _ in ranks]
    with_text = len(ranks) * len(steps) <= _HEATMAP_TEXT_CELLS
    text: list[list[str]] = [[""] * len(steps) for _ in ranks] if with_text else []
    for r in recs:
        i, j = ri[int(r["rank"])], si[int(r["step"])]
        z[i][j] = round(float(r["step_ms"]), 3)
        if with_text:
            text[i][j] = (
                f"compute {_fmt(r.get('compute_ms'), '{:.2f}')} ms<br>"
                f"exposed comm {_fmt(r.get('exposed_comm_ms'), '{:.2f}')} ms<br>"
                f"idle {_fmt(r.get('idle_ms'), '{:.2f}')} ms<br>other {_fmt(r.get('other_ms'), '{:.2f}')} ms"
            )
    trace: dict[str, Any] = {
        "type": "heatmap",
        "x": [str(s) for s in steps],
        "y": [_rank_label(r) for r in ranks],
        "z": z,
        "colorscale": "YlOrRd",
        "reversescale": True,  # plotly's YlOrRd runs red -> yellow; slow steps should be red
        "colorbar": {"title": {"text": "ms"}},
        "xgap": 1,
        "ygap": 1,
        "hoverongaps": False,
    }
    if with_text:
        trace["text"] = text
        trace["hovertemplate"] = "%{y}, step %{x}: <b>%{z:.2f} ms</b><br>%{text}<extra></extra>"
    else:
        trace["hovertemplate"] = "%{y}, step %{x}: <b>%{z:.2f} ms</b><extra></extra>"
    height = int(min(900, max(220, 22 * len(ranks) + 110)))
    return {
        "data": [trace],
        "layout": _base_layout(
            height,
            xaxis=_axis("global step", type="category"),
            yaxis=_axis(None, type="category", autorange="reversed"),
        ),
    }


def _fig_breakdown(report: dict[str, Any]) -> dict[str, Any] | None:
    by_rank = _steps_by_rank(report)
    if not by_rank:
        return None
    ranks = sorted(by_rank)

    def per_step(col: str) -> list[float]:
        return [round(_mean(_num(r.get(col)) for r in by_rank[k]) or 0.0, 4) for k in ranks]

    if html_scale.many(len(ranks)):
        cols = ("compute_ms", "exposed_comm_ms", "idle_ms", "other_ms", "memcpy_ms")
        means = {c: per_step(c) for c in cols}
        return html_scale.breakdown({r: {c: means[c][i] for c in cols} for i, r in enumerate(ranks)})

    compute = per_step("compute_ms")
    overlapped = per_step("overlapped_ms")
    comp_only = [max(c - o, 0.0) for c, o in zip(compute, overlapped)]
    overl = [min(o, c) for c, o in zip(compute, overlapped)]
    series = [
        ("compute", comp_only, _COLORS["compute"]),
        ("overlapped comm", overl, _COLORS["overlapped"]),
        ("exposed comm", per_step("exposed_comm_ms"), _COLORS["exposed"]),
        ("memcpy", per_step("memcpy_ms"), _COLORS["memcpy"]),
        ("idle", per_step("idle_ms"), _COLORS["idle"]),
        ("other", per_step("other_ms"), _COLORS["other"]),
    ]
    x = [_rank_label(r) for r in ranks]
    data = [
        {
            "type": "bar",
            "name": name,
            "x": x,
            "y": [round(v, 4) for v in ys],
            "marker": {"color": color},
            "hovertemplate": f"%{{x}}: {name} %{{y:.2f}} ms/step<extra></extra>",
        }
        for name, ys, color in series
        if name != "memcpy" or any(ys)
    ]
    return {
        "data": data,
        "layout": _base_layout(360, barmode="stack", xaxis=_axis(None), yaxis=_axis("ms per step (mean)")),
    }


def _fig_blame(report: dict[str, Any]) -> dict[str, Any] | None:
    rows = [s for s in report.get("stragglers") or [] if "rank" in s]
    if not rows:
        return None
    hosts = report.get("run", {}).get("hosts", {})

    def host_of(s: dict[str, Any]) -> str:
        return str(s.get("host") or hosts.get(str(s["rank"]), "?"))

    thr = _num(((report.get("straggler_info") or {}).get("rule") or {}).get("threshold_ms"))
    if html_scale.many(len(rows)):
        return html_scale.blame(rows, host_of, thr)
    rows.sort(key=lambda s: (host_of(s), int(s["rank"])))
    x = [[_pl(host_of(s)) for s in rows], [_rank_label(s["rank"]) for s in rows]]
    colors = [_NAMED if s.get("named") else _PLAIN for s in rows]
    data: list[dict[str, Any]] = [
        {
            "type": "bar",
            "name": "blame (others' wait) ms/step",
            "x": x,
            "y": [_num(s.get("blame_ms_per_step")) for s in rows],
            "marker": {"color": colors},
            "hovertemplate": "%{x}: blame %{y:.2f} ms/step<extra></extra>",
        },
        {
            "type": "scatter",
            "mode": "markers",
            "name": "mean lateness ms",
            "x": x,
            "y": [_num(s.get("mean_lateness_ms")) for s in rows],
            "marker": {"symbol": "diamond", "size": 11, "color": "#222222"},
            "hovertemplate": "%{x}: mean lateness %{y:.2f} ms<extra></extra>",
        },
    ]
    layout = _base_layout(360, xaxis=_axis(None, type="multicategory"), yaxis=_axis("ms"))
    if thr is not None:
        layout["shapes"] = [{"type": "line", "xref": "paper", "x0": 0, "x1": 1, "yref": "y", "y0": thr, "y1": thr,
                             "line": {"color": "#444444", "dash": "dash", "width": 1}}]
        layout["annotations"] = [{"xref": "paper", "x": 0, "xanchor": "left", "yref": "y", "y": thr,
                                  "yanchor": "bottom", "showarrow": False,
                                  "text": f"naming floor {thr:.2f} ms (lateness)", "font": {"size": 11}}]
    return {"data": data, "layout": layout}


def _fig_overlap(report: dict[str, Any]) -> dict[str, Any] | None:
    rows = sorted((o for o in report.get("overlap") or [] if "rank" in o), key=lambda o: int(o["rank"]))
    if not rows:
        return None
    if html_scale.many(len(rows)):
        return html_scale.overlap(rows)
    x = [_rank_label(o["rank"]) for o in rows]
    data = [
        {"type": "bar", "name": "overlapped, % of comm", "x": x,
         "y": [_num(o.get("overlap_pct")) for o in rows], "marker": {"color": _COLORS["overlapped"]},
         "hovertemplate": "%{x}: %{y:.1f} % of communication hidden<extra></extra>"},
        {"type": "bar", "name": "exposed comm, % of step", "x": x,
         "y": [_num(o.get("exposed_pct")) for o in rows], "marker": {"color": _COLORS["exposed"]},
         "hovertemplate": "%{x}: exposed comm %{y:.1f} % of step time<extra></extra>"},
    ]
    return {"data": data,
            "layout": _base_layout(320, barmode="group", xaxis=_axis(None), yaxis=_axis("%", range=[0, 100]))}


def _per_rank_imbalance(report: dict[str, Any]) -> list[dict[str, Any]]:
    rows = (report.get("imbalance") or {}).get("per_rank") or []
    if rows:
        return sorted((r for r in rows if "rank" in r), key=lambda r: int(r["rank"]))
    # Older or partial report: derive the per-rank means from the step table.
    out = []
    for rank, recs in sorted(_steps_by_rank(report).items()):
        total_ms = sum(_num(r.get("step_ms")) or 0.0 for r in recs)
        flops = sum(_num(r.get("flops")) or 0.0 for r in recs)
        mems = [_num(r.get("peak_mem_bytes")) for r in recs]
        out.append({
            "rank": rank,
            "compute_ms": _mean(_num(r.get("compute_ms")) for r in recs),
            "flops": flops / len(recs) if recs else None,
            "tflops": flops / (total_ms * 1e-3) / 1e12 if total_ms > 0 else None,
            "peak_mem_bytes": max((m for m in mems if m is not None), default=None),
        })
    return out


def _fig_imbalance(report: dict[str, Any]) -> dict[str, Any] | None:
    rows = _per_rank_imbalance(report)
    if not rows:
        return None
    if html_scale.many(len(rows)):
        return html_scale.imbalance(rows)
    x = [_rank_label(r["rank"]) for r in rows]

    def scaled(key: str, div: float) -> list[float | None]:
        return [None if _num(r.get(key)) is None else _num(r.get(key)) / div for r in rows]

    panels = [
        ("compute ms / step", scaled("compute_ms", 1.0), "{:.4g}"),
        ("GFLOP / step", scaled("flops", 1e9), "{:.4g}"),
        ("achieved TFLOP/s", scaled("tflops", 1.0), "{:.4g}"),
        ("peak memory MiB", scaled("peak_mem_bytes", 2**20), "{:.4g}"),
    ]
    n = len(panels)
    gap = 0.05
    width = (1 - gap * (n - 1)) / n
    data: list[dict[str, Any]] = []
    layout = _base_layout(320, showlegend=False, margin={"l": 60, "r": 20, "t": 40, "b": 50})
    shapes: list[dict[str, Any]] = []
    annotations: list[dict[str, Any]] = []
    for k, (title, ys, fmt) in enumerate(panels):
        sfx = "" if k == 0 else str(k + 1)
        x0 = k * (width + gap)
        layout[f"xaxis{sfx}"] = _axis(None, domain=[x0, x0 + width], anchor=f"y{sfx}")
        layout[f"yaxis{sfx}"] = _axis(None, anchor=f"x{sfx}", rangemode="tozero")
        data.append({"type": "bar", "x": x, "y": ys, "xaxis": f"x{sfx}", "yaxis": f"y{sfx}", "name": title,
                     "marker": {"color": _PLAIN}, "hovertemplate": f"%{{x}}: %{{y}} ({_pl(title)})<extra></extra>"})
        annotations.append({"xref": f"x{sfx} domain", "x": 0.5, "yref": "paper", "y": 1.0, "yanchor": "bottom",
                            "showarrow": False, "text": f"<b>{_pl(title)}</b>", "font": {"size": 12}})
        mean = _mean(ys)
        if mean is not None:
            shapes.append({"type": "line", "xref": f"x{sfx} domain", "x0": 0, "x1": 1, "yref": f"y{sfx}",
                           "y0": mean, "y1": mean, "line": {"color": "#d62728", "dash": "dash", "width": 1.5}})
            annotations.append({"xref": f"x{sfx} domain", "x": 0.02, "xanchor": "left", "yref": f"y{sfx}",
                                "y": mean, "yanchor": "bottom", "showarrow": False, "bgcolor": "rgba(255,255,255,0.85)",
                                "font": {"size": 11, "color": "#d62728"}, "text": "mean " + fmt.format(mean)})
    layout["shapes"] = shapes
    layout["annotations"] = annotations
    return {"data": data, "layout": layout}




def _fig_memory(run: Any, report: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:
    """Memory timeline per rank from the run summary's memory curves (one device per rank: its accelerator if it
    has allocator events there, else the CPU), on the aligned clock."""
    if run is None:
        return None, ("The memory timeline needs the run summary (render_html(report, run)); only the report was "
                      "given.")
    ranks = sorted(r for r, s in run.ranks.items() if s.memory_series)
    if not ranks:
        return None, "No allocator events were recorded (capture with profile_memory on to get a memory timeline)."
    n_all = len(ranks)
    if html_scale.many(n_all):
        peaks = {r: max(float(v.max()) for _, v in run.ranks[r].memory_series.values() if v.size) for r in ranks}
        ranks = html_scale.memory_ranks(peaks)
    per_rank = max(200, min(MEMORY_POINTS_PER_RANK, _MEMORY_POINTS_TOTAL // max(len(ranks), 1)))
    starts = [int(r["start_ns"]) for r in report.get("steps") or [] if "start_ns" in r]
    firsts = [int(t[0]) for r in ranks for t, _ in run.ranks[r].memory_series.values() if t.size]
    t0 = min(starts) if starts else min(firsts)
    relative = any(bool(a.get("memory_total_relative")) for a in (getattr(run, "attrs", None) or {}).values())
    data = []
    devices_used = set()
    for r in ranks:
        s = run.ranks[r]
        dev = s.memory_device
        devices_used.add(dev)
        n_total = sum(t.size for t, _ in s.memory_series.values())
        xs: list[float | None] = []
        ys: list[float | None] = []
        for w in sorted(s.memory_series):
            t_w, v_w = s.memory_series[w]
            if per_rank < MEMORY_POINTS:  # many ranks: fewer points each than the summaries kept
                budget = max(4, int(round(per_rank * t_w.size / max(n_total, 1))))
                t_s, v_s = _downsample_minmax(t_w, v_w, budget)
            else:
                t_s, v_s = t_w, v_w
            t_s = run.model.align(np.full(t_s.size, r), np.full(t_s.size, w), t_s)
            if xs:
                xs.append(None)  # break the line between windows
                ys.append(None)
            xs.extend(np.round((t_s - t0) / 1e9, 6).tolist())
            ys.extend(np.round(v_s / 2**20, 4).tolist())
        data.append({"type": "scatter", "mode": "lines", "line": {"shape": "hv", "width": 1.2},
                     "name": _rank_label(r) + ("" if dev < 0 else f" (cuda:{dev})"), "x": xs, "y": ys,
                     "hovertemplate": "%{fullData.name}: %{y:.2f} MiB at %{x:.4f} s<extra></extra>"})
    note = "Allocated memory over time (min/max kept per bucket, at most %d points per rank)." % per_rank
    if len(ranks) < n_all:
        note += (f" {n_all} ranks: drawn are the {len(ranks)} ranks with the highest, the median and the lowest "
                 "memory peak.")
    if relative and -1 in devices_used:
        note += (" CPU totals are relative to each window's start: torch exposes no CPU allocator total, so the"
                 " curve shows growth within the window.")
    layout = _base_layout(340, xaxis=_axis("seconds since the first recorded step"), yaxis=_axis("MiB allocated"))
    return {"data": data, "layout": layout}, note


def _fig_annotations(report: dict[str, Any]) -> dict[str, Any] | None:
    ann = [a for a in report.get("annotations") or [] if isinstance(a, dict) and a.get("name") is not None]
    if not ann:
        return None
    ann = ann[:_MAX_ANNOTATIONS]
    ranks = sorted({int(k) for a in ann for k in (a.get("ranks") or {})})
    if not ranks:
        return None
    z = [[_num(((a.get("ranks") or {}).get(str(r)) or {}).get("ms_per_step")) for r in ranks] for a in ann]
    x_labels = [_rank_label(r) for r in ranks]
    if html_scale.many(len(ranks)):  # min / median / max over ranks instead of one column per rank
        z = [[float(np.min(v)), float(np.median(v)), float(np.max(v))]
             for v in (np.array([x or 0.0 for x in row]) for row in z)]
        x_labels = ["min over ranks", "median", "max over ranks"]
    y = []
    seen: dict[str, int] = {}
    for a in ann:  # category labels must be unique
        label = _pl(a["name"])
        seen[label] = seen.get(label, 0) + 1
        y.append(label if seen[label] == 1 else f"{label} ({seen[label]})")
    trace = {"type": "heatmap", "x": x_labels, "y": y, "z": z,
             "colorscale": "Blues", "reversescale": True,  # plotly's Blues runs dark -> light; more time = darker
             "colorbar": {"title": {"text": "ms/step"}}, "xgap": 1, "ygap": 1, "hoverongaps": False,
             "hovertemplate": "%{y}<br>%{x}: %{z:.3f} ms/step<extra></extra>"}
    if len(x_labels) * len(ann) <= 400:
        trace["texttemplate"] = "%{z:.2f}"
    height = int(min(900, max(200, 26 * len(ann) + 110)))
    return {"data": [trace], "layout": _base_layout(
        height, xaxis=_axis(None, type="category", side="top"),
        yaxis=_axis(None, type="category", autorange="reversed"), margin={"l": 70, "r": 20, "t": 40, "b": 20})}
