"""The self-contained HTML report: one file, charts drawn by the plotly.js bundled in the ``plotly`` package.

    html = render_html(report, run)           # report from build_report(run); run (optional) adds the memory timeline
    write_html(report, "report.html", run)    # atomic: temporary file + rename

The page needs no network when viewed: plotly.js is inlined (by default gzip + base64, unpacked by the browser's
``DecompressionStream``; ``compress_js=False`` inlines the plain 4.8 MB bundle). Figures are plain dicts
(``{"data": [...], "layout": {...}}``) built here from the report; plotly.graph_objects is never imported.

Escaping: every string from the trace (op and annotation names, hosts, run id, warnings, findings) reaches the page
either through ``html.escape`` (HTML text) or inside the figure JSON, where ``<``, ``>``, ``&``, U+2028 and U+2029
are written as ``\\uXXXX`` so nothing can close the ``<script>`` element, and where strings plotly renders as
(pseudo-)HTML — labels, hover text — are entity-escaped first so plotly shows them literally.
"""

from __future__ import annotations

import base64
import functools
import gzip
import html
import json
import logging
import math
import os
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from ..analysis.names import display_name, rank_ranges
from ..errors import ConfigError

logger = logging.getLogger(__name__)

__all__ = ["render_html", "write_html", "check_html_path", "MEMORY_POINTS_PER_RANK"]

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
# escaping


def _e(x: Any) -> str:
    """HTML text or attribute value (the JS line separators as character references too: harmless in HTML, but
    the page then holds none anywhere)."""
    s = html.escape("" if x is None else str(x), quote=True)
    return s.replace("\u2028", "&#x2028;").replace("\u2029", "&#x2029;")


def _pl(x: Any) -> str:
    """A string plotly will render (labels, category names, hover text): plotly parses a little HTML (<b>, <br>,
    <a href>) and decodes entities, so escaping &, < and > makes it show the text literally."""
    return str(x).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


_JSON_SCRIPT_ESCAPES = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}


def _script_json(obj: Any) -> str:
    """JSON safe to embed in a <script> element: <, >, & and the JS line separators only occur inside JSON strings,
    where their \\u escapes mean the same, so nothing in the data can end the element or start a comment."""
    text = json.dumps(_clean(obj), allow_nan=False, ensure_ascii=False, separators=(",", ":"))
    for ch, rep in _JSON_SCRIPT_ESCAPES.items():
        text = text.replace(ch, rep)
    return text


def _clean(x: Any) -> Any:
    """Plain JSON values: numpy converted, NaN/inf -> None."""
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    if isinstance(x, np.ndarray):
        return _clean(x.tolist())
    if isinstance(x, np.generic):
        x = x.item()
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


# ---------------------------------------------------------------------------------------------------------------
# small helpers


def _num(x: Any) -> float | None:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def _fmt(x: Any, fmt: str = "{:.1f}", none: str = "–") -> str:
    v = _num(x)
    return none if v is None else fmt.format(v)


def _rank_label(r: Any) -> str:
    return f"rank {r}"


def _mean(vals: Iterable[float | None]) -> float | None:
    v = [x for x in vals if x is not None]
    return sum(v) / len(v) if v else None


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
    thr = _num(((report.get("straggler_info") or {}).get("rule") or {}).get("threshold_ms"))
    if thr is not None:
        layout["shapes"] = [{"type": "line", "xref": "paper", "x0": 0, "x1": 1, "yref": "y", "y0": thr, "y1": thr,
                             "line": {"color": "#444444", "dash": "dash", "width": 1}}]
        layout["annotations"] = [{"xref": "paper", "x": 0, "xanchor": "left", "yref": "y", "y": thr,
                                  "yanchor": "bottom", "showarrow": False,
                                  "text": f"naming threshold {thr:.2f} ms (lateness)", "font": {"size": 11}}]
    return {"data": data, "layout": layout}


def _fig_overlap(report: dict[str, Any]) -> dict[str, Any] | None:
    rows = sorted((o for o in report.get("overlap") or [] if "rank" in o), key=lambda o: int(o["rank"]))
    if not rows:
        return None
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


def _downsample_minmax(t: np.ndarray, v: np.ndarray, budget: int) -> tuple[np.ndarray, np.ndarray]:
    """At most ~`budget` points: per bucket of consecutive samples keep the min and the max (in time order), so the
    peaks and troughs of the timeline survive."""
    n = t.size
    if n <= budget:
        return t, v
    nb = max(budget // 2, 1)
    bucket = (np.arange(n, dtype=np.int64) * nb) // n
    order = np.lexsort((v, bucket))  # by bucket, then value
    b_sorted = bucket[order]
    first = np.flatnonzero(np.r_[True, b_sorted[1:] != b_sorted[:-1]])
    last = np.r_[first[1:] - 1, n - 1]
    keep = np.unique(np.concatenate([order[first], order[last]]))
    return t[keep], v[keep]


def _fig_memory(run: Any, report: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:
    """Memory timeline per rank from the MergedRun ``memory`` table (one device per rank: its accelerator if it
    has allocator events there, else the CPU)."""
    if run is None:
        return None, "The memory timeline needs the merged run (render_html(report, run)); only the report was given."
    mem = getattr(run, "memory", None) or {}
    if not mem or "ts_ns" not in mem or np.asarray(mem["ts_ns"]).size == 0:
        return None, "No allocator events were recorded (capture with profile_memory on to get a memory timeline)."
    ts = np.asarray(mem["ts_ns"], dtype=np.int64)
    total = np.asarray(mem["total_bytes"], dtype=np.int64)
    rank = np.asarray(mem["rank"])
    window = np.asarray(mem["window"]) if "window" in mem else np.zeros(ts.size, dtype=np.int32)
    device = np.asarray(mem["device"]) if "device" in mem else np.full(ts.size, -1)
    ranks = sorted(int(r) for r in np.unique(rank))
    per_rank = max(200, min(MEMORY_POINTS_PER_RANK, _MEMORY_POINTS_TOTAL // max(len(ranks), 1)))
    starts = [int(r["start_ns"]) for r in report.get("steps") or [] if "start_ns" in r]
    t0 = min(starts) if starts else int(ts.min())
    relative = any(bool(a.get("memory_total_relative")) for a in (getattr(run, "attrs", None) or {}).values())
    data = []
    devices_used = set()
    for r in ranks:
        sel = rank == r
        dev_r = device[sel]
        dev = int(dev_r[dev_r >= 0].min()) if (dev_r >= 0).any() else -1
        devices_used.add(dev)
        sel &= device == dev
        idx = np.flatnonzero(sel)
        idx = idx[np.argsort(ts[idx], kind="stable")]
        wins = window[idx]
        n_total = idx.size
        xs: list[float | None] = []
        ys: list[float | None] = []
        for w in sorted(int(x) for x in np.unique(wins)):
            part = idx[wins == w]
            budget = max(4, int(round(per_rank * part.size / n_total)))
            t_s, v_s = _downsample_minmax(ts[part], total[part], budget)
            if xs:
                xs.append(None)  # break the line between windows
                ys.append(None)
            xs.extend(np.round((t_s - t0) / 1e9, 6).tolist())
            ys.extend(np.round(v_s / 2**20, 4).tolist())
        data.append({"type": "scatter", "mode": "lines", "line": {"shape": "hv", "width": 1.2},
                     "name": _rank_label(r) + ("" if dev < 0 else f" (cuda:{dev})"), "x": xs, "y": ys,
                     "hovertemplate": "%{fullData.name}: %{y:.2f} MiB at %{x:.4f} s<extra></extra>"})
    note = "Allocated memory over time (min/max kept per bucket, at most %d points per rank)." % per_rank
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
    y = []
    seen: dict[str, int] = {}
    for a in ann:  # category labels must be unique
        label = _pl(a["name"])
        seen[label] = seen.get(label, 0) + 1
        y.append(label if seen[label] == 1 else f"{label} ({seen[label]})")
    trace = {"type": "heatmap", "x": [_rank_label(r) for r in ranks], "y": y, "z": z,
             "colorscale": "Blues", "reversescale": True,  # plotly's Blues runs dark -> light; more time = darker
             "colorbar": {"title": {"text": "ms/step"}}, "xgap": 1, "ygap": 1, "hoverongaps": False,
             "hovertemplate": "%{y}<br>%{x}: %{z:.3f} ms/step<extra></extra>"}
    if len(ranks) * len(ann) <= 400:
        trace["texttemplate"] = "%{z:.2f}"
    height = int(min(900, max(200, 26 * len(ann) + 110)))
    return {"data": [trace], "layout": _base_layout(
        height, xaxis=_axis(None, type="category", side="top"),
        yaxis=_axis(None, type="category", autorange="reversed"), margin={"l": 70, "r": 20, "t": 40, "b": 20})}


# ---------------------------------------------------------------------------------------------------------------
# HTML sections


def _verdict(report: dict[str, Any]) -> str:
    v = report.get("verdict")
    if isinstance(v, str) and v.strip():
        return v
    named = [s for s in report.get("stragglers") or [] if s.get("named")]
    s = report.get("summary") or {}
    if named:
        top = named[0]
        txt = (f"rank {top.get('rank')} on host {top.get('host')} is the straggler: it arrives last in "
               f"{_fmt(100 * (_num(top.get('late_fraction')) or 0), '{:.0f}')} % of collectives, "
               f"{_fmt(top.get('mean_lateness_ms'), '{:.1f}')} ms late on average, costing the others "
               f"{_fmt(top.get('blame_ms_per_step'), '{:.1f}')} ms per step.")
        if len(named) > 1:
            txt += " Also named: " + ", ".join(f"rank {x.get('rank')}" for x in named[1:]) + "."
        return txt
    if not s.get("n_rank_steps"):
        return "No recorded steps: nothing to analyse."
    parts = []
    if report.get("stragglers"):
        parts.append("No straggler: no rank is late often enough to be told from noise.")
    parts.append(f"{_fmt(s.get('compute_pct'), '{:.0f}')} % of step time is compute, "
                 f"{_fmt(s.get('exposed_comm_pct'), '{:.0f}')} % exposed communication, "
                 f"{_fmt(s.get('idle_pct'), '{:.0f}')} % idle.")
    return " ".join(parts)


def _header(report: dict[str, Any]) -> str:
    run = report.get("run") or {}
    hosts = sorted({str(h) for h in (run.get("hosts") or {}).values()})
    n_present = len(run.get("ranks_present") or [])
    host_txt = ", ".join(hosts[:8]) + (f" (+{len(hosts) - 8} more)" if len(hosts) > 8 else "")
    steps_txt = (f"steps {run.get('first_step')}–{run.get('last_step')} ({run.get('n_steps')} recorded)"
                 if run.get("n_steps") else "no recorded steps")
    windows = run.get("windows") or []
    meta = [
        f"{n_present}/{run.get('world_size', '?')} ranks on {run.get('n_hosts', len(hosts))} host(s): {host_txt}",
        steps_txt + (f" in {len(windows)} window(s)" if windows else ""),
        "backend " + "/".join(str(b) for b in run.get("backend") or ["?"])
        + ", device " + "/".join(str(d) for d in run.get("devices") or ["?"]),
    ]
    s = report.get("summary") or {}
    if s.get("step_ms_mean") is not None:
        meta.append(f"mean step {_fmt(s.get('step_ms_mean'), '{:.2f}')} ms "
                    f"(max {_fmt(s.get('step_ms_max'), '{:.2f}')})")
    out = [f"<h1>distprof report — run <span class=\"runid\">{_e(run.get('id', '?'))}</span></h1>",
           "<p class=\"meta\">" + " · ".join(_e(m) for m in meta) + "</p>"]
    if run.get("ranks_missing"):
        out.append(f"<p class=\"warn\">Missing ranks (no shard): {_e(rank_ranges(run['ranks_missing']))}</p>")
    out.append("<div class=\"verdict\" id=\"verdict\"><span class=\"label\">Verdict</span> "
               f"{_e(_verdict(report))}</div>")
    return "\n".join(out)


def _findings(report: dict[str, Any]) -> str:
    items = [f for f in report.get("findings") or [] if isinstance(f, dict)]
    if not items:
        msg = ("No findings: no rule fired." if "findings" in report
               else "This report has no findings list (written by an older distprof).")
        return f"<section id=\"findings\"><h2>Findings</h2><p class=\"muted\">{_e(msg)}</p></section>"
    rows = []
    for f in items:
        sev = str(f.get("severity") or "low").lower()
        sev_cls = sev if sev in ("high", "medium", "low") else "low"
        where = []
        if f.get("rank") is not None:
            where.append(f"rank {f['rank']}")
        if f.get("host") is not None:
            where.append(f"host {f['host']}")
        metrics = f.get("metrics") or {}
        met = ", ".join(f"{k} = {_fmt(v, '{:.4g}')}" for k, v in metrics.items() if _num(v) is not None)
        rows.append(
            "<li class=\"finding\">"
            f"<span class=\"badge {sev_cls}\">{_e(sev)}</span> "
            f"<span class=\"ftitle\">{_e(f.get('title') or f.get('id') or '')}</span>"
            + (f" <span class=\"where\">{_e(' · '.join(where))}</span>" if where else "")
            + (f"<div class=\"evidence\">{_e(f.get('evidence'))}</div>" if f.get("evidence") else "")
            + (f"<div class=\"advice\"><b>Advice:</b> {_e(f.get('advice'))}</div>" if f.get("advice") else "")
            + (f"<details class=\"metrics\"><summary>metrics</summary>{_e(met)}</details>" if met else "")
            + "</li>"
        )
    return "<section id=\"findings\"><h2>Findings</h2><ul class=\"findings\">" + "".join(rows) + "</ul></section>"


def _table(header: list[str], rows: list[list[str]], cls: str = "") -> str:
    """rows hold already-escaped cell HTML."""
    th = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table class=\"{cls}\"><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"


def _clock_table(report: dict[str, Any]) -> str:
    clock = report.get("clock") or {}
    if not clock:
        return "<p class=\"muted\">No clock alignment information.</p>"
    rows = []
    for host, c in clock.items():
        c = c or {}
        off = _num(c.get("offset_ns"))
        rows.append([
            _e(host), _e(c.get("method")), _e(_fmt(None if off is None else off / 1e6, "{:+.3f}")),
            _e(_fmt(c.get("drift_ppm"), "{:.2f}")), _e(_fmt(c.get("residual_us"), "{:.1f}")),
            _e(_fmt(c.get("residual_max_us"), "{:.1f}")), _e(c.get("n_samples")),
            _e(", ".join(str(r) for r in c.get("ranks") or [])),
        ])
    return _table(["host", "method", "offset ms", "drift ppm", "residual µs (median)", "residual µs (max)",
                   "samples", "ranks"], rows, "num")


def _root_cause(report: dict[str, Any]) -> str:
    rc = report.get("root_cause") or []
    if not rc:
        return "<p class=\"muted\">No named straggler, so no root-cause analysis.</p>"
    out = []
    for item in rc:
        rows = [[f'<span title="{_e(op.get("name"))}">{_e(display_name(str(op.get("name"))))}</span>', _e(op.get("kind")), _e(_fmt(op.get("excess_ms_per_step"), "{:.3f}")),
                 _e(_fmt(op.get("rank_ms_per_step"), "{:.3f}")),
                 _e(_fmt(op.get("others_median_ms_per_step"), "{:.3f}")),
                 _e(_fmt(op.get("calls_per_step"), "{:.1f}"))] for op in item.get("ops") or []]
        out.append(f"<h3>rank {_e(item.get('rank'))} on host {_e(item.get('host'))}"
                   f" <span class=\"muted\">({_e(item.get('n_steps'))} steps)</span></h3>")
        out.append(_table(["op", "kind", "excess ms/step", "its ms/step", "others' median ms/step", "calls/step"],
                          rows, "num") if rows else "<p class=\"muted\">No op took longer than on its peers.</p>")
    return "\n".join(out)


def _annotation_table(report: dict[str, Any]) -> str:
    ann = [a for a in report.get("annotations") or [] if isinstance(a, dict)]
    if not ann:
        return ""
    rows = []
    for a in ann[:_MAX_ANNOTATIONS]:
        vals = [_num((v or {}).get("ms_per_step")) for v in (a.get("ranks") or {}).values()]
        cnt = [_num((v or {}).get("count_per_step")) for v in (a.get("ranks") or {}).values()]
        rows.append([_e(a.get("name")), _e(_fmt(_mean(vals), "{:.3f}")), _e(_fmt(_mean(cnt), "{:.1f}")),
                     _e(_fmt(a.get("spread_pct"), "{:.1f}"))])
    more = (f"<p class=\"muted\">{len(ann) - _MAX_ANNOTATIONS} more not shown.</p>"
            if len(ann) > _MAX_ANNOTATIONS else "")
    return _table(["region", "mean ms/step", "calls/step", "spread % (max−min over mean)"], rows, "num") + more


def _gpu_time_table(report: dict[str, Any]) -> str:
    rows = [[_e(g.get("rank")), _e(_fmt(_num(g.get("span_us")) and _num(g.get("span_us")) / 1e3, "{:.1f}")),
             _e(_fmt(g.get("idle_pct"), "{:.2f}")), _e(_fmt(g.get("compute_pct"), "{:.2f}")),
             _e(_fmt(g.get("non_compute_pct"), "{:.2f}")), _e(_fmt(g.get("overlap_pct"), "{:.2f}"))]
            for g in report.get("gpu_time") or [] if isinstance(g, dict)]
    if not rows:
        return ""
    return _table(["rank", "GPU span ms", "idle %", "compute %", "non-compute %", "comm overlap %"], rows)


def _warnings(report: dict[str, Any]) -> str:
    w = [str(x) for x in report.get("warnings") or []]
    notes = [report["mfu_note"]] if report.get("mfu_note") else []
    if not w and not notes:
        return "<p class=\"muted\">No warnings.</p>"
    return ("<ul class=\"warnings\">" + "".join(f"<li>{_e(x)}</li>" for x in w)
            + "".join(f"<li class=\"muted\">{_e(x)}</li>" for x in notes) + "</ul>")


def _chart(fig_id: str, title: str, fig: dict[str, Any] | None, figs: dict[str, Any], caption: str = "",
           empty: str = "No data for this chart.") -> str:
    head = f"<h2>{_e(title)}</h2>" + (f"<p class=\"caption\">{_e(caption)}</p>" if caption else "")
    if fig is None:
        return f"<section class=\"chart-section\">{head}<p class=\"muted\">{_e(empty)}</p></section>"
    figs[fig_id] = fig
    h = int(fig["layout"].get("height", 320))
    return (f"<section class=\"chart-section\">{head}<div class=\"chart\" id=\"{_e(fig_id)}\" "
            f"style=\"min-height:{h}px\"></div></section>")


# ---------------------------------------------------------------------------------------------------------------
# plotly.js and the page


@functools.lru_cache(maxsize=2)
def _plotly_js(compressed: bool) -> str:
    from plotly.offline import get_plotlyjs  # only the bundled JS file is read; no graph_objects

    js = get_plotlyjs()
    if "</script" in js.lower():  # never seen; keep the inline element intact if a future bundle has one
        js = js.replace("</script", "<\\/script").replace("</SCRIPT", "<\\/SCRIPT")
    if not compressed:
        return js
    return base64.b64encode(gzip.compress(js.encode("utf-8"), compresslevel=9, mtime=0)).decode("ascii")


_CSS = """
*{box-sizing:border-box}
body{margin:0;background:#f6f7f9;color:#1d2330;font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif}
main{max-width:1240px;margin:0 auto;padding:20px 24px 40px}
h1{font-size:22px;margin:0 0 4px}
h1 .runid{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace}
h2{font-size:17px;margin:0 0 6px}
h3{font-size:14px;margin:14px 0 6px}
.meta{color:#4a5366;margin:0 0 14px}
.verdict{background:#fff;border-left:5px solid #d62728;padding:12px 16px;font-size:16px;border-radius:4px;
  box-shadow:0 1px 2px rgba(0,0,0,.08);margin-bottom:18px}
.verdict .label{font-weight:700;text-transform:uppercase;font-size:12px;letter-spacing:.06em;color:#d62728;
  margin-right:6px}
section{background:#fff;border-radius:6px;padding:14px 16px;margin:0 0 16px;box-shadow:0 1px 2px rgba(0,0,0,.08)}
.grid{display:grid;grid-template-columns:minmax(0,1fr) minmax(0,1fr);gap:16px;margin:0 0 16px}
.grid>section{margin:0}
@media (max-width:1000px){.grid{grid-template-columns:1fr}}
.caption{color:#4a5366;margin:0 0 6px;font-size:13px}
.muted{color:#7a8396}
.warn{color:#b00020}
ul.findings{list-style:none;margin:0;padding:0}
li.finding{padding:8px 0;border-top:1px solid #eceef2}
li.finding:first-child{border-top:none}
.badge{display:inline-block;min-width:58px;text-align:center;border-radius:10px;padding:1px 8px;font-size:11px;
  font-weight:700;text-transform:uppercase;color:#fff;vertical-align:1px}
.badge.high{background:#d62728}.badge.medium{background:#f28e2b}.badge.low{background:#7a8396}
.ftitle{font-weight:600}
.where{color:#4a5366;font-size:12px;margin-left:6px}
.evidence,.advice,.metrics{margin:3px 0 0 66px}
.metrics{color:#7a8396;font-size:12px;font-family:ui-monospace,Menlo,Consolas,monospace}
table{border-collapse:collapse;width:100%;font-size:13px}
th,td{padding:4px 8px;border-bottom:1px solid #eceef2;text-align:left;vertical-align:top}
th{background:#f3f4f7;font-weight:600}
table.num td+td{font-variant-numeric:tabular-nums}
td:first-child{word-break:break-all}
ul.warnings{margin:0;padding-left:20px}
footer{color:#7a8396;font-size:12px;text-align:center;margin-top:10px}
.chart-error{color:#b00020;padding:12px}
"""

_BOOT_JS = """
(function () {
  "use strict";
  var figs = JSON.parse(document.getElementById("dp-figures").textContent);
  var config = {displaylogo: false, responsive: true, modeBarButtonsToRemove: ["select2d", "lasso2d"]};
  function fail(msg) {
    Object.keys(figs).forEach(function (id) {
      var el = document.getElementById(id);
      if (!el) return;
      var p = document.createElement("p");
      p.className = "chart-error";
      p.textContent = msg;
      el.replaceChildren(p);
    });
    document.body.setAttribute("data-dp-rendered", "error");
  }
  function draw() {
    if (!window.Plotly) { fail("plotly.js did not load; the charts cannot be drawn."); return; }
    var done = Object.keys(figs).map(function (id) {
      var f = figs[id];
      return Promise.resolve(Plotly.newPlot(id, f.data, f.layout, config)).catch(function (e) {
        var p = document.createElement("p");
        p.className = "chart-error";
        p.textContent = "chart failed: " + e;
        document.getElementById(id).replaceChildren(p);
        throw e;
      });
    });
    Promise.all(done).then(function () { document.body.setAttribute("data-dp-rendered", "ok"); },
                           function (e) { document.body.setAttribute("data-dp-rendered", "error"); console.error(e); });
  }
  var packed = document.getElementById("dp-plotly-gz");
  if (!packed) { draw(); return; }
  if (typeof DecompressionStream === "undefined") {
    fail("This browser lacks DecompressionStream (needed to unpack the inlined plotly.js): open the report in a"
         + " current Chrome, Edge, Firefox or Safari, or regenerate it with compress_js=False.");
    return;
  }
  var bin = atob(packed.textContent.trim());
  var bytes = new Uint8Array(bin.length);
  for (var i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
  var stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip"));
  new Response(stream).text().then(function (js) {
    var s = document.createElement("script");
    s.textContent = js;
    document.head.appendChild(s);
    draw();
  }, function (e) { fail("could not unpack plotly.js: " + e); });
})();
"""


def render_html(report: dict[str, Any], run: Any = None, *, compress_js: bool = True) -> str:
    """The report as one self-contained HTML page (str).

    `run` (the MergedRun the report was built from) adds the memory timeline; without it the page says so.
    `compress_js` inlines plotly.js gzip+base64 (about 2.0 MB instead of 4.8 MB; unpacked by the browser's
    DecompressionStream, in every current browser) — False inlines the plain bundle.
    """
    figs: dict[str, Any] = {}
    mem_fig, mem_note = _fig_memory(run, report)
    summary = report.get("summary") or {}
    bd_caption = (
        "Mean per step; the bars add up to the step time. 'overlapped comm' is compute during which communication "
        "also ran (hidden communication); 'exposed comm' is time the rank only waited for communication."
    )
    if summary.get("n_rank_steps"):
        bd_caption += (f" Over all ranks: compute {_fmt(summary.get('compute_pct'), '{:.0f}')} %, exposed comm "
                       f"{_fmt(summary.get('exposed_comm_pct'), '{:.0f}')} %, idle "
                       f"{_fmt(summary.get('idle_pct'), '{:.0f}')} %, "
                       f"other {_fmt(summary.get('other_pct'), '{:.0f}')} %.")
    rule_text = ((report.get("straggler_info") or {}).get("rule") or {}).get("text") or ""
    has_ann_key = "annotations" in report
    body = [
        _header(report),
        _findings(report),
        _chart("fig-steps", "Step time per rank and step", _fig_step_heatmap(report), figs,
               "Each cell is one rank's step (ms); hover for its breakdown. A row that stays hot is a slow rank; "
               "a hot column is a slow step everywhere."),
        "<div class=\"grid\">",
        _chart("fig-breakdown", "Where step time goes, per rank", _fig_breakdown(report), figs, bd_caption),
        _chart("fig-blame", "Straggler blame per rank, grouped by host", _fig_blame(report), figs,
               "Bars: how long the other ranks waited for this rank at collectives, per step (red = named "
               "straggler). Diamonds: mean lateness against the naming threshold (dashed).",
               "No collective was matched across ranks: no straggler analysis."),
        "</div>",
        _chart("fig-imbalance", "Work and memory per rank", _fig_imbalance(report), figs,
               "Per-rank means per step (TFLOP/s: FLOPs over wall time; torch counts FLOPs of a few ops only); "
               "the dashed line marks the mean over ranks."),
        "<div class=\"grid\">",
        _chart("fig-overlap", "Communication overlap per rank", _fig_overlap(report), figs,
               "Share of communication hidden under compute, and exposed communication as a share of step time."),
        _chart("fig-annotations", "User annotations (record_function regions) per rank", _fig_annotations(report),
               figs, "Milliseconds per step inside each region, per rank.",
               "No user annotations in this run." if has_ann_key
               else "This report has no annotations table (written by an older distprof)."),
        "</div>",
        _chart("fig-memory", "Memory timeline per rank", mem_fig, figs, mem_note if mem_fig else "", mem_note),
    ]
    gpu_table = _gpu_time_table(report)
    if gpu_table:
        body.append("<section id=\"gpu-time\"><h2>GPU time per rank</h2><p class=\"caption\">HTA's temporal "
                    "breakdown of each rank's GPU span (idle: no kernel or copy on any stream; non-compute: only "
                    "communication or memory ran) and the share of communication-kernel time hidden under "
                    f"compute kernels.</p>{gpu_table}</section>")
    ann_table = _annotation_table(report)
    if ann_table:
        body.append(f"<section id=\"annotation-table\"><h2>Annotation spread</h2>{ann_table}</section>")
    body += [
        f"<section id=\"root-cause\"><h2>Root cause of named stragglers</h2>"
        f"<p class=\"caption\">Ops that took longer on the straggler than the median of its peers (inclusive "
        f"times).</p>{_root_cause(report)}</section>",
        f"<section id=\"clock\"><h2>Clock alignment</h2><p class=\"caption\">How each host's clock was mapped onto "
        f"the reference rank's; the residual is the collective causality violation left after alignment.</p>"
        f"{_clock_table(report)}"
        + (f"<p class=\"caption\">Straggler rule: {_e(rule_text)}</p>" if rule_text else "")
        + "</section>",
        f"<section id=\"warnings\"><h2>Warnings</h2>{_warnings(report)}</section>",
        f"<footer>distprof {_e(report.get('distprof_version', ''))} · report format "
        f"{_e(report.get('report_version', ''))} · self-contained page: charts by the inlined plotly.js, "
        f"no network needed</footer>",
    ]
    run_id = (report.get("run") or {}).get("id", "?")
    if compress_js:
        plotly_el = ("<script type=\"application/octet-stream\" id=\"dp-plotly-gz\">"
                     + _plotly_js(True) + "</script>")
    else:
        plotly_el = "<script>" + _plotly_js(False) + "</script>"
    page = [
        "<!DOCTYPE html>",
        "<html lang=\"en\"><head><meta charset=\"utf-8\">",
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">",
        f"<title>distprof report — {_e(run_id)}</title>",
        f"<style>{_CSS}</style>",
        "</head><body><main>",
        "\n".join(body),
        "</main>",
        f"<script type=\"application/json\" id=\"dp-figures\">{_script_json(figs)}</script>",
        plotly_el,
        f"<script>{_BOOT_JS}</script>",
        "</body></html>",
        "",
    ]
    return "\n".join(page)


def check_html_path(path: str | os.PathLike) -> Path:
    """`path` as a Path if an HTML report can be written there, else ConfigError (checked before the analysis)."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"--html {path}: is a directory; give a file name such as {path / 'report.html'}")
    if not path.parent.is_dir():
        raise ConfigError(f"--html {path}: folder {path.parent} does not exist; create it or choose another path")
    return path


def write_html(report: dict[str, Any], path: str | os.PathLike, run: Any = None, *,
               compress_js: bool = True) -> Path:
    """Write the HTML report to `path` (temporary file + rename, so nobody sees half a file); returns the path."""
    path = check_html_path(path)
    text = render_html(report, run, compress_js=compress_js)
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    logger.info("wrote %s (%d bytes)", path, len(text.encode("utf-8")))
    return path
